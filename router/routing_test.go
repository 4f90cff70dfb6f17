package router_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/router"
)

// A message still in flight is never sent twice: a physical redelivery is
// nacked, a logical requeue acked, and the endpoint sees one call.
func TestDuplicateDeliveryOfInFlightMessage(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var hits atomic.Int32
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		<-release
		_, _ = w.Write([]byte(`{"ack":true}`))
	})
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}})
	rec := newRecorder()
	target := "http://" + host + "/"
	rt.Route(context.Background(), []*router.Message{rec.msg("m", "m/1", target, "g")})
	pgtest.Eventually(t, 5*time.Second, "first delivery in flight", func() bool { return hits.Load() == 1 })
	rt.Route(context.Background(), []*router.Message{rec.msg("m", "m/1", target, "g")}) // same delivery again
	rt.Route(context.Background(), []*router.Message{rec.msg("m", "m/2", target, "g")}) // requeued copy
	require.Equal(t, []settled{{kind: "nack", delay: 30 * time.Second}}, rec.all("m/1"), "physical redelivery nacked")
	require.Equal(t, []settled{{kind: "ack"}}, rec.all("m/2"), "logical requeue acked")
	close(release)
	pgtest.Eventually(t, 5*time.Second, "original acked", func() bool { return len(rec.all("m/1")) == 2 })
	require.Equal(t, "ack", rec.all("m/1")[1].kind)
	require.EqualValues(t, 1, hits.Load())
}

// A pool that cannot take all of a batch's messages for it takes none;
// unknown pools fall back to DEFAULT-POOL with a warning.
func TestPoolCapacityAndDefaultPool(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) { <-release; _, _ = w.Write([]byte(`{"ack":true}`)) })
	defer close(release)
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, Pools: []router.PoolConfig{{Code: "P", Concurrency: 1}},
		GroupShare: 1}) // one group may fill the pool
	rec := newRecorder()
	target := "http://" + host + "/"
	fillPool(t, rt, rec, target)
	var second []*router.Message
	for i := 50; i < 52; i++ {
		second = append(second, rec.msg(fmt.Sprint(i), fmt.Sprintf("%d/1", i), target, "x"))
	}
	rt.Route(context.Background(), second) // 49 queued + 2 > 50: all of them nacked
	for _, m := range second {
		require.Equal(t, "nack", rec.outcome(t, m.DeliveryID).kind)
		require.False(t, rec.outcome(t, m.DeliveryID).attempted)
	}

	m := rec.msg("u", "u/1", target, "u")
	m.Pool = "NO-SUCH-POOL"
	rt.Route(context.Background(), []*router.Message{m})
	require.True(t, hasWarning(rt, router.WarnRouting, router.SeverityWarn))
	pgtest.Eventually(t, 5*time.Second, "DEFAULT-POOL exists", func() bool {
		for _, p := range rt.Pools() {
			if p.Code == router.DefaultPoolCode && p.Concurrency == router.DefaultPoolConcurrency {
				return true
			}
		}
		return false
	})
}

// Rate limit: with an injected clock, each minute sees at most its limit.
func TestRateLimitPerMinute(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	var hits atomic.Int32
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1); _, _ = w.Write([]byte(`{"ack":true}`)) })
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, Clock: clock, RateLimitPollEvery: time.Millisecond,
		Pools: []router.PoolConfig{{Code: "P", Concurrency: 10, RateLimitPerMinute: 6}}})
	rec := newRecorder()
	var batch []*router.Message
	for i := range 30 {
		batch = append(batch, rec.msg(fmt.Sprint(i), fmt.Sprintf("%d/1", i), "http://"+host+"/", fmt.Sprint(i%5)))
	}
	rt.Route(context.Background(), batch)
	time.Sleep(100 * time.Millisecond)
	require.EqualValues(t, 1, hits.Load(), "a burst of one")
	for minute := 1; minute <= 2; minute++ {
		before := hits.Load()
		for s := 0; s < 60; s += 10 {
			clock.Advance(10 * time.Second) // one permit every 10s
			want := before + int32(s/10+1)
			pgtest.Eventually(t, 5*time.Second, "a permit per 10s", func() bool { return hits.Load() >= want })
		}
		time.Sleep(50 * time.Millisecond)
		require.LessOrEqual(t, hits.Load()-before, int32(6), "minute %d", minute)
	}
	// A new limit applies live.
	rtPools := rt.Pools()
	require.Equal(t, 6, rtPools[0].RateLimitPerMinute)
}

// Concurrency changes apply live; a pool that leaves the configuration
// drains: what it queued is nacked, deliveries in progress finish.
func TestConcurrencyUpdateAndDrainWhileBusy(t *testing.T) {
	t.Parallel()
	var inFlight, peak atomic.Int32
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // never leave handlers blocked
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		inFlight.Add(-1)
		_, _ = w.Write([]byte(`{"ack":true}`))
	})
	src := &staticConfig{pools: []router.PoolConfig{{Code: "P", Concurrency: 2}}}
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, ConfigSource: src, Pools: []router.PoolConfig{}, SyncInterval: time.Hour})
	rec := newRecorder()
	var batch []*router.Message
	for i := range 20 {
		batch = append(batch, rec.msg(fmt.Sprint(i), fmt.Sprintf("%d/1", i), "http://"+host+"/", fmt.Sprint(i)))
	}
	rt.Route(context.Background(), batch)
	pgtest.Eventually(t, 5*time.Second, "2 in flight", func() bool { return inFlight.Load() == 2 })
	time.Sleep(50 * time.Millisecond)
	require.EqualValues(t, 2, peak.Load())

	src.set([]router.PoolConfig{{Code: "P", Concurrency: 5}})
	require.NoError(t, rt.Sync(context.Background()))
	pgtest.Eventually(t, 5*time.Second, "5 in flight after the update", func() bool { return inFlight.Load() == 5 })

	src.set([]router.PoolConfig{{Code: "Q", Concurrency: 1}})
	require.NoError(t, rt.Sync(context.Background()))
	count := func(kind string, attempted bool) int {
		n := 0
		for i := range 20 {
			for _, s := range rec.all(fmt.Sprintf("%d/1", i)) {
				if s.kind == kind && s.attempted == attempted {
					n++
				}
			}
		}
		return n
	}
	// Waiting, never delivered: nacked without counting an attempt.
	pgtest.Eventually(t, 5*time.Second, "15 waiting messages nacked", func() bool { return count("nack", false) == 15 })
	require.Zero(t, count("ack", false), "nothing acked that was not delivered")
	once.Do(func() { close(release) })
	pgtest.Eventually(t, 5*time.Second, "the 5 deliveries in progress finish and are acked", func() bool { return count("ack", false) == 5 })
	pools := rt.Pools()
	require.Len(t, pools, 1)
	require.Equal(t, "Q", pools[0].Code)
}

type staticConfig struct {
	mu    sync.Mutex
	pools []router.PoolConfig
	err   error
}

func (s *staticConfig) set(p []router.PoolConfig) { s.mu.Lock(); s.pools = p; s.mu.Unlock() }
func (s *staticConfig) Pools(context.Context) ([]router.PoolConfig, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pools, s.err
}

// The HTTP configuration source against a real local config server:
// start-up retries then failure; a later outage keeps the last
// configuration with a warning; a pool that leaves drains away.
func TestConfigSync(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	status, pools, calls := 500, []router.PoolConfig{{Code: "A", Concurrency: 3}, {Code: "B", Concurrency: 1, RateLimitPerMinute: 60}}, 0
	_, cfgHost := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if status != 200 {
			w.WriteHeader(status)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"pools": pools})
	})
	source := &router.HTTPConfigSource{URL: "http://" + cfgHost + "/config"}
	bad, err := router.New(router.Config{AllowedHosts: []string{"x"}, ConfigSource: source, StartupAttempts: 3, StartupRetryDelay: 10 * time.Millisecond})
	require.NoError(t, err)
	err = bad.Start(context.Background())
	require.ErrorIs(t, err, router.ErrConfigUnavailable)
	require.Equal(t, 1, strings.Count(err.Error(), "router:"), "each layer names itself once: %v", err)
	require.Contains(t, err.Error(), "HTTP 500")
	mu.Lock()
	require.Equal(t, 3, calls, "12 attempts by default; 3 here")
	status = 200
	mu.Unlock()
	require.True(t, hasWarning(bad, router.WarnConfigSyncFailed, router.SeverityCritical))
	require.NoError(t, bad.Stop(context.Background()))

	rt := newRouter(t, router.Config{AllowedHosts: []string{"x"}, ConfigSource: source, Pools: []router.PoolConfig{}, SyncInterval: 20 * time.Millisecond})
	require.Len(t, rt.Pools(), 2)
	mu.Lock()
	status = 503
	mu.Unlock()
	pgtest.Eventually(t, 5*time.Second, "sync failure warning", func() bool { return hasWarning(rt, router.WarnConfigSyncFailed, router.SeverityWarn) })
	require.Len(t, rt.Pools(), 2, "the last configuration stays")
	mu.Lock()
	status, pools = 200, []router.PoolConfig{{Code: "A", Concurrency: 7}}
	mu.Unlock()
	pgtest.Eventually(t, 5*time.Second, "B removed, A updated", func() bool {
		p := rt.Pools()
		return len(p) == 1 && p[0].Code == "A" && p[0].Concurrency == 7
	})
}

// More pools than allowed are refused with a critical warning.
func TestPoolLimits(t *testing.T) {
	t.Parallel()
	rt := newRouter(t, router.Config{AllowedHosts: []string{"x"}, MaxPools: 2, PoolWarningThreshold: 1,
		Pools: []router.PoolConfig{{Code: "a", Concurrency: 1}, {Code: "b", Concurrency: 1}, {Code: "c", Concurrency: 1}}})
	require.Len(t, rt.Pools(), 2)
	require.True(t, hasWarning(rt, router.WarnPoolLimit, router.SeverityCritical))
	require.True(t, hasWarning(rt, router.WarnPoolLimit, router.SeverityWarn))
}

// High-priority messages of a group are served before its regular ones;
// PointerBody sends {"messageId": …} instead of the payload.
func TestHighPriorityLaneAndPointerBody(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	var mu sync.Mutex
	var order []string
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		var b map[string]string
		_ = json.NewDecoder(r.Body).Decode(&b)
		if b["messageId"] == "first" {
			<-release // hold the group while the rest queues up
		}
		mu.Lock()
		order = append(order, b["messageId"])
		mu.Unlock()
		_, _ = w.Write([]byte(`{"ack":true}`))
	})
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, PointerBody: true})
	rec := newRecorder()
	target := "http://" + host + "/"
	rt.Route(context.Background(), []*router.Message{rec.msg("first", "first/1", target, "g")})
	pgtest.Eventually(t, 5*time.Second, "first in flight", func() bool { return rt.Pools()[0].InFlight == 1 })
	low := rec.msg("low", "low/1", target, "g")
	high := rec.msg("high", "high/1", target, "g")
	high.HighPriority = true
	rt.Route(context.Background(), []*router.Message{low, high})
	once.Do(func() { close(release) })
	rec.outcome(t, "low/1")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"first", "high", "low"}, order)
}

// Warnings expire after their TTL.
func TestWarningsExpire(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	rt := newRouter(t, router.Config{AllowedHosts: []string{"x"}, Clock: clock, WarningTTL: time.Hour})
	rec := newRecorder()
	rt.Route(context.Background(), []*router.Message{rec.msg("a", "a/1", "http://elsewhere/", "g")})
	require.True(t, hasWarning(rt, router.WarnTargetNotAllowed, router.SeverityError))
	clock.Advance(61 * time.Minute)
	require.Empty(t, rt.Warnings())
}

// Capacity bounds every message waiting in a pool, also those whose group
// goroutine took them and waits for a concurrency permit.
func TestCapacityCountsMessagesWaitingForAPermit(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) { <-release; _, _ = w.Write([]byte(`{"ack":true}`)) })
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, Pools: []router.PoolConfig{{Code: "P", Concurrency: 1}}})
	rec := newRecorder()
	target := "http://" + host + "/"
	var first []*router.Message
	for i := range 50 { // 50 groups: 50 goroutines, 1 permit
		first = append(first, rec.msg(fmt.Sprint(i), fmt.Sprintf("%d/1", i), target, fmt.Sprint(i)))
	}
	rt.Route(context.Background(), first)
	pgtest.Eventually(t, 5*time.Second, "1 in flight, 49 waiting", func() bool {
		p := rt.Pools()[0]
		return p.InFlight == 1 && p.Queued == 49 && p.ActiveGroups == 50
	})
	var second []*router.Message
	for i := 50; i < 52; i++ {
		second = append(second, rec.msg(fmt.Sprint(i), fmt.Sprintf("%d/1", i), target, fmt.Sprint(i)))
	}
	rt.Route(context.Background(), second)
	for _, m := range second {
		require.Equal(t, "nack", rec.outcome(t, m.DeliveryID).kind, "pool full")
	}
	require.LessOrEqual(t, rt.InFlight(), 50)
	once.Do(func() { close(release) })
	for i := range 50 {
		require.Equal(t, "ack", rec.outcome(t, fmt.Sprintf("%d/1", i)).kind)
	}
}

// Messages without a message group have no order to keep: they are
// delivered concurrently up to the pool's concurrency, and one failing
// does not hold the others back.
func TestUngroupedMessagesAreConcurrent(t *testing.T) {
	t.Parallel()
	var inFlight, peak atomic.Int32
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(100 * time.Millisecond)
		if strings.HasSuffix(r.URL.Path, "/fail") {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte(`{"ack":true}`))
	})
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, MaxAttempts: 1, Pools: []router.PoolConfig{{Code: "P", Concurrency: 5}}})
	rec := newRecorder()
	batch := []*router.Message{rec.msg("f", "f/1", "http://"+host+"/fail", "")}
	for i := range 10 {
		batch = append(batch, rec.msg(fmt.Sprint(i), fmt.Sprint(i, "/1"), "http://"+host+"/", ""))
	}
	rt.Route(context.Background(), batch)
	require.Equal(t, "nack", rec.outcome(t, "f/1").kind)
	for i := range 10 {
		require.Equal(t, "ack", rec.outcome(t, fmt.Sprint(i, "/1")).kind, "not held back by the failure")
	}
	require.EqualValues(t, 5, peak.Load(), "up to the pool's concurrency at once")
}
