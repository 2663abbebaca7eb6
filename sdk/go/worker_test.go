package qftrio

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder keeps a worker's events for a test to wait on.
type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) add(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// wait returns the first event that match holds for, waiting for it (the
// cap only turns a hang into a failure).
func (r *recorder) wait(t *testing.T, match func(Event) bool) Event {
	t.Helper()
	until := time.Now().Add(cap)
	for {
		r.mu.Lock()
		for _, e := range r.events {
			if match(e) {
				r.mu.Unlock()
				return e
			}
		}
		r.mu.Unlock()
		if time.Now().After(until) {
			t.Fatalf("no such event after %s: %+v", cap, r.events)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func typed(t EventType, jobID string) func(Event) bool {
	return func(e Event) bool { return e.Type == t && (jobID == "" || e.JobID == jobID) }
}

// running is a worker of the test's, run in a goroutine: stop drains it and
// answers what Run returned.
type running struct {
	events *recorder
	cancel context.CancelFunc
	done   chan error
}

func startWorker(t *testing.T, queue string, handlers map[string]Handler, opts Options) *running {
	t.Helper()
	r := &running{events: &recorder{}, done: make(chan error, 1)}
	opts.OnEvent = r.events.add
	if opts.Client == nil {
		opts.Client = newClient(t)
	}
	if opts.WaitSecs == 0 {
		opts.WaitSecs = 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- Run(ctx, queue, handlers, opts) }()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r
}

func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(cap):
		t.Fatalf("Run did not return within %s of its context's end", cap)
		return nil
	}
}

func enqueue(t *testing.T, kind, queue string, payload any, config JobConfig) *Job {
	t.Helper()
	config.Queue = queue
	job, err := newClient(t).Enqueue(context.Background(), kind, payload, &config)
	if err != nil {
		t.Fatal(err)
	}
	return job
}

// noWorkerGoroutines fails unless, Run having returned, every goroutine it
// started has ended (a goroutine past its last deferred call may still be
// ending: it is given the time to).
func noWorkerGoroutines(t *testing.T) {
	t.Helper()
	until := time.Now().Add(cap)
	for left := workerGoroutines(); len(left) > 0; left = workerGoroutines() {
		if time.Now().After(until) {
			t.Fatalf("goroutines of the worker outlive Run:\n%s", strings.Join(left, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// workerGoroutines are the goroutines running the worker's code.
func workerGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var found []string
	for _, stack := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(stack, "sdk/go.(*worker)") {
			found = append(found, stack)
		}
	}
	return found
}

func TestRunReportsEachOutcome(t *testing.T) {
	queue := queueOf(t)
	handlers := map[string]Handler{
		"ok":        func(ctx context.Context, job *Job) (any, error) { return map[string]int{"attempt": job.Attempt}, nil },
		"nothing":   func(ctx context.Context, job *Job) (any, error) { return nil, nil },
		"boom":      func(ctx context.Context, job *Job) (any, error) { return nil, errors.New("bad size") },
		"permanent": func(ctx context.Context, job *Job) (any, error) { return nil, Permanent(errors.New("never")) },
		"retry-in":  func(ctx context.Context, job *Job) (any, error) { return nil, RetryIn(time.Hour, errors.New("later")) },
		"snooze":    func(ctx context.Context, job *Job) (any, error) { return nil, Snooze(time.Hour) },
		"array":     func(ctx context.Context, job *Job) (any, error) { return []int{1}, nil },
		"panic":     func(ctx context.Context, job *Job) (any, error) { panic("oops") },
	}
	jobs := map[string]*Job{}
	for _, kind := range []string{"ok", "nothing", "boom", "permanent", "retry-in", "snooze", "array", "panic", "unregistered"} {
		jobs[kind] = enqueue(t, kind, queue, nil, JobConfig{MaxAttempts: ptr(2)})
	}
	w := startWorker(t, queue, handlers, Options{Lanes: 4})
	client := newClient(t)
	check := func(kind string, status Status, errorText string) *Job {
		t.Helper()
		job := waitJob(t, client, jobs[kind].ID, func(j *Job) bool { return j.Attempt == 1 && j.Status != StatusRunning })
		if job.Status != status || (errorText != "" && (job.Error == nil || !strings.Contains(*job.Error, errorText))) {
			t.Errorf("%s: %s %v, expected %s %q", kind, job.Status, job.Error, status, errorText)
		}
		return job
	}
	if job := check("ok", StatusCompleted, ""); string(job.Result) != `{"attempt":1}` {
		t.Errorf("ok's result: %s", job.Result)
	}
	if job := check("nothing", StatusCompleted, ""); string(job.Result) != `{}` {
		t.Errorf("nothing's result: %s", job.Result)
	}
	check("boom", StatusPending, "bad size")
	check("permanent", StatusFailed, "never")
	if job := check("retry-in", StatusPending, "later"); job.ScheduledAt.Before(time.Now().Add(50 * time.Minute)) {
		t.Errorf("RetryIn(1h) runs again at %s", job.ScheduledAt)
	}
	if job := check("snooze", StatusPending, ""); job.MaxAttempts != 3 || job.Error != nil {
		t.Errorf("a snooze uses up no attempt: %+v", job)
	}
	check("array", StatusFailed, "expected a value that is a JSON object")
	check("panic", StatusPending, "panic: oops")
	check("unregistered", StatusFailed, `no handler for kind "unregistered"`)
	w.events.wait(t, typed(EventFailed, jobs["permanent"].ID))
	if e := w.events.wait(t, typed(EventSnoozed, jobs["snooze"].ID)); e.Delay != time.Hour {
		t.Errorf("the snoozed event's delay: %s", e.Delay)
	}
	if err := w.stop(t); err != nil {
		t.Fatalf("a drained Run returns nil, not %v", err)
	}
}

func TestCancelledJobCancelsItsContext(t *testing.T) {
	queue := queueOf(t)
	causes := make(chan error, 1)
	handlers := map[string]Handler{"wait": func(ctx context.Context, job *Job) (any, error) {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return map[string]string{"too": "late"}, nil
	}}
	job := enqueue(t, "wait", queue, nil, JobConfig{})
	// Renewals every second: the cancel is seen within one.
	w := startWorker(t, queue, handlers, Options{LeaseSecs: 2})
	w.events.wait(t, typed(EventClaimed, job.ID))
	if _, err := newClient(t).JobCancel(context.Background(), job.ID); err != nil {
		t.Fatal(err)
	}
	if cause := <-causes; cause == nil || !strings.Contains(cause.Error(), "cancelled") {
		t.Errorf("the handler's context's cause: %v", cause)
	}
	w.events.wait(t, typed(EventLost, job.ID))
	if got := waitJob(t, newClient(t), job.ID, terminal); got.Status != StatusCancelled || got.Result != nil {
		t.Errorf("a cancelled job's outcome is never overwritten: %+v", got)
	}
}

func TestTimeoutCancelsTheHandler(t *testing.T) {
	queue := queueOf(t)
	causes := make(chan error, 1)
	handlers := map[string]Handler{"wait": func(ctx context.Context, job *Job) (any, error) {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, ctx.Err()
	}}
	job := enqueue(t, "wait", queue, nil, JobConfig{TimeoutSecs: ptr(1), MaxAttempts: ptr(1)})
	startWorker(t, queue, handlers, Options{})
	if cause := <-causes; !errors.Is(cause, errTimedOut) {
		t.Errorf("the handler's context's cause: %v", cause)
	}
	got := waitJob(t, newClient(t), job.ID, terminal)
	if got.Status != StatusFailed || got.Error == nil || *got.Error != "timed out after 1 s" {
		t.Errorf("a job past its timeout_secs: %s %v", got.Status, got.Error)
	}
}

func TestDrainFinishesHeldJobsAndLeasesNothing(t *testing.T) {
	queue := queueOf(t)
	release := make(chan struct{})
	ctxErrs := make(chan error, 2)
	handlers := map[string]Handler{"hold": func(ctx context.Context, job *Job) (any, error) {
		<-release
		ctxErrs <- ctx.Err()
		return map[string]bool{"held": true}, nil
	}}
	held := enqueue(t, "hold", queue, nil, JobConfig{})
	w := startWorker(t, queue, handlers, Options{Lanes: 2})
	w.events.wait(t, typed(EventClaimed, held.ID))
	w.cancel()
	// stopping is said once leasing has stopped.
	w.events.wait(t, typed(EventStopping, ""))
	later := enqueue(t, "hold", queue, nil, JobConfig{})
	select {
	case err := <-w.done:
		t.Fatalf("Run returned (%v) while a handler was running", err)
	default:
	}
	close(release)
	if err := w.stop(t); err != nil {
		t.Fatalf("a drained Run returns nil, not %v", err)
	}
	if err := <-ctxErrs; err != nil {
		t.Errorf("a drain leaves the handlers' contexts alone: %v", err)
	}
	client := newClient(t)
	if got, _ := client.JobGet(context.Background(), held.ID); got.Status != StatusCompleted {
		t.Errorf("the held job is finished and reported: %s", got.Status)
	}
	if got, _ := client.JobGet(context.Background(), later.ID); got.Status != StatusPending || got.Attempt != 0 {
		t.Errorf("nothing is leased after a drain: %s attempt %d", got.Status, got.Attempt)
	}
	noWorkerGoroutines(t)
}

func TestUnauthorizedEndsRun(t *testing.T) {
	client, _ := NewClient(serverURL, "nobody-knows-me")
	handlers := map[string]Handler{"k": func(ctx context.Context, job *Job) (any, error) { return nil, nil }}
	err := Run(context.Background(), queueOf(t), handlers, Options{Client: client})
	var api *APIError
	if !errors.As(err, &api) || api.Status != 401 {
		t.Fatalf("a 401 ends Run with it, not %v", err)
	}
	noWorkerGoroutines(t)
}

func TestLeaseCallsBackOffOnTransportErrors(t *testing.T) {
	client := closedClient(t)
	handlers := map[string]Handler{"k": func(ctx context.Context, job *Job) (any, error) { return nil, nil }}
	w := startWorker(t, queueOf(t), handlers, Options{Client: client})
	first := w.events.wait(t, typed(EventWaiting, ""))
	if first.Delay < 250*time.Millisecond || first.Delay > 500*time.Millisecond || !strings.Contains(first.Error, "/lease") {
		t.Errorf("the first back-off is 0.25-0.5 s and names the call: %+v", first)
	}
	if err := w.stop(t); err != nil {
		t.Fatalf("a drain while the server is away returns nil, not %v", err)
	}
}

func TestRunRefusesBadOptions(t *testing.T) {
	ok := map[string]Handler{"k": func(ctx context.Context, job *Job) (any, error) { return nil, nil }}
	cases := map[string]struct {
		queue    string
		handlers map[string]Handler
		opts     Options
	}{
		"no kind":     {"q", map[string]Handler{}, Options{Token: token}},
		"bad kind":    {"q", map[string]Handler{"a b": ok["k"]}, Options{Token: token}},
		"nil handler": {"q", map[string]Handler{"k": nil}, Options{Token: token}},
		"bad queue":   {"q/1", ok, Options{Token: token}},
		"no token":    {"q", ok, Options{}},
		"lanes":       {"q", ok, Options{Token: token, Lanes: -1}},
		"lease":       {"q", ok, Options{Token: token, LeaseSecs: 3601}},
		"wait":        {"q", ok, Options{Token: token, WaitSecs: 61}},
		"both":        {"q", ok, Options{Token: token, Client: newClient(t)}},
		"url":         {"q", ok, Options{Token: token, URL: "localhost"}},
	}
	for name, c := range cases {
		var config *ConfigError
		if err := Run(context.Background(), c.queue, c.handlers, c.opts); !errors.As(err, &config) {
			t.Errorf("%s: a ConfigError, not %v", name, err)
		}
	}
}

func TestProgressGoesWithAHeartbeat(t *testing.T) {
	queue := queueOf(t)
	client := newClient(t)
	errs := make(chan error, 3)
	handlers := map[string]Handler{"report": func(ctx context.Context, job *Job) (any, error) {
		errs <- job.Progress([]int{1})
		errs <- job.Progress(map[string]string{"big": strings.Repeat("x", maxProgress)})
		if err := job.Progress(map[string]int{"page": 1}); err != nil {
			return nil, err
		}
		errs <- job.Progress(map[string]int{"page": 3}) // the latest wins
		// The job runs until its progress is on the server: a lease of 60 s
		// renews after 30, so the progress went on a heartbeat of its own.
		waitJob(t, client, job.ID, func(j *Job) bool { return j.LastProgress != nil })
		return nil, nil
	}}
	job := enqueue(t, "report", queue, nil, JobConfig{})
	startWorker(t, queue, handlers, Options{})
	if err := <-errs; err == nil || !strings.Contains(err.Error(), "JSON object") {
		t.Errorf("a progress that is not an object is refused: %v", err)
	}
	if err := <-errs; err == nil || !strings.Contains(err.Error(), "8192") {
		t.Errorf("a progress over 8 KiB is refused: %v", err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	got := waitJob(t, client, job.ID, terminal)
	if got.Status != StatusCompleted || string(got.LastProgress) != `{"page":3}` || got.ProgressAt == nil {
		t.Errorf("the job's progress: %s %s at %v", got.Status, got.LastProgress, got.ProgressAt)
	}
}
