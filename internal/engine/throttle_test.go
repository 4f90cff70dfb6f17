package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// feedWindow closes one probe window whose probes all took d and returns
// what it said.
func feedWindow(t *testing.T, th *throttle, now time.Time, d time.Duration) load {
	t.Helper()
	for i := range probeWindow - 1 {
		_, closed := th.probed(now, d)
		require.False(t, closed, "window closed after %d probes", i+1)
	}
	l, closed := th.probed(now, d)
	require.True(t, closed)
	return l
}

// The load rule: the rate starts at a thousandth of the cap, grows by a
// tenth a quiet window up to the cap, shrinks by a quarter a busy window
// (commits more than BackfillMaxSlowdown times slower than the quiet
// level) down to a thousandth of the cap, and grows back once the database
// is quiet again.
func TestThrottleLoadRule(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	th := newThrottle(BackfillPace{Rate: 10_000, BatchSize: 100, Burst: 10_000,
		TargetLatency: time.Hour, MaxSlowdown: 2})
	require.Equal(t, rate.Limit(10), th.limiter.Limit(), "starts at a thousandth of the cap")

	for range 80 {
		l := feedWindow(t, th, now, time.Millisecond)
		require.False(t, l.busy)
	}
	require.Equal(t, rate.Limit(10_000), th.limiter.Limit(), "quiet: grows to the cap and no further")

	l := feedWindow(t, th, now, 1900*time.Microsecond)
	require.False(t, l.busy, "1.9 times the quiet level is within BackfillMaxSlowdown 2")
	l = feedWindow(t, th, now, 3*time.Millisecond)
	require.True(t, l.busy)
	require.Equal(t, time.Millisecond, l.quiet)
	require.Equal(t, 3*time.Millisecond, l.p95)
	require.Equal(t, rate.Limit(7_500), th.limiter.Limit(), "busy: a quarter less")
	for range 40 {
		feedWindow(t, th, now, 3*time.Millisecond)
	}
	require.Equal(t, rate.Limit(10), th.limiter.Limit(), "never below a thousandth of the cap")

	// Busy windows are not the quiet level while most of the look-back is
	// quiet (it is the 10th percentile of the windows' p95s).
	l = feedWindow(t, th, now, time.Millisecond)
	require.False(t, l.busy)
	require.Equal(t, time.Millisecond, l.quiet)
	require.InDelta(t, 11, float64(th.limiter.Limit()), 0.001, "quiet again: grows back")
}

// A window's p95 is what it is judged by: one slow probe in twenty does
// not make the database busy; two do.
func TestThrottleWindowP95(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	th := newThrottle(BackfillPace{Rate: 10_000, BatchSize: 100, Burst: 10_000,
		TargetLatency: time.Hour, MaxSlowdown: 2})
	feedWindow(t, th, now, time.Millisecond)
	window := func(slow int) load {
		var l load
		for i := range probeWindow {
			d := time.Millisecond
			if i < slow {
				d = 10 * time.Millisecond
			}
			l, _ = th.probed(now, d)
		}
		return l
	}
	require.False(t, window(1).busy)
	require.True(t, window(2).busy)
}

// Without the load rule the rate is the cap from the start.
func TestThrottleWithoutLoadRule(t *testing.T) {
	th := newThrottle(BackfillPace{Rate: 10_000, BatchSize: 100, Burst: 10_000,
		TargetLatency: time.Hour, MaxSlowdown: -1})
	require.Equal(t, rate.Limit(10_000), th.limiter.Limit())
}

// ready and wait follow the token bucket and the latency pause: a read of
// more rows than the bucket holds waits for the tokens it lacks; a read
// slower than the target pauses the next one for the excess, at most
// maxPause.
func TestThrottleReadyAndWait(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	th := newThrottle(BackfillPace{Rate: 1_000, BatchSize: 100, Burst: 10_000,
		TargetLatency: 10 * time.Millisecond, MaxSlowdown: -1})
	require.True(t, th.ready(now, 10_000), "the bucket starts full")
	require.Zero(t, th.wait(now, 100))
	require.Zero(t, th.observe(now, 10_000, time.Millisecond), "a fast read does not pause")
	require.False(t, th.ready(now, 100))
	require.Equal(t, 100*time.Millisecond, th.wait(now, 100), "100 rows at 1,000 a second")
	later := now.Add(100 * time.Millisecond)
	require.True(t, th.ready(later, 100))

	for range 4 {
		th.observe(later, 0, time.Second) // slow reads of no rows: nothing drawn from the bucket
	}
	p95 := th.observe(later, 0, time.Minute)
	require.Equal(t, time.Minute, p95)
	require.False(t, th.ready(later, 1), "paused")
	require.Equal(t, maxPause, th.wait(later, 1), "a pause lasts at most maxPause")
	require.True(t, th.ready(later.Add(maxPause), 1))
}
