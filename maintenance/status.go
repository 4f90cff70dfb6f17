package maintenance

import (
	"encoding/json"
	"time"
)

// JobStatus is where one maintenance job stands, from memory (reading it
// sends nothing to the database).
type JobStatus struct {
	// Job names the job: "dead-groups", "cleanup", "subscriptions" or
	// "partitions".
	Job string `json:"job"`
	// Every is how often the job runs.
	Every time.Duration `json:"-"`
	// LastSuccess is when a pass of the job last succeeded; zero before
	// the first.
	LastSuccess time.Time `json:"last_success"`
	// Failures counts the passes that failed since the last that
	// succeeded; LastError is the last failure's error, at LastErrorAt
	// ("" and zero after a pass that succeeded).
	Failures    int       `json:"failures"`
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// Behind counts the passes in a row that failed or took longer than
	// the job's interval, since BehindSince: a job behind for
	// BehindPasses passes or more does not keep up (for cleanup, the log
	// grows), and is logged at WARN.
	Behind      int       `json:"behind"`
	BehindSince time.Time `json:"behind_since,omitzero"`
}

// BehindPasses is how many passes in a row must fail or overrun the
// job's interval before the job is reported as falling behind.
const BehindPasses = 3

// FallingBehind reports whether the job has not kept up for BehindPasses
// passes in a row.
func (s JobStatus) FallingBehind() bool { return s.Behind >= BehindPasses }

// MarshalJSON writes Every in seconds.
func (s JobStatus) MarshalJSON() ([]byte, error) {
	type plain JobStatus
	return json.Marshal(struct {
		plain
		EverySeconds float64 `json:"every_seconds"`
	}{plain(s), s.Every.Seconds()})
}

func (s *JobStatus) record(err error, took, every time.Duration, now time.Time) {
	if err != nil || took > every {
		if s.Behind == 0 {
			s.BehindSince = now
		}
		s.Behind++
	} else {
		s.Behind, s.BehindSince = 0, time.Time{}
	}
	if err != nil {
		s.Failures++
		s.LastError, s.LastErrorAt = err.Error(), now
		return
	}
	s.Failures, s.LastError, s.LastErrorAt, s.LastSuccess = 0, "", time.Time{}, now
}

// Status returns where each job stands, in the order RunOnce runs them.
// Passes run by RunOnce count too.
func (s *Service) Status() []JobStatus {
	out := make([]JobStatus, 0, len(s.jobs))
	for _, j := range s.jobs {
		j.mu.Lock()
		st := j.last
		j.mu.Unlock()
		st.Job, st.Every = j.name, j.every
		out = append(out, st)
	}
	return out
}

// Running reports whether the service runs (between Start and Stop).
func (s *Service) Running() bool { return s.life.Running() }
