//! Every route the client calls, declared once: the client's methods send
//! through these, and the drift test (`tests/live/drift.rs`) holds the table
//! against the server's `/openapi.json` both ways.

/// A route: its method and its path, with `{name}` for each path parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    /// The query parameters the client sends.
    pub query: &'static [&'static str],
}

const fn route(method: &'static str, path: &'static str) -> Route {
    Route {
        method,
        path,
        query: &[],
    }
}

const PAGE: &[&str] = &["limit", "cursor"];

// The worker protocol (worker token).
pub const LEASE: Route = route("POST", "/api/v1/queues/{queue}/lease");
pub const HEARTBEAT: Route = route("POST", "/api/v1/jobs/{job_id}/heartbeat");
pub const COMPLETE: Route = route("POST", "/api/v1/jobs/{job_id}/complete");
pub const FAIL: Route = route("POST", "/api/v1/jobs/{job_id}/fail");
pub const SNOOZE: Route = route("POST", "/api/v1/jobs/{job_id}/snooze");
pub const PROGRESS: Route = route("POST", "/api/v1/jobs/{job_id}/progress");
pub const HEARTBEAT_MANY: Route = route("POST", "/api/v1/leases/heartbeat");
pub const COMPLETE_MANY: Route = route("POST", "/api/v1/leases/complete");
pub const FAIL_MANY: Route = route("POST", "/api/v1/leases/fail");
pub const SNOOZE_MANY: Route = route("POST", "/api/v1/leases/snooze");
pub const STEPS_ADD: Route = route("POST", "/api/v1/jobs/{job_id}/steps");
// The application API (tenant token).
pub const ENQUEUE: Route = route("POST", "/api/v1/jobs");
pub const ENQUEUE_MANY: Route = route("POST", "/api/v1/jobs/batch");
pub const JOB_GET: Route = route("GET", "/api/v1/jobs/{job_id}");
pub const EVENTS: Route = Route {
    query: &["queue", "kind", "job", "stats_secs"],
    ..route("GET", "/api/v1/events")
};
pub const JOB_WAIT: Route = Route {
    query: &["timeout_secs"],
    ..route("GET", "/api/v1/jobs/{job_id}/wait")
};
pub const JOBS_LIST: Route = Route {
    query: &["queue", "status", "kind", "limit", "cursor"],
    ..route("GET", "/api/v1/jobs")
};
pub const JOB_CANCEL: Route = route("POST", "/api/v1/jobs/{job_id}/cancel");
pub const JOB_RETRY: Route = route("POST", "/api/v1/jobs/{job_id}/retry");
pub const JOBS_BULK_RETRY: Route = route("POST", "/api/v1/jobs/bulk/retry");
pub const JOBS_BULK_CANCEL: Route = route("POST", "/api/v1/jobs/bulk/cancel");
pub const JOBS_BULK_DELETE: Route = route("POST", "/api/v1/jobs/bulk/delete");
pub const QUEUES: Route = Route {
    query: PAGE,
    ..route("GET", "/api/v1/queues")
};
pub const QUEUE_STATS: Route = route("GET", "/api/v1/queues/{queue}/stats");
pub const QUEUE_PAUSE: Route = route("POST", "/api/v1/queues/{queue}/pause");
pub const QUEUE_RESUME: Route = route("POST", "/api/v1/queues/{queue}/resume");
pub const WORKERS: Route = route("GET", "/api/v1/workers");
pub const RATE_LIMITS_LIST: Route = route("GET", "/api/v1/rate-limits");
pub const RATE_LIMIT_SET: Route = route("PUT", "/api/v1/rate-limits/{name}");
pub const RATE_LIMIT_GET: Route = route("GET", "/api/v1/rate-limits/{name}");
pub const RATE_LIMIT_DELETE: Route = route("DELETE", "/api/v1/rate-limits/{name}");
pub const WORKFLOW_CREATE: Route = route("POST", "/api/v1/workflows");
pub const WORKFLOW_GET: Route = route("GET", "/api/v1/workflows/{workflow_id}");
pub const WORKFLOWS_LIST: Route = Route {
    query: &["status", "limit", "cursor"],
    ..route("GET", "/api/v1/workflows")
};
pub const WORKFLOW_CANCEL: Route = route("POST", "/api/v1/workflows/{workflow_id}/cancel");
pub const SCHEDULE_SET: Route = route("PUT", "/api/v1/schedules/{name}");
pub const SCHEDULE_GET: Route = route("GET", "/api/v1/schedules/{name}");
pub const SCHEDULES_LIST: Route = Route {
    query: PAGE,
    ..route("GET", "/api/v1/schedules")
};
pub const SCHEDULE_DELETE: Route = route("DELETE", "/api/v1/schedules/{name}");
pub const SCHEDULE_PAUSE: Route = route("POST", "/api/v1/schedules/{name}/pause");
pub const SCHEDULE_RESUME: Route = route("POST", "/api/v1/schedules/{name}/resume");
pub const SCHEDULE_TRIGGER: Route = route("POST", "/api/v1/schedules/{name}/trigger");
pub const HEALTH: Route = route("GET", "/healthz");

/// Every route above.
pub const ALL: &[Route] = &[
    LEASE,
    HEARTBEAT,
    COMPLETE,
    FAIL,
    SNOOZE,
    PROGRESS,
    HEARTBEAT_MANY,
    COMPLETE_MANY,
    FAIL_MANY,
    SNOOZE_MANY,
    STEPS_ADD,
    ENQUEUE,
    ENQUEUE_MANY,
    JOB_GET,
    JOB_WAIT,
    EVENTS,
    JOBS_LIST,
    JOB_CANCEL,
    JOB_RETRY,
    JOBS_BULK_RETRY,
    JOBS_BULK_CANCEL,
    JOBS_BULK_DELETE,
    QUEUES,
    QUEUE_STATS,
    QUEUE_PAUSE,
    QUEUE_RESUME,
    WORKERS,
    RATE_LIMITS_LIST,
    RATE_LIMIT_SET,
    RATE_LIMIT_GET,
    RATE_LIMIT_DELETE,
    WORKFLOW_CREATE,
    WORKFLOW_GET,
    WORKFLOWS_LIST,
    WORKFLOW_CANCEL,
    SCHEDULE_SET,
    SCHEDULE_GET,
    SCHEDULES_LIST,
    SCHEDULE_DELETE,
    SCHEDULE_PAUSE,
    SCHEDULE_RESUME,
    SCHEDULE_TRIGGER,
    HEALTH,
];
