package pipeline

import "sync/atomic"

// Window is the back-pressure of a pipeline: how many claimed messages a
// consumer holds, and when its next claim is due and how large.
//
// A message counts from its claim until it is handled (or handed back
// untried): its outcome is written afterwards, together with others,
// while the next claim runs. A claim costs about the same whatever its
// size, so a claim takes a full batch when there is room for one, and a
// smaller one only when a worker is idle with nothing claimed to take.
// Its methods are safe for concurrent use.
type Window struct {
	capacity, batch, threshold int64
	held                       atomic.Int64
	room                       chan struct{}
}

// NewWindow returns a window for claims of up to batch messages, holding
// at most capacity (at least batch).
func NewWindow(capacity, batch int) *Window {
	return &Window{capacity: int64(max(capacity, batch)), batch: int64(batch),
		threshold: int64(max(1, batch/2)), room: make(chan struct{}, 1)}
}

// Claimed counts n claimed messages.
func (w *Window) Claimed(n int) { w.held.Add(int64(n)) }

// Handled counts a message handled or handed back, and signals Room.
func (w *Window) Handled() {
	w.held.Add(-1)
	w.Signal()
}

// Signal tells the claimer that a claim may be due: room was freed, a
// worker went idle, or outcomes were written (on an ordered topic the
// messages behind them may be free now).
func (w *Window) Signal() {
	select {
	case w.room <- struct{}{}:
	default:
	}
}

// Room receives the signals (coalesced).
func (w *Window) Room() <-chan struct{} { return w.room }

// Next returns how many messages to claim now, or 0 when the claimer
// should wait for Room. waiting is how many claimed messages wait for a
// worker that could take them, idle how many workers have nothing.
func (w *Window) Next(waiting, idle int) int {
	free := w.capacity - w.held.Load()
	if free < w.batch && (free < w.threshold || waiting >= idle) {
		return 0
	}
	return int(min(w.batch, free))
}

// Held is how many claimed messages are not yet handled.
func (w *Window) Held() int { return int(w.held.Load()) }
