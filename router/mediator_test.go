package router_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testmetrics"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// Every row of the seed's response table, one case each.
func TestResponseTable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		status    int
		header    map[string]string
		body      string
		want      string
		delay     time.Duration // expected nack delay (0: don't check)
		attempts  int32         // expected HTTP attempts
		warning   string
		severity  router.Severity
		attempted bool
	}{
		{name: "200 ack", status: 200, body: `{"ack":true}`, want: "ack", attempts: 1},
		{name: "200 nack with delay", status: 200, body: `{"ack":false,"delaySeconds":120}`, want: "nack", delay: 120 * time.Second, attempts: 1, attempted: true},
		{name: "200 nack without delay", status: 200, body: `{"ack":false}`, want: "nack", delay: 5 * time.Second, attempts: 1, attempted: true},
		{name: "200 nack delay clamped to 12h", status: 200, body: `{"ack":false,"delaySeconds":999999}`, want: "nack", delay: 12 * time.Hour, attempts: 1, attempted: true},
		{name: "200 unparseable body", status: 200, body: `<html>ok</html>`, want: "ack", attempts: 1, warning: router.WarnResponseParse, severity: router.SeverityWarn},
		{name: "200 without a body", status: 200, want: "ack", attempts: 1},
		{name: "200 with a blank body", status: 200, body: " \r\n", want: "ack", attempts: 1},
		{name: "201 without a body", status: 201, want: "ack", attempts: 1},
		{name: "202 with a body", status: 202, body: `{"queued":true}`, want: "ack", attempts: 1},
		{name: "204", status: 204, want: "ack", attempts: 1},
		{name: "202 nack", status: 202, body: `{"ack":false,"delaySeconds":60}`, want: "nack", delay: 60 * time.Second, attempts: 1, attempted: true},
		{name: "400", status: 400, want: "dead", attempts: 1, warning: router.WarnConfiguration, severity: router.SeverityError},
		{name: "401", status: 401, want: "dead", attempts: 1, warning: router.WarnConfiguration, severity: router.SeverityError},
		{name: "403", status: 403, want: "dead", attempts: 1, warning: router.WarnConfiguration, severity: router.SeverityError},
		{name: "404", status: 404, want: "dead", attempts: 1, warning: router.WarnConfiguration, severity: router.SeverityError},
		{name: "429 delta-seconds", status: 429, header: map[string]string{"Retry-After": "42"}, want: "nack", delay: 42 * time.Second, attempts: 1, attempted: true},
		{name: "429 HTTP-date", status: 429, header: map[string]string{"Retry-After": "+90s"}, want: "nack", delay: 90 * time.Second, attempts: 1, attempted: true},
		{name: "429 without Retry-After", status: 429, want: "nack", delay: 5 * time.Second, attempts: 1, attempted: true},
		{name: "501", status: 501, want: "dead", attempts: 1, warning: router.WarnConfiguration, severity: router.SeverityCritical},
		{name: "500 retried 3 times", status: 500, want: "nack", delay: 5 * time.Second, attempts: 3, attempted: true},
		{name: "503 retried 3 times", status: 503, want: "nack", delay: 5 * time.Second, attempts: 3, attempted: true},
		{name: "unexpected 304", status: 304, want: "nack", attempts: 1, attempted: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var hits atomic.Int32
			_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				for k, v := range tc.header {
					if v == "+90s" { // an HTTP-date 90 s from the moment of the response
						v = time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
					}
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			})
			rt := newRouter(t, router.Config{AllowedHosts: []string{host}, DefaultRetryDelay: 5 * time.Second})
			rec := newRecorder()
			rt.Route(context.Background(), []*router.Message{rec.msg("m1", "m1/1", "http://"+host+"/hook", "g")})
			got := rec.outcome(t, "m1/1")
			require.Equal(t, tc.want, got.kind)
			if tc.delay != 0 {
				require.InDelta(t, tc.delay.Seconds(), got.delay.Seconds(), 2)
			}
			require.Equal(t, tc.attempted, got.attempted)
			require.Equal(t, tc.attempts, hits.Load())
			if tc.warning != "" {
				require.True(t, hasWarning(rt, tc.warning, tc.severity), "warning %s/%s in %+v", tc.warning, tc.severity, rt.Warnings())
			} else if tc.want == "ack" {
				require.Empty(t, rt.Warnings(), "a plain success warns about nothing")
			}
			pgtest.Eventually(t, 5*time.Second, "in-flight map empty", func() bool { return rt.InFlight() == 0 })
		})
	}
}

func TestConnectionErrorsAndTimeouts(t *testing.T) {
	t.Parallel()
	// Connection refused: a listener that closed.
	srv, host := endpoint(t, func(http.ResponseWriter, *http.Request) {})
	srv.Close()
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}})
	rec := newRecorder()
	rt.Route(context.Background(), []*router.Message{rec.msg("a", "a/1", "http://"+host+"/", "g")})
	got := rec.outcome(t, "a/1")
	require.Equal(t, "nack", got.kind)
	require.True(t, got.attempted)

	// A request timeout.
	release := make(chan struct{})
	var hits atomic.Int32
	_, slowHost := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	rt2 := newRouter(t, router.Config{AllowedHosts: []string{slowHost}, RequestTimeout: 50 * time.Millisecond})
	rt2.Route(context.Background(), []*router.Message{rec.msg("b", "b/1", "http://"+slowHost+"/", "g")})
	got = rec.outcome(t, "b/1")
	require.Equal(t, "nack", got.kind)
	require.EqualValues(t, 3, hits.Load(), "timeouts are retried")
}

func TestTargetsMustBeAllowed(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1); _, _ = w.Write([]byte(`{"ack":true}`)) })
	rt := newRouter(t, router.Config{AllowedHosts: []string{"example.invalid:1"}})
	rec := newRecorder()
	rt.Route(context.Background(), []*router.Message{
		rec.msg("a", "a/1", "http://"+host+"/", "g"),
		rec.msg("b", "b/1", "not a url", "g"),
		rec.msg("c", "c/1", "ftp://example.invalid:1/x", "g"),
	})
	for _, id := range []string{"a/1", "b/1", "c/1"} {
		got := rec.outcome(t, id)
		require.Equal(t, "dead", got.kind, id)
	}
	require.Contains(t, rec.all("a/1")[0].reason, "not allowed")
	require.Contains(t, rec.all("b/1")[0].reason, "invalid target")
	require.Zero(t, hits.Load())
	require.True(t, hasWarning(rt, router.WarnTargetNotAllowed, router.SeverityError))

	_, err := router.New(router.Config{})
	require.ErrorIs(t, err, router.ErrInvalidConfig, "an empty allow-list is refused")
	_, err = router.New(router.Config{AllowedHosts: []string{"x"}, Pools: []router.PoolConfig{{Code: "p", Concurrency: -1}}})
	require.ErrorIs(t, err, router.ErrInvalidConfig)
}

// Redirects to another host are not followed; same-host ones are. A
// redirect to a host off the allow-list is a configuration error.
func TestRedirects(t *testing.T) {
	t.Parallel()
	var otherHits atomic.Int32
	_, other := endpoint(t, func(w http.ResponseWriter, r *http.Request) { otherHits.Add(1); _, _ = w.Write([]byte(`{"ack":true}`)) })
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/moved") {
			_, _ = w.Write([]byte(`{"ack":true}`))
			return
		}
		if strings.HasSuffix(r.URL.Path, "/away") {
			http.Redirect(w, r, "http://"+other+"/", http.StatusTemporaryRedirect)
			return
		}
		if strings.HasSuffix(r.URL.Path, "/off-list") {
			http.Redirect(w, r, "http://off-list.invalid/", http.StatusFound)
			return
		}
		http.Redirect(w, r, "/moved", http.StatusTemporaryRedirect)
	})
	rt := newRouter(t, router.Config{AllowedHosts: []string{host, other}})
	rec := newRecorder()
	rt.Route(context.Background(), []*router.Message{rec.msg("a", "a/1", "http://"+host+"/here", "a"), rec.msg("b", "b/1", "http://"+host+"/away", "b"),
		rec.msg("c", "c/1", "http://"+host+"/off-list", "c")})
	require.Equal(t, "ack", rec.outcome(t, "a/1").kind)
	require.Equal(t, "nack", rec.outcome(t, "b/1").kind)
	require.Zero(t, otherHits.Load())
	offList := rec.outcome(t, "c/1")
	require.Equal(t, "dead", offList.kind, "a redirect off the allow-list is not retried")
	require.Contains(t, offList.reason, "off-list.invalid")
	require.Contains(t, offList.reason, "not allowed")
}

// Credentials come from configuration or the token callback.
func TestAuthorizationAndHeaders(t *testing.T) {
	t.Parallel()
	seen := make(chan http.Header, 2)
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		_, _ = w.Write([]byte(`{"ack":true}`))
	})
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, Tokens: map[string]string{host: "s3cret"}})
	rec := newRecorder()
	m := rec.msg("a", "a/1", "http://"+host+"/", "grp")
	m.Topic = "orders"
	rt.Route(context.Background(), []*router.Message{m})
	h := <-seen
	require.Equal(t, "Bearer s3cret", h.Get("Authorization"))
	require.Equal(t, "a", h.Get("X-Message-Id"))
	require.Equal(t, "orders", h.Get("X-Message-Topic"))
	require.Equal(t, "grp", h.Get("X-Message-Group"))
	require.Equal(t, "a", h.Get("Idempotency-Key"))
}

// The circuit opens after failures and recovers when the host does.
func TestCircuitBreakerOpensAndRecovers(t *testing.T) {
	t.Parallel()
	var healthy atomic.Bool
	var hits atomic.Int32
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if !healthy.Load() {
			w.WriteHeader(500)
			return
		}
		_, _ = w.Write([]byte(`{"ack":true}`))
	})
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, MaxAttempts: 1,
		Breaker: router.BreakerConfig{MinRequests: 4, FailureRatio: 0.5, OpenFor: 300 * time.Millisecond, HalfOpenRequests: 1}})
	rec := newRecorder()
	for i := range 4 {
		id := string(rune('a' + i))
		rt.Route(context.Background(), []*router.Message{rec.msg(id, id+"/1", "http://"+host+"/", id)})
		require.Equal(t, "nack", rec.outcome(t, id+"/1").kind)
	}
	require.EqualValues(t, 4, hits.Load())
	rt.Route(context.Background(), []*router.Message{rec.msg("x", "x/1", "http://"+host+"/", "x")})
	got := rec.outcome(t, "x/1")
	require.Equal(t, "nack", got.kind)
	require.EqualValues(t, 4, hits.Load(), "open circuit: the host is not called")
	healthy.Store(true)
	time.Sleep(350 * time.Millisecond)
	rt.Route(context.Background(), []*router.Message{rec.msg("y", "y/1", "http://"+host+"/", "y")})
	require.Equal(t, "ack", rec.outcome(t, "y/1").kind)
	rt.Route(context.Background(), []*router.Message{rec.msg("z", "z/1", "http://"+host+"/", "z")})
	require.Equal(t, "ack", rec.outcome(t, "z/1").kind, "closed again")
}

// With Only200, the original table: only 200 acks; another 2xx is
// unexpected and retried.
func TestOnly200(t *testing.T) {
	t.Parallel()
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/created") {
			w.WriteHeader(http.StatusCreated)
			return
		}
		_, _ = w.Write([]byte(`{"ack":true}`))
	})
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, Success: router.Only200})
	rec := newRecorder()
	rt.Route(context.Background(), []*router.Message{rec.msg("a", "a/1", "http://"+host+"/ok", "a"), rec.msg("b", "b/1", "http://"+host+"/created", "b")})
	require.Equal(t, "ack", rec.outcome(t, "a/1").kind)
	got := rec.outcome(t, "b/1")
	require.Equal(t, "nack", got.kind)
	require.True(t, got.attempted)
	require.Contains(t, got.reason, "HTTP 201")
}

// The breaker judges the failure ratio over its Interval: failures after
// a long run of successes still open it once the successes are older
// than the interval.
func TestBreakerCountsResetOnInterval(t *testing.T) {
	t.Parallel()
	var failing atomic.Bool
	var hits atomic.Int32
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(`{"ack":true}`))
	})
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, MaxAttempts: 1,
		Breaker: router.BreakerConfig{MinRequests: 4, FailureRatio: 0.5, OpenFor: time.Minute, Interval: 500 * time.Millisecond}})
	rec := newRecorder()
	deliver := func(id string) settled { return rec.deliver(t, rt, "http://"+host+"/", id) }
	for i := range 20 {
		require.Equal(t, "ack", deliver(fmt.Sprint("ok", i)).kind)
	}
	time.Sleep(600 * time.Millisecond) // the successes leave the window
	failing.Store(true)
	for i := range 4 {
		require.True(t, deliver(fmt.Sprint("bad", i)).attempted)
	}
	require.EqualValues(t, 24, hits.Load())
	got := deliver("refused")
	require.EqualValues(t, 24, hits.Load(), "4 failures of 4 requests in the window opened the circuit")
	require.Equal(t, "nack", got.kind)
	require.False(t, got.attempted, "the host was not called")
}

// Every duration and count is checked by New, and the error names the
// field: a negative interval used to be accepted, and Start then panicked
// in a goroutine of its own (time.NewTicker), ending the process.
func TestNewRefusesNegativeDurationsAndCounts(t *testing.T) {
	t.Parallel()
	for field, set := range map[string]func(*router.Config){
		"HealthInterval":       func(c *router.Config) { c.HealthInterval = -time.Second },
		"SyncInterval":         func(c *router.Config) { c.SyncInterval = -time.Second },
		"LeakCheckInterval":    func(c *router.Config) { c.LeakCheckInterval = -time.Second },
		"CleanupInterval":      func(c *router.Config) { c.CleanupInterval = -time.Second },
		"StallTimeout":         func(c *router.Config) { c.StallTimeout = -time.Second },
		"RateLimitPollEvery":   func(c *router.Config) { c.RateLimitPollEvery = -time.Millisecond },
		"IdleTimeout":          func(c *router.Config) { c.IdleTimeout = -time.Minute },
		"RequestTimeout":       func(c *router.Config) { c.RequestTimeout = -time.Minute },
		"ConnectTimeout":       func(c *router.Config) { c.ConnectTimeout = -time.Minute },
		"DefaultRetryDelay":    func(c *router.Config) { c.DefaultRetryDelay = -time.Minute },
		"FastFailDelay":        func(c *router.Config) { c.FastFailDelay = -time.Minute },
		"StartupRetryDelay":    func(c *router.Config) { c.StartupRetryDelay = -time.Minute },
		"WarningTTL":           func(c *router.Config) { c.WarningTTL = -time.Minute },
		"LogInterval":          func(c *router.Config) { c.LogInterval = -time.Minute },
		"Breaker.OpenFor":      func(c *router.Config) { c.Breaker.OpenFor = -time.Minute },
		"Breaker.Interval":     func(c *router.Config) { c.Breaker.Interval = -time.Minute },
		"Breaker.FailureRatio": func(c *router.Config) { c.Breaker.FailureRatio = 1.5 },
		"MaxAttempts":          func(c *router.Config) { c.MaxAttempts = -1 },
		"StartupAttempts":      func(c *router.Config) { c.StartupAttempts = -1 },
		"MaxPools":             func(c *router.Config) { c.MaxPools = -1 },
		"PoolWarningThreshold": func(c *router.Config) { c.PoolWarningThreshold = -1 },
		"MaxWarnings":          func(c *router.Config) { c.MaxWarnings = -1 },
		"GroupShare":           func(c *router.Config) { c.GroupShare = -0.5 },
	} {
		cfg := router.Config{AllowedHosts: []string{"x"}}
		set(&cfg)
		_, err := router.New(cfg)
		require.ErrorIs(t, err, router.ErrInvalidConfig, field)
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, "one ErrInvalidConfig for the library")
		require.Contains(t, err.Error(), field)
	}
	for field, cfg := range map[string]router.QueueSourceConfig{
		"BatchSize":    {BatchSize: -1},
		"PollInterval": {PollInterval: -time.Second},
	} {
		cfg.Client, cfg.Topic = outboxClientWithoutDB(t), "hooks"
		_, err := router.NewQueueSource(cfg)
		require.ErrorIs(t, err, router.ErrInvalidConfig, field)
		require.Contains(t, err.Error(), field)
	}
}

// outboxClientWithoutDB is a client whose pool never connects (it is
// enough for checking configurations).
func outboxClientWithoutDB(t *testing.T) *outbox.Client {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	c, err := outbox.NewClient(pool, outbox.Config{PollOnly: true})
	require.NoError(t, err)
	return c
}

// The router's gauges: each pool's queue and in-flight messages, and each
// host's breaker state, which reads 2 once the circuit opened; none once
// the router stopped.
func TestGauges(t *testing.T) {
	t.Parallel()
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) })
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, MaxAttempts: 1, MeterProvider: mp,
		Breaker: router.BreakerConfig{MinRequests: 2, FailureRatio: 0.5, OpenFor: time.Minute}})
	points := testmetrics.Points(t, reader)
	queued, ok := testmetrics.Point(points, "pgoutbox.router.pool.queued", "pool", "P")
	require.True(t, ok, "no queue gauge for pool P: %v", points)
	require.Zero(t, queued.Value)
	_, ok = testmetrics.Point(points, "pgoutbox.router.pool.in_flight", "pool", "P")
	require.True(t, ok)

	rec := newRecorder()
	for _, id := range []string{"a", "b"} {
		rt.Route(context.Background(), []*router.Message{rec.msg(id, id+"/1", "http://"+host+"/", id)})
		require.Equal(t, "nack", rec.outcome(t, id+"/1").kind)
	}
	state, ok := testmetrics.Point(testmetrics.Points(t, reader), "pgoutbox.router.breaker.state", "host", host)
	require.True(t, ok, "no breaker gauge for %s", host)
	require.EqualValues(t, 2, state.Value, "the circuit is open")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, rt.Stop(ctx))
	require.Empty(t, testmetrics.Points(t, reader)["pgoutbox.router.pool.queued"], "a stopped router reports nothing")
}

// The settlement counters carry the pool, the host and the result, the
// delivery histogram times each call with the same attributes, messages
// sent to DEFAULT-POOL for want of their pool are counted by the pool
// they asked for, and each pool reports its active message groups.
func TestMetricsByPoolHostAndResult(t *testing.T) {
	t.Parallel()
	_, ok := endpoint(t, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(`{"ack":true}`)) })
	_, failing := endpoint(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) })
	_, gone := endpoint(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(404) })
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	rt := newRouter(t, router.Config{AllowedHosts: []string{ok, failing, gone}, MaxAttempts: 5, MeterProvider: mp})
	rec := newRecorder()
	route := func(id, host, pool string) string {
		m := rec.msg(id, id+"/1", "http://"+host+"/", "")
		m.Pool = pool
		rt.Route(context.Background(), []*router.Message{m})
		return rec.outcome(t, id+"/1").kind
	}
	require.Equal(t, "ack", route("a", ok, "P"))
	require.Equal(t, "ack", route("b", ok, "P"))
	require.Equal(t, "nack", route("c", failing, "P"))
	require.Equal(t, "dead", route("d", gone, "P"))
	require.Equal(t, "ack", route("e", ok, "NOPE"))
	require.Equal(t, "dead", route("f", "elsewhere.example", "P"))

	points := testmetrics.Points(t, reader)
	count := func(name string, kv ...string) float64 {
		t.Helper()
		g, found := testmetrics.Point(points, name, kv...)
		require.True(t, found, "no %s %v in %v", name, kv, points[name])
		return g.Value
	}
	require.EqualValues(t, 2, count("pgoutbox.router.acked", "pool", "P", "host", ok, "result", "SUCCESS"))
	require.EqualValues(t, 1, count("pgoutbox.router.nacked", "pool", "P", "host", failing, "result", "ERROR_PROCESS"))
	require.EqualValues(t, 1, count("pgoutbox.router.dead_lettered", "pool", "P", "host", gone, "result", "ERROR_CONFIG"))
	require.EqualValues(t, 1, count("pgoutbox.router.acked", "pool", router.DefaultPoolCode, "host", ok, "result", "SUCCESS"))
	require.EqualValues(t, 1, count("pgoutbox.router.default_pool", "requested", "NOPE"))
	require.EqualValues(t, 1, count("pgoutbox.router.dead_lettered", "host", "elsewhere.example", "result", "NOT_ALLOWED"))
	// The histogram's points count its recordings: one per HTTP call.
	require.EqualValues(t, 2, count("pgoutbox.router.delivery.duration", "pool", "P", "host", ok, "result", "SUCCESS"))
	require.EqualValues(t, 1, count("pgoutbox.router.delivery.duration", "pool", "P", "host", failing, "result", "ERROR_PROCESS"))
	_, found := testmetrics.Point(points, "pgoutbox.router.delivery.duration", "host", "elsewhere.example")
	require.False(t, found, "a target not allowed is never called")
	// A worker lets go of its message group just after settling.
	pgtest.Eventually(t, 5*time.Second, "no active message groups once nothing is queued or in flight", func() bool {
		g, found := testmetrics.Point(testmetrics.Points(t, reader), "pgoutbox.router.pool.active_groups", "pool", "P")
		return found && g.Value == 0
	})
}
