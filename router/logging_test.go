package router_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
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

// count counts the records that have every attribute of want (key=value).
func (c *logCapture) count(want map[string]string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.records {
		got := 0
		r.Attrs(func(a slog.Attr) bool {
			if v, ok := want[a.Key]; ok && a.Value.String() == v {
				got++
			}
			return true
		})
		if got == len(want) {
			n++
		}
	}
	return n
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
