package pipeline

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"
)

// testLoop runs a Loop whose looks are answered by the test: each look
// sends its limit and notified flag on looks and returns what the test
// sends on answers.
type testLoop struct {
	looks   chan [2]int // limit, notified (0/1)
	answers chan answer
	wake    chan struct{}
	window  *Window
	cancel  context.CancelFunc
	done    chan struct{}
}

type answer struct {
	found Found
	err   error
}

func startLoop(t *testing.T, poll time.Duration, waiting int) *testLoop {
	t.Helper()
	l := &testLoop{looks: make(chan [2]int), answers: make(chan answer), wake: make(chan struct{}, 1),
		window: NewWindow(20, 10), done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	loop := Loop{
		Window: l.window, Wake: l.wake, PollInterval: poll,
		Waiting: func() int { return waiting },
		Look: func(limit int, notified bool) (Found, error) {
			n := 0
			if notified {
				n = 1
			}
			select {
			case l.looks <- [2]int{limit, n}:
			case <-ctx.Done():
				return Found{}, nil
			}
			select {
			case a := <-l.answers:
				return a.found, a.err
			case <-ctx.Done(): // the test ended (or failed) before answering
				return Found{Done: true}, nil
			}
		},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	go func() { defer close(l.done); loop.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-l.done })
	return l
}

func (l *testLoop) next(t *testing.T) [2]int {
	t.Helper()
	select {
	case got := <-l.looks:
		return got
	case <-time.After(time.Minute):
		t.Fatal("no look")
		return [2]int{}
	}
}

// noLook asserts that no look comes while the loop is given every chance
// to make one (a wait of several poll intervals).
func (l *testLoop) noLook(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case got := <-l.looks:
		t.Fatalf("unexpected look %v", got)
	case <-time.After(d):
	}
}

func TestLoopLooksAgainAtOnceWhileThereIsMore(t *testing.T) {
	l := startLoop(t, time.Hour, 0) // only More, a wake-up or room can bring the next look
	if got := l.next(t); got[0] != 10 {
		t.Fatalf("first look's limit %d, want a full batch", got[0])
	}
	l.answers <- answer{found: Found{More: true}}
	l.next(t)
	l.answers <- answer{found: Found{Done: true}}
	select {
	case <-l.done:
	case <-time.After(time.Minute):
		t.Fatal("Done did not end Run")
	}
}

func TestLoopWaitsForAWakeUpAndSaysSo(t *testing.T) {
	l := startLoop(t, time.Hour, 0)
	l.next(t)
	l.answers <- answer{found: Found{}}
	l.wake <- struct{}{}
	if got := l.next(t); got[1] != 1 {
		t.Fatal("the look after a wake-up was not told of it")
	}
	l.answers <- answer{found: Found{More: true}}
	if got := l.next(t); got[1] != 0 {
		t.Fatal("a look told of a wake-up a previous look consumed")
	}
	l.answers <- answer{}
}

func TestLoopDoesNotLookWithoutRoom(t *testing.T) {
	l := startLoop(t, time.Millisecond, 5) // 5 claimed wait for busy workers
	l.next(t)
	l.window.Claimed(15) // 5 free: less than half a batch
	l.answers <- answer{found: Found{Claimed: 15}}
	l.noLook(t, 50*time.Millisecond)
	for range 10 {
		l.window.Handled()
	}
	if got := l.next(t); got[0] != 10 {
		t.Fatalf("limit %d once 15 were free, want 10", got[0])
	}
	l.answers <- answer{}
}

func TestLoopBacksOffAfterFailures(t *testing.T) {
	l := startLoop(t, time.Hour, 0)
	l.next(t)
	start := time.Now()
	l.answers <- answer{err: errors.New("connection refused")}
	l.next(t) // the backoff's first step is short: no wake-up needed
	l.answers <- answer{err: errors.New("connection refused")}
	l.next(t)
	if time.Since(start) < 10*time.Millisecond {
		t.Fatal("failed looks were retried without a backoff")
	}
	l.answers <- answer{}
}

func TestLoopRetryOverridesTheFollowUp(t *testing.T) {
	l := startLoop(t, time.Hour, 0)
	l.next(t)
	l.answers <- answer{found: Found{Retry: time.Millisecond}} // another instance is claiming
	l.next(t)
	l.answers <- answer{found: Found{Within: time.Millisecond}} // a throttled read is allowed then
	l.next(t)
	l.answers <- answer{}
}

// After a failed look, only the backoff brings the next: wake-ups and
// freed room do not.
func TestLoopBackoffIgnoresWakeUps(t *testing.T) {
	l := startLoop(t, time.Hour, 0)
	l.next(t)
	l.answers <- answer{err: errors.New("connection refused")}
	l.next(t)
	start := time.Now()
	l.answers <- answer{err: errors.New("connection refused")} // the second backoff: 10-20ms
	for range 3 {
		select {
		case l.wake <- struct{}{}:
		default:
		}
		l.window.Signal()
	}
	l.next(t)
	if took := time.Since(start); took < 10*time.Millisecond {
		t.Fatalf("the next look came after %v: wake-ups cut the backoff short", took)
	}
	l.answers <- answer{}
}
