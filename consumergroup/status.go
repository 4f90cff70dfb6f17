package consumergroup

import (
	"encoding/json"
	"sync"
	"time"
)

// Status is what an instance knows of itself, from memory: reading it
// sends nothing to the database, so a health probe built on it stays fast
// when the database is slow. Health reads the group from the database.
type Status struct {
	// Topic and Group name the group; Instance is this instance's id.
	Topic    string `json:"topic"`
	Group    string `json:"group"`
	Instance string `json:"instance"`
	// Running: started, and its run has not ended. A run ends with Stop,
	// or on its own when the subscription was cancelled or deleted (Err).
	Running bool `json:"running"`
	// Started is when the current (or last) run started; zero before the
	// first Start.
	Started time.Time `json:"started"`
	// Err is why the run ended on its own (ErrCancelled,
	// ErrSubscriptionGone), or nil.
	Err error `json:"-"`
	// LastLook is when a look for work last succeeded (whether or not it
	// found any); zero before the first.
	LastLook time.Time `json:"last_look"`
	// LookFailures counts the looks that failed since the last that
	// succeeded; LastLookError is the last failure's error, at
	// LastLookErrorAt ("" and zero while looks succeed).
	LookFailures    int       `json:"look_failures"`
	LastLookError   string    `json:"last_look_error,omitempty"`
	LastLookErrorAt time.Time `json:"last_look_error_at,omitzero"`
	// LastHeartbeat is when a heartbeat last went through. An instance
	// whose heartbeats failed for its HeartbeatTimeout fetches nothing
	// (Silent) until one goes through.
	LastHeartbeat time.Time `json:"last_heartbeat"`
	Silent        bool      `json:"silent"`
	// Backfill is where the instance's reads of a pending backfill stand.
	Backfill BackfillStatus `json:"backfill,omitempty"`
	// BackfillError is why the last look that read from the backfill
	// failed, at BackfillErrorAt, while Backfill is BackfillFailed.
	BackfillError   string    `json:"backfill_error,omitempty"`
	BackfillErrorAt time.Time `json:"backfill_error_at,omitzero"`
}

// MarshalJSON writes Err as a string ("error", left out when nil).
func (s Status) MarshalJSON() ([]byte, error) {
	type plain Status
	var e string
	if s.Err != nil {
		e = s.Err.Error()
	}
	return json.Marshal(struct {
		plain
		Error string `json:"error,omitempty"`
	}{plain(s), e})
}

// BackfillStatus is where an instance's catch-up reads stand.
type BackfillStatus string

const (
	// BackfillNone: no backfill is pending, or this instance has not read
	// one yet.
	BackfillNone BackfillStatus = ""
	// BackfillRunning: a backfill is pending, and the instance's last
	// look that read from it succeeded.
	BackfillRunning BackfillStatus = "RUNNING"
	// BackfillFailed: the instance's last look that read from the pending
	// backfill failed; Status.BackfillError says why. Looks take turns
	// between the stream and the backfill, so new messages still flow.
	BackfillFailed BackfillStatus = "FAILED"
)

// Status returns what this instance knows of itself, without a query.
func (g *Group) Status() Status {
	s := Status{Topic: g.cfg.Topic, Group: g.cfg.Group, Instance: g.cfg.InstanceID}
	g.mu.Lock()
	r := g.run
	g.mu.Unlock()
	if r == nil {
		return s
	}
	s.Running = r.fetchCtx.Err() == nil
	s.Err = r.cause()
	s.LastHeartbeat = time.Unix(0, r.lastBeat.Load())
	s.Silent = s.Running && !r.canFetch()
	r.looks.fill(&s)
	return s
}

// lookRecord is what the fetcher records of its looks for Status.
type lookRecord struct {
	mu          sync.Mutex
	started     time.Time
	last        time.Time
	failures    int
	err         string
	errAt       time.Time
	backfill    BackfillStatus
	backfillErr string
	backfillAt  time.Time
}

// Looked notes a look's outcome at now; catchup says it read from a
// backfill (see engine.LookObserver).
func (l *lookRecord) Looked(err error, catchup bool, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.failures++
		l.err, l.errAt = err.Error(), now
	} else {
		l.failures, l.err, l.errAt, l.last = 0, "", time.Time{}, now
	}
	if catchup {
		l.backfill, l.backfillErr, l.backfillAt = BackfillRunning, "", time.Time{}
		if err != nil {
			l.backfill, l.backfillErr, l.backfillAt = BackfillFailed, err.Error(), now
		}
	}
}

// NoBackfill notes that no backfill is pending.
func (l *lookRecord) NoBackfill() {
	l.mu.Lock()
	l.backfill, l.backfillErr, l.backfillAt = BackfillNone, "", time.Time{}
	l.mu.Unlock()
}

func (l *lookRecord) fill(s *Status) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s.Started, s.LastLook = l.started, l.last
	s.LookFailures, s.LastLookError, s.LastLookErrorAt = l.failures, l.err, l.errAt
	s.Backfill, s.BackfillError, s.BackfillErrorAt = l.backfill, l.backfillErr, l.backfillAt
}
