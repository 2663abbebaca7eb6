/**
 * Every route the client calls: method, path, the OpenAPI schema titles of
 * its request body and of its answer, and its query parameters.
 * `test/openapi.test.ts` checks this table against the server's
 * `/openapi.json`, both ways: every route here is the server's, and every
 * route of the server (but `/metrics`) is here.
 */

export interface Route {
  readonly method: "GET" | "POST" | "PUT" | "DELETE";
  readonly path: string;
  /** The request body's schema, `null` for none. */
  readonly request: string | null;
  /** The success answer's schema, `null` for `204` (or a stream). */
  readonly answer: string | null;
  /** The answer is a stream of server-sent events (`text/event-stream`). */
  readonly stream?: true;
  readonly query?: readonly string[];
}

export const ROUTES = {
  // The worker protocol (worker token).
  lease: { method: "POST", path: "/api/v1/queues/{queue}/lease", request: "LeaseRequest", answer: "LeasesAnswer" },
  heartbeat: { method: "POST", path: "/api/v1/jobs/{job_id}/heartbeat", request: "HeartbeatRequest", answer: "HeartbeatAnswer" },
  progress: { method: "POST", path: "/api/v1/jobs/{job_id}/progress", request: "ProgressRequest", answer: "HeartbeatAnswer" },
  complete: { method: "POST", path: "/api/v1/jobs/{job_id}/complete", request: "CompleteRequest", answer: null },
  fail: { method: "POST", path: "/api/v1/jobs/{job_id}/fail", request: "FailRequest", answer: null },
  heartbeatMany: { method: "POST", path: "/api/v1/leases/heartbeat", request: "HeartbeatManyRequest", answer: "ReportResultsAnswer" },
  completeMany: { method: "POST", path: "/api/v1/leases/complete", request: "CompleteManyRequest", answer: "ReportResultsAnswer" },
  failMany: { method: "POST", path: "/api/v1/leases/fail", request: "FailManyRequest", answer: "ReportResultsAnswer" },
  snooze: { method: "POST", path: "/api/v1/jobs/{job_id}/snooze", request: "SnoozeRequest", answer: null },
  snoozeMany: { method: "POST", path: "/api/v1/leases/snooze", request: "SnoozeManyRequest", answer: "ReportResultsAnswer" },
  stepsAdd: { method: "POST", path: "/api/v1/jobs/{job_id}/steps", request: "StepsAddRequest", answer: "WorkflowAnswer" },
  // The application API (tenant token).
  enqueue: { method: "POST", path: "/api/v1/jobs", request: "EnqueueRequest", answer: "JobAnswer" },
  enqueueMany: { method: "POST", path: "/api/v1/jobs/batch", request: "EnqueueBatchRequest", answer: "JobsAnswer" },
  jobGet: { method: "GET", path: "/api/v1/jobs/{job_id}", request: null, answer: "JobAnswer" },
  jobWait: { method: "GET", path: "/api/v1/jobs/{job_id}/wait", request: null, answer: "JobAnswer", query: ["timeout_secs"] },
  jobsList: {
    method: "GET",
    path: "/api/v1/jobs",
    request: null,
    answer: "JobsPageAnswer",
    query: ["queue", "status", "kind", "limit", "cursor"],
  },
  events: {
    method: "GET",
    path: "/api/v1/events",
    request: null,
    answer: null,
    stream: true,
    query: ["queue", "kind", "job", "stats_secs"],
  },
  jobCancel: { method: "POST", path: "/api/v1/jobs/{job_id}/cancel", request: null, answer: "JobAnswer" },
  jobRetry: { method: "POST", path: "/api/v1/jobs/{job_id}/retry", request: null, answer: "JobAnswer" },
  jobsBulkRetry: { method: "POST", path: "/api/v1/jobs/bulk/retry", request: "BulkRequest", answer: "CountAnswer" },
  jobsBulkCancel: { method: "POST", path: "/api/v1/jobs/bulk/cancel", request: "BulkRequest", answer: "CountAnswer" },
  jobsBulkDelete: { method: "POST", path: "/api/v1/jobs/bulk/delete", request: "BulkRequest", answer: "CountAnswer" },
  queues: { method: "GET", path: "/api/v1/queues", request: null, answer: "QueuesAnswer", query: ["limit", "cursor"] },
  queueStats: { method: "GET", path: "/api/v1/queues/{queue}/stats", request: null, answer: "QueueStatsAnswer" },
  queuePause: { method: "POST", path: "/api/v1/queues/{queue}/pause", request: null, answer: "QueueStatsAnswer" },
  queueResume: { method: "POST", path: "/api/v1/queues/{queue}/resume", request: null, answer: "QueueStatsAnswer" },
  workers: { method: "GET", path: "/api/v1/workers", request: null, answer: "WorkersAnswer" },
  rateLimitsList: { method: "GET", path: "/api/v1/rate-limits", request: null, answer: "RateLimitsAnswer" },
  rateLimitSet: { method: "PUT", path: "/api/v1/rate-limits/{name}", request: "RateLimitRequest", answer: "RateLimitAnswer" },
  rateLimitGet: { method: "GET", path: "/api/v1/rate-limits/{name}", request: null, answer: "RateLimitAnswer" },
  rateLimitDelete: { method: "DELETE", path: "/api/v1/rate-limits/{name}", request: null, answer: null },
  workflowCreate: { method: "POST", path: "/api/v1/workflows", request: "WorkflowCreateRequest", answer: "WorkflowAnswer" },
  workflowGet: { method: "GET", path: "/api/v1/workflows/{workflow_id}", request: null, answer: "WorkflowAnswer" },
  workflowsList: {
    method: "GET",
    path: "/api/v1/workflows",
    request: null,
    answer: "WorkflowsPageAnswer",
    query: ["status", "limit", "cursor"],
  },
  workflowCancel: { method: "POST", path: "/api/v1/workflows/{workflow_id}/cancel", request: null, answer: "WorkflowAnswer" },
  scheduleSet: { method: "PUT", path: "/api/v1/schedules/{name}", request: "ScheduleRequest", answer: "ScheduleAnswer" },
  scheduleGet: { method: "GET", path: "/api/v1/schedules/{name}", request: null, answer: "ScheduleAnswer" },
  schedulesList: {
    method: "GET",
    path: "/api/v1/schedules",
    request: null,
    answer: "SchedulesAnswer",
    query: ["limit", "cursor"],
  },
  scheduleDelete: { method: "DELETE", path: "/api/v1/schedules/{name}", request: null, answer: null },
  schedulePause: { method: "POST", path: "/api/v1/schedules/{name}/pause", request: null, answer: "ScheduleAnswer" },
  scheduleResume: { method: "POST", path: "/api/v1/schedules/{name}/resume", request: null, answer: "ScheduleAnswer" },
  scheduleTrigger: { method: "POST", path: "/api/v1/schedules/{name}/trigger", request: null, answer: "ScheduleTriggerAnswer" },
  health: { method: "GET", path: "/healthz", request: null, answer: "HealthAnswer" },
} as const satisfies Record<string, Route>;

export type RouteName = keyof typeof ROUTES;
