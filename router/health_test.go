package router_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/startstop/startstoptest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/router"
)

// stuckSource polls once, then hangs without polling again.
type stuckSource struct{ runs atomic.Int32 }

func (s *stuckSource) Name() string { return "stuck" }
func (s *stuckSource) LastPoll() time.Time {
	if s.runs.Load() == 0 {
		return time.Time{}
	}
	return time.Now().Add(-time.Hour) // polled long ago
}
func (s *stuckSource) Run(ctx context.Context, _ func(context.Context, []*router.Message)) error {
	s.runs.Add(1)
	<-ctx.Done()
	return nil
}

// A source that stopped polling is restarted, with a warning.
func TestStalledSourceIsRestarted(t *testing.T) {
	t.Parallel()
	src := &stuckSource{}
	rt := newRouter(t, router.Config{AllowedHosts: []string{"x"}, HealthInterval: 20 * time.Millisecond, StallTimeout: 50 * time.Millisecond})
	rt.AddSource(src)
	pgtest.Eventually(t, 5*time.Second, "restarted", func() bool { return src.runs.Load() >= 2 })
	require.True(t, hasWarning(rt, router.WarnConsumerRestart, router.SeverityWarn))
}

func TestStartTwiceAndStopIdempotent(t *testing.T) {
	t.Parallel()
	rt, err := router.New(router.Config{AllowedHosts: []string{"x"}})
	require.NoError(t, err)
	require.NoError(t, rt.Stop(context.Background()), "stop before start")
	require.NoError(t, rt.Start(context.Background()))
	require.ErrorIs(t, rt.Start(context.Background()), router.ErrStarted)
	require.NoError(t, rt.Stop(context.Background()))
	require.NoError(t, rt.Stop(context.Background()))
}

// blockingSettler's Nack waits for release, so drained messages stay in
// the in-flight map while they are being settled.
type blockingSettler struct {
	recSettler
	release <-chan struct{}
}

func (b blockingSettler) Nack(ctx context.Context, r router.Retry) error {
	<-b.release
	return b.recSettler.Nack(ctx, r)
}

// The in-flight map growing past what the pools can hold raises
// PIPELINE_MAP_LEAK: here 60 messages of a removed pool are stuck in a slow
// nack while the only remaining pool holds 50.
func TestLeakDetection(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release); close(hold) }) })
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) { <-hold; _, _ = w.Write([]byte(`{"ack":true}`)) })
	src := &staticConfig{pools: []router.PoolConfig{{Code: "P", Concurrency: 3}}}
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, ConfigSource: src, Pools: []router.PoolConfig{},
		SyncInterval: time.Hour, LeakCheckInterval: 10 * time.Millisecond})
	rec := newRecorder()
	var batch []*router.Message
	for i := range 60 {
		m := rec.msg(fmt.Sprint(i), fmt.Sprintf("%d/1", i), "http://"+host+"/", fmt.Sprint(i))
		m.Settle = blockingSettler{recSettler: recSettler{r: rec, id: m.DeliveryID}, release: release}
		batch = append(batch, m)
	}
	rt.Route(context.Background(), batch)
	pgtest.Eventually(t, 5*time.Second, "3 in flight", func() bool { return rt.Pools()[0].InFlight == 3 })
	require.False(t, hasWarning(rt, router.WarnPipelineMapLeak, router.SeverityWarn))
	src.set([]router.PoolConfig{{Code: "Q", Concurrency: 1}})
	go func() { _ = rt.Sync(context.Background()) }() // drains P: its nacks block
	pgtest.Eventually(t, 5*time.Second, "leak warning", func() bool { return hasWarning(rt, router.WarnPipelineMapLeak, router.SeverityWarn) })
	once.Do(func() { close(release); close(hold) })
	pgtest.Eventually(t, 10*time.Second, "everything settled", func() bool { return rt.InFlight() == 0 })
}

// overlapSource counts how many of its Runs are active at once; each Run
// takes a while to return after it is cancelled, and it never polls, so
// the health check keeps restarting it.
type overlapSource struct {
	runs, active, peak atomic.Int32
	fail               bool          // Runs after the first fail at once
	polling            bool          // it polls (LastPoll is now)
	slowStop           time.Duration // how long a cancelled Run takes to return
}

func (s *overlapSource) Name() string { return "overlap" }
func (s *overlapSource) LastPoll() time.Time {
	if s.polling {
		return time.Now()
	}
	return time.Now().Add(-time.Hour)
}
func (s *overlapSource) Run(ctx context.Context, _ func(context.Context, []*router.Message)) error {
	if s.runs.Add(1) > 1 && s.fail {
		return errors.New("cannot connect")
	}
	n := s.active.Add(1)
	defer s.active.Add(-1)
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
	<-ctx.Done()
	time.Sleep(s.slowStop)
	return nil
}

// A stalled source is restarted only after its previous Run returned: two
// Runs of one source never overlap.
func TestRestartWaitsForTheOldRun(t *testing.T) {
	t.Parallel()
	src := &overlapSource{slowStop: 150 * time.Millisecond}
	rt := newRouter(t, router.Config{AllowedHosts: []string{"x"}, HealthInterval: 20 * time.Millisecond, StallTimeout: 50 * time.Millisecond})
	rt.AddSource(src)
	pgtest.Eventually(t, 5*time.Second, "restarted twice", func() bool { return src.runs.Load() >= 3 })
	require.EqualValues(t, 1, src.peak.Load(), "Runs never overlap")
	require.True(t, hasWarning(rt, router.WarnConsumerRestart, router.SeverityWarn))
}

// A restart whose Run fails raises CONSUMER_RESTART_FAILED.
func TestRestartFailureIsReported(t *testing.T) {
	t.Parallel()
	src := &overlapSource{fail: true}
	rt := newRouter(t, router.Config{AllowedHosts: []string{"x"}, HealthInterval: 20 * time.Millisecond, StallTimeout: 50 * time.Millisecond})
	rt.AddSource(src)
	pgtest.Eventually(t, 5*time.Second, "restart failure reported", func() bool {
		return hasWarning(rt, router.WarnConsumerRestartFailed, router.SeverityCritical)
	})
	for _, w := range rt.Warnings() {
		if w.Code == router.WarnConsumerRestartFailed {
			require.Contains(t, w.Message, "cannot connect")
		}
	}
}

// RemoveSource stops a source for good: its Run returned when RemoveSource
// returns, and the health check does not start it again.
func TestRemoveSource(t *testing.T) {
	t.Parallel()
	src := &overlapSource{polling: true}
	rt := newRouter(t, router.Config{AllowedHosts: []string{"x"}, HealthInterval: 10 * time.Millisecond, StallTimeout: 50 * time.Millisecond})
	rt.AddSource(src)
	pgtest.Eventually(t, 5*time.Second, "running", func() bool { return src.active.Load() == 1 })
	require.NoError(t, rt.RemoveSource(context.Background(), src))
	require.Zero(t, src.active.Load(), "its Run returned")
	time.Sleep(100 * time.Millisecond) // ten health checks
	require.EqualValues(t, 1, src.runs.Load(), "not started again")
	require.ErrorIs(t, rt.RemoveSource(context.Background(), src), router.ErrUnknownSource)
}

// A panic in delivery code (here the token callback) is recovered: the
// message is nacked as a failed attempt, GROUP_THREAD_RESTART is raised,
// and the pool goes on delivering.
func TestPanicInDeliveryIsRecovered(t *testing.T) {
	t.Parallel()
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(`{"ack":true}`)) })
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, TokenFunc: func(_ context.Context, u *url.URL) (string, error) {
		if strings.HasSuffix(u.Path, "/boom") {
			panic("token store exploded")
		}
		return "t", nil
	}})
	rec := newRecorder()
	rt.Route(context.Background(), []*router.Message{rec.msg("a", "a/1", "http://"+host+"/boom", "g")})
	got := rec.outcome(t, "a/1")
	require.Equal(t, "nack", got.kind)
	require.True(t, got.attempted)
	require.Contains(t, got.reason, "token store exploded")
	require.True(t, hasWarning(rt, router.WarnGroupThreadRestart, router.SeverityWarn))
	rt.Route(context.Background(), []*router.Message{rec.msg("b", "b/1", "http://"+host+"/fine", "g2")})
	require.Equal(t, "ack", rec.outcome(t, "b/1").kind, "the pool lives on")
	pgtest.Eventually(t, 5*time.Second, "in-flight map empty", func() bool { return rt.InFlight() == 0 })
}

// The stall check measures a source's last poll in the time sources
// report it in (the wall clock), whatever Config.Clock says: a router
// whose clock runs an hour ahead (a test clock) does not take a polling
// source for stalled (it restarted it every health check).
func TestStallCheckIgnoresTheInjectedClock(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now().Add(time.Hour))
	src := &overlapSource{polling: true}
	rt := newRouter(t, router.Config{AllowedHosts: []string{"x"}, Clock: clock,
		HealthInterval: 10 * time.Millisecond, StallTimeout: 50 * time.Millisecond})
	rt.AddSource(src)
	time.Sleep(200 * time.Millisecond) // twenty health checks
	require.EqualValues(t, 1, src.runs.Load(), "a polling source was restarted")
	require.False(t, hasWarning(rt, router.WarnConsumerRestart, router.SeverityWarn))
}

// A router started and stopped from ten goroutines at once, over and over,
// never hangs a Stop, and a stopped router starts again and routes: its
// sources run again, its pools are made anew.
func TestRouterStartStopStress(t *testing.T) {
	t.Parallel()
	src := &overlapSource{polling: true}
	rt, err := router.New(router.Config{AllowedHosts: []string{"x"}, HealthInterval: 5 * time.Millisecond, StallTimeout: time.Second})
	require.NoError(t, err)
	rt.AddSource(src)
	startstoptest.Stress(t, rt, 20)
	require.LessOrEqual(t, src.peak.Load(), int32(1), "two Runs of one source at once")

	require.NoError(t, rt.Start(context.Background()))
	pgtest.Eventually(t, 5*time.Second, "the source runs again", func() bool { return src.active.Load() == 1 })
	rec := newRecorder()
	rt.Route(context.Background(), []*router.Message{rec.msg("m", "m/1", "http://x/", "g")})
	got := rec.outcome(t, "m/1")
	require.True(t, got.kind == "nack" && got.attempted, "routed and delivered (x does not resolve: retried later) after a restart: %+v", got)
	require.NoError(t, rt.Stop(context.Background()))
	require.Zero(t, src.active.Load())
}
