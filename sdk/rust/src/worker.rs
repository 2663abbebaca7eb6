//! The worker runtime: lease jobs, run their handlers, heartbeat, report.
//!
//! ```no_run
//! # async fn demo(client: qftrio::Client) -> Result<(), qftrio::Error> {
//! use qftrio::{Worker, WorkerOptions};
//! use serde_json::json;
//!
//! Worker::new(client, "images", WorkerOptions::default())
//!     .register("resize-image", |job, ctx| async move { Ok(json!({})) })
//!     .run()
//!     .await
//! # }
//! ```
//!
//! It keeps the rules of the Python runtime (docs/worker.md):
//!
//! - Lanes: a handler runs in a lane, one job per lane. A lease asks for as
//!   many jobs as there are free lanes (at most 100), only while one is free.
//! - One heartbeat scheduler renews every held job every `lease_secs / 2`
//!   from its claim, the jobs due together in one batch call. A `409`, a
//!   `404` or a status other than `running` fires the job's cancellation
//!   token and nothing is reported (`Lost`). When renewals keep failing and
//!   the lease is about to end, the token fires and a retryable fail is
//!   attempted. At the job's `timeout_secs` deadline the token fires and the
//!   job fails with the server's text.
//! - Reports (complete, fail, snooze) go through the batch routes, retried
//!   with backoff until the lease ends, then given up (`Unreported`).
//! - Lease calls back off with jitter on transport errors and passing 5xx
//!   answers (`Waiting`), forever; answers that never change (`401`/`403`, a
//!   refused request, an answer that is not qftrio's) end `run` with that error.
//! - The first SIGINT/SIGTERM (or `run_until`'s future) drains: lease
//!   nothing more, finish and report the held jobs. A second signal quits
//!   the process at once (exit status 130).
//!
//! Every task the worker starts (the heartbeat scheduler, its calls, the
//! signal watcher, each job and its handler) is owned by `run` and has ended
//! when `run` returns.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::client::Client;
use crate::error::{BoxError, Error, Result};
use crate::types::{
    CompleteItem, FailItem, HeartbeatItem, Job, Lease, LeaseRequest, Object, ReportResult,
    SnoozeItem, Status, StepSpec, Workflow,
};

/// What a handler's future answers: a JSON object (or `null` for `{}`) completes the job.
pub type HandlerResult = std::result::Result<Value, BoxError>;

type HandlerFuture = Pin<Box<dyn Future<Output = HandlerResult> + Send>>;
type Handler = Arc<dyn Fn(Job, JobContext) -> HandlerFuture + Send + Sync>;
/// A listener of the worker's events.
pub type OnEvent = Arc<dyn Fn(&Event) + Send + Sync>;
/// A renewal in a heartbeat batch: the held job's key and its item.
type Renewal = (u64, HeartbeatItem);

const MAX_LEASE_JOBS: usize = 100;
/// Each lane costs little, but not nothing: a bound, far above any use.
const MAX_LANES: usize = 10_000;
const MAX_BATCH: usize = 1000;
const MAX_WORKER_ID: usize = 200;
const MAX_ERROR_CHARS: usize = 65536;
const MAX_PROGRESS_BYTES: usize = 8192;
/// Backoff of retried calls, seconds: about `base` first, doubling up to
/// `cap`, each wait scaled by a random factor in [0.5, 1] so that a fleet
/// does not retry in lockstep.
const LEASE_BACKOFF: (f64, f64) = (0.5, 15.0);
const REPORT_BACKOFF: (f64, f64) = (0.25, 5.0);
/// Allowed between the server's claim and our reading its answer: the lease
/// is reckoned from then.
const CLAIM_SLACK: Duration = Duration::from_millis(100);
/// Renewals, and reports, falling due within this long of each other go together.
const COALESCE: Duration = Duration::from_millis(5);
/// A progress value waits at most this long for the heartbeat that carries it.
const PROGRESS_DELAY: Duration = Duration::from_millis(500);
/// Answers to a lease call that a later call may not get: ridden out.
const PASSING: [u16; 6] = [408, 429, 500, 502, 503, 504];

/// What the worker did, for logs and dashboards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A job was leased.
    Claimed,
    /// Its completion landed.
    Completed,
    /// Its failure landed (`retryable` says which kind).
    Failed,
    /// Its snooze landed; it runs again after `delay`.
    Snoozed,
    /// The server took the job back (cancelled, lease lost); its token fired and nothing was reported.
    Lost,
    /// The report could not land before the lease ran out; the job runs again later.
    Unreported,
    /// A lease call failed; the next try is after `delay`.
    Waiting,
    /// The worker is draining, or stopping on an error (`error` says which).
    Stopping,
}

/// One event; the job's fields are set when it is about one.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub kind: EventKind,
    pub job_id: Option<String>,
    pub job_kind: Option<String>,
    pub attempt: Option<u32>,
    pub lane: Option<usize>,
    pub error: Option<String>,
    pub retryable: Option<bool>,
    pub delay: Option<Duration>,
}

impl Event {
    fn new(kind: EventKind) -> Event {
        Event {
            kind,
            job_id: None,
            job_kind: None,
            attempt: None,
            lane: None,
            error: None,
            retryable: None,
            delay: None,
        }
    }
}

/// The worker's settings.
#[derive(Clone)]
pub struct WorkerOptions {
    /// Jobs run at once; default 10.
    pub lanes: usize,
    /// The lease asked for and each renewal's extension (1..=3600, default 60).
    /// A crashed worker's jobs wait up to this long before running elsewhere.
    pub lease_secs: u32,
    /// The long poll of each lease call (0..=60, default 20).
    pub wait_secs: f64,
    /// Recorded on every job it holds; default `host-pid`.
    pub worker_id: Option<String>,
    /// The first SIGINT/SIGTERM drains, the second quits the process at once (default true).
    pub handle_signals: bool,
    /// Called with every event. It must not block; a panic in it is ignored.
    pub on_event: Option<OnEvent>,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            lanes: 10,
            lease_secs: 60,
            wait_secs: 20.0,
            worker_id: None,
            handle_signals: true,
            on_event: None,
        }
    }
}

impl std::fmt::Debug for WorkerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerOptions")
            .field("lanes", &self.lanes)
            .field("lease_secs", &self.lease_secs)
            .field("wait_secs", &self.wait_secs)
            .field("worker_id", &self.worker_id)
            .field("handle_signals", &self.handle_signals)
            .field("on_event", &self.on_event.is_some())
            .finish()
    }
}

/// What a handler gets besides the job.
#[derive(Clone)]
pub struct JobContext {
    token: CancellationToken,
    reason: Arc<Mutex<Option<String>>>,
    lane: usize,
    key: u64,
    shared: Arc<Shared>,
}

impl JobContext {
    /// Resolves when the job is no longer this worker's (cancelled, its
    /// lease lost: a heartbeat answered `409`, `404` or a status other than
    /// `running`), its lease is about to end, or its `timeout_secs` passed:
    /// stop then.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    /// Whether `cancelled()` has fired.
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// The job's cancellation token itself, to hand to other tasks.
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }

    /// Why the token fired, once it has.
    pub fn reason(&self) -> Option<String> {
        lock(&self.reason).clone()
    }

    /// The lane (1..=lanes) the handler runs in.
    pub fn lane(&self) -> usize {
        self.lane
    }

    /// Report `value` (a JSON object of at most 8 KiB) as the job's progress:
    /// sent with the job's next heartbeat, within a second; the latest value
    /// wins. A value that is not an object, or too large, is refused here.
    pub fn progress(&self, value: Value) -> Result<()> {
        let Value::Object(value) = value else {
            return Err(Error::Config("progress must be a JSON object".into()));
        };
        let size = serde_json::to_vec(&value).map_or(usize::MAX, |bytes| bytes.len());
        if size > MAX_PROGRESS_BYTES {
            return Err(Error::Config(format!(
                "progress is {size} bytes of JSON; at most {MAX_PROGRESS_BYTES} are kept"
            )));
        }
        let mut state = self.shared.state();
        if let Some(held) = state.held.get_mut(&self.key) {
            if held.progress_due.is_none() {
                held.progress_due = Some(Instant::now() + PROGRESS_DELAY);
            }
            held.progress = Some(value);
        }
        drop(state);
        self.shared.bump();
        Ok(())
    }

    /// Add `steps` to the workflow of this step (fan-out; at most 1000 a
    /// call): they run once this job has completed, the steps waiting for it
    /// wait for them too, and with `collect` their results go, in this
    /// order, to a list under that key of the context (fan-in). Sent again
    /// after transport errors while the lease lasts (a repeat changes
    /// nothing); the server's refusal is an `Error::Api` (409: the lease is
    /// lost; 422: steps that do not fit).
    pub async fn add_steps(&self, steps: Vec<StepSpec>, collect: Option<&str>) -> Result<Workflow> {
        let mut failures = 0;
        loop {
            let Some((job_id, token, deadline)) = self
                .shared
                .state()
                .held
                .get(&self.key)
                .map(|held| (held.job_id.clone(), held.token.clone(), held.deadline))
            else {
                return Err(Error::Config(
                    "add_steps: the job is no longer this worker's".into(),
                ));
            };
            match self
                .shared
                .client
                .steps_add(&job_id, &token, steps.clone(), collect)
                .await
            {
                Err(error @ Error::Transport { .. }) => {
                    failures += 1;
                    let at = Instant::now() + backoff(failures, REPORT_BACKOFF);
                    if at >= deadline - self.shared.margin {
                        return Err(error);
                    }
                    tokio::select! {
                        _ = sleep_until(at) => {}
                        _ = self.token.cancelled() => return Err(error),
                    }
                }
                answer => return answer,
            }
        }
    }
}

/// A worker for one queue: register a handler per kind, then `run`.
pub struct Worker {
    client: Client,
    queue: String,
    options: WorkerOptions,
    handlers: HashMap<String, Handler>,
}

impl Worker {
    pub fn new(client: Client, queue: impl Into<String>, options: WorkerOptions) -> Worker {
        Worker {
            client,
            queue: queue.into(),
            options,
            handlers: HashMap::new(),
        }
    }

    /// Run `handler` for the jobs of `kind`. Its answer (a JSON object, or
    /// `null` for `{}`) completes the job; an `Error::Permanent` fails it
    /// without retry, `Error::Snooze` puts it back for a while without using
    /// up its attempt, `Error::RetryIn` fails it with a chosen delay, and any
    /// other error fails it retryably with the error's text.
    pub fn register<F, Fut>(mut self, kind: impl Into<String>, handler: F) -> Worker
    where
        F: Fn(Job, JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |job, ctx| Box::pin(handler(job, ctx)));
        self.handlers.insert(kind.into(), handler);
        self
    }

    /// Work until drained by a signal or stopped by an error that would never change.
    pub async fn run(self) -> Result<()> {
        self.run_until(std::future::pending()).await
    }

    /// Work until `shutdown` resolves (or a signal comes), then drain: lease
    /// nothing more, let the held jobs finish and report, and return.
    /// Returns at once with `Error::Config` for bad options, and with the
    /// error that made working impossible (`401`/`403`, a lease request the
    /// server refuses, an answer that is not qftrio's).
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        self.validate()?;
        let signals = match self.options.handle_signals {
            true => Some(Signals::listen()?),
            false => None,
        };
        let options = self.options;
        let worker_id = options.worker_id.clone().unwrap_or_else(default_worker_id);
        let (changed, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            client: self.client,
            queue: self.queue,
            handlers: self.handlers,
            lanes: options.lanes,
            lease: Duration::from_secs(options.lease_secs.into()),
            lease_secs: options.lease_secs,
            margin: Duration::from_secs_f64((f64::from(options.lease_secs) * 0.2).min(5.0)),
            wait_secs: options.wait_secs,
            worker_id,
            on_event: options.on_event.clone(),
            state: Mutex::new(State {
                held: HashMap::new(),
                free_lanes: (1..=options.lanes).collect(),
                busy: 0,
                next_key: 0,
                fatal: None,
            }),
            reports: Mutex::new(Default::default()),
            changed,
            stop: CancellationToken::new(),
            quit: CancellationToken::new(),
        });
        let mut background = JoinSet::new();
        background.spawn(heartbeats(shared.clone()));
        if let Some(signals) = signals {
            background.spawn(watch_signals(shared.clone(), signals));
        }
        let mut jobs = JoinSet::new();
        shared.lease_loop(&mut jobs, shutdown).await;
        // Leasing has stopped: the held jobs finish and report, unless an
        // error stops everything, which ends every handler at once.
        loop {
            tokio::select! {
                next = jobs.join_next() => if next.is_none() { break },
                _ = shared.quit.cancelled() => {
                    jobs.abort_all();
                    while jobs.join_next().await.is_some() {}
                    break;
                }
            }
        }
        background.abort_all();
        while background.join_next().await.is_some() {}
        let fatal = shared.state().fatal.take();
        fatal.map_or(Ok(()), Err)
    }

    fn validate(&self) -> Result<()> {
        let o = &self.options;
        if !valid_name(&self.queue) {
            return Err(Error::Config(format!(
                "queue {:?}: use 1-128 characters of A-Z a-z 0-9 _ . -",
                self.queue
            )));
        }
        if self.handlers.is_empty() {
            return Err(Error::Config(
                "no handler is registered: the worker would fail every job it leases".into(),
            ));
        }
        if let Some(kind) = self.handlers.keys().find(|kind| !valid_name(kind)) {
            return Err(Error::Config(format!(
                "kind {kind:?}: use 1-128 characters of A-Z a-z 0-9 _ . -"
            )));
        }
        if !(1..=MAX_LANES).contains(&o.lanes) {
            return Err(Error::Config(format!(
                "lanes must be from 1 to {MAX_LANES}, not {}",
                o.lanes
            )));
        }
        if !(1..=3600).contains(&o.lease_secs) {
            return Err(Error::Config(format!(
                "lease_secs must be from 1 to 3600, not {}",
                o.lease_secs
            )));
        }
        if !(0.0..=60.0).contains(&o.wait_secs) {
            return Err(Error::Config(format!(
                "wait_secs must be from 0 to 60, not {}",
                o.wait_secs
            )));
        }
        if let Some(id) = &o.worker_id {
            if id.is_empty() || id.chars().count() > MAX_WORKER_ID {
                return Err(Error::Config(format!(
                    "worker_id must be 1 to {MAX_WORKER_ID} characters"
                )));
            }
        }
        Ok(())
    }
}

fn valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".into());
    let id = format!("{host}-{}", std::process::id());
    id.chars().take(MAX_WORKER_ID).collect()
}

/// A random factor in [0, 1): std's hasher keys are random per process and
/// change with each `RandomState`, which is all jitter needs.
fn random() -> f64 {
    let bits = RandomState::new().build_hasher().finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

fn backoff(failures: u32, (base, cap): (f64, f64)) -> Duration {
    let exp = base * 2f64.powi(failures.saturating_sub(1).min(30) as i32);
    Duration::from_secs_f64(exp.min(cap) * (0.5 + 0.5 * random()))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing that runs under these locks calls user code: a poisoned lock
    // would be this module's own bug, and the state it guards stays usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// *text* cut to what the server takes, saying so.
fn truncate_error(text: String) -> String {
    let count = text.chars().count();
    if count <= MAX_ERROR_CHARS {
        return text;
    }
    let note = format!("\n[truncated: {count} characters in all]");
    let keep = MAX_ERROR_CHARS - note.chars().count();
    text.chars().take(keep).collect::<String>() + &note
}

/// The server will refuse the credential, or is not qftrio: stop.
fn is_fatal(error: &Error) -> bool {
    matches!(
        error,
        Error::Api {
            status: 401 | 403,
            ..
        } | Error::Unexpected(_)
    )
}

/// The server refused the request itself: sending it again cannot help.
fn is_refusal(error: &Error) -> bool {
    matches!(
        error,
        Error::Api {
            status: 400 | 413 | 422,
            ..
        }
    )
}

/// How a handler's attempt ended.
#[derive(Debug, Clone)]
enum Outcome {
    Complete(Object),
    Fail {
        error: String,
        retryable: bool,
        retry_in: Option<Duration>,
    },
    Snooze(Duration),
}

impl Outcome {
    fn fail(error: impl Into<String>, retryable: bool) -> Outcome {
        Outcome::Fail {
            error: truncate_error(error.into()),
            retryable,
            retry_in: None,
        }
    }

    fn of(answer: std::result::Result<HandlerResult, oneshot::error::RecvError>) -> Outcome {
        match answer {
            Ok(Ok(Value::Object(result))) => Outcome::Complete(result),
            Ok(Ok(Value::Null)) => Outcome::Complete(Object::new()),
            Ok(Ok(other)) => {
                let kind = match other {
                    Value::Array(_) => "an array",
                    Value::String(_) => "a string",
                    Value::Number(_) => "a number",
                    _ => "a boolean",
                };
                Outcome::fail(
                    format!("handler returned {kind}; expected an object or null"),
                    false,
                )
            }
            Ok(Err(error)) => match error.downcast_ref::<Error>() {
                Some(Error::Permanent(message)) => Outcome::fail(message.clone(), false),
                Some(Error::Snooze(delay)) => Outcome::Snooze(*delay),
                Some(Error::RetryIn(delay, message)) => Outcome::Fail {
                    error: truncate_error(message.clone()),
                    retryable: true,
                    retry_in: Some(*delay),
                },
                _ => Outcome::fail(crate::client::describe_chain(error.as_ref()), true),
            },
            // Its sender was dropped: the handler panicked (the panic's
            // message went to standard error).
            Err(_) => Outcome::fail("the handler panicked", true),
        }
    }
}

/// A report's item, for its batch route.
#[derive(Clone)]
enum Report {
    Complete(CompleteItem),
    Fail(FailItem),
    Snooze(SnoozeItem),
}

impl Report {
    fn of(outcome: &Outcome, id: &str, token: &str) -> Report {
        let (id, lease_token) = (id.to_owned(), token.to_owned());
        match outcome {
            Outcome::Complete(result) => Report::Complete(CompleteItem {
                id,
                lease_token,
                result: result.clone(),
            }),
            Outcome::Fail {
                error,
                retryable,
                retry_in,
            } => Report::Fail(FailItem {
                id,
                lease_token,
                error: error.clone(),
                retryable: *retryable,
                retry_in_secs: retry_in.map(|d| d.as_secs_f64()),
            }),
            Outcome::Snooze(delay) => Report::Snooze(SnoozeItem {
                id,
                lease_token,
                delay_secs: delay.as_secs_f64(),
            }),
        }
    }

    /// Which batch it goes in.
    fn kind(&self) -> usize {
        match self {
            Report::Complete(_) => 0,
            Report::Fail(_) => 1,
            Report::Snooze(_) => 2,
        }
    }
}

/// Reports waiting for their batch call, by kind, each with where its answer goes.
type PendingReports = [Vec<(Report, oneshot::Sender<Result<u16>>)>; 3];

/// One leased job, from claim to report.
struct Held {
    job_id: String,
    job_kind: String,
    attempt: u32,
    token: String,
    lane: usize,
    /// When our lease ends, by our own reckoning.
    deadline: Instant,
    /// When its next renewal falls due.
    next_beat: Instant,
    cancel: CancellationToken,
    reason: Arc<Mutex<Option<String>>>,
    /// Renewed until its handler is done, or it is given up.
    beating: bool,
    /// A renewal of it is in flight.
    in_call: bool,
    /// Cancelled because renewals failed and the lease is ending.
    expiring: bool,
    /// Renewals failed in a row.
    failures: u32,
    /// Why the server took it back: nothing is reported.
    lost: Option<String>,
    /// Of the last renewal or report that failed.
    last_error: Option<String>,
    progress: Option<Object>,
    progress_due: Option<Instant>,
}

impl Held {
    fn cancel(&mut self, why: String) {
        lock(&self.reason).get_or_insert(why);
        self.cancel.cancel();
    }
}

struct State {
    held: HashMap<u64, Held>,
    free_lanes: BTreeSet<usize>,
    /// Jobs whose handler is running.
    busy: usize,
    next_key: u64,
    fatal: Option<Error>,
}

struct Shared {
    client: Client,
    queue: String,
    handlers: HashMap<String, Handler>,
    lanes: usize,
    lease: Duration,
    lease_secs: u32,
    /// Renewals that have not landed this long before the lease ends give the job up.
    margin: Duration,
    wait_secs: f64,
    worker_id: String,
    on_event: Option<OnEvent>,
    state: Mutex<State>,
    reports: Mutex<PendingReports>,
    /// Bumped on every change the lease loop or the heartbeat scheduler waits for.
    changed: watch::Sender<u64>,
    /// Drain: lease nothing more.
    stop: CancellationToken,
    /// Stop everything: an error that would never change.
    quit: CancellationToken,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn bump(&self) {
        self.changed.send_modify(|version| *version += 1);
    }

    fn emit(&self, event: Event) {
        if let Some(on_event) = &self.on_event {
            // A listener's panic is not the worker's: it would end the task
            // that emits (the heartbeat scheduler, say).
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| on_event(&event)));
        }
    }

    fn job_event(&self, kind: EventKind, key: u64, fill: impl FnOnce(&mut Event)) {
        let mut event = Event::new(kind);
        if let Some(held) = self.state().held.get(&key) {
            event.job_id = Some(held.job_id.clone());
            event.job_kind = Some(held.job_kind.clone());
            event.attempt = Some(held.attempt);
            event.lane = Some(held.lane);
        }
        fill(&mut event);
        self.emit(event);
    }

    /// Drain: lease nothing more, finish the held jobs. The long poll in
    /// flight is abandoned (a job the server claimed for it meanwhile runs
    /// elsewhere once its lease expires).
    fn drain(&self) {
        if self.stop.is_cancelled() {
            return;
        }
        self.stop.cancel();
        let held = self.state().held.len();
        let mut event = Event::new(EventKind::Stopping);
        event.error = Some(format!("finishing {held} held job(s)"));
        self.emit(event);
        self.bump();
    }

    /// Stop everything because of `error`, which `run` returns: every
    /// handler's token fires and nothing more is reported.
    fn die(&self, error: Error) {
        let held = {
            let mut state = self.state();
            if state.fatal.is_some() {
                return;
            }
            for held in state.held.values_mut() {
                held.beating = false;
                held.cancel(format!("the worker is stopping: {error}"));
            }
            state.fatal = Some(error.clone());
            state.held.len()
        };
        self.stop.cancel();
        self.quit.cancel();
        let mut event = Event::new(EventKind::Stopping);
        event.error = Some(format!("{error}: abandoning {held} held job(s)"));
        self.emit(event);
        self.bump();
    }

    // -- leasing --------------------------------------------------------------

    async fn lease_loop(
        self: &Arc<Self>,
        jobs: &mut JoinSet<()>,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let most = MAX_LEASE_JOBS.min(self.lanes);
        let mut failures = 0u32;
        let mut changes = self.changed.subscribe();
        loop {
            while jobs.try_join_next().is_some() {}
            if self.stop.is_cancelled() {
                return;
            }
            changes.borrow_and_update();
            let (busy, held) = {
                let state = self.state();
                (state.busy, state.held.len())
            };
            // Jobs whose handler is done count as gone (their reports travel
            // on); the second bound keeps lagging reports from piling up.
            if busy >= self.lanes || held >= self.lanes + 2 * most {
                tokio::select! {
                    _ = changes.changed() => {}
                    _ = self.stop.cancelled() => {}
                    _ = &mut shutdown => self.drain(),
                }
                continue;
            }
            let request = LeaseRequest {
                max_jobs: (self.lanes - busy).min(MAX_LEASE_JOBS) as u32,
                lease_secs: self.lease_secs,
                wait_secs: self.wait_secs,
                worker_id: Some(self.worker_id.clone()),
            };
            let sent_at = Instant::now();
            let answer = tokio::select! {
                answer = self.client.lease(&self.queue, &request) => answer,
                _ = self.stop.cancelled() => return,
                _ = &mut shutdown => { self.drain(); return }
            };
            let leases = match answer {
                Ok(leases) => leases,
                Err(error) => {
                    let passing = match &error {
                        Error::Api { status, .. } => PASSING.contains(status),
                        Error::Transport { .. } => true,
                        _ => false,
                    };
                    if !passing {
                        // A 404 here means no qftrio worker route at this URL.
                        self.die(error);
                        return;
                    }
                    failures += 1;
                    let delay = backoff(failures, LEASE_BACKOFF);
                    let mut event = Event::new(EventKind::Waiting);
                    event.error = Some(error.to_string());
                    event.delay = Some(delay);
                    self.emit(event);
                    tokio::select! {
                        _ = sleep(delay) => {}
                        _ = self.stop.cancelled() => {}
                        _ = &mut shutdown => self.drain(),
                    }
                    continue;
                }
            };
            failures = 0;
            let now = Instant::now();
            let waited = now - sent_at >= Duration::from_secs_f64(self.wait_secs.min(1.0) * 0.5);
            if leases.is_empty() && (self.wait_secs == 0.0 || !waited) {
                // An empty answer that did not wait (no long poll asked, or
                // a server shutting down answers long polls at once): do not
                // spin on it.
                tokio::select! {
                    _ = sleep(backoff(1, LEASE_BACKOFF)) => {}
                    _ = self.stop.cancelled() => {}
                    _ = &mut shutdown => self.drain(),
                }
                continue;
            }
            // A long poll may have waited long before anything came: the
            // claim was just before the answer, not when we asked.
            let deadline = sent_at.max(now - CLAIM_SLACK) + self.lease;
            for lease in leases {
                self.start(jobs, lease, deadline);
            }
            self.bump();
        }
    }

    fn start(self: &Arc<Self>, jobs: &mut JoinSet<()>, lease: Lease, deadline: Instant) {
        let claimed = deadline - self.lease;
        let cancel = CancellationToken::new();
        let reason = Arc::new(Mutex::new(None));
        let (key, lane) = {
            let mut state = self.state();
            let lane = state.free_lanes.pop_first().unwrap_or(0);
            state.busy += 1;
            let key = state.next_key;
            state.next_key += 1;
            state.held.insert(
                key,
                Held {
                    job_id: lease.job.id.clone(),
                    job_kind: lease.job.kind.clone(),
                    attempt: lease.job.attempt,
                    token: lease.lease_token.clone(),
                    lane,
                    deadline,
                    next_beat: claimed + self.lease / 2,
                    cancel: cancel.clone(),
                    reason: reason.clone(),
                    beating: true,
                    in_call: false,
                    expiring: false,
                    failures: 0,
                    lost: None,
                    last_error: None,
                    progress: None,
                    progress_due: None,
                },
            );
            (key, lane)
        };
        self.job_event(EventKind::Claimed, key, |_| {});
        let ctx = JobContext {
            token: cancel,
            reason,
            lane,
            key,
            shared: self.clone(),
        };
        let timeout_at = lease
            .job
            .timeout_secs
            .map(|secs| claimed + Duration::from_secs(secs));
        // The handler runs in a task of its own, beside its job's task, so
        // that its job's task can report at the job's deadline while the
        // handler ends in its own time. A handler that panics drops its
        // sender: the job fails retryably.
        let answer = self.handlers.get(&lease.job.kind).cloned().map(|handler| {
            let (sender, answer) = oneshot::channel();
            let handled = handler(lease.job.clone(), ctx.clone());
            jobs.spawn(async move {
                let _ = sender.send(handled.await);
            });
            answer
        });
        jobs.spawn(
            self.clone()
                .run_job(key, lease.job, ctx.lane, answer, timeout_at),
        );
    }

    // -- one job --------------------------------------------------------------

    async fn run_job(
        self: Arc<Self>,
        key: u64,
        job: Job,
        lane: usize,
        answer: Option<oneshot::Receiver<HandlerResult>>,
        timeout_at: Option<Instant>,
    ) {
        let mut still_running = None;
        let outcome = match answer {
            None => {
                // The lease has no filter by kind: fail such a job, so that
                // it does not bounce between workers until its attempts run out.
                let mut known: Vec<_> = self.handlers.keys().map(String::as_str).collect();
                known.sort_unstable();
                Outcome::fail(
                    format!(
                        "no handler for kind {:?} on this worker (it handles: {})",
                        job.kind,
                        known.join(", ")
                    ),
                    false,
                )
            }
            Some(mut answer) => {
                let timed_out = async {
                    match timeout_at {
                        Some(at) => sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    answered = &mut answer => Outcome::of(answered),
                    _ = timed_out => {
                        // The server ends the attempt at the deadline,
                        // whatever the handler does: fail it with the
                        // server's text at once, and let the handler end
                        // in its own time.
                        let text = format!("timed out after {} s", job.timeout_secs.unwrap_or_default());
                        if let Some(held) = self.state().held.get_mut(&key) {
                            held.cancel(text.clone());
                        }
                        still_running = Some(answer);
                        Outcome::fail(text, true)
                    }
                }
            }
        };
        let report = {
            let mut state = self.state();
            let held = state
                .held
                .get_mut(&key)
                .expect("a held job stays until its task ends");
            held.beating = false;
            let lost = held.lost.clone();
            let outcome = if held.expiring {
                let reason = held
                    .last_error
                    .as_ref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default();
                Outcome::fail(
                    format!("lease about to expire: heartbeats failed{reason}"),
                    true,
                )
            } else {
                outcome
            };
            if still_running.is_none() {
                state.busy -= 1;
                state.free_lanes.insert(lane);
            }
            lost.map_or(Ok(outcome), Err)
        };
        self.bump();
        match report {
            Err(lost) => self.job_event(EventKind::Lost, key, |e| e.error = Some(lost)),
            Ok(outcome) => self.report(key, outcome).await,
        }
        if let Some(answer) = still_running {
            let _ = answer.await;
            let mut state = self.state();
            state.busy -= 1;
            state.free_lanes.insert(lane);
        }
        self.state().held.remove(&key);
        self.bump();
    }

    /// Send the job's report, again with backoff until its lease ends.
    async fn report(&self, key: u64, mut outcome: Outcome) {
        let (id, token, deadline) = {
            let state = self.state();
            let held = &state.held[&key];
            (held.job_id.clone(), held.token.clone(), held.deadline)
        };
        let mut failures = 0;
        loop {
            if Instant::now() >= deadline {
                let error = self.state().held[&key].last_error.clone();
                let error =
                    error.unwrap_or_else(|| "the lease ran out before the report landed".into());
                self.job_event(EventKind::Unreported, key, |e| e.error = Some(error));
                return;
            }
            let sent = self.send_report(Report::of(&outcome, &id, &token)).await;
            match sent {
                Ok(code) => {
                    if code == 204 {
                        match outcome {
                            Outcome::Complete(_) => {
                                self.job_event(EventKind::Completed, key, |_| {})
                            }
                            Outcome::Snooze(delay) => {
                                self.job_event(EventKind::Snoozed, key, |e| e.delay = Some(delay))
                            }
                            Outcome::Fail {
                                error,
                                retryable,
                                retry_in,
                            } => self.job_event(EventKind::Failed, key, |e| {
                                e.error = Some(error);
                                e.retryable = Some(retryable);
                                e.delay = retry_in;
                            }),
                        }
                    } else {
                        let why = if code == 409 {
                            "lease lost (409): the report was refused".to_owned()
                        } else {
                            format!("report answered {code}")
                        };
                        self.job_event(EventKind::Lost, key, |e| e.error = Some(why));
                    }
                    return;
                }
                Err(error) if is_fatal(&error) => return self.die(error),
                Err(error) if is_refusal(&error) => {
                    if let Outcome::Complete(_) = outcome {
                        // The server refuses this result (a smaller body cap,
                        // say): fail the job, saying why, rather than run it again.
                        outcome =
                            Outcome::fail(format!("the server refused the result: {error}"), false);
                        continue;
                    }
                    self.job_event(EventKind::Unreported, key, |e| {
                        e.error = Some(error.to_string())
                    });
                    return;
                }
                Err(error) => {
                    failures += 1;
                    if let Some(held) = self.state().held.get_mut(&key) {
                        held.last_error = Some(error.to_string());
                    }
                    let at = (Instant::now() + backoff(failures, REPORT_BACKOFF)).min(deadline);
                    sleep_until(at).await;
                }
            }
        }
    }

    /// Send one report, in one call with the reports of the same kind that
    /// fall due within a few milliseconds: the first of them waits that
    /// long, then sends them all and hands each its item's answer code.
    async fn send_report(&self, report: Report) -> Result<u16> {
        let kind = report.kind();
        let (answer, answered) = oneshot::channel();
        let lead = {
            let mut pending = lock(&self.reports);
            pending[kind].push((report, answer));
            pending[kind].len() == 1
        };
        if lead {
            sleep(COALESCE).await;
            let batch = std::mem::take(&mut lock(&self.reports)[kind]);
            let mut batch = batch.into_iter().peekable();
            while batch.peek().is_some() {
                let chunk: Vec<_> = batch.by_ref().take(MAX_BATCH).collect();
                let (reports, answers): (Vec<_>, Vec<_>) = chunk.into_iter().unzip();
                match self.call_reports(reports.clone()).await {
                    Ok(codes) => answers.into_iter().zip(codes).for_each(|(a, code)| {
                        let _ = a.send(Ok(code));
                    }),
                    Err(error) if is_refusal(&error) && reports.len() > 1 => {
                        // One report's result, say, is too large: send them
                        // one by one, so that it fails alone.
                        for (report, answer) in reports.into_iter().zip(answers) {
                            let code = self.call_reports(vec![report]).await.map(|codes| codes[0]);
                            let _ = answer.send(code);
                        }
                    }
                    Err(error) => answers.into_iter().for_each(|a| {
                        let _ = a.send(Err(error.clone()));
                    }),
                }
            }
        }
        // Its sender is dropped only if the task sending the batch ended
        // first (the worker stopping): no answer, as if the call had failed.
        answered.await.unwrap_or_else(|_| {
            Err(Error::Transport {
                method: "POST",
                path: "/api/v1/leases/...".into(),
                message: "the batch call was abandoned".into(),
            })
        })
    }

    /// One batch call for `reports`, all of one kind: each one's answer code, in order.
    async fn call_reports(&self, reports: Vec<Report>) -> Result<Vec<u16>> {
        let count = reports.len();
        let (mut complete, mut fail, mut snooze) = (Vec::new(), Vec::new(), Vec::new());
        for report in reports {
            match report {
                Report::Complete(item) => complete.push(item),
                Report::Fail(item) => fail.push(item),
                Report::Snooze(item) => snooze.push(item),
            }
        }
        let results = if !complete.is_empty() {
            self.client.complete_many(complete).await?
        } else if !fail.is_empty() {
            self.client.fail_many(fail).await?
        } else {
            self.client.snooze_many(snooze).await?
        };
        // An answer that leaves an item out counts as no answer for it (0).
        Ok((0..count)
            .map(|i| results.get(i).map_or(0, |r| r.code))
            .collect())
    }

    // -- heartbeats -----------------------------------------------------------

    /// Renewals due now, and when the next one falls due. Jobs whose lease
    /// is about to end unrenewed are cancelled here.
    fn due(&self) -> (Vec<Renewal>, Option<Instant>) {
        let now = Instant::now();
        let mut state = self.state();
        let mut due = Vec::new();
        let mut wake: Option<Instant> = None;
        for (key, held) in state.held.iter_mut() {
            if !held.beating {
                continue;
            }
            if now + self.margin >= held.deadline {
                // Renewals kept failing and the lease is about to end: stop
                // the handler while there is still time to say so.
                held.beating = false;
                held.expiring = true;
                held.cancel("the lease is about to expire: heartbeats failed".into());
                continue;
            }
            let beat_at = held
                .progress_due
                .map_or(held.next_beat, |p| p.min(held.next_beat));
            if !held.in_call && beat_at <= now + COALESCE {
                held.in_call = true;
                held.progress_due = None;
                let item = HeartbeatItem {
                    id: held.job_id.clone(),
                    lease_token: held.token.clone(),
                    extend_secs: self.lease_secs,
                    progress: held.progress.take(),
                };
                due.push((*key, item));
            }
            let mut next = held.deadline - self.margin;
            if !held.in_call {
                next = next.min(beat_at);
            }
            wake = Some(wake.map_or(next, |w| w.min(next)));
        }
        (due, wake)
    }

    /// One batch renewal: extend the leases still ours, cancel the jobs that are not.
    async fn renew(self: Arc<Self>, due: Vec<Renewal>) {
        let sent_at = Instant::now();
        let (keys, items): (Vec<_>, Vec<_>) = due.into_iter().unzip();
        let answer = self.client.heartbeat_many(items.clone()).await;
        if let Err(error) = &answer {
            if is_fatal(error) {
                return self.die(error.clone());
            }
        }
        let mut state = self.state();
        for (i, (key, item)) in keys.into_iter().zip(items).enumerate() {
            let Some(held) = state.held.get_mut(&key) else {
                continue;
            };
            held.in_call = false;
            match &answer {
                Ok(replies) => match replies.get(i) {
                    Some(ReportResult {
                        code: 200,
                        status: Some(Status::Running),
                        ..
                    }) => {
                        held.deadline = sent_at + self.lease;
                        held.failures = 0;
                        held.next_beat = sent_at + self.lease / 2;
                    }
                    reply if held.beating => {
                        let why = match reply {
                            Some(ReportResult {
                                code: 200,
                                status: Some(status),
                                ..
                            }) => format!("the job is {}", status.as_str()),
                            Some(ReportResult { code: 409, .. }) => {
                                "lease lost (409): the job was taken back".to_owned()
                            }
                            Some(reply) => format!("heartbeat answered {}", reply.code),
                            None => "heartbeat answered nothing for the job".to_owned(),
                        };
                        held.beating = false;
                        held.lost = Some(why.clone());
                        held.cancel(why);
                    }
                    // Its handler is done: its report learns the same.
                    _ => {}
                },
                Err(error) => {
                    held.failures += 1;
                    held.last_error = Some(error.to_string());
                    held.next_beat = Instant::now() + backoff(held.failures, REPORT_BACKOFF);
                    // Its progress goes with the next try, unless a newer one came meanwhile.
                    if held.progress.is_none() && item.progress.is_some() {
                        held.progress = item.progress;
                        held.progress_due = Some(held.next_beat);
                    }
                }
            }
        }
        drop(state);
        self.bump();
    }
}

/// The one heartbeat scheduler: renews every held job when due, in batches.
async fn heartbeats(shared: Arc<Shared>) {
    let mut calls = JoinSet::new();
    let mut changes = shared.changed.subscribe();
    loop {
        changes.borrow_and_update();
        let (due, wake) = shared.due();
        let mut due = due.into_iter().peekable();
        while due.peek().is_some() {
            let batch: Vec<_> = due.by_ref().take(MAX_BATCH).collect();
            calls.spawn(shared.clone().renew(batch));
        }
        let wake = wake.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            _ = sleep_until(wake) => {}
            _ = changes.changed() => {}
            Some(_) = calls.join_next() => {}
        }
    }
}

/// SIGINT and SIGTERM, listened to from the moment this is made (made
/// before anything is leased, so that no signal finds the default handler).
struct Signals {
    #[cfg(unix)]
    streams: Vec<tokio::signal::unix::Signal>,
}

impl Signals {
    fn listen() -> Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let streams = [SignalKind::interrupt(), SignalKind::terminate()]
                .into_iter()
                .map(signal)
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| Error::Config(format!("cannot listen for SIGINT and SIGTERM: {e}")))?;
            Ok(Signals { streams })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        {
            let [interrupt, terminate] = &mut self.streams[..] else {
                unreachable!("two streams are made")
            };
            tokio::select! {
                _ = interrupt.recv() => {}
                _ = terminate.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The first SIGINT/SIGTERM drains; the second quits the process at once.
async fn watch_signals(shared: Arc<Shared>, mut signals: Signals) {
    signals.next().await;
    shared.drain();
    signals.next().await;
    // Held jobs are not reported; their leases run out and other workers
    // take them.
    let held = shared.state().held.len();
    let mut event = Event::new(EventKind::Stopping);
    event.error = Some(format!("quitting: {held} held job(s) abandoned"));
    shared.emit(event);
    std::process::exit(130);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_too_long_for_the_server_is_cut_to_its_cap_saying_so() {
        let cut = truncate_error("é".repeat(70_000));
        assert_eq!(cut.chars().count(), MAX_ERROR_CHARS);
        assert!(
            cut.ends_with("\n[truncated: 70000 characters in all]"),
            "{}",
            &cut[cut.len() - 60..]
        );
        assert_eq!(truncate_error("short".into()), "short");
    }

    #[test]
    fn backoff_doubles_to_its_cap_each_wait_scaled_by_half_to_one() {
        for (failures, full) in [(1, 0.5), (2, 1.0), (3, 2.0), (6, 15.0), (1000, 15.0)] {
            for _ in 0..100 {
                let wait = backoff(failures, LEASE_BACKOFF).as_secs_f64();
                assert!(
                    (full * 0.5..=full).contains(&wait),
                    "{failures} failures: {wait} s"
                );
            }
        }
    }
}
