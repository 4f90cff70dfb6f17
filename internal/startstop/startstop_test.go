package startstop_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/cfgcheck"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
	"github.com/pgoutbox/pgoutbox/internal/startstop/startstoptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ticker is a minimal service: one goroutine counting until stopped.
type ticker struct {
	startstop.Base
	ticks    atomic.Int64
	failNext atomic.Bool
}

func (s *ticker) Start(ctx context.Context) error {
	run, done, err := s.StartInit(ctx, "ticker")
	if err != nil {
		return err
	}
	if s.failNext.Swap(false) {
		done()
		return errors.New("cannot start")
	}
	var tasks startstop.Tasks
	tasks.Go(func() {
		for run.Err() == nil {
			s.ticks.Add(1)
			time.Sleep(time.Millisecond)
		}
	})
	go func() { tasks.Wait(); done() }()
	return nil
}

func (s *ticker) Stop(ctx context.Context) error {
	stopped, ok := s.StopInit()
	if !ok {
		return nil
	}
	return startstop.Wait(ctx, stopped)
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	s := &ticker{}
	first := s.Stopped()
	if err := s.Stop(ctx); err != nil {
		t.Fatalf("Stop of a never-started service: %v", err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); !errors.Is(err, cfgcheck.ErrAlreadyStarted) {
		t.Fatalf("second Start: %v", err)
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first:
	default:
		t.Fatal("Stopped taken before Start is not closed by the run's end")
	}
	if s.Running() {
		t.Fatal("running after Stop")
	}
	n := s.ticks.Load()
	time.Sleep(5 * time.Millisecond)
	if s.ticks.Load() != n {
		t.Fatal("the goroutine outlived Stop")
	}
	if err := s.Start(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	select {
	case <-s.Stopped():
		t.Fatal("Stopped of a new run is closed")
	default:
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	s.failNext.Store(true)
	if err := s.Start(ctx); err == nil {
		t.Fatal("a failing start succeeded")
	}
	if s.Running() {
		t.Fatal("a failed start left the service running")
	}
}

func TestStartAllRollsBack(t *testing.T) {
	ctx := context.Background()
	a, b, c := &ticker{}, &ticker{}, &ticker{}
	b.failNext.Store(true)
	if err := startstop.StartAll(ctx, a, b, c); err == nil {
		t.Fatal("StartAll succeeded")
	}
	if a.Running() || b.Running() || c.Running() {
		t.Fatal("StartAll left services running")
	}
	if err := startstop.StartAll(ctx, a, b, c); err != nil {
		t.Fatal(err)
	}
	if err := startstop.StopAll(ctx, a, b, c); err != nil {
		t.Fatal(err)
	}
}

// A Start while a stop is in progress waits for it.
func TestStartWaitsForAStopInProgress(t *testing.T) {
	ctx := context.Background()
	s := &ticker{}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithCancel(ctx)
	cancel()
	_ = s.Stop(short) // returns at once; the run ends on its own
	if err := s.Start(ctx); err != nil {
		t.Fatalf("Start after a stop in progress: %v", err)
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestStress(t *testing.T) {
	startstoptest.Stress(t, &ticker{}, 50)
}
