package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/ratelog"
	"github.com/pgoutbox/pgoutbox/internal/tracing"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// newExecutor returns a started executor of workers that calls h, and a
// function that closes it and returns every outcome it settled.
func newExecutor(t *testing.T, workers int, timeout time.Duration, byGroup bool, h outbox.Handler) (*Executor, func() []Settled) {
	t.Helper()
	e := NewExecutor(ExecutorConfig{
		Workers:        workers,
		Capacity:       64,
		Window:         NewWindow(64, 16),
		Timeout:        timeout,
		Handler:        func(*outbox.Delivery) outbox.Handler { return h },
		Judge:          outbox.TopicConfig{MaxAttempts: 3}.Judge,
		ByMessageGroup: byGroup,
		Topic:          "t",
		Group:          "g",
		Tracer:         tracing.New(nil),
		Failures:       ratelog.New(slog.New(slog.DiscardHandler), time.Minute, time.Now),
	})
	e.Start()
	var got []Settled
	done := make(chan struct{})
	go func() {
		defer close(done)
		for s := range e.Settled() {
			got = append(got, s)
		}
	}()
	return e, func() []Settled {
		e.Close()
		<-done
		return got
	}
}

func delivery(id int64, group string) *outbox.Delivery {
	return &outbox.Delivery{ID: id, Group: group, Attempt: 1}
}

// A message group's run is handled in id order by one worker; once a
// message fails, the ones behind it come back untried, with their
// attempt given back.
func TestExecutorRunStopsAtAFailure(t *testing.T) {
	defer goleak.VerifyNone(t)
	var mu sync.Mutex
	var order []int64
	e, closeAll := newExecutor(t, 4, time.Second, true, func(_ context.Context, d *outbox.Delivery) error {
		mu.Lock()
		order = append(order, d.ID)
		mu.Unlock()
		if d.ID == 3 {
			return errors.New("boom")
		}
		return nil
	})
	var jobs []*Job
	for _, id := range []int64{5, 1, 4, 2, 3} { // dispatched out of order
		jobs = append(jobs, &Job{D: delivery(id, "a")})
	}
	e.Dispatch(jobs)
	got := closeAll()
	require.Equal(t, []int64{1, 2, 3}, order, "handled in id order, up to the failure")
	outcomes := map[int64]Settled{}
	for _, s := range got {
		outcomes[s.Failure.ID] = s
	}
	require.Len(t, outcomes, 5)
	require.Equal(t, Ack, outcomes[1].Outcome)
	require.Equal(t, Ack, outcomes[2].Outcome)
	require.Equal(t, Fail, outcomes[3].Outcome)
	require.Equal(t, "boom", outcomes[3].Failure.Err)
	require.Equal(t, 1, outcomes[3].Failure.Attempts)
	for _, id := range []int64{4, 5} {
		require.Equal(t, Release, outcomes[id].Outcome, "message %d", id)
		require.Equal(t, 0, outcomes[id].Failure.Attempts, "message %d: its attempt is given back", id)
	}
}

// A batch is settled once, when its last message is done, with every
// message under its outcome.
func TestExecutorSettlesABatchWhole(t *testing.T) {
	defer goleak.VerifyNone(t)
	e, closeAll := newExecutor(t, 3, time.Second, false, func(_ context.Context, d *outbox.Delivery) error {
		if d.ID%2 == 0 {
			return outbox.Permanent(errors.New("bad"))
		}
		return nil
	})
	b := NewBatch(7, 6)
	var jobs []*Job
	for id := range int64(6) {
		jobs = append(jobs, &Job{D: delivery(id+1, ""), Batch: b})
	}
	e.Dispatch(jobs)
	got := closeAll()
	require.Len(t, got, 1)
	require.Same(t, b, got[0].Batch)
	acked, failed, released := b.Outcomes()
	require.ElementsMatch(t, []int64{1, 3, 5}, acked)
	require.Len(t, failed, 3)
	for _, f := range failed {
		require.True(t, f.Dead, "a permanent error dead-letters message %d", f.ID)
	}
	require.Empty(t, released)
}

// A handler that ignores its context is given up on after its timeout:
// its message fails with ErrHandlerTimeout, a new worker takes the next
// jobs, and WaitAbandoned waits for the call to return.
func TestExecutorGivesUpOnAHungHandler(t *testing.T) {
	defer goleak.VerifyNone(t)
	unblock := make(chan struct{})
	e, closeAll := newExecutor(t, 1, 20*time.Millisecond, false, func(_ context.Context, d *outbox.Delivery) error {
		if d.ID == 1 {
			<-unblock // ignores ctx
		}
		return nil
	})
	e.Dispatch([]*Job{{D: delivery(1, "")}, {D: delivery(2, "")}})
	// The one worker is stuck on message 1: message 2 is handled only by
	// the worker that replaces it (Close waits for that).
	got := closeAll()
	require.Len(t, got, 2)
	byID := map[int64]Settled{got[0].Failure.ID: got[0], got[1].Failure.ID: got[1]}
	require.Equal(t, Fail, byID[1].Outcome)
	require.Contains(t, byID[1].Failure.Err, ErrHandlerTimeout.Error())
	require.Equal(t, Ack, byID[2].Outcome)

	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	require.ErrorIs(t, e.WaitAbandoned(short), context.DeadlineExceeded, "the hung call still runs")
	close(unblock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, e.WaitAbandoned(ctx))
}

// After BeginStop, jobs not yet started come back untried; a handler
// cancelled by CancelHandlers is handed back, not failed.
func TestExecutorStopHandsBackWhatItHasNotDone(t *testing.T) {
	defer goleak.VerifyNone(t)
	started := make(chan struct{})
	e, closeAll := newExecutor(t, 1, time.Minute, false, func(ctx context.Context, _ *outbox.Delivery) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	})
	e.Dispatch([]*Job{{D: delivery(1, "")}, {D: delivery(2, "")}, {D: delivery(3, "")}})
	<-started
	e.BeginStop()
	e.CancelHandlers()
	got := closeAll()
	require.Len(t, got, 3)
	for _, s := range got {
		require.Equal(t, Release, s.Outcome, "message %d", s.Failure.ID)
		require.Equal(t, 0, s.Failure.Attempts, "message %d: its attempt is given back", s.Failure.ID)
	}
}

// A handler that does not return when CancelHandlers cancels it is
// given up on after its grace, and its attempt is spent: it may still
// finish its work, so its next delivery must say it is a later attempt.
// A job it held up is still handed back untried.
func TestExecutorStopSpendsTheAttemptOfAHandlerThatOutlivesIt(t *testing.T) {
	defer goleak.VerifyNone(t)
	started := make(chan struct{})
	unblock := make(chan struct{})
	e, closeAll := newExecutor(t, 1, time.Minute, false, func(context.Context, *outbox.Delivery) error {
		close(started)
		<-unblock // ignores ctx
		return nil
	})
	e.Dispatch([]*Job{{D: delivery(1, "")}, {D: delivery(2, "")}})
	<-started
	e.BeginStop()
	e.CancelHandlers()
	got := closeAll() // returns once the watchdog gave up on message 1
	require.Len(t, got, 2)
	byID := map[int64]Settled{got[0].Failure.ID: got[0], got[1].Failure.ID: got[1]}
	require.Equal(t, Fail, byID[1].Outcome)
	require.Equal(t, 1, byID[1].Failure.Attempts, "the attempt of a call given up on is spent")
	require.Contains(t, byID[1].Failure.Err, ErrHandlerTimeout.Error())
	require.Equal(t, Release, byID[2].Outcome)
	require.Equal(t, 0, byID[2].Failure.Attempts, "a job never started gets its attempt back")
	close(unblock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, e.WaitAbandoned(ctx))
}

// The executor tells a paced window how long each message took: a
// delivery no member takes costs nothing, a call the watchdog gave up on
// took at least the timeout. The window then holds what its workers
// finish within HoldFor at that pace.
func TestExecutorPacesItsWindow(t *testing.T) {
	defer goleak.VerifyNone(t)
	run := func(timeout time.Duration, handlerOf func(*outbox.Delivery) outbox.Handler) *Window {
		w := NewPacedWindow(1001, 1000, 1)
		e := NewExecutor(ExecutorConfig{
			Workers: 1, Capacity: 1001, Window: w, Timeout: timeout, Handler: handlerOf,
			Judge: outbox.TopicConfig{MaxAttempts: 3}.Judge, Topic: "t", Group: "g", Tracer: tracing.New(nil),
			Failures: ratelog.New(slog.New(slog.DiscardHandler), time.Minute, time.Now),
			Logger:   slog.New(slog.DiscardHandler),
		})
		e.Start()
		require.Equal(t, 1, w.Next(0, 1), "nothing timed: what the one worker can start")
		e.Dispatch([]*Job{{D: delivery(1, "")}})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range e.Settled() {
			}
		}()
		e.Close()
		<-done
		return w
	}

	nobody := run(time.Second, func(*outbox.Delivery) outbox.Handler { return nil })
	require.Equal(t, 1000, nobody.Next(0, 1), "a delivery no member takes is no work: a full batch")

	unblock := make(chan struct{})
	hung := run(100*time.Millisecond, func(*outbox.Delivery) outbox.Handler {
		return func(context.Context, *outbox.Delivery) error { <-unblock; return nil }
	})
	require.Equal(t, 11, hung.Next(0, 1), "a call given up on after 100 ms: the one the worker starts and the 10 it finishes in a second at that pace")
	close(unblock)
}

// A job of a priority above 0 goes ahead of the jobs of priority 0 that
// wait for a worker, on a topic that is not ordered; on an ordered one
// every job keeps its place.
func TestExecutorTakesPrioritizedJobsFirst(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, byGroup := range []bool{false, true} {
		entered, release := make(chan struct{}), make(chan struct{})
		var mu sync.Mutex
		var order []int64
		e, closeAll := newExecutor(t, 1, time.Minute, byGroup, func(_ context.Context, d *outbox.Delivery) error {
			if d.ID == 1 {
				close(entered)
				<-release
			}
			mu.Lock()
			order = append(order, d.ID)
			mu.Unlock()
			return nil
		})
		var backlog []*Job
		for id := range int64(20) { // one worker: 1 runs, the rest wait
			backlog = append(backlog, &Job{D: delivery(id+1, fmt.Sprint("g", id))})
		}
		e.Dispatch(backlog)
		<-entered
		urgent := delivery(21, "g20")
		urgent.Priority = 10
		e.Dispatch([]*Job{{D: urgent}})
		close(release)
		closeAll()
		require.Len(t, order, 21)
		if byGroup {
			require.Equal(t, int64(21), order[20], "an ordered topic keeps commit order")
		} else {
			require.Equal(t, []int64{1, 21, 2}, order[:3], "the priority-10 job is taken first once the worker is free")
		}
	}
}
