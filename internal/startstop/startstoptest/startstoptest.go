// Package startstoptest puts a service's Start and Stop under stress, so
// the race detector sees how they interleave.
package startstoptest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/cfgcheck"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
)

// Stress starts and stops svc from 10 goroutines at once, rounds times
// each, then stops it for good. A Start may fail only with
// ErrAlreadyStarted (another goroutine's run is on) or startstop.ErrStop
// (another goroutine's Stop cut it short); every Stop must return within
// 10 seconds, without error.
func Stress(tb testing.TB, svc startstop.Service, rounds int) {
	tb.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for range rounds {
				if err := svc.Start(ctx); err != nil && !errors.Is(err, cfgcheck.ErrAlreadyStarted) && !errors.Is(err, startstop.ErrStop) {
					tb.Errorf("Start: %v", err)
					return
				}
				stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := svc.Stop(stopCtx)
				cancel()
				if err != nil {
					tb.Errorf("Stop: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := svc.Stop(stopCtx); err != nil {
		tb.Errorf("final Stop: %v", err)
	}
}
