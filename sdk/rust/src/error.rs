//! One error type for the client, the worker and handlers.

use std::fmt;
use std::time::Duration;

/// What a handler's future may fail with: any error. `Error::Permanent`,
/// `Error::Snooze` and `Error::RetryIn` say what to do with the job; any
/// other error fails it retryably with its text.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong, and the three ways a handler can end a job
/// other than completing it or failing it retryably.
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// The server answered an error status. `code` is its error body's code
    /// (`not_found`, `lease_lost`, `invalid`, ...), `None` when the answer
    /// had no qftrio error body (a proxy's page, say).
    Api {
        status: u16,
        code: Option<String>,
        message: String,
    },
    /// No answer: the server could not be reached, the connection broke, or
    /// the call timed out. Sending the call again may succeed.
    Transport {
        method: &'static str,
        path: String,
        message: String,
    },
    /// What answered is not a qftrio server: not JSON, or not of the shape
    /// the route answers.
    Unexpected(String),
    /// An option or argument that can never work, refused before anything is sent.
    Config(String),
    /// From a handler: fail the job with `retryable: false` (dead-lettered at once).
    Permanent(String),
    /// From a handler: put the job back to pending for this long (0 to 30
    /// days) without using up its attempt.
    Snooze(Duration),
    /// From a handler: fail the attempt with this message, retried after
    /// this delay (0 to 30 days) instead of the job's backoff.
    RetryIn(Duration, String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Api {
                status,
                code: Some(code),
                message,
            } => write!(f, "{status} {code}: {message}"),
            Error::Api {
                status, message, ..
            } => write!(f, "{status}: {message}"),
            Error::Transport {
                method,
                path,
                message,
            } => write!(f, "{method} {path}: {message}"),
            Error::Unexpected(message) | Error::Config(message) | Error::Permanent(message) => {
                f.write_str(message)
            }
            Error::Snooze(delay) => write!(f, "snoozed for {} s", delay.as_secs_f64()),
            Error::RetryIn(_, message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// The HTTP status of an `Api` error.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
