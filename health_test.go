package pgoutbox_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testmetrics"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// get fetches path from h and decodes the report.
func get(t *testing.T, h http.Handler, path string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
	return rec.Code, body
}

func problems(h pgoutbox.Health) string { return strings.Join(h.Problems, "\n") }
func warnings(h pgoutbox.Health) string { return strings.Join(h.Warnings, "\n") }

// A started client with a consumer, a group and a router is live and
// ready, every component running with its looks succeeding, its LISTEN
// connection and proof of life held; not started or stopped, it is live
// but not ready. The HTTP handler answers the probes from the same
// report.
func TestHealthFollowsTheClient(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(`{"ack":true}`)) }))
	defer srv.Close()
	c := newClient(t, db)
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "jobs"}))
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Offset}))
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "hooks"}))
	var handled atomic.Int64
	count := func(context.Context, *outbox.Delivery) error { handled.Add(1); return nil }
	_, err := c.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "jobs", Handler: count, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	g, err := c.NewGroup(consumergroup.Config{Topic: "events", Group: "audit", PollInterval: 50 * time.Millisecond}, consumergroup.FromNow())
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", count, nil))
	rt, err := c.NewRouter(router.Config{AllowedHosts: []string{strings.TrimPrefix(srv.URL, "http://")},
		Pools: []router.PoolConfig{{Code: "P", Concurrency: 2}}})
	require.NoError(t, err)
	qs, err := router.NewQueueSource(router.QueueSourceConfig{Client: c.Outbox(), Topic: "hooks", PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	rt.AddSource(qs)
	h := c.HealthHandler()

	before := c.Health(ctx)
	require.True(t, before.Live, problems(before))
	require.False(t, before.Ready)
	require.Contains(t, problems(before), "not running")
	code, _ := get(t, h, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)

	require.NoError(t, c.Start(ctx))
	send(t, c, "jobs", 5, nil)
	send(t, c, "events", 5, nil)
	send(t, c, "hooks", 5, map[string]string{router.HeaderPool: "P", router.HeaderTarget: srv.URL + "/h"})
	pgtest.Eventually(t, 20*time.Second, "the messages handled", func() bool { return handled.Load() == 10 })
	_, err = c.Maintenance().RunOnce(ctx)
	require.NoError(t, err)
	var running pgoutbox.Health
	pgtest.Eventually(t, 10*time.Second, "ready, with the proof of life held", func() bool {
		running = c.Health(ctx)
		return running.Ready && running.Connections.ProofOfLife == outbox.ProofHeld
	})
	require.True(t, running.Live)
	require.Empty(t, running.Problems)
	require.Empty(t, running.Warnings)
	require.True(t, running.Database.Reachable)
	require.Equal(t, outbox.WakeUpsListening, running.Connections.WakeUps)
	names := []string{}
	for _, comp := range running.Components {
		names = append(names, comp.Name)
		require.True(t, comp.Running, comp.Name)
	}
	require.Equal(t, []string{"maintenance", "consumer of jobs", "consumer group audit of events", "router"}, names)
	for _, comp := range running.Components[1:3] {
		require.NotNil(t, comp.Instance, comp.Name)
		require.False(t, comp.Instance.LastLook.IsZero(), "%s: no look recorded", comp.Name)
		require.Zero(t, comp.Instance.LookFailures)
	}
	src := running.Components[3].Sources
	require.Len(t, src, 1)
	require.True(t, src[0].Running)
	require.NotNil(t, src[0].Instance, "the router's source shows its group instance")
	require.Equal(t, "hooks", src[0].Instance.Topic)
	require.Len(t, running.Maintenance, 4)
	for _, j := range running.Maintenance {
		require.False(t, j.LastSuccess.IsZero(), j.Job)
		require.Zero(t, j.Failures, j.Job)
	}

	code, body := get(t, h, "/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, true, body["live"])
	require.NotContains(t, body, "database", "liveness sends nothing to the database")
	code, body = get(t, h, "/readyz")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, true, body["ready"])
	comps := body["components"].([]any)
	inst := comps[1].(map[string]any)["instance"].(map[string]any)
	require.Contains(t, inst, "look_failures", "snake_case JSON")
	require.Contains(t, body["maintenance"].([]any)[0], "every_seconds")

	stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, c.Stop(stopCtx))
	after := c.Health(ctx)
	require.False(t, after.Ready)
	require.True(t, after.Live, "a plain Stop is not a failure")
}

// A group whose subscription is cancelled under it stops on its own: the
// client is not live any more (restart the process), and /healthz and
// the pgoutbox.client gauges say so.
func TestHealthNotLiveWhenAGroupStopsOnItsOwn(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	c, err := pgoutbox.NewClient(ctx, db.Pool, pgoutbox.Config{Schema: db.Schema, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	require.NoError(t, err)
	gauge := func(name string) float64 {
		g, ok := testmetrics.Point(testmetrics.Points(t, reader), name, "schema", db.Schema)
		require.True(t, ok, name)
		return g.Value
	}
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Offset}))
	g, err := c.NewGroup(consumergroup.Config{Topic: "events", Group: "audit", PollInterval: 50 * time.Millisecond}, consumergroup.FromNow())
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return nil }, nil))
	require.NoError(t, c.Start(ctx))
	defer c.Stop(context.Background())
	pgtest.Eventually(t, 10*time.Second, "ready", func() bool { return c.Health(ctx).Ready })
	require.Equal(t, 1.0, gauge("pgoutbox.client.live"))
	require.Equal(t, 1.0, gauge("pgoutbox.client.ready"))

	require.NoError(t, c.Admin().CancelGroup(ctx, "events", "audit"))
	var h pgoutbox.Health
	pgtest.Eventually(t, 10*time.Second, "not live", func() bool { h = c.Liveness(); return !h.Live })
	require.False(t, h.Ready)
	require.Contains(t, problems(h), "consumer group audit of events stopped on its own")
	require.Contains(t, problems(h), "cancelled")
	code, body := get(t, c.HealthHandler(), "/healthz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, false, body["live"])
	require.Equal(t, 0.0, gauge("pgoutbox.client.live"))
	require.Equal(t, 0.0, gauge("pgoutbox.client.ready"))
}

// While a consumer's looks for work fail (here every batch it takes
// cannot be recorded), the client is not ready after FailingLooks of
// them, and says why; once they succeed again it is ready, and nothing
// was lost.
func TestHealthNotReadyWhileLooksFail(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	c := newClient(t, db)
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "jobs"}))
	var handled atomic.Int64
	_, err := c.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "jobs", PollInterval: 50 * time.Millisecond,
		Handler: func(context.Context, *outbox.Delivery) error { handled.Add(1); return nil }})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Stop(context.Background())
	pgtest.Eventually(t, 10*time.Second, "ready", func() bool { return c.Health(ctx).Ready })

	batches := db.Table("outbox_group_batches")
	_, err = db.Pool.Exec(ctx, `ALTER TABLE `+batches+` ADD CONSTRAINT health_test_no_batch CHECK (false) NOT VALID`)
	require.NoError(t, err)
	send(t, c, "jobs", 10, nil)
	var h pgoutbox.Health
	pgtest.Eventually(t, 20*time.Second, "not ready", func() bool { h = c.Health(ctx); return !h.Ready })
	require.True(t, h.Live, "failing looks are retried: no restart needed")
	require.Contains(t, problems(h), "consumer of jobs: its last")
	require.Contains(t, problems(h), "health_test_no_batch")
	require.Zero(t, handled.Load())

	_, err = db.Pool.Exec(ctx, `ALTER TABLE `+batches+` DROP CONSTRAINT health_test_no_batch`)
	require.NoError(t, err)
	pgtest.Eventually(t, 20*time.Second, "ready again, every message handled", func() bool {
		return c.Health(ctx).Ready && handled.Load() == 10
	})
}

// A group whose backfill cannot go on (here its progress cannot be
// recorded) warns with the error, while new messages still flow; once it
// can, the backfill finishes and the warning goes.
func TestHealthWarnsOfAFailedBackfill(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	c, err := pgoutbox.NewClient(ctx, db.Pool, pgoutbox.Config{Schema: db.Schema, NoMaintenance: true})
	require.NoError(t, err)
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Offset}))
	send(t, c, "events", 20, nil) // before the group: its backfill's
	offsets := db.Table("outbox_subscription_offsets")
	_, err = db.Pool.Exec(ctx, `ALTER TABLE `+offsets+` ADD CONSTRAINT health_test_no_progress CHECK (backfill_done = 0) NOT VALID`)
	require.NoError(t, err)
	var handled atomic.Int64
	g, err := c.NewGroup(consumergroup.Config{Topic: "events", Group: "late", PollInterval: 50 * time.Millisecond}, consumergroup.FromBeginning(true))
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error { handled.Add(1); return nil }, nil))
	require.NoError(t, c.Start(ctx))
	defer c.Stop(context.Background())

	var h pgoutbox.Health
	pgtest.Eventually(t, 20*time.Second, "the failed backfill reported", func() bool {
		h = c.Liveness()
		return strings.Contains(warnings(h), "backfill failed")
	})
	require.Contains(t, warnings(h), "health_test_no_progress")
	require.Equal(t, consumergroup.BackfillFailed, g.Status().Backfill)
	send(t, c, "events", 5, nil)
	pgtest.Eventually(t, 20*time.Second, "new messages flow meanwhile", func() bool { return handled.Load() >= 5 })

	_, err = db.Pool.Exec(ctx, `ALTER TABLE `+offsets+` DROP CONSTRAINT health_test_no_progress`)
	require.NoError(t, err)
	pgtest.Eventually(t, 20*time.Second, "the backfill done, the warning gone", func() bool {
		h = c.Liveness()
		return handled.Load() == 25 && !strings.Contains(warnings(h), "backfill")
	})
}

// A maintenance job whose statements keep failing (here each one times
// out at once) shows in the report: its failures, last error, and a
// warning; the client stays ready, its consumers unaffected.
func TestHealthWarnsOfAFailingMaintenanceJob(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	c, err := pgoutbox.NewClient(ctx, db.Pool, pgoutbox.Config{Schema: db.Schema,
		Maintenance: maintenance.Config{StatementTimeout: time.Nanosecond}})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer c.Stop(context.Background())
	_, err = c.Maintenance().RunOnce(ctx)
	require.Error(t, err)
	h := c.Health(ctx)
	var failing []string
	for _, j := range h.Maintenance {
		if j.Failures > 0 {
			failing = append(failing, j.Job)
			require.NotEmpty(t, j.LastError)
			require.False(t, j.LastErrorAt.IsZero())
			require.Contains(t, warnings(h), "maintenance job "+j.Job+" failed")
		}
	}
	require.NotEmpty(t, failing, "no job reported its failure: %+v", h.Maintenance)
	require.True(t, h.Ready, problems(h))
}
