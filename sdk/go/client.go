package qftrio

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Client is the HTTP client of a qftrio server: a method per route, named as
// the Python client's (Enqueue, JobGet, JobsList, JobCancel, ...). Bodies and
// answers are the wire's (docs/protocol.md). A Client is safe for use by many
// goroutines.
//
// An error answer is an *APIError (Status, Code); no answer (refused, broken,
// timed out, ctx done) a *TransportError; an answer that is not qftrio's an
// *UnexpectedAnswer. A failed call is never sent again by the client.
type Client struct {
	// URL is the server's base URL, without a trailing slash.
	URL string
	// Timeout bounds each call (a long poll gets its wait on top); default 10 s.
	Timeout time.Duration
	// HTTP sends the calls; default a client of its own.
	HTTP *http.Client

	header http.Header
}

// The most of an answer read: the server bounds its answers far below this.
const maxAnswerBytes = 64 << 20

var tokenPattern = regexp.MustCompile(`^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$`)

// NewClient returns a client of the server at rawURL (http:// or https://,
// no query, fragment or user info) sending token as its bearer credential: a
// worker token for the worker protocol, a tenant token for the application
// API, "" for none.
func NewClient(rawURL, token string) (*Client, error) {
	parsed, err := url.Parse(rawURL)
	if err != nil || (parsed.Scheme != "http" && parsed.Scheme != "https") || parsed.Host == "" {
		return nil, configErrorf("not a usable server URL: %q (use http:// or https://)", rawURL)
	}
	if parsed.RawQuery != "" || parsed.Fragment != "" || parsed.User != nil {
		return nil, configErrorf("not a usable server URL: %q (no query, fragment or user info)", rawURL)
	}
	header := http.Header{}
	header.Set("Content-Type", "application/json")
	header.Set("User-Agent", "qftrio-go")
	if token != "" {
		if !tokenPattern.MatchString(token) {
			return nil, configErrorf("the token cannot be sent: use printable ASCII without a line break or surrounding spaces")
		}
		header.Set("Authorization", "Bearer "+token)
	}
	// A worker's heartbeats, reports and lease calls go in parallel: keep
	// enough connections open to reuse them rather than open new ones.
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 32
	return &Client{
		URL:     strings.TrimRight(parsed.String(), "/"),
		Timeout: 10 * time.Second,
		HTTP:    &http.Client{Transport: transport},
		header:  header,
	}, nil
}

// segment is a path parameter as one path segment: "." and ".." too, so
// that nothing climbs to another route.
func segment(value string) string {
	text := url.PathEscape(value)
	if text == "." || text == ".." {
		return strings.ReplaceAll(text, ".", "%2E")
	}
	return text
}

// oneLine is the first line of text, at most limit characters: an answer may
// be a whole page.
func oneLine(text string, limit int) string {
	line, _, _ := strings.Cut(strings.TrimSpace(text), "\n")
	line = strings.TrimSpace(line)
	if len(line) <= limit {
		return line
	}
	return line[:limit-3] + "..."
}

// call sends one call of the route name: params fill its path's {...} in
// order, query its query string, body (nil for none) is sent as JSON, and
// the answer is decoded into out (nil for a 204). want names a field the
// answer must have. extra is added to the call's timeout (a long poll's wait).
func (c *Client) call(ctx context.Context, name string, params []string, query url.Values, body, out any, want string, extra time.Duration) error {
	r := routes[name]
	path := r.path
	for _, value := range params {
		start := strings.IndexByte(path, '{')
		end := strings.IndexByte(path, '}')
		key := path[start+1 : end]
		if value == "" {
			return configErrorf("%s: expected a non-empty string", key)
		}
		path = path[:start] + segment(value) + path[end+1:]
	}
	if len(query) > 0 {
		path += "?" + query.Encode()
	}
	var reader io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return configErrorf("the request cannot be sent as JSON: %v", err)
		}
		reader = bytes.NewReader(data)
	}
	where := c.URL + path
	timeout := c.Timeout + extra
	callCtx, cancel := context.WithTimeoutCause(ctx, timeout, errNoAnswer)
	defer cancel()
	request, err := http.NewRequestWithContext(callCtx, r.method, where, reader)
	if err != nil {
		return configErrorf("%s %s: %v", r.method, where, err)
	}
	for key, values := range c.header {
		request.Header[key] = values
	}
	fail := func(err error) error {
		if ctx.Err() != nil {
			return &TransportError{Method: r.method, URL: where, Err: ctx.Err()}
		}
		if errors.Is(context.Cause(callCtx), errNoAnswer) {
			return &TransportError{Method: r.method, URL: where, Err: fmt.Errorf("no answer within %s", timeout)}
		}
		return &TransportError{Method: r.method, URL: where, Err: err}
	}
	response, err := c.HTTP.Do(request)
	if err != nil {
		var urlError *url.Error
		if errors.As(err, &urlError) {
			err = urlError.Err // the method and URL are said once, by TransportError
		}
		return fail(err)
	}
	defer response.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(response.Body, maxAnswerBytes))
	if err != nil {
		return fail(err)
	}
	if response.StatusCode >= 400 {
		return apiError(response, answer)
	}
	if response.StatusCode == http.StatusNoContent {
		return nil
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(answer, &fields) != nil || fields == nil {
		return &UnexpectedAnswer{Method: r.method, URL: where, Detail: "the answer is not a JSON object"}
	}
	if _, ok := fields[want]; want != "" && !ok {
		return &UnexpectedAnswer{Method: r.method, URL: where, Detail: "the answer has no " + want}
	}
	if out != nil {
		if err := json.Unmarshal(answer, out); err != nil {
			return &UnexpectedAnswer{Method: r.method, URL: where, Detail: "the answer does not read: " + err.Error()}
		}
	}
	return nil
}

var errNoAnswer = errors.New("no answer in time")

func apiError(response *http.Response, text []byte) *APIError {
	var body struct {
		Error *struct {
			Code    *string `json:"code"`
			Message *string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(text, &body) == nil && body.Error != nil && body.Error.Code != nil && body.Error.Message != nil {
		return &APIError{Status: response.StatusCode, Code: *body.Error.Code, Message: *body.Error.Message}
	}
	// A proxy's short text is worth passing on; another server's page is named, not repeated.
	kind, _, err := mime.ParseMediaType(response.Header.Get("Content-Type"))
	if err != nil {
		kind = "no content type"
	}
	trimmed := strings.TrimSpace(string(text))
	message := fmt.Sprintf("the answer is not qftrio's (%s): is the URL a qftrio server?", kind)
	if kind == "text/plain" && trimmed != "" && !strings.Contains(trimmed, "\n") {
		message = oneLine(trimmed, 200)
	}
	return &APIError{Status: response.StatusCode, Message: message}
}

func pageQuery(filter PageFilter) url.Values {
	query := url.Values{}
	if filter.Limit != 0 {
		query.Set("limit", strconv.Itoa(filter.Limit))
	}
	if filter.Cursor != "" {
		query.Set("cursor", filter.Cursor)
	}
	return query
}

// --- the worker protocol ------------------------------------------------------

// Lease claims up to request.MaxJobs jobs of queue, waiting up to
// request.WaitSecs for the first. It may answer none.
func (c *Client) Lease(ctx context.Context, queue string, request LeaseRequest) ([]Lease, error) {
	var answer leasesAnswer
	extra := time.Duration(request.WaitSecs * float64(time.Second))
	err := c.call(ctx, "lease", []string{queue}, nil, request, &answer, "jobs", extra)
	return answer.Jobs, err
}

// Heartbeat extends a lease by extendSecs from now. The answer's Status is
// running while the job is this token's; anything else, or an *APIError 409,
// means stop and report nothing.
func (c *Client) Heartbeat(ctx context.Context, jobID, leaseToken string, extendSecs int) (*HeartbeatAnswer, error) {
	return c.beat(ctx, "heartbeat", jobID, heartbeatRequest{LeaseToken: leaseToken, ExtendSecs: extendSecs})
}

// JobProgress records progress (a JSON object of at most 8 KiB) as the job's,
// extending nothing; it answers as Heartbeat does. A handler Run runs
// reports with Job.Progress, which sends it with a heartbeat.
func (c *Client) JobProgress(ctx context.Context, jobID, leaseToken string, progress any) (*HeartbeatAnswer, error) {
	return c.beat(ctx, "progress", jobID, progressRequest{LeaseToken: leaseToken, Progress: progress})
}

func (c *Client) beat(ctx context.Context, name, jobID string, body any) (*HeartbeatAnswer, error) {
	var answer HeartbeatAnswer
	if err := c.call(ctx, name, []string{jobID}, nil, body, &answer, "status", 0); err != nil {
		return nil, err
	}
	return &answer, nil
}

// Complete records success with result (nil for {}); replaying it with the
// same token changes nothing.
func (c *Client) Complete(ctx context.Context, jobID, leaseToken string, result any) error {
	if result == nil {
		result = struct{}{}
	}
	return c.call(ctx, "complete", []string{jobID}, nil, completeRequest{LeaseToken: leaseToken, Result: result}, nil, "", 0)
}

// Fail records a failure: retried later when retryable and attempts are left
// (after retryIn when it is not nil, else after the job's backoff), else
// dead-lettered.
func (c *Client) Fail(ctx context.Context, jobID, leaseToken, message string, retryable bool, retryIn *time.Duration) error {
	body := failRequest{LeaseToken: leaseToken, Error: message, Retryable: retryable, RetryInSecs: secondsOf(retryIn)}
	return c.call(ctx, "fail", []string{jobID}, nil, body, nil, "", 0)
}

// Snooze puts a running job back to pending for delay (0 to 30 days)
// without using up its attempt.
func (c *Client) Snooze(ctx context.Context, jobID, leaseToken string, delay time.Duration) error {
	body := snoozeRequest{LeaseToken: leaseToken, DelaySecs: delay.Seconds()}
	return c.call(ctx, "snooze", []string{jobID}, nil, body, nil, "", 0)
}

func secondsOf(d *time.Duration) *float64 {
	if d == nil {
		return nil
	}
	secs := d.Seconds()
	return &secs
}

// HeartbeatMany heartbeats many leases in one call (at most 1000): one result
// per item, in order.
func (c *Client) HeartbeatMany(ctx context.Context, items []HeartbeatItem) ([]ReportResult, error) {
	return c.reports(ctx, "heartbeatMany", heartbeatManyRequest{Items: items})
}

// CompleteMany completes many jobs in one call (at most 1000).
func (c *Client) CompleteMany(ctx context.Context, items []CompleteItem) ([]ReportResult, error) {
	for i := range items {
		if items[i].Result == nil {
			items[i].Result = struct{}{}
		}
	}
	return c.reports(ctx, "completeMany", completeManyRequest{Items: items})
}

// FailMany fails many jobs in one call (at most 1000).
func (c *Client) FailMany(ctx context.Context, items []FailItem) ([]ReportResult, error) {
	return c.reports(ctx, "failMany", failManyRequest{Items: items})
}

// SnoozeMany snoozes many jobs in one call (at most 1000).
func (c *Client) SnoozeMany(ctx context.Context, items []SnoozeItem) ([]ReportResult, error) {
	return c.reports(ctx, "snoozeMany", snoozeManyRequest{Items: items})
}

func (c *Client) reports(ctx context.Context, name string, body any) ([]ReportResult, error) {
	var answer reportResultsAnswer
	err := c.call(ctx, name, nil, nil, body, &answer, "results", 0)
	return answer.Results, err
}

// --- the application API ------------------------------------------------------

// Enqueue enqueues one job of kind with payload (nil for {}) and config (nil
// for the defaults). A repeated IdempotencyKey, or a Unique key held, answers
// the existing job and enqueues nothing.
func (c *Client) Enqueue(ctx context.Context, kind string, payload any, config *JobConfig) (*Job, error) {
	var job Job
	if err := c.call(ctx, "enqueue", nil, nil, EnqueueRequest{Kind: kind, Payload: payload, Config: config}, &job, "id", 0); err != nil {
		return nil, err
	}
	return &job, nil
}

// EnqueueMany enqueues up to 1000 jobs in one transaction: all or none.
func (c *Client) EnqueueMany(ctx context.Context, jobs []EnqueueRequest) ([]Job, error) {
	var answer jobsAnswer
	err := c.call(ctx, "enqueueMany", nil, nil, enqueueBatchRequest{Jobs: jobs}, &answer, "jobs", 0)
	return answer.Jobs, err
}

// JobGet reads one job.
func (c *Client) JobGet(ctx context.Context, jobID string) (*Job, error) {
	return c.job(ctx, "jobGet", jobID)
}

// JobCancel cancels a job: a pending one never runs, a running one's handler
// is told at its next heartbeat. A job already ended is an *APIError 409.
func (c *Client) JobCancel(ctx context.Context, jobID string) (*Job, error) {
	return c.job(ctx, "jobCancel", jobID)
}

// JobRetry puts a failed or cancelled job back to pending with a fresh
// attempt budget.
func (c *Client) JobRetry(ctx context.Context, jobID string) (*Job, error) {
	return c.job(ctx, "jobRetry", jobID)
}

func (c *Client) job(ctx context.Context, name, jobID string) (*Job, error) {
	var job Job
	if err := c.call(ctx, name, []string{jobID}, nil, nil, &job, "id", 0); err != nil {
		return nil, err
	}
	return &job, nil
}

// JobWait answers the job once it has ended (completed, failed or
// cancelled), or as it stands after timeout (0 to 60 s): read its Status.
// The server wakes the wait within milliseconds of the end, from any server.
func (c *Client) JobWait(ctx context.Context, jobID string, timeout time.Duration) (*Job, error) {
	query := url.Values{"timeout_secs": {strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64)}}
	var job Job
	if err := c.call(ctx, "jobWait", []string{jobID}, query, nil, &job, "id", timeout); err != nil {
		return nil, err
	}
	return &job, nil
}

// JobsList reads one page of jobs, newest first; pass NextCursor as Cursor
// for the next.
func (c *Client) JobsList(ctx context.Context, filter JobsFilter) (*JobsPage, error) {
	query := pageQuery(PageFilter{Limit: filter.Limit, Cursor: filter.Cursor})
	for key, value := range map[string]string{"queue": filter.Queue, "status": string(filter.Status), "kind": filter.Kind} {
		if value != "" {
			query.Set(key, value)
		}
	}
	var page JobsPage
	if err := c.call(ctx, "jobsList", nil, query, nil, &page, "jobs", 0); err != nil {
		return nil, err
	}
	return &page, nil
}

// JobsBulk applies action ("retry", "cancel" or "delete") to every job
// filter selects (at most filter.Limit, default 10,000) and answers how many
// changed.
func (c *Client) JobsBulk(ctx context.Context, action string, filter BulkFilter) (int, error) {
	name, ok := map[string]string{"retry": "jobsBulkRetry", "cancel": "jobsBulkCancel", "delete": "jobsBulkDelete"}[action]
	if !ok {
		return 0, configErrorf("action: not one of retry, cancel, delete: %q", action)
	}
	var answer countAnswer
	err := c.call(ctx, name, nil, nil, filter, &answer, "count", 0)
	return answer.Count, err
}

// Queues reads one page of queues by name.
func (c *Client) Queues(ctx context.Context, filter PageFilter) (*QueuesPage, error) {
	var page QueuesPage
	if err := c.call(ctx, "queues", nil, pageQuery(filter), nil, &page, "queues", 0); err != nil {
		return nil, err
	}
	return &page, nil
}

// QueueStats reads a queue's counts and when work is next available.
func (c *Client) QueueStats(ctx context.Context, queue string) (*QueueStats, error) {
	return c.queue(ctx, "queueStats", queue)
}

// QueuePause pauses queue on every server (idempotent): leases hand out none
// of its jobs until QueueResume; running jobs go on.
func (c *Client) QueuePause(ctx context.Context, queue string) (*QueueStats, error) {
	return c.queue(ctx, "queuePause", queue)
}

// QueueResume resumes a paused queue.
func (c *Client) QueueResume(ctx context.Context, queue string) (*QueueStats, error) {
	return c.queue(ctx, "queueResume", queue)
}

func (c *Client) queue(ctx context.Context, name, queue string) (*QueueStats, error) {
	var stats QueueStats
	if err := c.call(ctx, name, []string{queue}, nil, nil, &stats, "counts", 0); err != nil {
		return nil, err
	}
	return &stats, nil
}

// Workers lists the workers holding running jobs, most jobs first.
func (c *Client) Workers(ctx context.Context) ([]WorkerInfo, error) {
	var answer workersAnswer
	err := c.call(ctx, "workers", nil, nil, nil, &answer, "workers", 0)
	return answer.Workers, err
}

// RateLimitSet declares or changes a rate limit: at most limit claims of
// jobs naming it (JobConfig.RateLimit) in any window of per, on every server.
func (c *Client) RateLimitSet(ctx context.Context, name string, limit int, per time.Duration) (*RateLimit, error) {
	return c.rateLimit(ctx, "rateLimitSet", name, rateLimitRequest{Limit: limit, PerSecs: per.Seconds()})
}

// RateLimitGet reads a rate limit, and when a job it holds back can next be claimed.
func (c *Client) RateLimitGet(ctx context.Context, name string) (*RateLimit, error) {
	return c.rateLimit(ctx, "rateLimitGet", name, nil)
}

func (c *Client) rateLimit(ctx context.Context, route, name string, body any) (*RateLimit, error) {
	var limit RateLimit
	if err := c.call(ctx, route, []string{name}, nil, body, &limit, "name", 0); err != nil {
		return nil, err
	}
	return &limit, nil
}

// RateLimitsList lists the tenant's rate limits by name.
func (c *Client) RateLimitsList(ctx context.Context) ([]RateLimit, error) {
	var answer rateLimitsAnswer
	err := c.call(ctx, "rateLimitsList", nil, nil, nil, &answer, "rate_limits", 0)
	return answer.RateLimits, err
}

// RateLimitDelete forgets a rate limit: jobs naming it are no longer held back by it.
func (c *Client) RateLimitDelete(ctx context.Context, name string) error {
	return c.call(ctx, "rateLimitDelete", []string{name}, nil, nil, nil, "", 0)
}

// Health is GET /healthz (no credential needed).
func (c *Client) Health(ctx context.Context) (*Health, error) {
	var health Health
	if err := c.call(ctx, "health", nil, nil, nil, &health, "status", 0); err != nil {
		return nil, err
	}
	return &health, nil
}

// --- schedules ----------------------------------------------------------------

// ScheduleSet creates or replaces the schedule name. A cron, time zone or job
// config the server cannot use is an *APIError 422 naming the field, and
// stores nothing.
func (c *Client) ScheduleSet(ctx context.Context, name string, schedule ScheduleRequest) (*Schedule, error) {
	return c.schedule(ctx, "scheduleSet", name, schedule)
}

// ScheduleGet reads a schedule.
func (c *Client) ScheduleGet(ctx context.Context, name string) (*Schedule, error) {
	return c.schedule(ctx, "scheduleGet", name, nil)
}

// SchedulePause pauses a schedule (idempotent): no tick fires until ScheduleResume.
func (c *Client) SchedulePause(ctx context.Context, name string) (*Schedule, error) {
	return c.schedule(ctx, "schedulePause", name, nil)
}

// ScheduleResume resumes a schedule from its next tick.
func (c *Client) ScheduleResume(ctx context.Context, name string) (*Schedule, error) {
	return c.schedule(ctx, "scheduleResume", name, nil)
}

func (c *Client) schedule(ctx context.Context, route, name string, body any) (*Schedule, error) {
	var schedule Schedule
	if err := c.call(ctx, route, []string{name}, nil, body, &schedule, "cron", 0); err != nil {
		return nil, err
	}
	return &schedule, nil
}

// SchedulesList reads one page of schedules by name.
func (c *Client) SchedulesList(ctx context.Context, filter PageFilter) (*SchedulesPage, error) {
	var page SchedulesPage
	if err := c.call(ctx, "schedulesList", nil, pageQuery(filter), nil, &page, "schedules", 0); err != nil {
		return nil, err
	}
	return &page, nil
}

// ScheduleDelete deletes a schedule; the jobs it enqueued stay.
func (c *Client) ScheduleDelete(ctx context.Context, name string) error {
	return c.call(ctx, "scheduleDelete", []string{name}, nil, nil, nil, "", 0)
}

// ScheduleTrigger enqueues one job of the schedule now, besides its ticks.
func (c *Client) ScheduleTrigger(ctx context.Context, name string) (*ScheduleTriggered, error) {
	var answer ScheduleTriggered
	if err := c.call(ctx, "scheduleTrigger", []string{name}, nil, nil, &answer, "job", 0); err != nil {
		return nil, err
	}
	return &answer, nil
}

// --- workflows ----------------------------------------------------------------

// WorkflowCreate creates a workflow whose context starts as initial (nil for {}); a bad step
// graph is an *APIError 422 and stores nothing.
func (c *Client) WorkflowCreate(ctx context.Context, name string, steps []WorkflowStepRequest, initial any) (*Workflow, error) {
	if initial == nil {
		initial = struct{}{}
	}
	return c.workflow(ctx, "workflowCreate", nil, workflowCreateRequest{Name: name, Context: initial, Steps: steps})
}

// StepsAdd adds steps (at most 1000 a call) to the workflow of the running
// step jobID, whose lease leaseToken holds (worker token). They run once that
// step has completed, and the steps waiting for it wait for them too; with
// collect (not ""), their results go, in this order, to a list under that key
// of the context. The same call repeated changes nothing. A lost lease is an
// *APIError 409; steps that do not fit the workflow, 422.
func (c *Client) StepsAdd(ctx context.Context, jobID, leaseToken string, steps []WorkflowStepRequest, collect string) (*Workflow, error) {
	return c.workflow(ctx, "stepsAdd", []string{jobID}, stepsAddRequest{LeaseToken: leaseToken, Steps: steps, Collect: collect})
}

// WorkflowGet reads a workflow and every step of it.
func (c *Client) WorkflowGet(ctx context.Context, workflowID string) (*Workflow, error) {
	return c.workflow(ctx, "workflowGet", []string{workflowID}, nil)
}

// WorkflowCancel cancels a workflow and its unfinished steps.
func (c *Client) WorkflowCancel(ctx context.Context, workflowID string) (*Workflow, error) {
	return c.workflow(ctx, "workflowCancel", []string{workflowID}, nil)
}

func (c *Client) workflow(ctx context.Context, name string, params []string, body any) (*Workflow, error) {
	var workflow Workflow
	if err := c.call(ctx, name, params, nil, body, &workflow, "steps", 0); err != nil {
		return nil, err
	}
	return &workflow, nil
}

// WorkflowsList reads one page of workflows, newest first; status "" is any.
func (c *Client) WorkflowsList(ctx context.Context, status string, filter PageFilter) (*WorkflowsPage, error) {
	query := pageQuery(filter)
	if status != "" {
		query.Set("status", status)
	}
	var page WorkflowsPage
	if err := c.call(ctx, "workflowsList", nil, query, nil, &page, "workflows", 0); err != nil {
		return nil, err
	}
	return &page, nil
}
