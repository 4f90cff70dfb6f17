package router

import (
	"sync"
	"time"
)

// holds remembers, per stream and message group, a message that failed or
// was sent back and will be redelivered: until it comes back (or the hold
// lapses), messages of the group routed in later batches are nacked
// instead of delivered ahead of it. Messages routed before it are not
// affected.
//
// Holds serve only sources that do not keep the order themselves:
// sources of your own, and messages whose Mapper gave them another Group
// than the one they were sent with. QueueSource and GroupSource read every
// topic by message group (consumergroup.Config.ByMessageGroup), so the
// database hands out a message group's next messages only once those
// before them are settled, across routers and restarts, which no hold in
// one process can do; their messages are never held (Message.ordered).
// Sources like SQS FIFO keep the order themselves too.
type holds struct {
	mu sync.Mutex
	m  map[string]hold
}

type hold struct {
	messageID  string
	afterBatch uint64    // messages of later batches are held back
	resume     time.Time // held-back messages come back at this one instant
	until      time.Time // the hold lapses then (the message never returned)
}

func newHolds() *holds { return &holds{m: map[string]hold{}} }

func holdKey(m *Message) string { return m.groupKey }

// hold holds m's group back: m returns at retryAt; its group mates from
// later batches are nacked to one instant just after, so they come back
// together, in order.
func (h *holds) hold(m *Message, retryAt time.Time, gap time.Duration) {
	if m.ordered {
		return // its source keeps the order
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	k := holdKey(m)
	nh := hold{messageID: m.ID, afterBatch: m.batchSeq, resume: retryAt.Add(gap), until: retryAt.Add(2 * gap)}
	if old, ok := h.m[k]; ok && old.resume.After(nh.resume) {
		// A mate already waits to come back later: m's later mates must
		// not come back before it.
		nh.resume = old.resume
		if old.until.After(nh.until) {
			nh.until = old.until
		}
	}
	h.m[k] = nh
}

// heldBack reports whether m must wait for an earlier message of its
// group, and until when.
func (h *holds) heldBack(m *Message, now time.Time) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !m.grouped() || m.ordered {
		return time.Time{}, false // no order to keep, or its source keeps it
	}
	k := holdKey(m)
	hd, ok := h.m[k]
	if !ok || m.batchSeq <= hd.afterBatch {
		return time.Time{}, false
	}
	if hd.messageID == m.ID || now.After(hd.until) {
		delete(h.m, k) // the held message is back (or the hold lapsed)
		return time.Time{}, false
	}
	if hd.resume.Before(now) {
		return now.Add(MinDelay), true
	}
	return hd.resume, true
}

// prune forgets the holds that lapsed: their groups saw no message since.
func (h *holds) prune(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, hd := range h.m {
		if now.After(hd.until) {
			delete(h.m, k)
		}
	}
}
