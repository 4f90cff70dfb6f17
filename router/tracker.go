package router

import "sync"

// tracker is the in-flight map: every message between routing and its
// ack/nack, by pipeline key (the delivery id), with an index by message id
// to recognise a logical requeue of a message still in flight.
type tracker struct {
	mu    sync.Mutex
	byKey map[string]*Message
	byID  map[string]string // message id → pipeline key
}

func newTracker() *tracker {
	return &tracker{byKey: map[string]*Message{}, byID: map[string]string{}}
}

type trackResult int

const (
	tracked trackResult = iota
	physicalDuplicate
	logicalRequeue
)

// check classifies m without tracking it; for a duplicate it also returns
// the message in flight.
func (t *tracker) check(m *Message) (trackResult, *Message) {
	t.mu.Lock()
	defer t.mu.Unlock()
	res := t.checkLocked(m)
	if res == tracked {
		return res, nil
	}
	if orig, ok := t.byKey[m.pipelineKey()]; ok {
		return res, orig
	}
	return res, t.byKey[t.byID[m.idKey()]]
}

func (t *tracker) checkLocked(m *Message) trackResult {
	if _, ok := t.byKey[m.pipelineKey()]; ok {
		return physicalDuplicate
	}
	if key, ok := t.byID[m.idKey()]; ok {
		if _, live := t.byKey[key]; live {
			if key == m.pipelineKey() {
				return physicalDuplicate
			}
			return logicalRequeue
		}
		delete(t.byID, m.idKey()) // stale index entry
	}
	return tracked
}

// track adds m unless it is a duplicate.
func (t *tracker) track(m *Message) trackResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r := t.checkLocked(m); r != tracked {
		return r
	}
	t.byKey[m.pipelineKey()] = m
	t.byID[m.idKey()] = m.pipelineKey()
	return tracked
}

func (t *tracker) remove(m *Message) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byKey[m.pipelineKey()] == m {
		delete(t.byKey, m.pipelineKey())
		if t.byID[m.idKey()] == m.pipelineKey() {
			delete(t.byID, m.idKey())
		}
	}
}

func (t *tracker) size() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byKey)
}

// drain removes and returns everything still tracked.
func (t *tracker) drain() []*Message {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*Message, 0, len(t.byKey))
	for _, m := range t.byKey {
		out = append(out, m)
	}
	t.byKey, t.byID = map[string]*Message{}, map[string]string{}
	return out
}
