//! The wire's bodies and answers, field for field as docs/protocol.md gives
//! them. Answers derive `Default` and serialize every field, so that the
//! drift test (`tests/live/drift.rs`) can hold each against the schema of
//! the same name in the server's `/openapi.json`. Times are the server's
//! RFC 3339 UTC strings.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A JSON object: payloads, results, contexts.
pub type Object = Map<String, Value>;

/// A job's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    #[default]
    Pending,
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl Status {
    /// Whether a job in this status has ended (it changes no more unless retried).
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Completed | Status::Failed | Status::Cancelled)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Running => "running",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }
}

/// One failed attempt in a job's `errors`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorEntry {
    pub attempt: u32,
    pub error: String,
    pub at: String,
}

/// How one claim of a job ended (`Running` while it has not); `Lost`: its
/// lease expired, taken back by the janitor or claimed again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    #[default]
    Running,
    Completed,
    Failed,
    TimedOut,
    Lost,
    Snoozed,
    Cancelled,
}

/// One claim in a job's `attempts` (`AttemptEntryAnswer`): who claimed it
/// and when, when and how it ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AttemptEntry {
    pub attempt: u32,
    pub worker_id: Option<String>,
    pub claimed_at: Option<String>,
    pub ended_at: Option<String>,
    pub outcome: AttemptOutcome,
    pub error: Option<String>,
}

/// A job (`JobAnswer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: String,
    pub tenant: String,
    pub queue: String,
    pub kind: String,
    pub payload: Object,
    pub status: Status,
    pub priority: i64,
    pub attempt: u32,
    pub max_attempts: u32,
    pub scheduled_at: String,
    pub created_at: String,
    pub updated_at: String,
    pub locked_until: Option<String>,
    pub worker_id: Option<String>,
    pub result: Option<Object>,
    pub error: Option<String>,
    pub errors: Vec<ErrorEntry>,
    pub workflow_id: Option<String>,
    pub step: Option<String>,
    pub context: Option<Object>,
    pub timeout_secs: Option<u64>,
    pub backoff: Option<Object>,
    pub concurrency: Option<Object>,
    pub rate_limit: Option<String>,
    pub unique: Option<Object>,
    pub headers: Option<BTreeMap<String, String>>,
    pub schedule: Option<String>,
    /// The last progress its handler reported (`ctx.progress()`), and when.
    pub progress: Option<Object>,
    pub progress_at: Option<String>,
    /// Its claims, oldest first, the newest 20 kept.
    pub attempts: Vec<AttemptEntry>,
}

/// A leased job and the token that proves the lease (`LeaseAnswer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    pub job: Job,
    pub lease_token: String,
}

/// `POST /api/v1/queues/{queue}/lease`'s body (`LeaseRequest`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseRequest {
    /// 1..=100
    pub max_jobs: u32,
    /// 1..=3600
    pub lease_secs: u32,
    /// 0..=60: how long the call may wait for a job
    pub wait_secs: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
}

impl Default for LeaseRequest {
    fn default() -> Self {
        LeaseRequest {
            max_jobs: 1,
            lease_secs: 60,
            wait_secs: 0.0,
            worker_id: None,
        }
    }
}

/// A single heartbeat's answer (`HeartbeatAnswer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatAnswer {
    pub status: Status,
    #[serde(default)]
    pub locked_until: Option<String>,
}

/// An item of `POST /api/v1/leases/heartbeat` (`HeartbeatManyItem`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatItem {
    pub id: String,
    pub lease_token: String,
    pub extend_secs: u32,
    /// The handler's latest progress, recorded with this heartbeat.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Object>,
}

/// An item of `POST /api/v1/leases/complete` (`CompleteManyItem`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompleteItem {
    pub id: String,
    pub lease_token: String,
    pub result: Object,
}

/// An item of `POST /api/v1/leases/fail` (`FailManyItem`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailItem {
    pub id: String,
    pub lease_token: String,
    pub error: String,
    pub retryable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_in_secs: Option<f64>,
}

/// An item of `POST /api/v1/leases/snooze` (`SnoozeManyItem`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnoozeItem {
    pub id: String,
    pub lease_token: String,
    pub delay_secs: f64,
}

/// One item's answer in a batch report or heartbeat (`ReportResultAnswer`):
/// `code` 200 (a heartbeat: `status`, and `locked_until` while running),
/// 204 (a report landed), 404 (unknown job) or 409 (not the current token).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReportResult {
    pub id: String,
    pub code: u16,
    #[serde(default)]
    pub status: Option<Status>,
    #[serde(default)]
    pub locked_until: Option<String>,
}

/// A job's retry delays (`BackoffConfig`); each field left out is the server's default's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BackoffConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jitter: Option<f64>,
}

/// At most `limit` running jobs of the tenant carry `key` (`ConcurrencyConfig`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConcurrencyConfig {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// Enqueue nothing while a job with the same key is in one of `statuses` (`UniqueConfig`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UniqueConfig {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub statuses: Option<Vec<Status>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period_secs: Option<f64>,
}

/// An enqueued job's `config` (`JobConfig`); every field left out is the server's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencyConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unique: Option<UniqueConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
}

impl JobConfig {
    /// A config naming only the queue.
    pub fn queue(queue: impl Into<String>) -> Self {
        JobConfig {
            queue: Some(queue.into()),
            ..JobConfig::default()
        }
    }
}

/// A job to enqueue (`EnqueueRequest`): in batches, and as a schedule's job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NewJob {
    pub kind: String,
    pub payload: Object,
    pub config: JobConfig,
}

/// `GET /api/v1/jobs`'s filters and page (all optional).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobsFilter {
    pub queue: Option<String>,
    pub status: Option<Status>,
    pub kind: Option<String>,
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

/// A page of jobs, newest first (`JobsPageAnswer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobsPage {
    pub jobs: Vec<Job>,
    pub next_cursor: Option<String>,
}

/// Which jobs a bulk action takes (`BulkRetryRequest` and its siblings): at
/// least one filter, or `all: true`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BulkFilter {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_after: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_before: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

/// A bulk action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkAction {
    Retry,
    Cancel,
    Delete,
}

/// Jobs by status (`CountsAnswer`); `scheduled` counts the pending ones whose time has not come.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    pub pending: u64,
    pub running: u64,
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub scheduled: u64,
}

/// Ready jobs that flow control holds back (`HeldBackAnswer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeldBack {
    pub concurrency: u64,
    pub rate_limit: u64,
}

/// A queue's backlog (`QueueStatsAnswer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueStats {
    pub queue: String,
    pub counts: Counts,
    pub held_back: HeldBack,
    pub oldest_ready_at: Option<String>,
    pub next_available_at: Option<String>,
    pub paused: bool,
}

/// A page of queues (`QueuesAnswer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueuesPage {
    pub queues: Vec<QueueStats>,
    pub next_cursor: Option<String>,
}

/// A live worker (`WorkerAnswer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    pub worker_id: String,
    pub jobs: u64,
    pub job_ids: Vec<String>,
    pub queues: Vec<String>,
    pub last_seen_at: String,
}

/// A rate limit (`RateLimitAnswer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RateLimit {
    pub name: String,
    pub limit: u64,
    pub per_secs: f64,
    pub next_available_at: Option<String>,
}

/// A workflow step to create (`WorkflowStepRequest`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepSpec {
    pub name: String,
    pub kind: String,
    pub payload: Object,
    pub depends_on: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
}

/// A workflow step's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    #[default]
    Waiting,
    Pending,
    Running,
    Completed,
    Failed,
    Cancelled,
}

/// A workflow's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkflowStatus {
    #[default]
    Running,
    Completed,
    Failed,
    Cancelled,
}

/// A workflow's step (`WorkflowStepAnswer`); `job` is left out in lists.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkflowStep {
    pub name: String,
    pub kind: String,
    pub payload: Object,
    pub depends_on: Vec<String>,
    pub max_attempts: u32,
    pub status: StepStatus,
    pub job_id: Option<String>,
    /// The step that added it at run time, else `None`.
    #[serde(default)]
    pub added_by: Option<String>,
    #[serde(default)]
    pub job: Option<Job>,
}

/// A workflow and its steps (`WorkflowAnswer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Workflow {
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub status: WorkflowStatus,
    pub context: Object,
    pub steps: Vec<WorkflowStep>,
    pub created_at: String,
    pub updated_at: String,
}

/// A page of workflows (`WorkflowsPageAnswer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkflowsPage {
    pub workflows: Vec<Workflow>,
    pub next_cursor: Option<String>,
}

/// A schedule to set (`ScheduleRequest`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    pub cron: String,
    pub job: NewJob,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// `latest` (the default), `none` or `all`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<String>,
}

/// A cron schedule (`ScheduleAnswer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub name: String,
    pub tenant: String,
    pub cron: String,
    pub timezone: String,
    pub job: Object,
    pub paused: bool,
    pub catch_up: String,
    pub next_run_at: Option<String>,
    pub last_run_at: Option<String>,
    pub last_job_id: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

/// A page of schedules (`SchedulesAnswer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SchedulesPage {
    pub schedules: Vec<Schedule>,
    pub next_cursor: Option<String>,
}

/// What triggering a schedule enqueued (`ScheduleTriggerAnswer`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScheduleTrigger {
    pub job: Job,
    pub schedule: Schedule,
}

/// Whether the server reaches its database (`HealthAnswer`): `ok` or `unavailable`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
}
