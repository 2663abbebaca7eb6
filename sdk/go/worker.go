package qftrio

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// The worker runtime: lease jobs, run their handlers, heartbeat, report. It
// keeps the rules of the Python runtime (docs/worker.md):
//
//   - Lanes: a handler runs in a lane, one job per lane. A lease asks for as
//     many jobs as there are free lanes (at most 100), only while one is free.
//   - One heartbeat scheduler renews every held job every LeaseSecs/2 from its
//     claim, the jobs due together in one batch call. A 409, a 404 or a status
//     other than running cancels the job's context and nothing is reported
//     (lost). When renewals keep failing and the lease is about to end, the
//     context is cancelled and a retryable fail is attempted.
//   - Reports (complete, fail, snooze) go in batch calls, retried with backoff
//     until the lease ends, then given up (unreported): the job runs again later.
//   - Lease calls back off with jitter on transport errors and 5xx answers
//     (waiting), forever; answers that never change (401/403, a refused
//     request, an answer that is not qftrio's) stop the worker with that error.
//   - Cancelling Run's context drains: nothing more is leased, the held jobs
//     finish and are reported, and Run returns once every goroutine it started
//     has ended.

// Handler runs one job. Its result (a value that marshals to a JSON object,
// or nil for {}) completes the job; an error fails it, retryably unless it is
// Permanent(err); Snooze(d) puts the job back for d without using up its
// attempt; RetryIn(d, err) fails it with a chosen delay. ctx is cancelled
// when the job is no longer this worker's (cancelled, lease lost), its lease
// is about to end, or its timeout_secs have passed: return then.
type Handler func(ctx context.Context, job *Job) (any, error)

// EventType names what a worker did.
type EventType string

const (
	EventClaimed    EventType = "claimed"    // a job was leased
	EventCompleted  EventType = "completed"  // its completion landed
	EventFailed     EventType = "failed"     // its failure landed (Retryable says which kind)
	EventSnoozed    EventType = "snoozed"    // its snooze landed; it runs again in Delay
	EventLost       EventType = "lost"       // the server took it back; nothing was reported
	EventUnreported EventType = "unreported" // its report could not land before the lease ran out
	EventWaiting    EventType = "waiting"    // a lease call failed; the next is in Delay
	EventStopping   EventType = "stopping"   // draining, or stopping on an error (Error says which)
)

// Event is something the worker did, for logs and dashboards.
type Event struct {
	Type EventType
	// The job's, when the event is about one.
	JobID   string
	Kind    string
	Attempt int
	Lane    int
	// What went wrong, in words (for stopping: what happens to held jobs).
	Error string
	// For failed: whether the job will be retried (attempts permitting).
	Retryable bool
	// For waiting: until the next lease call; for snoozed and the failed of a
	// RetryIn: until the job runs again.
	Delay time.Duration
}

// Options are a worker's settings. Zero fields take the defaults.
type Options struct {
	// Client is a client with the worker token; or give URL and Token.
	Client *Client
	// URL is the server's, default http://127.0.0.1:8000.
	URL string
	// Token is the worker token (any token of a --dev server).
	Token string
	// Lanes is how many jobs run at once; default 10.
	Lanes int
	// LeaseSecs is the lease asked for and each renewal's extension (1..3600,
	// default 60): a crashed worker's jobs wait up to this long.
	LeaseSecs int
	// WaitSecs is the long poll of each lease call (1..60, default 20); a
	// negative value leases without waiting.
	WaitSecs int
	// WorkerID is recorded on every job it holds; default host-pid.
	WorkerID string
	// OnEvent is called with every event, one call at a time, from the
	// worker's goroutines. It must not block; a panic in it is ignored.
	OnEvent func(Event)
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

const (
	defaultURL    = "http://127.0.0.1:8000"
	maxLeaseJobs  = 100
	maxBatch      = 1000
	maxWorkerID   = 200
	maxErrorChars = 65536
	maxProgress   = 8192
	// Time allowed between the server's claim and our reading its answer:
	// the lease is reckoned from then.
	claimSlack = 100 * time.Millisecond
	// Reports and renewals falling due within this long go together.
	coalesce = 5 * time.Millisecond
	// A progress report waits this long for later ones to replace it, so that
	// a handler reporting in a tight loop sends a few a second, the latest.
	progressDelay = 200 * time.Millisecond
)

// Backoff of retried calls: about base first, doubling up to limit, each wait
// scaled by a random factor in [0.5, 1] so that a fleet does not retry in lockstep.
type backoffRule struct{ base, limit time.Duration }

var (
	leaseBackoff  = backoffRule{500 * time.Millisecond, 15 * time.Second}
	reportBackoff = backoffRule{250 * time.Millisecond, 5 * time.Second}
)

func (b backoffRule) delay(failures int) time.Duration {
	d := math.Min(float64(b.limit), float64(b.base)*math.Pow(2, float64(max(0, failures-1))))
	return time.Duration(d * (0.5 + 0.5*rand.Float64()))
}

var (
	errTimedOut = errors.New("the job's timeout_secs have passed")
	errExpiring = errors.New("the lease is about to expire: heartbeats failed")
)

// isFatal: the server will refuse the credential, or is not qftrio: stop.
func isFatal(err error) bool {
	var api *APIError
	var unexpected *UnexpectedAnswer
	var config *ConfigError
	return (errors.As(err, &api) && (api.Status == 401 || api.Status == 403)) ||
		errors.As(err, &unexpected) || errors.As(err, &config)
}

// isRefusal: the server refused the request itself: sending it again cannot help.
func isRefusal(err error) bool {
	var api *APIError
	return errors.As(err, &api) && (api.Status == 400 || api.Status == 413 || api.Status == 422)
}

// passing: answers to a lease call that a later call may not get: ridden out.
func passing(err error) bool {
	var api *APIError
	if errors.As(err, &api) {
		return slices.Contains([]int{408, 429, 500, 502, 503, 504}, api.Status)
	}
	var transport *TransportError
	return errors.As(err, &transport)
}

func truncateError(text string) string {
	if len(text) <= maxErrorChars {
		return text
	}
	note := fmt.Sprintf("\n[truncated: %d characters in all]", len(text))
	cut := maxErrorChars - len(note)
	for cut > 0 && !utf8Start(text[cut]) {
		cut--
	}
	return text[:cut] + note
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// outcome is how a job's attempt ended, as reported.
type outcome struct {
	report    string          // "complete", "fail" or "snooze"
	result    json.RawMessage // complete
	err       string          // fail
	retryable bool            // fail
	again     *time.Duration  // snooze, or the retry of a RetryIn
}

// held is one leased job, from claim to report. Its fields but job, token
// and lane are the worker's mutex's.
type held struct {
	job       *Job
	token     string
	lane      int
	deadline  time.Time // when our lease ends, by our own reckoning
	nextBeat  time.Time // when its next renewal falls due
	cancel    context.CancelCauseFunc
	beating   bool   // renewed until its handler is done, or it is given up
	inCall    bool   // a renewal of it is in flight
	expiring  bool   // cancelled because renewals failed and the lease is ending
	failures  int    // renewals failed in a row
	lost      string // why the server took it back: nothing is reported
	lastError string // of the last renewal that failed
	progress  any    // the latest progress not yet sent, nil for none
	progSeq   int    // counts Progress calls, so that a renewal clears only what it sent
}

type worker struct {
	client   *Client
	queue    string
	handlers map[string]Handler
	opts     Options
	lanes    int
	lease    time.Duration
	waitSecs float64
	workerID string
	margin   time.Duration

	// bg is every job's, renewal's and report's context: not Run's, which
	// only drains, but cancelled when the worker dies.
	bg          context.Context
	kill        context.CancelCauseFunc
	leaseCtx    context.Context // Run's, also cancelled when the worker dies
	stopLeasing context.CancelCauseFunc

	wg        sync.WaitGroup // the scheduler, the reporter, and each renewal and report call
	running   sync.WaitGroup // the handlers, one goroutine each
	emitMu    sync.Mutex
	reports   chan report
	kick      chan struct{} // wakes the heartbeat scheduler
	laneFreed chan struct{} // wakes the lease loop
	quit      chan struct{} // ends the heartbeat scheduler

	mu        sync.Mutex
	held      map[string]*held
	freeLanes []int
	busy      int
	fatal     error
}

type report struct {
	h *held
	o outcome
}

func validate(queue string, handlers map[string]Handler, opts Options) error {
	if !namePattern.MatchString(queue) {
		return configErrorf("queue %q: use 1-128 characters of A-Z a-z 0-9 _ . -", queue)
	}
	if len(handlers) == 0 {
		return configErrorf("handlers names no kind: the worker would fail every job it leases")
	}
	for kind, handler := range handlers {
		if !namePattern.MatchString(kind) {
			return configErrorf("handlers: kind %q: use 1-128 characters of A-Z a-z 0-9 _ . -", kind)
		}
		if handler == nil {
			return configErrorf("handlers: the handler of %q is nil", kind)
		}
	}
	if opts.Lanes < 0 {
		return configErrorf("Lanes must be positive, not %d", opts.Lanes)
	}
	if opts.LeaseSecs < 0 || opts.LeaseSecs > 3600 {
		return configErrorf("LeaseSecs must be from 1 to 3600, not %d", opts.LeaseSecs)
	}
	if opts.WaitSecs > 60 {
		return configErrorf("WaitSecs must be at most 60, not %d", opts.WaitSecs)
	}
	if len(opts.WorkerID) > maxWorkerID {
		return configErrorf("WorkerID must be at most %d characters", maxWorkerID)
	}
	if opts.Client != nil && (opts.URL != "" || opts.Token != "") {
		return configErrorf("give either Client, or URL and Token, not both")
	}
	if opts.Client == nil && opts.Token == "" {
		return configErrorf("Token: a worker needs the worker token (any token of a --dev server)")
	}
	return nil
}

// Run runs handlers (by job kind) for the jobs leased from queue until ctx is
// cancelled, which drains (nothing more is leased, held jobs finish and are
// reported), or an error that would never change stops it. It returns once
// every goroutine it started has ended, every handler included: a handler
// that ignores its ctx keeps Run waiting.
//
// It returns nil after a drain, a *ConfigError at once for bad options, an
// *APIError (401/403, a lease request the server refuses) or an
// *UnexpectedAnswer (not a qftrio server) when the server makes working
// impossible.
func Run(ctx context.Context, queue string, handlers map[string]Handler, opts Options) error {
	if err := validate(queue, handlers, opts); err != nil {
		return err
	}
	client := opts.Client
	if client == nil {
		url := opts.URL
		if url == "" {
			url = defaultURL
		}
		var err error
		if client, err = NewClient(url, opts.Token); err != nil {
			return err
		}
	}
	w := &worker{
		client:    client,
		queue:     queue,
		handlers:  copyHandlers(handlers),
		opts:      opts,
		lanes:     orDefault(opts.Lanes, 10),
		lease:     time.Duration(orDefault(opts.LeaseSecs, 60)) * time.Second,
		waitSecs:  float64(orDefault(opts.WaitSecs, 20)),
		workerID:  opts.WorkerID,
		reports:   make(chan report),
		kick:      make(chan struct{}, 1),
		laneFreed: make(chan struct{}, 1),
		quit:      make(chan struct{}),
		held:      map[string]*held{},
	}
	if opts.WaitSecs < 0 {
		w.waitSecs = 0
	}
	if w.workerID == "" {
		host, _ := os.Hostname()
		w.workerID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	w.margin = min(5*time.Second, w.lease/5)
	for lane := 1; lane <= w.lanes; lane++ {
		w.freeLanes = append(w.freeLanes, lane)
	}
	w.bg, w.kill = context.WithCancelCause(context.WithoutCancel(ctx))
	w.leaseCtx, w.stopLeasing = context.WithCancelCause(ctx)
	defer w.kill(nil)
	defer w.stopLeasing(nil)
	return w.run()
}

func copyHandlers(handlers map[string]Handler) map[string]Handler {
	copied := make(map[string]Handler, len(handlers))
	for kind, handler := range handlers {
		copied[kind] = handler
	}
	return copied
}

func orDefault(value, fallback int) int {
	if value == 0 {
		return fallback
	}
	return value
}

func (w *worker) run() error {
	w.wg.Add(2)
	go w.beatLoop()
	go w.reportLoop()
	w.leaseLoop()
	w.mu.Lock()
	fatal, n := w.fatal, len(w.held)
	w.mu.Unlock()
	if fatal == nil {
		w.emit(Event{Type: EventStopping, Error: fmt.Sprintf("finishing %d held job(s)", n)})
	}
	// Leasing has stopped: the held jobs finish and report, then the rest ends.
	w.running.Wait()
	close(w.reports)
	close(w.quit)
	w.wg.Wait()
	return w.fatal
}

// die stops everything because of err, which Run returns: every handler's
// context is cancelled and nothing more is reported.
func (w *worker) die(err error) {
	w.mu.Lock()
	first := w.fatal == nil
	if first {
		w.fatal = err
	}
	n := len(w.held)
	w.mu.Unlock()
	if first {
		w.emit(Event{Type: EventStopping, Error: fmt.Sprintf("%v: abandoning %d held job(s)", err, n)})
		w.stopLeasing(err)
		w.kill(err)
	}
}

func (w *worker) emit(event Event) {
	if w.opts.OnEvent == nil {
		return
	}
	w.emitMu.Lock()
	defer w.emitMu.Unlock()
	defer func() { _ = recover() }() // a listener's failure is not the worker's
	w.opts.OnEvent(event)
}

func (w *worker) jobEvent(t EventType, h *held, e Event) {
	e.Type, e.JobID, e.Kind, e.Attempt, e.Lane = t, h.job.ID, h.job.Kind, h.job.Attempt, h.lane
	w.emit(e)
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (w *worker) forget(h *held) {
	w.mu.Lock()
	delete(w.held, h.token)
	w.mu.Unlock()
	wake(w.kick)
	wake(w.laneFreed)
}

// pause waits d, or less if leasing stops meanwhile.
func (w *worker) pause(d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-w.leaseCtx.Done():
	}
}

// --- leasing --------------------------------------------------------------------

func (w *worker) leaseLoop() {
	most := min(maxLeaseJobs, w.lanes)
	failures := 0
	for w.leaseCtx.Err() == nil {
		w.mu.Lock()
		free := w.lanes - w.busy
		// Jobs whose handler is done count as gone (their reports travel in
		// the background); the second bound keeps lagging reports from
		// piling up without end.
		full := free <= 0 || len(w.held) >= w.lanes+2*most
		w.mu.Unlock()
		if full {
			select {
			case <-w.laneFreed:
			case <-w.leaseCtx.Done():
			}
			continue
		}
		sentAt := time.Now()
		request := LeaseRequest{MaxJobs: min(maxLeaseJobs, free), LeaseSecs: int(w.lease / time.Second), WaitSecs: w.waitSecs, WorkerID: w.workerID}
		leases, err := w.client.Lease(w.leaseCtx, w.queue, request)
		if w.leaseCtx.Err() != nil {
			// The long poll, abandoned by a drain: a job the server claimed
			// for it at that moment runs elsewhere once its lease expires.
			return
		}
		if err != nil {
			if isFatal(err) || !passing(err) {
				// A 404 here means no qftrio worker route at this URL.
				w.die(err)
				return
			}
			failures++
			delay := leaseBackoff.delay(failures)
			w.emit(Event{Type: EventWaiting, Error: oneLine(err.Error(), 200), Delay: delay})
			w.pause(delay)
			continue
		}
		failures = 0
		now := time.Now()
		if len(leases) == 0 && w.waitSecs > 0 && now.Sub(sentAt) < time.Duration(min(w.waitSecs, 1)*float64(time.Second/2)) {
			// An empty answer that did not wait: a server shutting down answers
			// long polls at once. Do not spin on it.
			w.pause(leaseBackoff.delay(1))
			continue
		}
		// A long poll may have waited long before anything came: the claim
		// was just before the answer, not when we asked.
		claimed := now.Add(-claimSlack)
		if claimed.Before(sentAt) {
			claimed = sentAt
		}
		for i := range leases {
			w.start(&leases[i], claimed)
		}
		wake(w.kick)
	}
}

func (w *worker) start(lease *Lease, claimed time.Time) {
	job := &lease.Job
	h := &held{job: job, token: lease.LeaseToken, deadline: claimed.Add(w.lease), nextBeat: claimed.Add(w.lease / 2), beating: true}
	ctx, cancel := context.WithCancelCause(w.bg)
	h.cancel = cancel
	stopTimeout := context.CancelFunc(func() {})
	if job.TimeoutSecs != nil {
		// The server ends the attempt then, whatever the worker holds.
		ctx, stopTimeout = context.WithDeadlineCause(ctx, claimed.Add(time.Duration(*job.TimeoutSecs)*time.Second), errTimedOut)
	}
	job.progress = func(v any) error { return w.setProgress(h, v) }
	job.addSteps = func(ctx context.Context, steps []WorkflowStepRequest, collect string) (*Workflow, error) {
		return w.addSteps(ctx, h, steps, collect)
	}
	w.mu.Lock()
	sort.Ints(w.freeLanes)
	h.lane, w.freeLanes = w.freeLanes[0], w.freeLanes[1:]
	w.busy++
	w.held[h.token] = h
	w.mu.Unlock()
	w.jobEvent(EventClaimed, h, Event{})
	w.running.Add(1)
	go func() {
		defer w.running.Done()
		o := w.execute(ctx, h)
		stopTimeout()
		cancel(nil)
		w.finished(h, o)
	}()
}

// --- one job ----------------------------------------------------------------------

func (w *worker) execute(ctx context.Context, h *held) outcome {
	job := h.job
	handler, ok := w.handlers[job.Kind]
	if !ok {
		// The lease has no filter by kind: fail such a job, so that it does
		// not bounce between workers until its attempts run out.
		kinds := make([]string, 0, len(w.handlers))
		for kind := range w.handlers {
			kinds = append(kinds, kind)
		}
		sort.Strings(kinds)
		return outcome{report: "fail", err: fmt.Sprintf("no handler for kind %q on this worker (it handles: %s)", job.Kind, strings.Join(kinds, ", "))}
	}
	result, err := safely(ctx, handler, job)
	if errors.Is(context.Cause(ctx), errTimedOut) {
		return outcome{report: "fail", err: fmt.Sprintf("timed out after %d s", *job.TimeoutSecs), retryable: true}
	}
	if err != nil {
		var permanent *PermanentError
		var snooze *SnoozeError
		var retryIn *RetryInError
		switch {
		case errors.As(err, &permanent):
			return outcome{report: "fail", err: err.Error()}
		case errors.As(err, &snooze):
			return outcome{report: "snooze", again: &snooze.Delay}
		case errors.As(err, &retryIn):
			return outcome{report: "fail", err: err.Error(), retryable: true, again: &retryIn.Delay}
		}
		text := err.Error()
		if text == "" {
			text = fmt.Sprintf("%T", err)
		}
		return outcome{report: "fail", err: text, retryable: true}
	}
	if result == nil {
		return outcome{report: "complete", result: json.RawMessage("{}")}
	}
	data, err := json.Marshal(result)
	if err != nil {
		return outcome{report: "fail", err: fmt.Sprintf("handler result is not JSON: %v", err)}
	}
	if len(data) == 0 || data[0] != '{' {
		return outcome{report: "fail", err: fmt.Sprintf("handler returned %T; expected a value that is a JSON object, or nil", result)}
	}
	return outcome{report: "complete", result: data}
}

// safely runs the handler; a panic fails its job as an error would.
func safely(ctx context.Context, handler Handler, job *Job) (result any, err error) {
	defer func() {
		if p := recover(); p != nil {
			result, err = nil, fmt.Errorf("panic: %v", p)
		}
	}()
	return handler(ctx, job)
}

func (w *worker) finished(h *held, o outcome) {
	w.mu.Lock()
	h.beating = false
	w.busy--
	w.freeLanes = append(w.freeLanes, h.lane)
	dead, lost, expiring, lastError := w.fatal != nil, h.lost, h.expiring, h.lastError
	w.mu.Unlock()
	wake(w.laneFreed)
	switch {
	case dead:
		w.forget(h)
	case lost != "":
		w.jobEvent(EventLost, h, Event{Error: lost})
		w.forget(h)
	default:
		if expiring {
			reason := ""
			if lastError != "" {
				reason = ": " + lastError
			}
			o = outcome{report: "fail", err: "lease about to expire: heartbeats failed" + reason, retryable: true}
		}
		w.reports <- report{h, o}
	}
}

// setProgress keeps v as the job's latest progress, sent with its next
// renewal, at most progressDelay from now.
func (w *worker) setProgress(h *held, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("progress is not JSON: %w", err)
	}
	if len(data) == 0 || data[0] != '{' {
		return fmt.Errorf("progress must be a JSON object, not %T", v)
	}
	if len(data) > maxProgress {
		return fmt.Errorf("progress is %d bytes of JSON; at most %d are kept", len(data), maxProgress)
	}
	w.mu.Lock()
	if h.beating {
		h.progress = json.RawMessage(data)
		h.progSeq++
		if soon := time.Now().Add(progressDelay); h.nextBeat.After(soon) {
			h.nextBeat = soon
		}
	}
	w.mu.Unlock()
	wake(w.kick)
	return nil
}

// Progress reports v (a value that marshals to a JSON object of at most 8
// KiB) as the job's progress: sent with the job's next heartbeat, within a
// second; a later call replaces a value not yet sent. Outside a worker's
// handler it does nothing.
func (j *Job) Progress(v any) error {
	if j.progress == nil {
		return nil
	}
	return j.progress(v)
}

// addSteps sends Job.AddSteps, and sends it again after a transport error
// with the reports' backoff until the lease is about to end (a repeat of a
// landed add changes nothing).
func (w *worker) addSteps(ctx context.Context, h *held, steps []WorkflowStepRequest, collect string) (*Workflow, error) {
	for failures := 1; ; failures++ {
		workflow, err := w.client.StepsAdd(ctx, h.job.ID, h.token, steps, collect)
		var transport *TransportError
		if err == nil || !errors.As(err, &transport) {
			return workflow, err
		}
		w.mu.Lock()
		giveUp := h.deadline.Add(-w.margin)
		w.mu.Unlock()
		delay := reportBackoff.delay(failures)
		if !time.Now().Add(delay).Before(giveUp) {
			return nil, err
		}
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, context.Cause(ctx)
		}
	}
}

// AddSteps adds steps to the workflow of this step (fan-out; at most 1000 a
// call): they run once this job has completed, the steps waiting for it wait
// for them too, and with collect (not "") their results go, in this order, to
// a list under that key of the context (fan-in). It answers the workflow, is
// sent again after transport errors while the lease lasts (a repeat changes
// nothing), and answers the server's *APIError otherwise (409: the lease is
// lost; 422: steps that do not fit). Outside a worker's handler it is an error.
func (j *Job) AddSteps(ctx context.Context, steps []WorkflowStepRequest, collect string) (*Workflow, error) {
	if j.addSteps == nil {
		return nil, errors.New("qftrio: Job.AddSteps adds steps from inside a handler that a worker runs")
	}
	return j.addSteps(ctx, steps, collect)
}

// --- heartbeats ---------------------------------------------------------------------

// beatLoop is the one heartbeat scheduler: it wakes at the first renewal or
// give-up that falls due, and sends the renewals due together in one call.
func (w *worker) beatLoop() {
	defer w.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		var due []*held
		next := now.Add(time.Hour)
		w.mu.Lock()
		for _, h := range w.held {
			if !h.beating {
				continue
			}
			if giveUp := h.deadline.Add(-w.margin); !now.Before(giveUp) {
				// Renewals kept failing and the lease is about to end: stop the
				// handler while there is still time to say so.
				h.beating = false
				h.expiring = true
				h.cancel(errExpiring)
				continue
			} else if giveUp.Before(next) {
				next = giveUp
			}
			if h.inCall {
				continue
			}
			if !h.nextBeat.After(now.Add(coalesce)) {
				h.inCall = true
				due = append(due, h)
			} else if h.nextBeat.Before(next) {
				next = h.nextBeat
			}
		}
		w.mu.Unlock()
		for len(due) > 0 {
			n := min(len(due), maxBatch)
			w.wg.Add(1)
			go w.renew(due[:n])
			due = due[n:]
		}
		timer.Reset(time.Until(next))
		select {
		case <-timer.C:
		case <-w.kick:
		case <-w.quit:
			return
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// renew sends one batch renewal: it extends the leases still ours and
// cancels the handlers of the jobs that are not.
func (w *worker) renew(due []*held) {
	defer w.wg.Done()
	defer wake(w.kick)
	sentAt := time.Now()
	items := make([]HeartbeatItem, len(due))
	sent := make([]int, len(due))
	w.mu.Lock()
	for i, h := range due {
		items[i] = HeartbeatItem{ID: h.job.ID, LeaseToken: h.token, ExtendSecs: int(w.lease / time.Second), Progress: h.progress}
		sent[i] = h.progSeq
	}
	w.mu.Unlock()
	replies, err := w.client.HeartbeatMany(w.bg, items)
	if err == nil && len(replies) != len(items) {
		err = &UnexpectedAnswer{Method: "POST", URL: w.client.URL + routes["heartbeatMany"].path, Detail: "the answer has not one result per item"}
	}
	if err != nil && isFatal(err) {
		w.die(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, h := range due {
		h.inCall = false
	}
	if w.bg.Err() != nil {
		return
	}
	if err != nil {
		text := oneLine(err.Error(), 200)
		now := time.Now()
		for i, h := range due {
			if isRefusal(err) && items[i].Progress != nil {
				// The server refuses the progress (one it does not take):
				// drop it, so that the renewal itself lands.
				if h.progSeq == sent[i] {
					h.progress = nil
				}
				h.nextBeat = now
				continue
			}
			h.failures++
			h.lastError = text
			h.nextBeat = now.Add(reportBackoff.delay(h.failures))
		}
		return
	}
	for i, h := range due {
		reply := replies[i]
		if reply.Code == 200 && reply.Status != nil && *reply.Status == StatusRunning {
			h.deadline = sentAt.Add(w.lease)
			h.nextBeat = sentAt.Add(w.lease / 2)
			h.failures = 0
			if h.progSeq == sent[i] {
				h.progress = nil
			} else if soon := time.Now().Add(progressDelay); h.nextBeat.After(soon) {
				h.nextBeat = soon // a newer progress came meanwhile
			}
			continue
		}
		if !h.beating {
			continue // its handler is done: its report learns the same
		}
		switch {
		case reply.Code == 200 && reply.Status != nil:
			h.lost = fmt.Sprintf("the job is %s", *reply.Status)
		case reply.Code == 409:
			h.lost = "lease lost (409): the job was taken back"
		default:
			h.lost = fmt.Sprintf("heartbeat answered %d", reply.Code)
		}
		h.beating = false
		h.cancel(errors.New(h.lost))
	}
}

// --- reports --------------------------------------------------------------------------

// reportLoop gathers the reports of jobs finishing about together and sends
// each kind's in one call, until the handlers are all done.
func (w *worker) reportLoop() {
	defer w.wg.Done()
	for first := range w.reports {
		batches := map[string][]report{first.o.report: {first}}
		timer := time.NewTimer(coalesce)
	gather:
		for {
			select {
			case r, ok := <-w.reports:
				if !ok {
					break gather
				}
				batches[r.o.report] = append(batches[r.o.report], r)
			case <-timer.C:
				break gather
			}
		}
		timer.Stop()
		for _, batch := range batches {
			for len(batch) > 0 {
				n := min(len(batch), maxBatch)
				w.wg.Add(1)
				go func(batch []report) {
					defer w.wg.Done()
					w.deliver(batch)
				}(batch[:n])
				batch = batch[n:]
			}
		}
	}
}

// deliver sends the reports of batch (all of one kind), again with backoff
// while they fail, each until its lease ends.
func (w *worker) deliver(batch []report) {
	failures := 0
	for len(batch) > 0 {
		replies, err := w.send(batch)
		if w.bg.Err() != nil {
			for _, r := range batch {
				w.forget(r.h)
			}
			return
		}
		if err == nil && len(replies) != len(batch) {
			err = &UnexpectedAnswer{Method: "POST", URL: w.client.URL, Detail: "the answer has not one result per item"}
		}
		switch {
		case err == nil:
			for i, r := range batch {
				w.landed(r, replies[i])
			}
			return
		case isFatal(err):
			w.die(err)
			return
		case isRefusal(err) && len(batch) > 1:
			// One report's result, say, is too large: send them one by one,
			// so that it fails alone.
			for _, r := range batch {
				w.deliver([]report{r})
			}
			return
		case isRefusal(err):
			r := batch[0]
			if r.o.report != "complete" {
				w.giveUp(r.h, oneLine(err.Error(), 200)) // the server refuses this fail or snooze
				return
			}
			// The server refuses this result (a smaller body cap, say): fail
			// the job, saying why, rather than run it again.
			batch = []report{{r.h, outcome{report: "fail", err: "the server refused the result: " + oneLine(err.Error(), 200)}}}
			continue
		}
		now := time.Now()
		text := oneLine(err.Error(), 200)
		var left []report
		end := now.Add(time.Hour)
		for _, r := range batch {
			w.mu.Lock()
			// No try in the lease's last moments: a report sent then may
			// reach the server after the job was leased again.
			deadline := r.h.deadline.Add(-w.margin)
			w.mu.Unlock()
			if now.Before(deadline) {
				left = append(left, r)
				end = minTime(end, deadline)
			} else {
				w.giveUp(r.h, text)
			}
		}
		batch = left
		if len(batch) == 0 {
			return
		}
		failures++
		timer := time.NewTimer(min(reportBackoff.delay(failures), time.Until(end)))
		select {
		case <-timer.C:
		case <-w.bg.Done():
		}
		timer.Stop()
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func (w *worker) send(batch []report) ([]ReportResult, error) {
	switch batch[0].o.report {
	case "complete":
		items := make([]CompleteItem, len(batch))
		for i, r := range batch {
			items[i] = CompleteItem{ID: r.h.job.ID, LeaseToken: r.h.token, Result: r.o.result}
		}
		return w.client.CompleteMany(w.bg, items)
	case "snooze":
		items := make([]SnoozeItem, len(batch))
		for i, r := range batch {
			items[i] = SnoozeItem{ID: r.h.job.ID, LeaseToken: r.h.token, DelaySecs: r.o.again.Seconds()}
		}
		return w.client.SnoozeMany(w.bg, items)
	default:
		items := make([]FailItem, len(batch))
		for i, r := range batch {
			items[i] = FailItem{ID: r.h.job.ID, LeaseToken: r.h.token, Error: truncateError(r.o.err), Retryable: r.o.retryable, RetryInSecs: secondsOf(r.o.again)}
		}
		return w.client.FailMany(w.bg, items)
	}
}

func (w *worker) landed(r report, reply ReportResult) {
	defer w.forget(r.h)
	if reply.Code != 204 {
		lost := fmt.Sprintf("report answered %d", reply.Code)
		if reply.Code == 409 {
			lost = "lease lost (409): the report was refused"
		}
		w.jobEvent(EventLost, r.h, Event{Error: lost})
		return
	}
	var delay time.Duration
	if r.o.again != nil {
		delay = *r.o.again
	}
	switch r.o.report {
	case "complete":
		w.jobEvent(EventCompleted, r.h, Event{})
	case "snooze":
		w.jobEvent(EventSnoozed, r.h, Event{Delay: delay})
	default:
		w.jobEvent(EventFailed, r.h, Event{Error: r.o.err, Retryable: r.o.retryable, Delay: delay})
	}
}

func (w *worker) giveUp(h *held, why string) {
	if why == "" {
		why = "the lease ran out before the report landed"
	}
	w.jobEvent(EventUnreported, h, Event{Error: why})
	w.forget(h)
}
