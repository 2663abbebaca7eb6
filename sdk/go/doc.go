// Package qftrio is the Go SDK of qftrio, a durable job server: a Client of
// every route of its HTTP API, and Run, a worker that leases jobs of a queue,
// runs their handlers in lanes, heartbeats and reports, with the rules of the
// Python runtime (docs/worker.md, docs/sdk-go.md).
//
//	ctx, stop := qftrio.HandleSignals(context.Background())
//	defer stop()
//	err := qftrio.Run(ctx, "images", map[string]qftrio.Handler{
//		"resize-image": func(ctx context.Context, job *qftrio.Job) (any, error) {
//			return resize(ctx, job.Payload) // return when ctx is done
//		},
//	}, qftrio.Options{URL: "http://127.0.0.1:8000", Token: token, Lanes: 8})
//
// A handler's result completes its job; an error fails it (retried with
// backoff), Permanent(err) fails it for good, Snooze(d) and RetryIn(d, err)
// run it again later. Its ctx is cancelled when the job is no longer this
// worker's, its lease is about to end or its timeout_secs have passed.
// Cancelling Run's ctx drains: nothing more is leased, held jobs finish and
// are reported, and Run returns once every goroutine it started has ended.
//
// The package imports nothing beyond the standard library.
package qftrio
