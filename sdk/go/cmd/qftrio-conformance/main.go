// Command qftrio-conformance is the Go runtime's adapter of the conformance
// suite (tests/sdk_conformance/ADAPTER.md): a worker on the SDK whose
// handlers do what each kind of the suite asks, printing one JSON line per
// event on standard output.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	qftrio "github.com/qftrio/qftrio/sdk/go"
)

var outMu sync.Mutex

// say prints one line of the contract; os.Stdout is unbuffered, so each
// line is written as it is printed.
func say(line map[string]any) {
	data, err := json.Marshal(line)
	if err != nil {
		panic(err)
	}
	outMu.Lock()
	defer outMu.Unlock()
	os.Stdout.Write(append(data, '\n'))
}

func number(name string) int {
	value, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		fmt.Fprintf(os.Stderr, "qftrio-conformance: %s: not an integer: %q\n", name, os.Getenv(name))
		os.Exit(2)
	}
	return value
}

func seconds(secs float64) time.Duration { return time.Duration(secs * float64(time.Second)) }

// wait waits d, or until ctx is cancelled: then it says so and answers false.
func wait(ctx context.Context, job *qftrio.Job, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		say(map[string]any{"event": "aborted", "job": job.ID})
		return false
	}
}

type payload struct {
	Secs     float64         `json:"secs"`
	ThenSecs float64         `json:"then_secs"`
	Message  string          `json:"message"`
	Progress json.RawMessage `json:"progress"`
}

func headers(job *qftrio.Job) map[string]string {
	if job.Headers == nil {
		return map[string]string{}
	}
	return job.Headers
}

// handler wraps run with the started and returned lines of the contract.
func handler(run func(ctx context.Context, job *qftrio.Job, p payload) (any, bool, error)) qftrio.Handler {
	return func(ctx context.Context, job *qftrio.Job) (any, error) {
		say(map[string]any{"event": "started", "job": job.ID, "kind": job.Kind, "attempt": job.Attempt, "headers": headers(job)})
		var p payload
		_ = json.Unmarshal(job.Payload, &p) // a kind that reads no field takes any payload
		result, ended, err := run(ctx, job, p)
		if ended {
			say(map[string]any{"event": "returned", "job": job.ID})
		}
		return result, err
	}
}

var handlers = map[string]qftrio.Handler{
	"echo": handler(func(_ context.Context, job *qftrio.Job, _ payload) (any, bool, error) {
		return map[string]json.RawMessage{"echo": job.Payload}, true, nil
	}),
	"sleep": handler(func(ctx context.Context, job *qftrio.Job, p payload) (any, bool, error) {
		if !wait(ctx, job, seconds(p.Secs)) {
			return nil, false, ctx.Err()
		}
		return map[string]float64{"slept": p.Secs}, true, nil
	}),
	"fail": handler(func(_ context.Context, _ *qftrio.Job, p payload) (any, bool, error) {
		return nil, true, errors.New(p.Message)
	}),
	"permanent": handler(func(_ context.Context, _ *qftrio.Job, p payload) (any, bool, error) {
		return nil, true, qftrio.Permanent(errors.New(p.Message))
	}),
	"snooze": handler(func(_ context.Context, _ *qftrio.Job, p payload) (any, bool, error) {
		return nil, true, qftrio.Snooze(seconds(p.Secs))
	}),
	"retry_in": handler(func(_ context.Context, _ *qftrio.Job, p payload) (any, bool, error) {
		return nil, true, qftrio.RetryIn(seconds(p.Secs), errors.New(p.Message))
	}),
	"progress": handler(func(ctx context.Context, job *qftrio.Job, p payload) (any, bool, error) {
		if err := job.Progress(p.Progress); err != nil {
			return nil, true, err
		}
		if !wait(ctx, job, seconds(p.ThenSecs)) {
			return nil, false, ctx.Err()
		}
		return nil, true, nil
	}),
	"headers": handler(func(_ context.Context, job *qftrio.Job, _ payload) (any, bool, error) {
		return map[string]any{"headers": headers(job)}, true, nil
	}),
}

func main() {
	ctx, stop := qftrio.HandleSignals(context.Background())
	defer stop()
	waitSecs := number("ADAPTER_WAIT_SECS")
	if waitSecs == 0 {
		waitSecs = -1 // the SDK's zero is its default; negative leases without waiting
	}
	options := qftrio.Options{
		URL:       os.Getenv("QFTRIO_URL"),
		Token:     os.Getenv("QFTRIO_TOKEN"),
		Lanes:     number("ADAPTER_LANES"),
		LeaseSecs: number("ADAPTER_LEASE_SECS"),
		WaitSecs:  waitSecs,
		WorkerID:  os.Getenv("ADAPTER_WORKER_ID"),
		OnEvent: func(event qftrio.Event) {
			fmt.Fprintf(os.Stderr, "%s %s %s\n", event.Type, event.JobID, event.Error)
		},
	}
	say(map[string]any{"event": "ready"})
	err := qftrio.Run(ctx, os.Getenv("ADAPTER_QUEUE"), handlers, options)
	if err != nil {
		say(map[string]any{"event": "stopped", "error": err.Error()})
		stop()
		os.Exit(2)
	}
	say(map[string]any{"event": "stopped", "error": nil})
}
