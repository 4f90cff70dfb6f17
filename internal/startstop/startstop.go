// Package startstop is the one start/stop helper of every background
// goroutine pgoutbox runs: a Base that gives a service a race-free,
// restartable Start and a Stop that waits, a Tasks group for the
// goroutines of one run, and StartAll/StopAll for sets of services.
//
// A service embeds Base. Its Start calls StartInit, starts its goroutines
// under the returned context and arranges for done to be called once they
// have all ended; its Stop calls StopInit, which cancels that context with
// ErrStop as the cause, and waits on the returned channel (or does a
// graceful drain of its own first):
//
//	func (s *Service) Start(ctx context.Context) error {
//		run, done, err := s.StartInit(ctx, "service")
//		if err != nil {
//			return err
//		}
//		var tasks startstop.Tasks
//		tasks.Go(func() { s.loop(run) })
//		go func() { tasks.Wait(); done() }()
//		return nil
//	}
//
//	func (s *Service) Stop(ctx context.Context) error {
//		stopped, ok := s.StopInit()
//		if !ok {
//			return nil
//		}
//		return startstop.Wait(ctx, stopped)
//	}
package startstop

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/pgoutbox/pgoutbox/internal/cfgcheck"
)

// ErrStop is the cause of a run context cancelled by Stop: a controlled
// stop, told apart from other cancellations with context.Cause.
var ErrStop = errors.New("pgoutbox: stopping")

// Service is something that runs in the background between Start and Stop.
type Service interface {
	// Start starts the service and returns once it runs; ctx bounds the
	// start-up only. Start on a running service fails with
	// cfgcheck.ErrAlreadyStarted.
	Start(ctx context.Context) error
	// Stop stops it and waits until it stopped, or ctx ended (then it
	// returns ctx's error and the service finishes stopping on its own).
	// Stop on a service that does not run returns nil.
	Stop(ctx context.Context) error
}

type state int

const (
	idle state = iota
	running
	stopping
)

// Base is the lifecycle of a service: idle → running (StartInit) →
// stopping (StopInit, or the run ending on its own) → idle (done), and
// round again. Its zero value is an idle service.
type Base struct {
	mu      sync.Mutex
	state   state
	cancel  context.CancelCauseFunc
	stopped chan struct{} // closed by done: the current (or next) run ended
	idle    chan struct{} // closed by done: a Start waiting for a stop may go
}

// StartInit begins a run. It returns the run's context (cancelled, with
// ErrStop as the cause, by StopInit) and done, which the service calls
// once every goroutine of the run has ended (also when its start-up
// failed half-way). A service that runs already makes it fail with
// ErrAlreadyStarted naming what; a service that is stopping is waited for,
// as long as ctx allows.
func (b *Base) StartInit(ctx context.Context, what string) (run context.Context, done func(), err error) {
	b.mu.Lock()
	for b.state == stopping {
		wait := b.idle
		b.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("pgoutbox: start %s: waiting for its previous stop: %w", what, ctx.Err())
		}
		b.mu.Lock()
	}
	defer b.mu.Unlock()
	if b.state == running {
		return nil, nil, fmt.Errorf("%w: %s", cfgcheck.ErrAlreadyStarted, what)
	}
	b.state = running
	if b.stopped == nil || Closed(b.stopped) {
		b.stopped = make(chan struct{}) // the previous run's is closed
	}
	b.idle = make(chan struct{})
	run, b.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	stopped, free, cancel := b.stopped, b.idle, b.cancel
	done = sync.OnceFunc(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		cancel(ErrStop)
		b.state = idle
		close(stopped)
		close(free)
	})
	return run, done, nil
}

// StopInit begins a stop: it cancels the run's context with ErrStop and
// returns the channel closed when the run ended. ok is false when the
// service does not run (never started, or stopped already).
func (b *Base) StopInit() (stopped <-chan struct{}, ok bool) {
	return b.end(ErrStop)
}

// EndRun is StopInit for a run that ends on its own (its subscription
// went away, say): cause is the run context's cause.
func (b *Base) EndRun(cause error) { b.end(cause) }

func (b *Base) end(cause error) (<-chan struct{}, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == idle {
		return nil, false
	}
	b.state = stopping
	b.cancel(cause)
	return b.stopped, true
}

// Stopped returns a channel closed when the current run ends: between
// runs the last run's (closed), before the first Start the first run's.
func (b *Base) Stopped() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped == nil {
		b.stopped = make(chan struct{})
	}
	return b.stopped
}

// Running reports whether a run started and did not end yet (it may be
// stopping).
func (b *Base) Running() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state != idle
}

// Closed reports whether ch is closed (it never blocks).
func Closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Wait waits until ch is closed or ctx ends (then it returns ctx's error).
func Wait(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Tasks is a set of goroutines of one run, waited for together.
type Tasks struct{ wg sync.WaitGroup }

// Go runs f in a goroutine of the set.
func (t *Tasks) Go(f func()) { t.wg.Go(f) }

// Wait waits for every goroutine of the set.
func (t *Tasks) Wait() { t.wg.Wait() }

// Done returns a channel closed once every goroutine of the set ended
// (call it after the last Go).
func (t *Tasks) Done() <-chan struct{} {
	ch := make(chan struct{})
	go func() { t.Wait(); close(ch) }()
	return ch
}

// WaitGroup waits for wg until ctx ends, then returns ctx's error.
func WaitGroup(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return Wait(ctx, done)
}

// StartAll starts services in order. If one fails, the ones it started are
// stopped (at once, in parallel) and its error is returned.
func StartAll(ctx context.Context, services ...Service) error {
	for i, s := range services {
		if err := s.Start(ctx); err != nil {
			return errors.Join(err, StopAll(context.WithoutCancel(ctx), services[:i]...))
		}
	}
	return nil
}

// StopAll stops services in parallel and waits for all of them; it
// returns their errors joined.
func StopAll(ctx context.Context, services ...Service) error {
	errs := make([]error, len(services))
	var t Tasks
	for i, s := range services {
		t.Go(func() { errs[i] = s.Stop(ctx) })
	}
	t.Wait()
	return errors.Join(errs...)
}
