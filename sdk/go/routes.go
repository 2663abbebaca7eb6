package qftrio

// route is one route the client calls: its method and path, the OpenAPI
// schema titles of its request body and of its success answer ("" for none,
// and for a 204), and its query parameters. openapi_test.go checks this
// table against the server's /openapi.json both ways.
type route struct {
	method, path    string
	request, answer string
	query           []string
}

// streamAnswer is the answer of a route that answers server-sent events.
const streamAnswer = "text/event-stream"

var routes = map[string]route{
	// The worker protocol (worker token).
	"lease":         {"POST", "/api/v1/queues/{queue}/lease", "LeaseRequest", "LeasesAnswer", nil},
	"heartbeat":     {"POST", "/api/v1/jobs/{job_id}/heartbeat", "HeartbeatRequest", "HeartbeatAnswer", nil},
	"progress":      {"POST", "/api/v1/jobs/{job_id}/progress", "ProgressRequest", "HeartbeatAnswer", nil},
	"complete":      {"POST", "/api/v1/jobs/{job_id}/complete", "CompleteRequest", "", nil},
	"fail":          {"POST", "/api/v1/jobs/{job_id}/fail", "FailRequest", "", nil},
	"snooze":        {"POST", "/api/v1/jobs/{job_id}/snooze", "SnoozeRequest", "", nil},
	"heartbeatMany": {"POST", "/api/v1/leases/heartbeat", "HeartbeatManyRequest", "ReportResultsAnswer", nil},
	"completeMany":  {"POST", "/api/v1/leases/complete", "CompleteManyRequest", "ReportResultsAnswer", nil},
	"failMany":      {"POST", "/api/v1/leases/fail", "FailManyRequest", "ReportResultsAnswer", nil},
	"snoozeMany":    {"POST", "/api/v1/leases/snooze", "SnoozeManyRequest", "ReportResultsAnswer", nil},
	"stepsAdd":      {"POST", "/api/v1/jobs/{job_id}/steps", "StepsAddRequest", "WorkflowAnswer", nil},
	// The application API (tenant token).
	"enqueue":         {"POST", "/api/v1/jobs", "EnqueueRequest", "JobAnswer", nil},
	"enqueueMany":     {"POST", "/api/v1/jobs/batch", "EnqueueBatchRequest", "JobsAnswer", nil},
	"jobGet":          {"GET", "/api/v1/jobs/{job_id}", "", "JobAnswer", nil},
	"jobWait":         {"GET", "/api/v1/jobs/{job_id}/wait", "", "JobAnswer", []string{"timeout_secs"}},
	"events":          {"GET", "/api/v1/events", "", streamAnswer, []string{"queue", "kind", "job", "stats_secs"}},
	"jobsList":        {"GET", "/api/v1/jobs", "", "JobsPageAnswer", []string{"queue", "status", "kind", "limit", "cursor"}},
	"jobCancel":       {"POST", "/api/v1/jobs/{job_id}/cancel", "", "JobAnswer", nil},
	"jobRetry":        {"POST", "/api/v1/jobs/{job_id}/retry", "", "JobAnswer", nil},
	"jobsBulkRetry":   {"POST", "/api/v1/jobs/bulk/retry", "BulkRetryRequest", "CountAnswer", nil},
	"jobsBulkCancel":  {"POST", "/api/v1/jobs/bulk/cancel", "BulkCancelRequest", "CountAnswer", nil},
	"jobsBulkDelete":  {"POST", "/api/v1/jobs/bulk/delete", "BulkDeleteRequest", "CountAnswer", nil},
	"queues":          {"GET", "/api/v1/queues", "", "QueuesAnswer", []string{"limit", "cursor"}},
	"queueStats":      {"GET", "/api/v1/queues/{queue}/stats", "", "QueueStatsAnswer", nil},
	"queuePause":      {"POST", "/api/v1/queues/{queue}/pause", "", "QueueStatsAnswer", nil},
	"queueResume":     {"POST", "/api/v1/queues/{queue}/resume", "", "QueueStatsAnswer", nil},
	"workers":         {"GET", "/api/v1/workers", "", "WorkersAnswer", nil},
	"rateLimitsList":  {"GET", "/api/v1/rate-limits", "", "RateLimitsAnswer", nil},
	"rateLimitSet":    {"PUT", "/api/v1/rate-limits/{name}", "RateLimitRequest", "RateLimitAnswer", nil},
	"rateLimitGet":    {"GET", "/api/v1/rate-limits/{name}", "", "RateLimitAnswer", nil},
	"rateLimitDelete": {"DELETE", "/api/v1/rate-limits/{name}", "", "", nil},
	"workflowCreate":  {"POST", "/api/v1/workflows", "WorkflowCreateRequest", "WorkflowAnswer", nil},
	"workflowGet":     {"GET", "/api/v1/workflows/{workflow_id}", "", "WorkflowAnswer", nil},
	"workflowsList":   {"GET", "/api/v1/workflows", "", "WorkflowsPageAnswer", []string{"status", "limit", "cursor"}},
	"workflowCancel":  {"POST", "/api/v1/workflows/{workflow_id}/cancel", "", "WorkflowAnswer", nil},
	"scheduleSet":     {"PUT", "/api/v1/schedules/{name}", "ScheduleRequest", "ScheduleAnswer", nil},
	"scheduleGet":     {"GET", "/api/v1/schedules/{name}", "", "ScheduleAnswer", nil},
	"schedulesList":   {"GET", "/api/v1/schedules", "", "SchedulesAnswer", []string{"limit", "cursor"}},
	"scheduleDelete":  {"DELETE", "/api/v1/schedules/{name}", "", "", nil},
	"schedulePause":   {"POST", "/api/v1/schedules/{name}/pause", "", "ScheduleAnswer", nil},
	"scheduleResume":  {"POST", "/api/v1/schedules/{name}/resume", "", "ScheduleAnswer", nil},
	"scheduleTrigger": {"POST", "/api/v1/schedules/{name}/trigger", "", "ScheduleTriggerAnswer", nil},
	"health":          {"GET", "/healthz", "", "HealthAnswer", nil},
}
