// A worker for the queue "jobs". Start as many copies as you like, on as
// many machines as you like: they share the queue, and when one dies, the
// others finish its jobs once its leases run out.
package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	qftrio "github.com/qftrio/qftrio/sdk/go"
)

// work is your job. It can run more than once (a worker can die after doing
// the work but before reporting it), so pass job.ID to external services as
// an idempotency key. Return when ctx is done: the job is no longer yours,
// or its lease is about to end.
func work(ctx context.Context, job *qftrio.Job) (any, error) {
	select { // Pretend to call an API.
	case <-time.After(time.Second + rand.N(2*time.Second)):
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	return map[string]any{"handledBy": *job.WorkerID, "attempt": job.Attempt}, nil
}

func env(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}

func number(name string, fallback int) int {
	value, err := strconv.Atoi(env(name, strconv.Itoa(fallback)))
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: not a number\n", name)
		os.Exit(2)
	}
	return value
}

func main() {
	// The first Ctrl+C or SIGTERM stops leasing and finishes held jobs; a
	// second quits at once (their leases expire and other workers take over).
	ctx, stop := qftrio.HandleSignals(context.Background())
	defer stop()
	host, _ := os.Hostname()
	err := qftrio.Run(ctx, env("WORKER_QUEUE", "jobs"), map[string]qftrio.Handler{"work": work}, qftrio.Options{
		URL:       env("QFTRIO_URL", "http://127.0.0.1:8000"),
		Token:     env("QFTRIO_WORKER_TOKEN", "dev"),
		WorkerID:  env("WORKER_ID", fmt.Sprintf("%s-%d", host, os.Getpid())),
		Lanes:     number("WORKER_LANES", 4),
		LeaseSecs: number("WORKER_LEASE_SECS", 10),
		OnEvent: func(e qftrio.Event) {
			line := time.Now().Format("15:04:05")
			if e.Lane != 0 {
				line += fmt.Sprintf(" lane %d:", e.Lane)
			}
			for _, part := range []string{string(e.Type), e.JobID, e.Error} {
				if part != "" {
					line += " " + part
				}
			}
			fmt.Println(line)
		},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "worker stopped: %v\n", err)
		stop()
		os.Exit(2)
	}
}
