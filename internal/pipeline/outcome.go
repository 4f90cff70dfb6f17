package pipeline

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgoutbox/pgoutbox/outbox"
)

// Outcome is what became of a claimed message in the execute step.
type Outcome int

const (
	// Ack: handled, or taken by no member: done for the group.
	Ack Outcome = iota
	// Fail: to retry later or dead-letter, as its Failure says.
	Fail
	// Release: never handled (the instance is stopping): handed back
	// with its attempt given back.
	Release
)

// Failure is the detail of an outcome: the attempts a message spent and,
// when it did not succeed, what comes next for it.
type Failure struct {
	ID       int64
	Attempts int           // attempts spent
	Delay    time.Duration // until it is due again
	At       time.Time     // when set, the instant it is due again (Delay approximates it)
	Dead     bool          // dead-lettered now
	Snoozed  bool          // the handler did not try it: the attempt is given back
	Err      string        // the handler's error
}

// DueAt is the instant f was given (RetryAt, SnoozeUntil), or nil: due
// after its Delay.
func (f Failure) DueAt() *time.Time {
	if f.At.IsZero() {
		return nil
	}
	return &f.At
}

// Untried is the outcome of a job handed back without being handled: its
// attempt is given back.
func Untried(j *Job) Failure {
	return Failure{ID: j.D.ID, Attempts: j.D.Attempt - 1}
}

// Job is one claimed delivery to handle.
type Job struct {
	D *outbox.Delivery
	// Batch is the fetched batch the delivery belongs to; nil for a
	// delivery claimed on its own (a retry, or a message group's head).
	Batch *Batch
	// Next is the next message of the same message group in one claim,
	// handled after this one succeeds (see Runs).
	Next *Job
}

// Batch gathers the outcomes of a fetched batch, which is completed whole
// once its last message is done. Its methods are safe for concurrent use.
type Batch struct {
	ID        int64
	remaining atomic.Int64
	mu        sync.Mutex // guards the outcome lists
	acked     []int64
	ackedInTx []int64 // acked in handlers' transactions
	failed    []Failure
	released  []Failure
}

// NewBatch returns batch id of n messages.
func NewBatch(id int64, n int) *Batch {
	b := &Batch{ID: id}
	b.remaining.Store(int64(n))
	return b
}

// AckedInTx records that message id was acked in a handler's transaction.
func (b *Batch) AckedInTx(id int64) {
	b.mu.Lock()
	b.ackedInTx = append(b.ackedInTx, id)
	b.mu.Unlock()
}

// HandledInTx returns the messages acked in handlers' transactions.
func (b *Batch) HandledInTx() []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ackedInTx
}

// Outcomes returns the batch's messages by outcome. Call it once the
// batch is settled.
func (b *Batch) Outcomes() (acked []int64, failed, released []Failure) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.acked, b.failed, b.released
}

// add records one message's outcome and reports whether it was the
// batch's last.
func (b *Batch) add(o Outcome, f Failure) (last bool) {
	b.mu.Lock()
	switch o {
	case Ack:
		b.acked = append(b.acked, f.ID)
	case Fail:
		b.failed = append(b.failed, f)
	case Release:
		b.released = append(b.released, f)
	}
	b.mu.Unlock()
	return b.remaining.Add(-1) == 0
}

// Settled is what the complete step writes: a whole batch, or the outcome
// of one delivery claimed on its own.
type Settled struct {
	Batch   *Batch  // the batch, when the outcome is a batch's
	Outcome Outcome // of a delivery claimed on its own
	Failure Failure // its detail (the message id is in Failure.ID)
}

// Held lists the batches and deliveries claimed on their own that a
// consumer still works on: their leases are extended while they are.
// Its methods are safe for concurrent use.
type Held struct {
	mu      sync.Mutex
	batches map[int64]bool // true once the complete step began to finish it
	retries map[int64]struct{}
	lost    map[int64]bool // batches whose takeover was reported (see ReportLost)
}

// NewHeld returns an empty list.
func NewHeld() *Held {
	return &Held{batches: map[int64]bool{}, retries: map[int64]struct{}{}, lost: map[int64]bool{}}
}

// Add lists batch batchID (unless 0) and the deliveries retryIDs.
func (h *Held) Add(batchID int64, retryIDs []int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if batchID != 0 {
		h.batches[batchID] = false
	}
	for _, id := range retryIDs {
		h.retries[id] = struct{}{}
	}
}

// Remove forgets batch batchID and delivery retryID (either may be 0).
func (h *Held) Remove(batchID, retryID int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.batches, batchID)
	delete(h.retries, retryID)
	delete(h.lost, batchID)
}

// ReportLost records that batchID was taken over, reporting whether that
// is news.
func (h *Held) ReportLost(batchID int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lost[batchID] {
		return false
	}
	h.lost[batchID] = true
	return true
}

// Finishing records that the complete step is about to delete batchID's
// row: from then on its absence is no sign of a takeover.
func (h *Held) Finishing(batchID int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.batches[batchID]; ok {
		h.batches[batchID] = true
	}
}

// WorkingOn reports whether batchID is listed and not being finished.
func (h *Held) WorkingOn(batchID int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	finishing, ok := h.batches[batchID]
	return ok && !finishing
}

// Snapshot returns what is listed.
func (h *Held) Snapshot() (batches, retries []int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.batches {
		batches = append(batches, id)
	}
	for id := range h.retries {
		retries = append(retries, id)
	}
	return batches, retries
}
