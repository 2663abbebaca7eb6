/**
 * One error tree, as the Python client's:
 *
 *     QftrioError
 *     ├── ApiError          the server answered 4xx/5xx: `status` and `code`
 *     ├── TransportError    no answer: connection refused or broken, timeout
 *     ├── UnexpectedAnswer  an answer that is not qftrio's (another service at the URL)
 *     ├── ConfigError       an argument that can never work (a bad URL, lanes 0, ...)
 *     ├── PermanentError    thrown by a handler: fail the job without retry
 *     ├── Snooze            thrown by a handler: run the job again later, the attempt not used up
 *     └── RetryIn           thrown by a handler: fail, retried after the delay given
 */

export class QftrioError extends Error {
  override name = "QftrioError";
}

/** The server answered with an error status. `code` is the error body's
 * code (`not_found`, `lease_lost`, `invalid`, ...), `null` when the answer
 * had no qftrio error body (a proxy's page, say). */
export class ApiError extends QftrioError {
  override name = "ApiError";
  constructor(
    readonly status: number,
    readonly code: string | null,
    message: string,
  ) {
    super(`${status}${code ? ` ${code}` : ""}: ${message}`);
  }
}

/** No answer: the server could not be reached, the connection broke, or the
 * call timed out. Sending the call again may succeed. */
export class TransportError extends QftrioError {
  override name = "TransportError";
}

/** What answered is not a qftrio server: not JSON, or not of the shape the
 * route answers. */
export class UnexpectedAnswer extends QftrioError {
  override name = "UnexpectedAnswer";
}

/** An option or argument that can never work; thrown before anything is sent. */
export class ConfigError extends QftrioError {
  override name = "ConfigError";
}

/** Thrown by a handler: the job fails with `retryable: false` (dead-lettered
 * at once) and the error's message. */
export class PermanentError extends QftrioError {
  override name = "PermanentError";
}

/** Thrown by a handler: the job goes back to pending for `seconds` (0 to 30
 * days) without using up its attempt (the server raises its
 * `max_attempts` by one), so it can be snoozed any number of times. */
export class Snooze extends QftrioError {
  override name = "Snooze";
  constructor(readonly seconds: number) {
    super(`snoozed for ${seconds} s`);
  }
}

/** Thrown by a handler: the attempt fails with the error's message and is
 * retried in `seconds` (0 to 30 days) instead of after the job's backoff (an
 * upstream's `Retry-After`, say); the last attempt is dead-lettered all the same. */
export class RetryIn extends QftrioError {
  override name = "RetryIn";
  constructor(
    readonly seconds: number,
    message = "retry requested",
  ) {
    super(message);
  }
}
