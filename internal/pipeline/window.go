package pipeline

import (
	"sync/atomic"
	"time"
)

// Window is the back-pressure of a pipeline: how many claimed messages a
// consumer holds, and when its next claim is due and how large.
//
// A message counts from its claim until it is handled (or handed back
// untried): its outcome is written afterwards, together with others,
// while the next claim runs. A claim costs about the same whatever its
// size, so a claim takes a full batch when there is room for one, and a
// smaller one only when a worker is idle with nothing claimed to take.
//
// A window that knows its workers (NewPacedWindow) also holds no more
// than they finish within HoldFor, as their handler calls have taken so
// far: slow handlers leave the rest of a backlog to other consumers,
// which would otherwise sit idle while this one works through what it
// holds, and fast ones are claimed for in full batches. Until a handler
// call is timed, it claims only what its workers can start. It claims
// what it has room for whenever a worker is idle with nothing to take.
//
// Its methods are safe for concurrent use.
type Window struct {
	capacity, batch int64
	workers         int64 // 0: not paced
	held            atomic.Int64
	handlerTime     atomic.Int64 // nanoseconds, a moving average of handler calls (0: none timed yet)
	urged           atomic.Bool  // the next claim may be as small as one (see Urge)
	room            chan struct{}
}

// HoldFor is how much work a paced window holds: what its workers finish
// in this time, at the pace of its handler calls so far.
const HoldFor = time.Second

// NewWindow returns a window for claims of up to batch messages, holding
// at most capacity (at least batch).
func NewWindow(capacity, batch int) *Window {
	return &Window{capacity: int64(max(capacity, batch)), batch: int64(batch), room: make(chan struct{}, 1)}
}

// NewPacedWindow returns a window like NewWindow's for workers that take
// one message at a time, which also holds no more than they finish
// within HoldFor (see Window). The executor times their handler calls
// (HandlerTook).
func NewPacedWindow(capacity, batch, workers int) *Window {
	w := NewWindow(capacity, batch)
	w.workers = int64(max(workers, 1))
	return w
}

// Claimed counts n claimed messages.
func (w *Window) Claimed(n int) { w.held.Add(int64(n)) }

// Handled counts a message handled or handed back, and signals Room.
func (w *Window) Handled() {
	w.held.Add(-1)
	w.Signal()
}

// HandlerTook records that a handler call took d: a paced window's
// average moves an eighth of the way to it.
func (w *Window) HandlerTook(d time.Duration) {
	if w.workers == 0 {
		return
	}
	d = max(d, time.Microsecond)
	avg := w.handlerTime.Load()
	if avg == 0 {
		w.handlerTime.Store(int64(d))
		return
	}
	w.handlerTime.Store(avg + (int64(d)-avg)/8) // concurrent calls may lose an update: an average either way
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

// Urge makes the next claim due as soon as there is room for one
// message, even while every worker is busy: a claim just took messages of
// a priority above 0 ahead of the backlog, and the next claims them
// (waiting for room for a batch, they would wait behind what the window
// holds).
func (w *Window) Urge() {
	w.urged.Store(true)
	w.Signal()
}

// Room receives the signals (coalesced).
func (w *Window) Room() <-chan struct{} { return w.room }

// Next returns how many messages to claim now, or 0 when the claimer
// should wait for Room. waiting is how many claimed messages wait for a
// worker that could take them, idle how many workers have nothing.
func (w *Window) Next(waiting, idle int) int {
	capacity, batch, least := w.limits()
	free := capacity - w.held.Load()
	due := free >= batch || // room for a batch
		(free >= least && waiting < idle) || // a worker idle with nothing to take
		(free >= 1 && w.urged.Load()) // messages taken ahead wait (see Urge)
	if !due {
		return 0
	}
	w.urged.Store(false)
	return int(min(w.batch, free))
}

// limits are what the window holds at most now, the room it claims for
// while its workers are busy, and the least it claims for while a worker
// is idle with nothing to take: half a batch, or, in a paced window,
// whatever it has room for (it holds no more than its workers soon take,
// so waiting for more room would leave one idle). A claim takes all the
// room there is, up to a batch.
func (w *Window) limits() (capacity, batch, least int64) {
	if w.workers == 0 {
		return w.capacity, w.batch, max(1, w.batch/2)
	}
	avg := w.handlerTime.Load()
	if avg == 0 { // nothing timed yet: what the workers can start
		return min(w.capacity, w.workers), min(w.batch, w.workers), 1
	}
	// The workers' own messages, and what they finish within HoldFor.
	soon := w.workers + w.workers*int64(HoldFor)/avg
	capacity = min(w.capacity, soon)
	return capacity, max(1, min(w.batch, capacity-w.workers)), 1
}

// Held is how many claimed messages are not yet handled.
func (w *Window) Held() int { return int(w.held.Load()) }
