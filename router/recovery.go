package router

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/ratelog"
)

// recoveries notices receivers that recover. A host whose deliveries
// failed (each failure goes to the log as a retry, at most once per
// LogInterval) gets one Info record when a delivery to it succeeds again,
// saying how many failed and since when; the circuit breaker closing
// again is part of that recovery and not logged beside it.
type recoveries struct {
	log *ratelog.Log
	now func() time.Time

	failingHosts atomic.Int32 // len(failing): a success to a healthy host takes no lock
	mu           sync.Mutex
	failing      map[string]*failingHost // by host; hosts are allow-listed, so few
}

type failingHost struct {
	since    time.Time
	failures int
}

func newRecoveries(log *ratelog.Log, now func() time.Time) *recoveries {
	return &recoveries{log: log, now: now, failing: map[string]*failingHost{}}
}

// failed records a delivery to host that failed.
func (r *recoveries) failed(host string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.failing[host]
	if f == nil {
		f = &failingHost{since: r.now()}
		r.failing[host] = f
		r.failingHosts.Add(1)
	}
	f.failures++
}

// succeeded records a delivery to host that succeeded, and logs the
// recovery of a host that was failing.
func (r *recoveries) succeeded(host string) {
	if r.failingHosts.Load() == 0 {
		return
	}
	r.mu.Lock()
	f := r.failing[host]
	if f != nil {
		delete(r.failing, host)
		r.failingHosts.Add(-1)
	}
	r.mu.Unlock()
	if f == nil {
		return
	}
	r.log.Log(slog.LevelInfo, "recovered|"+host, "pgoutbox router: deliveries succeed again", slog.String("event", "recovered"),
		slog.String("host", host), slog.Int("failed", f.failures), slog.Duration("failing_for", r.now().Sub(f.since)))
}
