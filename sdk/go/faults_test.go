package qftrio

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// faulty is a proxy in front of the test server that answers 503 to the
// calls refuse picks, and counts each path's calls.
type faulty struct {
	mu     sync.Mutex
	calls  map[string]int
	refuse func(path string, call int) bool
	client *Client
}

func startFaulty(t *testing.T, refuse func(path string, call int) bool) *faulty {
	t.Helper()
	target, _ := url.Parse(serverURL)
	forward := httputil.NewSingleHostReverseProxy(target)
	// A worker's long poll ended by its drain is a call the proxy sees
	// cancelled: not worth a line of the test's output.
	forward.ErrorLog = log.New(io.Discard, "", 0)
	f := &faulty{calls: map[string]int{}, refuse: refuse}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.calls[r.URL.Path]++
		refused := f.refuse(r.URL.Path, f.calls[r.URL.Path])
		f.mu.Unlock()
		if refused {
			http.Error(w, "down for a moment", http.StatusServiceUnavailable)
			return
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	f.client, _ = NewClient(proxy.URL, token)
	return f
}

func (f *faulty) count(path string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[path]
}

func TestLeaseAboutToEndCancelsAndFailsRetryably(t *testing.T) {
	queue := queueOf(t)
	proxy := startFaulty(t, func(path string, _ int) bool { return path == "/api/v1/leases/heartbeat" })
	causes := make(chan error, 1)
	handlers := map[string]Handler{"wait": func(ctx context.Context, job *Job) (any, error) {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, nil
	}}
	job := enqueue(t, "wait", queue, nil, JobConfig{MaxAttempts: ptr(2)})
	// A lease of 2 s: renewals from 1 s, given up 0.4 s before its end.
	startWorker(t, queue, handlers, Options{Client: proxy.client, LeaseSecs: 2})
	if cause := <-causes; !errors.Is(cause, errExpiring) {
		t.Errorf("the handler's context's cause: %v", cause)
	}
	got := waitJob(t, newClient(t), job.ID, func(j *Job) bool { return j.Error != nil })
	if got.Status != StatusPending || !strings.HasPrefix(*got.Error, "lease about to expire: heartbeats failed: ") || !strings.Contains(*got.Error, "503") {
		t.Errorf("a lease about to end is failed retryably, saying why: %s %q", got.Status, *got.Error)
	}
	if proxy.count("/api/v1/leases/heartbeat") < 2 {
		t.Errorf("failed renewals are tried again: %d calls", proxy.count("/api/v1/leases/heartbeat"))
	}
}

func TestReportsAreRetriedUntilTheyLand(t *testing.T) {
	queue := queueOf(t)
	proxy := startFaulty(t, func(path string, call int) bool { return path == "/api/v1/leases/complete" && call <= 2 })
	handlers := map[string]Handler{"ok": func(ctx context.Context, job *Job) (any, error) { return map[string]bool{"ok": true}, nil }}
	job := enqueue(t, "ok", queue, nil, JobConfig{})
	w := startWorker(t, queue, handlers, Options{Client: proxy.client})
	w.events.wait(t, typed(EventCompleted, job.ID))
	if got, _ := newClient(t).JobGet(context.Background(), job.ID); got.Status != StatusCompleted || proxy.count("/api/v1/leases/complete") != 3 {
		t.Errorf("the completion lands on its third call: %s after %d", got.Status, proxy.count("/api/v1/leases/complete"))
	}
}

func TestReportsAreGivenUpWhenTheLeaseEnds(t *testing.T) {
	queue := queueOf(t)
	proxy := startFaulty(t, func(path string, _ int) bool { return path == "/api/v1/leases/complete" })
	handlers := map[string]Handler{"ok": func(ctx context.Context, job *Job) (any, error) { return nil, nil }}
	job := enqueue(t, "ok", queue, nil, JobConfig{})
	w := startWorker(t, queue, handlers, Options{Client: proxy.client, LeaseSecs: 1})
	e := w.events.wait(t, typed(EventUnreported, job.ID))
	if !strings.Contains(e.Error, "503") {
		t.Errorf("unreported says why: %q", e.Error)
	}
	if proxy.count("/api/v1/leases/complete") < 2 {
		t.Errorf("the report was tried again before the lease ended: %d calls", proxy.count("/api/v1/leases/complete"))
	}
}
