package qftrio

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func ptr[T any](v T) *T { return &v }

func TestEnqueueAndReadJobs(t *testing.T) {
	ctx, client, queue := context.Background(), newClient(t), queueOf(t)
	job, err := client.Enqueue(ctx, "resize", map[string]any{"src": "a.png"}, &JobConfig{
		Queue: queue, Priority: ptr(3), MaxAttempts: ptr(2), IdempotencyKey: "once",
		TimeoutSecs: ptr(30), Headers: map[string]string{"x-request": "r1"},
		Backoff: &Backoff{InitialSecs: ptr(1.0)}, Concurrency: &Concurrency{Key: "k", Limit: 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if job.Status != StatusPending || job.Queue != queue || job.Priority != 3 || job.MaxAttempts != 2 ||
		job.Headers["x-request"] != "r1" || *job.TimeoutSecs != 30 || job.Concurrency.Limit != 2 || job.CreatedAt.IsZero() {
		t.Fatalf("the job is not as enqueued: %+v", job)
	}
	var payload struct{ Src string }
	if err := json.Unmarshal(job.Payload, &payload); err != nil || payload.Src != "a.png" {
		t.Fatalf("payload %s: %v", job.Payload, err)
	}
	again, err := client.Enqueue(ctx, "resize", nil, &JobConfig{Queue: queue, IdempotencyKey: "once"})
	if err != nil || again.ID != job.ID {
		t.Fatalf("a repeated idempotency key answers the first job: %v %v", again, err)
	}
	many, err := client.EnqueueMany(ctx, []EnqueueRequest{
		{Kind: "a", Config: &JobConfig{Queue: queue}},
		{Kind: "b", Payload: map[string]int{"n": 1}, Config: &JobConfig{Queue: queue}},
	})
	if err != nil || len(many) != 2 || many[1].Kind != "b" {
		t.Fatalf("EnqueueMany: %v %v", many, err)
	}
	got, err := client.JobGet(ctx, job.ID)
	if err != nil || got.ID != job.ID || got.Kind != "resize" {
		t.Fatalf("JobGet: %v %v", got, err)
	}
	page, err := client.JobsList(ctx, JobsFilter{Queue: queue, Kind: "b"})
	if err != nil || len(page.Jobs) != 1 || page.Jobs[0].ID != many[1].ID {
		t.Fatalf("JobsList by kind: %+v %v", page, err)
	}
	first, err := client.JobsList(ctx, JobsFilter{Queue: queue, Limit: 2})
	if err != nil || len(first.Jobs) != 2 || first.NextCursor == nil {
		t.Fatalf("JobsList's first page: %+v %v", first, err)
	}
	rest, err := client.JobsList(ctx, JobsFilter{Queue: queue, Limit: 2, Cursor: *first.NextCursor})
	if err != nil || len(rest.Jobs) != 1 || rest.NextCursor != nil {
		t.Fatalf("JobsList's last page: %+v %v", rest, err)
	}
	if still, err := client.JobWait(ctx, many[0].ID, 200*time.Millisecond); err != nil || still.Status != StatusPending {
		t.Fatalf("JobWait on a pending job: %v %v", still, err)
	}
	cancelled, err := client.JobCancel(ctx, many[0].ID)
	if err != nil || cancelled.Status != StatusCancelled {
		t.Fatalf("JobCancel: %v %v", cancelled, err)
	}
	if ended, err := client.JobWait(ctx, many[0].ID, time.Minute); err != nil || ended.Status != StatusCancelled {
		t.Fatalf("JobWait on a cancelled job: %v %v", ended, err)
	}
	retried, err := client.JobRetry(ctx, many[0].ID)
	if err != nil || retried.Status != StatusPending {
		t.Fatalf("JobRetry: %v %v", retried, err)
	}
	n, err := client.JobsBulk(ctx, "cancel", BulkFilter{Queue: queue, Status: StatusPending})
	if err != nil || n != 3 {
		t.Fatalf("JobsBulk cancel: %d %v", n, err)
	}
	if n, err = client.JobsBulk(ctx, "delete", BulkFilter{Queue: queue}); err != nil || n != 3 {
		t.Fatalf("JobsBulk delete: %d %v", n, err)
	}
	var config *ConfigError
	if _, err := client.JobsBulk(ctx, "explode", BulkFilter{}); !errors.As(err, &config) {
		t.Fatalf("an unknown bulk action is a ConfigError, not %v", err)
	}
}

func TestWorkerProtocolCalls(t *testing.T) {
	ctx, client, queue := context.Background(), newClient(t), queueOf(t)
	for _, kind := range []string{"one", "two", "three", "four"} {
		if _, err := client.Enqueue(ctx, kind, nil, &JobConfig{Queue: queue}); err != nil {
			t.Fatal(err)
		}
	}
	leases, err := client.Lease(ctx, queue, LeaseRequest{MaxJobs: 4, LeaseSecs: 30, WorkerID: "go-test"})
	if err != nil || len(leases) != 4 {
		t.Fatalf("Lease: %v %v", leases, err)
	}
	byKind := map[string]Lease{}
	for _, lease := range leases {
		if lease.Job.Status != StatusRunning || *lease.Job.WorkerID != "go-test" || lease.LeaseToken == "" {
			t.Fatalf("a leased job: %+v", lease)
		}
		byKind[lease.Job.Kind] = lease
	}
	one, two, three, four := byKind["one"], byKind["two"], byKind["three"], byKind["four"]
	beat, err := client.Heartbeat(ctx, one.Job.ID, one.LeaseToken, 60)
	if err != nil || beat.Status != StatusRunning || beat.LockedUntil == nil {
		t.Fatalf("Heartbeat: %+v %v", beat, err)
	}
	results, err := client.HeartbeatMany(ctx, []HeartbeatItem{
		{ID: two.Job.ID, LeaseToken: two.LeaseToken, ExtendSecs: 60},
		{ID: three.Job.ID, LeaseToken: one.LeaseToken, ExtendSecs: 60},
	})
	if err != nil || len(results) != 2 || results[0].Code != 200 || *results[0].Status != StatusRunning || results[1].Code != 409 {
		t.Fatalf("HeartbeatMany: %+v %v", results, err)
	}
	if answer, err := client.JobProgress(ctx, one.Job.ID, one.LeaseToken, map[string]int{"page": 2}); err != nil || answer.Status != StatusRunning {
		t.Fatalf("JobProgress: %+v %v", answer, err)
	}
	if err := client.Complete(ctx, one.Job.ID, one.LeaseToken, map[string]int{"n": 1}); err != nil {
		t.Fatal(err)
	}
	if err := client.Complete(ctx, one.Job.ID, one.LeaseToken, map[string]int{"n": 1}); err != nil {
		t.Fatalf("a replayed completion is 204 again: %v", err)
	}
	if err := client.Fail(ctx, two.Job.ID, two.LeaseToken, "bad", true, ptr(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := client.Snooze(ctx, three.Job.ID, three.LeaseToken, time.Hour); err != nil {
		t.Fatal(err)
	}
	reports, err := client.CompleteMany(ctx, []CompleteItem{{ID: four.Job.ID, LeaseToken: four.LeaseToken}})
	if err != nil || reports[0].Code != 204 {
		t.Fatalf("CompleteMany: %+v %v", reports, err)
	}
	reports, err = client.FailMany(ctx, []FailItem{{ID: four.Job.ID, LeaseToken: two.LeaseToken, Error: "x"}})
	if err != nil || reports[0].Code != 409 {
		t.Fatalf("FailMany with another job's token: %+v %v", reports, err)
	}
	reports, err = client.SnoozeMany(ctx, []SnoozeItem{{ID: four.Job.ID, LeaseToken: two.LeaseToken, DelaySecs: 1}})
	if err != nil || reports[0].Code != 409 {
		t.Fatalf("SnoozeMany with another job's token: %+v %v", reports, err)
	}
	done, _ := client.JobGet(ctx, one.Job.ID)
	failed, _ := client.JobGet(ctx, two.Job.ID)
	snoozed, _ := client.JobGet(ctx, three.Job.ID)
	if string(done.Result) != `{"n":1}` || string(done.LastProgress) != `{"page":2}` || failed.Status != StatusPending || *failed.Error != "bad" ||
		failed.ScheduledAt.Before(time.Now().Add(50*time.Minute)) || snoozed.Status != StatusPending || snoozed.MaxAttempts != 6 {
		t.Fatalf("the reports did not land as sent: %+v %+v %+v", done, failed, snoozed)
	}
	var api *APIError
	if err := client.Complete(ctx, two.Job.ID, two.LeaseToken, nil); !errors.As(err, &api) || api.Status != 409 {
		t.Fatalf("a stale token is an APIError 409, not %v", err)
	}
	empty, err := client.Lease(ctx, queue+"-empty", LeaseRequest{})
	if err != nil || len(empty) != 0 {
		t.Fatalf("an empty lease: %v %v", empty, err)
	}
}

func TestQueuesWorkersRateLimits(t *testing.T) {
	ctx, client, queue := context.Background(), newClient(t), queueOf(t)
	if _, err := client.Enqueue(ctx, "k", nil, &JobConfig{Queue: queue}); err != nil {
		t.Fatal(err)
	}
	stats, err := client.QueueStats(ctx, queue)
	if err != nil || stats.Queue != queue || stats.Counts.Pending != 1 || stats.OldestReadyAt == nil {
		t.Fatalf("QueueStats: %+v %v", stats, err)
	}
	if paused, err := client.QueuePause(ctx, queue); err != nil || !paused.Paused {
		t.Fatalf("QueuePause: %+v %v", paused, err)
	}
	if leases, err := client.Lease(ctx, queue, LeaseRequest{}); err != nil || len(leases) != 0 {
		t.Fatalf("a paused queue leases nothing: %v %v", leases, err)
	}
	if resumed, err := client.QueueResume(ctx, queue); err != nil || resumed.Paused {
		t.Fatalf("QueueResume: %+v %v", resumed, err)
	}
	if _, err := client.Lease(ctx, queue, LeaseRequest{WorkerID: "go-" + queue}); err != nil {
		t.Fatal(err)
	}
	workers, err := client.Workers(ctx)
	if err != nil || !containsFunc(workers, func(w WorkerInfo) bool { return w.WorkerID == "go-"+queue && w.Jobs == 1 }) {
		t.Fatalf("Workers: %+v %v", workers, err)
	}
	page, err := client.Queues(ctx, PageFilter{Limit: 100})
	if err != nil || !containsFunc(page.Queues, func(q QueueStats) bool { return q.Queue == queue }) {
		t.Fatalf("Queues: %+v %v", page, err)
	}
	limit, err := client.RateLimitSet(ctx, "go-api", 5, 2*time.Second)
	if err != nil || limit.Limit != 5 || limit.PerSecs != 2 {
		t.Fatalf("RateLimitSet: %+v %v", limit, err)
	}
	if got, err := client.RateLimitGet(ctx, "go-api"); err != nil || got.Name != "go-api" {
		t.Fatalf("RateLimitGet: %+v %v", got, err)
	}
	if all, err := client.RateLimitsList(ctx); err != nil || !containsFunc(all, func(r RateLimit) bool { return r.Name == "go-api" }) {
		t.Fatalf("RateLimitsList: %+v %v", all, err)
	}
	if err := client.RateLimitDelete(ctx, "go-api"); err != nil {
		t.Fatal(err)
	}
	var api *APIError
	if _, err := client.RateLimitGet(ctx, "go-api"); !errors.As(err, &api) || api.Status != 404 {
		t.Fatalf("a deleted rate limit is a 404, not %v", err)
	}
}

func containsFunc[T any](items []T, match func(T) bool) bool {
	for _, item := range items {
		if match(item) {
			return true
		}
	}
	return false
}

func TestSchedulesAndWorkflows(t *testing.T) {
	ctx, client, queue := context.Background(), newClient(t), queueOf(t)
	name := "go-" + queue
	schedule, err := client.ScheduleSet(ctx, name, ScheduleRequest{
		Cron: "0 3 * * *", Timezone: "Europe/Paris",
		Job: EnqueueRequest{Kind: "nightly", Payload: map[string]int{"n": 1}, Config: &JobConfig{Queue: queue}},
	})
	if err != nil || schedule.Name != name || schedule.Timezone != "Europe/Paris" || schedule.NextRunAt == nil {
		t.Fatalf("ScheduleSet: %+v %v", schedule, err)
	}
	if got, err := client.ScheduleGet(ctx, name); err != nil || got.Cron != "0 3 * * *" {
		t.Fatalf("ScheduleGet: %+v %v", got, err)
	}
	if paused, err := client.SchedulePause(ctx, name); err != nil || !paused.Paused {
		t.Fatalf("SchedulePause: %+v %v", paused, err)
	}
	if resumed, err := client.ScheduleResume(ctx, name); err != nil || resumed.Paused {
		t.Fatalf("ScheduleResume: %+v %v", resumed, err)
	}
	triggered, err := client.ScheduleTrigger(ctx, name)
	if err != nil || triggered.Job.Kind != "nightly" || *triggered.Job.Schedule != name {
		t.Fatalf("ScheduleTrigger: %+v %v", triggered, err)
	}
	if page, err := client.SchedulesList(ctx, PageFilter{}); err != nil || !containsFunc(page.Schedules, func(s Schedule) bool { return s.Name == name }) {
		t.Fatalf("SchedulesList: %+v %v", page, err)
	}
	if err := client.ScheduleDelete(ctx, name); err != nil {
		t.Fatal(err)
	}
	var api *APIError
	if _, err := client.ScheduleSet(ctx, name, ScheduleRequest{Cron: "not a cron", Job: EnqueueRequest{Kind: "k"}}); !errors.As(err, &api) || api.Status != 422 || !strings.Contains(api.Message, "cron") {
		t.Fatalf("a bad cron is a 422 naming it, not %v", err)
	}

	workflow, err := client.WorkflowCreate(ctx, "go-flow", []WorkflowStepRequest{
		{Name: "a", Kind: "first"},
		{Name: "b", Kind: "second", DependsOn: []string{"a"}},
	}, map[string]string{"who": "go"})
	if err != nil || workflow.Status != "running" || len(workflow.Steps) != 2 || string(workflow.Context) != `{"who":"go"}` {
		t.Fatalf("WorkflowCreate: %+v %v", workflow, err)
	}
	if got, err := client.WorkflowGet(ctx, workflow.ID); err != nil || got.Steps[0].JobID == nil || got.Steps[1].Status != "waiting" {
		t.Fatalf("WorkflowGet: %+v %v", got, err)
	}
	if page, err := client.WorkflowsList(ctx, "running", PageFilter{}); err != nil || !containsFunc(page.Workflows, func(w Workflow) bool { return w.ID == workflow.ID }) {
		t.Fatalf("WorkflowsList: %+v %v", page, err)
	}
	if cancelled, err := client.WorkflowCancel(ctx, workflow.ID); err != nil || cancelled.Status != "cancelled" {
		t.Fatalf("WorkflowCancel: %+v %v", cancelled, err)
	}
	if _, err := client.WorkflowCreate(ctx, "cycle", []WorkflowStepRequest{{Name: "a", Kind: "k", DependsOn: []string{"a"}}}, nil); !errors.As(err, &api) || api.Status != 422 {
		t.Fatalf("a cycle is a 422, not %v", err)
	}
}

func TestErrorAnswers(t *testing.T) {
	ctx, client := context.Background(), newClient(t)
	var api *APIError
	_, err := client.JobGet(ctx, "01a25053-72c4-73af-b8d5-7c27e7190bb4")
	if !errors.As(err, &api) || api.Status != 404 || api.Code != "not_found" {
		t.Fatalf("an unknown job is an APIError 404 not_found, not %#v", err)
	}
	_, err = client.Enqueue(ctx, "bad kind!", nil, nil)
	if !errors.As(err, &api) || api.Status != 422 || !strings.Contains(api.Message, "kind") {
		t.Fatalf("a bad kind is a 422 naming the field, not %v", err)
	}
	stranger, _ := NewClient(serverURL, "nobody-knows-me")
	_, err = stranger.QueueStats(ctx, "default")
	if !errors.As(err, &api) || api.Status != 401 {
		t.Fatalf("an unknown token is a 401, not %v", err)
	}
	// A path parameter is one segment: ".." climbs to no other route.
	if _, err := client.JobGet(ctx, ".."); !errors.As(err, &api) || api.Status != 404 {
		t.Fatalf("JobGet(\"..\") is a 404 of the job route, not %v", err)
	}
	var config *ConfigError
	if _, err := client.JobGet(ctx, ""); !errors.As(err, &config) {
		t.Fatalf("an empty id is a ConfigError, not %v", err)
	}
}

func TestTransportErrorsNameTheCall(t *testing.T) {
	client := closedClient(t)
	err := client.Complete(context.Background(), "job-1", "token", nil)
	var transport *TransportError
	if !errors.As(err, &transport) || transport.Method != "POST" || !strings.HasSuffix(transport.URL, "/api/v1/jobs/job-1/complete") {
		t.Fatalf("a refused connection is a TransportError naming the call, not %#v", err)
	}
	if !strings.Contains(err.Error(), "POST http://127.0.0.1:") || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("the error says what failed where: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := newClient(t).JobGet(ctx, "x"); !errors.As(err, &transport) || !errors.Is(err, context.Canceled) {
		t.Fatalf("a call of a cancelled context is a TransportError wrapping context.Canceled, not %v", err)
	}
}

func TestAnswersThatAreNotQftrios(t *testing.T) {
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte("<html>hello</html>"))
			return
		}
		http.Error(w, "no such page", http.StatusNotFound)
	}))
	defer other.Close()
	client, _ := NewClient(other.URL, token)
	var unexpected *UnexpectedAnswer
	if _, err := client.Health(context.Background()); !errors.As(err, &unexpected) {
		t.Fatalf("a page that is not JSON is an UnexpectedAnswer, not %v", err)
	}
	var api *APIError
	_, err := client.JobGet(context.Background(), "x")
	if !errors.As(err, &api) || api.Status != 404 || api.Code != "" || api.Message != "no such page" {
		t.Fatalf("another server's short 404 text is passed on: %#v", err)
	}
}

func TestNewClientRefusesWhatCannotWork(t *testing.T) {
	for _, url := range []string{"", "127.0.0.1:8000", "ftp://host", "http://host/?q=1", "http://user:pw@host"} {
		var config *ConfigError
		if _, err := NewClient(url, token); !errors.As(err, &config) {
			t.Errorf("NewClient(%q) is a ConfigError, not %v", url, err)
		}
	}
	var config *ConfigError
	if _, err := NewClient("http://host", "se\ncret"); !errors.As(err, &config) || strings.Contains(err.Error(), "cret") {
		t.Errorf("a token that cannot be a header is a ConfigError that does not show it, not %v", err)
	}
	client, err := NewClient("http://host:1/base/", "")
	if err != nil || client.URL != "http://host:1/base" {
		t.Errorf("a trailing slash is dropped: %v %v", client, err)
	}
}
