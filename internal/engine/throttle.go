package engine

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// throttle paces one instance's catch-up reads. Three rules, each on what
// it observes itself:
//
//   - a rate cap: a token bucket of Rate rows a second (it starts full,
//     with Burst rows: a small backfill is over before any rule matters);
//   - read latency: reads pause while the p95 of their latency is above
//     TargetLatency, for the excess (at most maxPause);
//   - database load: while a backfill runs, the instance times, every
//     probeEvery, the commit of a transaction that writes nothing but its
//     own id, at times that have nothing to do with the backfill's reads.
//     A commit waits for the server's CPU and for the WAL to reach the
//     disk, which is what every other writing client of the database waits
//     on: it grows when the backfill (or anything else) keeps the server
//     or its disk busy. Every probeWindow probes, when the window's p95 is
//     more than MaxSlowdown times the quiet level (the 10th
//     percentile of the window p95s of the last quietWindows windows) the
//     rate shrinks by a quarter, down to a thousandth of the cap; otherwise
//     it grows back by a tenth. The rate starts at that thousandth, so the
//     quiet level is seen before the backfill runs at full speed (it
//     reaches the cap after about 73 quiet seconds).
//
// The fetcher calls ready, wait and observe; the load sampler calls
// probed. The limiter is safe for both; mu guards the probe windows.
type throttle struct {
	limiter  *rate.Limiter
	max      rate.Limit
	target   time.Duration
	slowdown float64 // <= 0: no load rule

	reads      []time.Duration // the latest reads' latencies, oldest first (fetcher only)
	pauseUntil time.Time       // fetcher only
	lastLog    time.Time       // of progress (fetcher only)
	lastPause  time.Time       // of a pause's log record (fetcher only)

	mu       sync.Mutex
	window   []time.Duration // probes of the window being filled
	quiet    []time.Duration // p95s of the latest windows, oldest first
	lastSlow time.Time       // of a slowdown's log record
}

// loadProbe is the load sampler's probe.
const loadProbe = "BEGIN; SELECT pg_current_xact_id(); COMMIT"

const (
	throttleSamples = 20 // reads in the latency p95
	probeEvery      = 50 * time.Millisecond
	probeWindow     = 20  // probes in a window: a second
	quietWindows    = 300 // windows the quiet level looks back on: five minutes
	maxPause        = 5 * time.Second
	minRateShare    = 0.001 // the load rule's floor, and its start: a thousandth of the cap
)

// BackfillPace is how fast a backfill may read (see throttle).
type BackfillPace struct {
	Rate          float64       // rows a second, at most
	BatchSize     int           // rows a read, at most
	Burst         int           // rows the token bucket holds, and starts with
	TargetLatency time.Duration // reads pause while their p95 is above it
	MaxSlowdown   float64       // <= 0: no load rule
}

func newThrottle(p BackfillPace) *throttle {
	limit := rate.Limit(p.Rate)
	start := limit
	if p.MaxSlowdown > 0 {
		start = limit * minRateShare
	}
	return &throttle{limiter: rate.NewLimiter(start, p.Burst), max: limit,
		target: p.TargetLatency, slowdown: p.MaxSlowdown}
}

// ready reports whether a read of want rows may run now.
func (t *throttle) ready(now time.Time, want int) bool {
	return !now.Before(t.pauseUntil) && t.limiter.TokensAt(now) >= float64(want)
}

// wait is how long until a read of want rows may run.
func (t *throttle) wait(now time.Time, want int) time.Duration {
	if now.Before(t.pauseUntil) {
		return t.pauseUntil.Sub(now)
	}
	missing := float64(want) - t.limiter.TokensAt(now)
	if missing <= 0 {
		return 0
	}
	return time.Duration(missing / float64(t.limiter.Limit()) * float64(time.Second))
}

// observe records a read of n rows that took d: it spends n tokens and
// pauses reads for the p95's excess over the target. It returns the p95
// when it paused, else 0.
func (t *throttle) observe(now time.Time, n int, d time.Duration) time.Duration {
	t.limiter.ReserveN(now, n)
	t.reads = append(t.reads, d)
	if len(t.reads) > throttleSamples {
		t.reads = t.reads[1:]
	}
	if p95 := percentile(t.reads, 95); p95 > t.target && len(t.reads) >= 5 {
		t.pauseUntil = now.Add(min(p95-t.target, maxPause))
		return p95
	}
	return 0
}

// load is what a closed probe window said.
type load struct {
	p95, quiet time.Duration
	busy       bool
	rate       rate.Limit // the rate after the window
	log        bool       // busy, and no slowdown was logged in the last 30 s
}

// probed records a probe's round trip at now. When it closes a window it
// adapts the rate and returns what the window said.
func (t *throttle) probed(now time.Time, d time.Duration) (load, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.window = append(t.window, d); len(t.window) < probeWindow {
		return load{}, false
	}
	l := load{p95: percentile(t.window, 95)}
	t.window = t.window[:0]
	if t.quiet = append(t.quiet, l.p95); len(t.quiet) > quietWindows {
		t.quiet = t.quiet[1:]
	}
	l.quiet = percentile(t.quiet, 10)
	l.busy = float64(l.p95) > t.slowdown*float64(l.quiet)
	if l.busy {
		t.limiter.SetLimitAt(now, max(t.limiter.Limit()*3/4, t.max*minRateShare))
		if l.log = now.Sub(t.lastSlow) >= 30*time.Second; l.log {
			t.lastSlow = now
		}
	} else if t.limiter.Limit() < t.max {
		t.limiter.SetLimitAt(now, min(t.limiter.Limit()*11/10, t.max))
	}
	l.rate = t.limiter.Limit()
	return l, true
}

// percentile is the p-th percentile of d (not empty), by nearest rank:
// the smallest value at least p percent of d are at or below.
func percentile(d []time.Duration, p int) time.Duration {
	s := slices.Sorted(slices.Values(d))
	return s[max(0, (len(s)*p+99)/100-1)]
}

// sampleLoad is the load sampler: until ctx ends, while the group has a
// backfill to read, it probes the database every probeEvery on the probe
// pool (the heartbeats' pool: so it
// never waits for one of the pool's connections the fetcher or the
// handlers use) and feeds the throttle. It runs only when the load rule is
// on. A probe takes a transaction id: 20 a second while a backfill runs.
func (f *Fetcher) sampleLoad(ctx context.Context) {
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	var lastFailure time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !f.backfilling.Load() || f.throttle.limiter.Tokens() >= float64(f.throttle.limiter.Burst())/2 {
			continue // no backfill, or one still on the bucket's first rows: the rate does not bind yet
		}
		d, err := f.probe(ctx)
		if err != nil {
			if ctx.Err() == nil && time.Since(lastFailure) >= 30*time.Second {
				lastFailure = time.Now()
				f.Logger.Warn("pgoutbox: backfill load probe failed; the backfill keeps its current pace until one succeeds",
					slog.Any("error", err))
			}
			continue
		}
		l, closed := f.throttle.probed(time.Now(), d)
		if !closed || !l.busy {
			continue
		}
		f.cfg.BackfillPauses(context.WithoutCancel(ctx), 1)
		if l.log {
			f.Logger.Info("pgoutbox: backfill yields: commits take longer than when the database was quiet; it slows down",
				slog.Duration("p95", l.p95), slog.Duration("quiet_p95", l.quiet),
				slog.Float64("rows_per_second", float64(l.rate)))
		}
	}
}

// probe times one write transaction's round trip, its commit included (it
// writes nothing but its id), not counting the wait for a connection. The
// three statements go as one simple-protocol message, so through
// PgBouncer in transaction mode they run on one server connection.
func (f *Fetcher) probe(ctx context.Context) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := f.cfg.ProbePool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer c.Release()
	start := time.Now()
	_, err = c.Exec(ctx, loadProbe)
	return time.Since(start), err
}
