package pipeline

import (
	"testing"
	"time"
)

func TestNext(t *testing.T) {
	w := NewWindow(110, 100) // 10 workers, batches of 100
	if got := w.Next(0, 10); got != 100 {
		t.Fatalf("empty window: claim %d, want a full batch", got)
	}
	w.Claimed(100)
	if got := w.Next(90, 0); got != 0 {
		t.Fatalf("10 free: claim %d, want to wait", got)
	}
	for range 60 {
		w.Handled()
	}
	if got := w.Next(30, 0); got != 0 {
		t.Fatalf("70 free, 30 waiting for busy workers: claim %d, want to wait for a full batch", got)
	}
	if got := w.Next(0, 3); got != 70 {
		t.Fatalf("70 free, 3 idle workers with nothing: claim %d, want 70", got)
	}
	for range 40 {
		w.Handled()
	}
	if got := w.Next(0, 0); got != 100 {
		t.Fatalf("all free: claim %d, want 100", got)
	}
	select {
	case <-w.Room():
	default:
		t.Fatal("Handled did not signal Room")
	}
	if w.Held() != 0 {
		t.Fatalf("held %d, want 0", w.Held())
	}
}

func TestCapacityAtLeastABatch(t *testing.T) {
	w := NewWindow(1, 5)
	if got := w.Next(0, 1); got != 5 {
		t.Fatalf("claim %d, want 5", got)
	}
}

// A paced window claims what its workers can start until a handler call
// is timed, then what they finish within HoldFor, in claims of at most a
// batch: a full batch for fast handlers, a few messages for slow ones.
func TestPacedWindowHoldsWhatItsWorkersFinishSoon(t *testing.T) {
	w := NewPacedWindow(1010, 1000, 10)
	if got := w.Next(0, 1); got != 10 {
		t.Fatalf("nothing timed: claim %d, want what 10 workers start", got)
	}

	w.HandlerTook(10 * time.Microsecond)
	if got := w.Next(0, 1); got != 1000 {
		t.Fatalf("10 µs handlers: claim %d, want a full batch", got)
	}

	slow := NewPacedWindow(1010, 1000, 10)
	slow.HandlerTook(100 * time.Millisecond)
	if got := slow.Next(0, 1); got != 110 {
		t.Fatalf("100 ms handlers: claim %d, want the 10 the workers start and the 100 they finish in a second", got)
	}
	slow.Claimed(110)
	if got := slow.Next(100, 0); got != 0 {
		t.Fatalf("holding a second's work, 100 waiting for busy workers: claim %d, want to wait", got)
	}
	for range 60 {
		slow.Handled()
	}
	if got := slow.Next(40, 0); got != 0 {
		t.Fatalf("50 held of 110, 40 waiting for busy workers: claim %d, want to wait for a batch's room", got)
	}
	if got := slow.Next(0, 1); got != 60 {
		t.Fatalf("50 held of 110, a worker idle with nothing: claim %d, want 60", got)
	}

	slowest := NewPacedWindow(1010, 1000, 10)
	slowest.HandlerTook(time.Minute)
	slowest.Claimed(9)
	if got := slowest.Next(0, 1); got != 1 {
		t.Fatalf("one-minute handlers, 9 held: claim %d, want the 1 a worker can start", got)
	}
	slowest.Claimed(1)
	if got := slowest.Next(0, 1); got != 0 {
		t.Fatalf("one-minute handlers, every worker busy: claim %d, want to wait", got)
	}
}

// A paced window whose first messages were claimed while the rest were
// still being sent claims the rest as soon as a worker is idle with nothing
// to take, however few: waiting for half a batch of room would wait for
// handlers that have not returned once (they may never, until the
// instance stops).
func TestPacedWindowTopsUpWhatItsWorkersCanStart(t *testing.T) {
	w := NewPacedWindow(100, 50, 50)
	w.Claimed(30) // started by 30 of the 50 workers, none returned yet
	if got := w.Next(0, 1); got != 20 {
		t.Fatalf("30 held, none returned, 20 workers idle: claim %d, want the 20 they can start", got)
	}
}

// The average follows the handler calls: after handlers slowed down, a
// paced window holds less.
func TestPacedWindowFollowsTheHandlers(t *testing.T) {
	w := NewPacedWindow(1010, 1000, 10)
	w.HandlerTook(10 * time.Microsecond)
	for range 100 {
		w.HandlerTook(time.Second)
	}
	if got := w.Next(0, 1); got > 20 {
		t.Fatalf("handlers of a second: claim %d, want at most what 10 workers finish in a second and a bit", got)
	}
}

// A window that is not paced ignores handler times.
func TestUnpacedWindowIgnoresHandlerTimes(t *testing.T) {
	w := NewWindow(110, 100)
	w.HandlerTook(time.Minute)
	if got := w.Next(0, 1); got != 100 {
		t.Fatalf("claim %d, want a full batch", got)
	}
}

// A claim that took prioritized messages ahead urges the next: it is due
// as soon as there is room for one message, even while every worker is
// busy, once; then claims wait for room for a batch again.
func TestUrgedWindowClaimsWhatRoomThereIs(t *testing.T) {
	w := NewWindow(110, 100)
	w.Claimed(110) // no signal pending
	w.Urge()
	select {
	case <-w.Room():
	default:
		t.Fatal("Urge did not signal Room")
	}
	if got := w.Next(100, 0); got != 0 {
		t.Fatalf("urged, no room: claim %d, want to wait", got)
	}
	for range 3 {
		w.Handled()
	}
	if got := w.Next(97, 0); got != 3 {
		t.Fatalf("urged, 3 free, every worker busy: claim %d, want 3", got)
	}
	w.Claimed(3)
	for range 5 {
		w.Handled()
	}
	if got := w.Next(95, 0); got != 0 {
		t.Fatalf("after the urged claim, 5 free, every worker busy: claim %d, want to wait for a full batch", got)
	}
}
