package qftrio

import (
	"context"
	"encoding/json"
	"time"
)

// The wire's types, field for field as docs/protocol.md gives them (the JSON
// names are the server's). openapi_test.go checks each against the server's
// /openapi.json: an answer's type has exactly the schema's fields, a
// request's sends none the server refuses and every one it requires.
// A field the server may send as null is a pointer, slice, map or raw JSON.

// Status is a job's status.
type Status string

const (
	StatusPending   Status = "pending"
	StatusRunning   Status = "running"
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
	StatusCancelled Status = "cancelled"
)

// Job is a job as the server answers it. Payload, Result and Context are
// the JSON objects as sent: json.Unmarshal them into your own types.
type Job struct {
	ID          string            `json:"id"`
	Tenant      string            `json:"tenant"`
	Queue       string            `json:"queue"`
	Kind        string            `json:"kind"`
	Payload     json.RawMessage   `json:"payload"`
	Status      Status            `json:"status"`
	Priority    int               `json:"priority"`
	Attempt     int               `json:"attempt"`
	MaxAttempts int               `json:"max_attempts"`
	ScheduledAt time.Time         `json:"scheduled_at"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
	LockedUntil *time.Time        `json:"locked_until"`
	WorkerID    *string           `json:"worker_id"`
	Result      json.RawMessage   `json:"result"`
	Error       *string           `json:"error"`
	Errors      []ErrorEntry      `json:"errors"`
	WorkflowID  *string           `json:"workflow_id"`
	Step        *string           `json:"step"`
	Context     json.RawMessage   `json:"context"`
	TimeoutSecs *int              `json:"timeout_secs"`
	Backoff     *Backoff          `json:"backoff"`
	Concurrency *Concurrency      `json:"concurrency"`
	RateLimit   *string           `json:"rate_limit"`
	Unique      *Unique           `json:"unique"`
	Headers     map[string]string `json:"headers"`
	Schedule    *string           `json:"schedule"`
	// LastProgress is the last progress its handler reported (Job.Progress),
	// and ProgressAt when.
	LastProgress json.RawMessage `json:"progress"`
	ProgressAt   *time.Time      `json:"progress_at"`
	// Attempts is the history of its claims, oldest first, the newest 20 kept.
	Attempts []AttemptEntry `json:"attempts"`

	// progress is the worker's: Job.Progress hands the value to it.
	progress func(v any) error
	// addSteps is the worker's: Job.AddSteps hands the steps to it.
	addSteps func(ctx context.Context, steps []WorkflowStepRequest, collect string) (*Workflow, error)
}

// UnmarshalJSON reads a job as the wire has it, a null Result, Context or
// LastProgress as nil (encoding/json keeps a null json.RawMessage as the text "null").
func (j *Job) UnmarshalJSON(data []byte) error {
	type wire Job
	if err := json.Unmarshal(data, (*wire)(j)); err != nil {
		return err
	}
	for _, raw := range []*json.RawMessage{&j.Result, &j.Context, &j.LastProgress} {
		if string(*raw) == "null" {
			*raw = nil
		}
	}
	return nil
}

// ErrorEntry is one failed attempt of a job's history.
type ErrorEntry struct {
	Attempt int       `json:"attempt"`
	Error   string    `json:"error"`
	At      time.Time `json:"at"`
}

// AttemptOutcome is how one claim of a job ended (running while it has not).
type AttemptOutcome string

const (
	AttemptRunning   AttemptOutcome = "running"
	AttemptCompleted AttemptOutcome = "completed"
	AttemptFailed    AttemptOutcome = "failed"
	AttemptTimedOut  AttemptOutcome = "timed_out"
	// AttemptLost: its lease expired, taken back by the janitor or claimed again.
	AttemptLost      AttemptOutcome = "lost"
	AttemptSnoozed   AttemptOutcome = "snoozed"
	AttemptCancelled AttemptOutcome = "cancelled"
)

// AttemptEntry is one claim of a job: who claimed it and when, when and how
// it ended (EndedAt nil while it runs; ClaimedAt nil for a claim made before
// the history existed).
type AttemptEntry struct {
	Attempt   int            `json:"attempt"`
	WorkerID  *string        `json:"worker_id"`
	ClaimedAt *time.Time     `json:"claimed_at"`
	EndedAt   *time.Time     `json:"ended_at"`
	Outcome   AttemptOutcome `json:"outcome"`
	Error     *string        `json:"error"`
}

// Backoff is a job's own retry delays: initial_secs * factor^(attempt-1),
// capped at max_secs, scaled by a random jitter.
type Backoff struct {
	InitialSecs *float64 `json:"initial_secs,omitempty"`
	Factor      *float64 `json:"factor,omitempty"`
	MaxSecs     *float64 `json:"max_secs,omitempty"`
	Jitter      *float64 `json:"jitter,omitempty"`
}

// Concurrency caps the running jobs of a tenant that carry the same Key.
type Concurrency struct {
	Key   string `json:"key"`
	Limit int    `json:"limit,omitempty"`
}

// Unique makes an enqueue answer the existing job of the same Key while one
// is in Statuses (and, with PeriodSecs, younger than that).
type Unique struct {
	Key        string   `json:"key"`
	Statuses   []Status `json:"statuses,omitempty"`
	PeriodSecs *float64 `json:"period_secs,omitempty"`
}

// JobConfig is an enqueue's options; the zero value takes the server's
// defaults (queue "default", priority 0, max_attempts 5).
type JobConfig struct {
	Queue          string            `json:"queue,omitempty"`
	Priority       *int              `json:"priority,omitempty"`
	MaxAttempts    *int              `json:"max_attempts,omitempty"`
	DelaySecs      *float64          `json:"delay_secs,omitempty"`
	ScheduledAt    *time.Time        `json:"scheduled_at,omitempty"`
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	TimeoutSecs    *int              `json:"timeout_secs,omitempty"`
	Backoff        *Backoff          `json:"backoff,omitempty"`
	Concurrency    *Concurrency      `json:"concurrency,omitempty"`
	RateLimit      string            `json:"rate_limit,omitempty"`
	Unique         *Unique           `json:"unique,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
}

// EnqueueRequest is one job to enqueue (EnqueueMany takes many; a schedule
// enqueues one on each tick). A nil Payload is {}.
type EnqueueRequest struct {
	Kind    string     `json:"kind"`
	Payload any        `json:"payload,omitempty"`
	Config  *JobConfig `json:"config,omitempty"`
}

type enqueueBatchRequest struct {
	Jobs []EnqueueRequest `json:"jobs"`
}

type jobsAnswer struct {
	Jobs []Job `json:"jobs"`
}

// JobsFilter selects a page of JobsList; empty fields select everything.
type JobsFilter struct {
	Queue  string
	Status Status
	Kind   string
	Limit  int
	Cursor string
}

// JobsPage is one page of jobs, newest first; NextCursor (nil on the last
// page) is the Cursor of the next.
type JobsPage struct {
	Jobs       []Job   `json:"jobs"`
	NextCursor *string `json:"next_cursor"`
}

// BulkFilter selects the jobs of JobsBulk. All must be true to select with
// no other field set.
type BulkFilter struct {
	Queue         string     `json:"queue,omitempty"`
	Status        Status     `json:"status,omitempty"`
	Kind          string     `json:"kind,omitempty"`
	CreatedAfter  *time.Time `json:"created_after,omitempty"`
	CreatedBefore *time.Time `json:"created_before,omitempty"`
	Limit         int        `json:"limit,omitempty"`
	All           bool       `json:"all,omitempty"`
}

type countAnswer struct {
	Count int `json:"count"`
}

// --- the worker protocol ---------------------------------------------------

// LeaseRequest is a lease call's options; zero fields take the server's
// defaults (one job, 60 s, no wait).
type LeaseRequest struct {
	MaxJobs   int     `json:"max_jobs,omitempty"`
	LeaseSecs int     `json:"lease_secs,omitempty"`
	WaitSecs  float64 `json:"wait_secs,omitempty"`
	WorkerID  string  `json:"worker_id,omitempty"`
}

// Lease is one claimed job and the token that reports on it.
type Lease struct {
	Job        Job    `json:"job"`
	LeaseToken string `json:"lease_token"`
}

type leasesAnswer struct {
	Jobs []Lease `json:"jobs"`
}

type heartbeatRequest struct {
	LeaseToken string `json:"lease_token"`
	ExtendSecs int    `json:"extend_secs"`
}

// HeartbeatAnswer says whether the job is still running (and the lease's
// new end) or what it became.
type HeartbeatAnswer struct {
	Status      Status     `json:"status"`
	LockedUntil *time.Time `json:"locked_until,omitempty"`
}

type progressRequest struct {
	LeaseToken string `json:"lease_token"`
	Progress   any    `json:"progress"`
}

type completeRequest struct {
	LeaseToken string `json:"lease_token"`
	Result     any    `json:"result"`
}

type failRequest struct {
	LeaseToken  string   `json:"lease_token"`
	Error       string   `json:"error"`
	Retryable   bool     `json:"retryable"`
	RetryInSecs *float64 `json:"retry_in_secs,omitempty"`
}

type snoozeRequest struct {
	LeaseToken string  `json:"lease_token"`
	DelaySecs  float64 `json:"delay_secs"`
}

// HeartbeatItem is one lease of HeartbeatMany. Progress, when set, replaces
// the job's progress.
type HeartbeatItem struct {
	ID         string `json:"id"`
	LeaseToken string `json:"lease_token"`
	ExtendSecs int    `json:"extend_secs"`
	Progress   any    `json:"progress,omitempty"`
}

// CompleteItem is one completion of CompleteMany; a nil Result is {}.
type CompleteItem struct {
	ID         string `json:"id"`
	LeaseToken string `json:"lease_token"`
	Result     any    `json:"result,omitempty"`
}

// FailItem is one failure of FailMany.
type FailItem struct {
	ID          string   `json:"id"`
	LeaseToken  string   `json:"lease_token"`
	Error       string   `json:"error"`
	Retryable   bool     `json:"retryable"`
	RetryInSecs *float64 `json:"retry_in_secs,omitempty"`
}

// SnoozeItem is one snooze of SnoozeMany.
type SnoozeItem struct {
	ID         string  `json:"id"`
	LeaseToken string  `json:"lease_token"`
	DelaySecs  float64 `json:"delay_secs"`
}

type heartbeatManyRequest struct {
	Items []HeartbeatItem `json:"items"`
}
type completeManyRequest struct {
	Items []CompleteItem `json:"items"`
}
type failManyRequest struct {
	Items []FailItem `json:"items"`
}
type snoozeManyRequest struct {
	Items []SnoozeItem `json:"items"`
}

// ReportResult is the answer of one item of a batch report: Code 200 (a
// heartbeat: Status says what the job is), 204 (landed), 404 or 409 (not
// this token's job any more).
type ReportResult struct {
	ID          string     `json:"id"`
	Code        int        `json:"code"`
	Status      *Status    `json:"status,omitempty"`
	LockedUntil *time.Time `json:"locked_until,omitempty"`
}

type reportResultsAnswer struct {
	Results []ReportResult `json:"results"`
}

// --- queues, workers, rate limits -------------------------------------------

// QueueStats is a queue's counts and when work is next available.
type QueueStats struct {
	Queue           string     `json:"queue"`
	Counts          Counts     `json:"counts"`
	HeldBack        HeldBack   `json:"held_back"`
	OldestReadyAt   *time.Time `json:"oldest_ready_at"`
	NextAvailableAt *time.Time `json:"next_available_at"`
	Paused          bool       `json:"paused"`
}

// Counts is a queue's jobs by status (Scheduled: pending jobs whose time
// has not come).
type Counts struct {
	Pending   int `json:"pending"`
	Running   int `json:"running"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	Cancelled int `json:"cancelled"`
	Scheduled int `json:"scheduled"`
}

// HeldBack counts the ready jobs a concurrency key or a rate limit holds back.
type HeldBack struct {
	Concurrency int `json:"concurrency"`
	RateLimit   int `json:"rate_limit"`
}

// QueuesPage is one page of queues by name.
type QueuesPage struct {
	Queues     []QueueStats `json:"queues"`
	NextCursor *string      `json:"next_cursor"`
}

// PageFilter is the Limit and Cursor of a paged list; zero values take the
// first page of the server's default size.
type PageFilter struct {
	Limit  int
	Cursor string
}

// WorkerInfo is a worker holding running jobs.
type WorkerInfo struct {
	WorkerID   string    `json:"worker_id"`
	Jobs       int       `json:"jobs"`
	JobIDs     []string  `json:"job_ids"`
	Queues     []string  `json:"queues"`
	LastSeenAt time.Time `json:"last_seen_at"`
}

type workersAnswer struct {
	Workers []WorkerInfo `json:"workers"`
}

// RateLimit is a tenant's rate limit: at most Limit claims in any PerSecs.
type RateLimit struct {
	Name            string     `json:"name"`
	Limit           int        `json:"limit"`
	PerSecs         float64    `json:"per_secs"`
	NextAvailableAt *time.Time `json:"next_available_at"`
}

type rateLimitRequest struct {
	Limit   int     `json:"limit"`
	PerSecs float64 `json:"per_secs"`
}

type rateLimitsAnswer struct {
	RateLimits []RateLimit `json:"rate_limits"`
}

// Health is GET /healthz: "ok" or "unavailable".
type Health struct {
	Status string `json:"status"`
}

// --- schedules ----------------------------------------------------------------

// ScheduleRequest declares a schedule: each tick of Cron in Timezone
// (default UTC) enqueues Job. CatchUp is "latest" (default), "none" or "all".
type ScheduleRequest struct {
	Cron     string         `json:"cron"`
	Timezone string         `json:"timezone,omitempty"`
	Job      EnqueueRequest `json:"job"`
	Paused   bool           `json:"paused,omitempty"`
	CatchUp  string         `json:"catch_up,omitempty"`
}

// Schedule is a schedule as the server keeps it; Job is its job as declared.
type Schedule struct {
	Name      string          `json:"name"`
	Tenant    string          `json:"tenant"`
	Cron      string          `json:"cron"`
	Timezone  string          `json:"timezone"`
	Job       json.RawMessage `json:"job"`
	Paused    bool            `json:"paused"`
	CatchUp   string          `json:"catch_up"`
	NextRunAt *time.Time      `json:"next_run_at"`
	LastRunAt *time.Time      `json:"last_run_at"`
	LastJobID *string         `json:"last_job_id"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// SchedulesPage is one page of schedules by name.
type SchedulesPage struct {
	Schedules  []Schedule `json:"schedules"`
	NextCursor *string    `json:"next_cursor"`
}

// ScheduleTriggered is the job a trigger enqueued, and its schedule.
type ScheduleTriggered struct {
	Job      Job      `json:"job"`
	Schedule Schedule `json:"schedule"`
}

// --- workflows ----------------------------------------------------------------

// WorkflowStepRequest is one step of a new workflow; a nil Payload is {}.
type WorkflowStepRequest struct {
	Name        string   `json:"name"`
	Kind        string   `json:"kind"`
	Payload     any      `json:"payload,omitempty"`
	DependsOn   []string `json:"depends_on,omitempty"`
	MaxAttempts int      `json:"max_attempts,omitempty"`
}

type stepsAddRequest struct {
	LeaseToken string                `json:"lease_token"`
	Steps      []WorkflowStepRequest `json:"steps"`
	Collect    string                `json:"collect,omitempty"`
}

type workflowCreateRequest struct {
	Name    string                `json:"name"`
	Context any                   `json:"context"`
	Steps   []WorkflowStepRequest `json:"steps"`
}

// Workflow is a workflow and every step of it.
type Workflow struct {
	ID        string          `json:"id"`
	Tenant    string          `json:"tenant"`
	Name      string          `json:"name"`
	Status    string          `json:"status"`
	Context   json.RawMessage `json:"context"`
	Steps     []WorkflowStep  `json:"steps"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// WorkflowStep is one step: its job once it has one.
type WorkflowStep struct {
	Name        string          `json:"name"`
	Kind        string          `json:"kind"`
	Payload     json.RawMessage `json:"payload"`
	DependsOn   []string        `json:"depends_on"`
	MaxAttempts int             `json:"max_attempts"`
	Status      string          `json:"status"`
	JobID       *string         `json:"job_id"`
	// AddedBy names the step that added it at run time, else nil.
	AddedBy *string `json:"added_by"`
	Job     *Job    `json:"job,omitempty"`
}

// WorkflowsPage is one page of workflows, newest first.
type WorkflowsPage struct {
	Workflows  []Workflow `json:"workflows"`
	NextCursor *string    `json:"next_cursor"`
}
