package router_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testmetrics"
	"github.com/pgoutbox/pgoutbox/router"
)

// logCapture is a slog.Handler that keeps every record.
type logCapture struct {
	mu      sync.Mutex
	records []slog.Record
}

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCapture) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.records = append(c.records, r.Clone())
	return nil
}
func (c *logCapture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCapture) WithGroup(string) slog.Handler      { return c }

// matching returns the records that have every attribute of want
// (key=value).
func (c *logCapture) matching(want map[string]string) []slog.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []slog.Record
	for _, r := range c.records {
		got := 0
		r.Attrs(func(a slog.Attr) bool {
			if v, ok := want[a.Key]; ok && a.Value.String() == v {
				got++
			}
			return true
		})
		if got == len(want) {
			out = append(out, r)
		}
	}
	return out
}

// count counts the records that have every attribute of want (key=value).
func (c *logCapture) count(want map[string]string) int { return len(c.matching(want)) }

// levels returns the levels of the records that have every attribute of
// want (key=value).
func (c *logCapture) levels(want map[string]string) []slog.Level {
	var out []slog.Level
	for _, r := range c.matching(want) {
		out = append(out, r.Level)
	}
	return out
}

// intAttr returns attribute key of the first record that has every
// attribute of want (key=value), or 0.
func (c *logCapture) intAttr(want map[string]string, key string) int64 {
	var v int64
	for _, r := range c.matching(want) {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == key {
				v = a.Value.Int64()
			}
			return true
		})
		return v
	}
	return 0
}

// warnings returns the messages of the records at Warn and above.
func (c *logCapture) warnings() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, r := range c.records {
		if r.Level >= slog.LevelWarn {
			out = append(out, r.Message)
		}
	}
	return out
}

// What goes wrong is logged through the configured logger, once per kind
// and subject per LogInterval: DEFAULT-POOL fallbacks, dead letters,
// retries and circuit breaker transitions.
func TestProblemsAreLoggedRateLimited(t *testing.T) {
	t.Parallel()
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	logs := &logCapture{}
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, Logger: slog.New(logs), MaxAttempts: 1,
		Breaker: router.BreakerConfig{MinRequests: 3, FailureRatio: 0.5, OpenFor: time.Minute}})
	rec := newRecorder()
	var batch []*router.Message
	for i := range 100 {
		m := rec.msg(fmt.Sprint("u", i), fmt.Sprint("u", i, "/1"), "http://elsewhere.invalid/", fmt.Sprint(i))
		m.Pool = "NO-SUCH-POOL"
		batch = append(batch, m)
	}
	rt.Route(context.Background(), batch) // 100 fallbacks, 100 dead letters (target not allowed)
	for i := range 100 {
		m := rec.msg(fmt.Sprint("f", i), fmt.Sprint("f", i, "/1"), "http://"+host+"/", fmt.Sprint("f", i))
		m.Pool = "NO-SUCH-POOL"
		rt.Route(context.Background(), []*router.Message{m})
	}
	for i := range 100 {
		rec.outcome(t, fmt.Sprint("f", i, "/1"))
	}
	require.Equal(t, 1, logs.count(map[string]string{"code": router.WarnRouting, "subject": "NO-SUCH-POOL"}), "one DEFAULT-POOL fallback record")
	require.Equal(t, 1, logs.count(map[string]string{"event": "dead-letter", "host": "elsewhere.invalid"}), "one dead-letter record")
	require.Equal(t, 1, logs.count(map[string]string{"event": "retry", "host": host}), "one retry record")
	require.Equal(t, 1, logs.count(map[string]string{"event": "breaker", "host": host, "state": "open"}), "the circuit opened")
	pgtest.Eventually(t, 5*time.Second, "in-flight map empty", func() bool { return rt.InFlight() == 0 })
}

// An allow-list entry that can never match a target's host (a URL, a
// path, spaces) is refused by New.
func TestAllowListEntriesMustBeHosts(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"http://hooks.internal:8080", "hooks.internal/path", "", " hooks.internal", "user@hooks.internal", "hooks.internal:port"} {
		_, err := router.New(router.Config{AllowedHosts: []string{"ok.internal", bad}})
		require.ErrorIs(t, err, router.ErrInvalidAllowedHost, "%q", bad)
		require.ErrorIs(t, err, router.ErrInvalidConfig, "%q", bad)
	}
	for _, good := range []string{"hooks.internal", "hooks.internal:8443", "127.0.0.1", "127.0.0.1:9000", "[::1]:8080", "::1", "HOOKS.internal"} {
		_, err := router.New(router.Config{AllowedHosts: []string{good}})
		require.NoError(t, err, "%q", good)
	}
}

// A pool too full for a batch is back-pressure, not a problem: the batch
// goes back to its source, one Info record says so (once per LogInterval
// and pool), nothing is logged as a warning or raised as one, and
// pgoutbox.router.pool.refused counts the messages sent back.
func TestFullPoolIsBackPressure(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) { <-release })
	defer close(release)
	logs := &logCapture{}
	reader := sdkmetric.NewManualReader()
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, Logger: slog.New(logs), GroupShare: 1,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		Pools:         []router.PoolConfig{{Code: "P", Concurrency: 1}}})
	rec := newRecorder()
	target := "http://" + host + "/"
	fillPool(t, rt, rec, target)
	for b := range 3 {
		second := []*router.Message{rec.msg(fmt.Sprint("x", b), fmt.Sprint("x", b, "/1"), target, "x"),
			rec.msg(fmt.Sprint("y", b), fmt.Sprint("y", b, "/1"), target, "y")}
		rt.Route(context.Background(), second) // 49 queued + 2 > 50: sent back
		for _, m := range second {
			require.Equal(t, "nack", rec.outcome(t, m.DeliveryID).kind)
		}
	}
	require.Empty(t, logs.warnings(), "a full pool is not a warning")
	require.Empty(t, rt.Warnings())
	require.Equal(t, []slog.Level{slog.LevelInfo}, logs.levels(map[string]string{"event": "pool-full", "pool": "P"}),
		"one Info record per LogInterval")
	refused, ok := testmetrics.Point(testmetrics.Points(t, reader), "pgoutbox.router.pool.refused", "pool", "P")
	require.True(t, ok, "no pgoutbox.router.pool.refused for pool P")
	require.EqualValues(t, 6, refused.Value)
}

// A receiver that recovers gets one Info record: deliveries to it failed
// (the circuit opened, and closes again once they succeed), and succeed
// again. The breaker's own changes back to closed are not logged at Info
// beside it.
func TestRecoveredReceiverIsLoggedOnce(t *testing.T) {
	t.Parallel()
	var healthy atomic.Bool
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(`{"ack":true}`))
	})
	logs := &logCapture{}
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, MaxAttempts: 1, Logger: slog.New(logs),
		Breaker: router.BreakerConfig{MinRequests: 4, FailureRatio: 0.5, OpenFor: 300 * time.Millisecond, HalfOpenRequests: 2}})
	rec := newRecorder()
	deliver := func(id string) settled { return rec.deliver(t, rt, "http://"+host+"/", id) }
	for i := range 5 {
		require.Equal(t, "nack", deliver(fmt.Sprint("f", i)).kind)
	}
	require.Zero(t, logs.count(map[string]string{"event": "recovered", "host": host}), "not recovered yet")
	healthy.Store(true)
	time.Sleep(350 * time.Millisecond) // the circuit half-opens
	for i := range 5 {
		require.Equal(t, "ack", deliver(fmt.Sprint("s", i)).kind)
	}
	require.Equal(t, []slog.Level{slog.LevelInfo}, logs.levels(map[string]string{"event": "recovered", "host": host}))
	for _, state := range []string{"half-open", "closed"} {
		for _, l := range logs.levels(map[string]string{"event": "breaker", "host": host, "state": state}) {
			require.Less(t, l, slog.LevelInfo, "the circuit %s: one Info record says the receiver recovered", state)
		}
	}
}
