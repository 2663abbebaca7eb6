package qftrio

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// HandleSignals returns a context that is cancelled at the first SIGINT or
// SIGTERM, which drains a worker Run with it; a second signal quits the
// process at once (exit status 130): the held jobs' leases expire and other
// workers take them. Call stop when done with it: it ends the goroutine that
// watches for signals and restores their default handling.
//
//	ctx, stop := qftrio.HandleSignals(context.Background())
//	defer stop()
//	err := qftrio.Run(ctx, "images", handlers, options)
func HandleSignals(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		count := 0
		for {
			select {
			case <-signals:
				count++
				if count > 1 {
					os.Exit(130)
				}
				cancel()
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			signal.Stop(signals)
			close(done)
			<-ended
			cancel()
		})
	}
	return ctx, stop
}
