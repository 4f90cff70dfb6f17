package pgoutbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/startstop/startstoptest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/router"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(standbyChildEnv); spec != "" {
		runStandbyChild(spec)
	}
	pgtest.Main(m)
}

func newClient(t *testing.T, db *pgtest.DB) *pgoutbox.Client {
	t.Helper()
	c, err := pgoutbox.NewClient(context.Background(), db.Pool, pgoutbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	return c
}

func send(t *testing.T, c *pgoutbox.Client, topic string, n int, headers map[string]string) {
	t.Helper()
	err := pgx.BeginFunc(context.Background(), c.Pool(), func(tx pgx.Tx) error {
		for i := range n {
			msg, err := outbox.NewMessage(topic, map[string]int{"n": i})
			if err != nil {
				return err
			}
			msg.Headers = headers
			if _, err := c.Send(context.Background(), tx, msg); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
}

// Every kind of component is created from one client, started by one
// call and stopped by one call; nothing the library started is left
// running afterwards.
func TestOneClientStartsAndStopsEverything(t *testing.T) {
	db := pgtest.NewDB(t)
	ctx := context.Background()
	var delivered atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		delivered.Add(1)
		_, _ = w.Write([]byte(`{"ack":true}`))
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	leaks := goleak.IgnoreCurrent() // the test's pool and receiver

	// Every maintenance job runs, several times, before the client stops.
	c, err := pgoutbox.NewClient(ctx, db.Pool, pgoutbox.Config{Schema: db.Schema, Maintenance: maintenance.Config{
		DeadGroupInterval: 50 * time.Millisecond, CleanupInterval: 50 * time.Millisecond, SubscriptionCleanupInterval: 50 * time.Millisecond,
		PartitionInterval: 50 * time.Millisecond, RowCleanupDelay: time.Millisecond}})
	require.NoError(t, err)
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "jobs"}))
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Bitmap,
		Retention: time.Millisecond}))
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "hooks"}))
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "relayed", Semantics: outbox.PubSub, Tracking: outbox.Offset,
		Ordered: true, Retention: time.Millisecond}))

	var jobs, events atomic.Int64
	_, err = c.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "jobs", PollInterval: 20 * time.Millisecond,
		Handler: func(context.Context, *outbox.Delivery) error { jobs.Add(1); return nil }})
	require.NoError(t, err)
	g, err := c.NewGroup(consumergroup.Config{Topic: "events", Group: "audit", PollInterval: 20 * time.Millisecond}, consumergroup.FromNow())
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error { events.Add(1); return nil }, nil))
	rt, err := c.NewRouter(router.Config{AllowedHosts: []string{host}, Pools: []router.PoolConfig{{Code: "P", Concurrency: 4}}})
	require.NoError(t, err)
	qs, err := router.NewQueueSource(router.QueueSourceConfig{Client: c.Outbox(), Topic: "hooks", PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	rt.AddSource(qs)
	gs, err := router.NewGroupSource(router.GroupSourceConfig{Pool: c.Pool(),
		Group: consumergroup.Config{Client: c.Outbox(), Topic: "events", Group: "webhooks", PollInterval: 20 * time.Millisecond}})
	require.NoError(t, err)
	rt.AddSource(gs)
	var relayed atomic.Int64
	_, err = c.NewRelay(relay.Config{Consumer: consumergroup.Config{Topic: "relayed", PollInterval: 20 * time.Millisecond},
		Publisher: relay.PublisherFunc(func(_ context.Context, msgs []relay.Message) []error {
			relayed.Add(int64(len(msgs)))
			return make([]error, len(msgs))
		})}, consumergroup.FromNow())
	require.NoError(t, err)

	require.NoError(t, c.Start(ctx))
	pgtest.Eventually(t, 10*time.Second, "the groups and the relay subscribed", func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("outbox_topic_subscriptions")+
			` WHERE group_name <> '(queue)'`).Scan(&n)) // a QUEUE topic's group is there from its configuration
		return n == 3
	})
	hook := map[string]string{router.HeaderPool: "P", router.HeaderTarget: srv.URL + "/hook"}
	send(t, c, "jobs", 10, nil)
	send(t, c, "events", 10, hook)
	send(t, c, "hooks", 10, hook)
	send(t, c, "relayed", 10, nil)
	pgtest.Eventually(t, 20*time.Second, "everything handled", func() bool {
		return jobs.Load() == 10 && events.Load() == 10 && delivered.Load() == 20 && relayed.Load() == 10
	})
	pgtest.Eventually(t, 10*time.Second, "maintenance deleted what both groups finished", func() bool {
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("outbox_published")).Scan(&n))
		return n == 0
	})

	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, c.Stop(stopCtx))
	select {
	case <-c.Stopped():
	default:
		t.Fatal("Stopped not closed after Stop")
	}
	require.NoError(t, c.Stop(stopCtx), "Stop is idempotent")
	db.VerifyNoLeaks(t, leaks)

	// Stopped, the client starts again, with what was created meanwhile.
	var late atomic.Int64
	_, err = c.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "jobs", PollInterval: 20 * time.Millisecond,
		Handler: func(context.Context, *outbox.Delivery) error { late.Add(1); return nil }})
	require.NoError(t, err)
	send(t, c, "jobs", 10, nil)
	require.NoError(t, c.Start(ctx))
	pgtest.Eventually(t, 20*time.Second, "handled after a restart", func() bool { return jobs.Load()+late.Load() == 20 })
	require.NoError(t, c.Stop(stopCtx))
	db.VerifyNoLeaks(t, leaks)
}

// A client started and stopped from ten goroutines at once, over and over,
// never hangs a Stop and leaves nothing running.
func TestClientStartStopStress(t *testing.T) {
	db := pgtest.NewDB(t)
	ctx := context.Background()
	leaks := goleak.IgnoreCurrent()
	c := newClient(t, db)
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "jobs"}))
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub}))
	_, err := c.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "jobs", Handler: func(context.Context, *outbox.Delivery) error { return nil }})
	require.NoError(t, err)
	g, err := c.NewGroup(consumergroup.Config{Topic: "events", Group: "g"}, consumergroup.FromNow())
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return nil }, nil))
	_, err = c.NewRouter(router.Config{AllowedHosts: []string{"x"}})
	require.NoError(t, err)
	startstoptest.Stress(t, c, 5)
	db.VerifyNoLeaks(t, leaks)
}

// StopAndCancel returns by its deadline even when handlers ignore their
// context; the messages they held are retried later.
func TestStopAndCancelDoesNotWaitForHandlersThatIgnoreTheirContext(t *testing.T) {
	db := pgtest.NewDB(t)
	ctx := context.Background()
	c := newClient(t, db)
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "jobs"}))
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub}))
	release := make(chan struct{})
	var running atomic.Int64
	stuck := func(context.Context, *outbox.Delivery) error { running.Add(1); <-release; return nil }
	k, err := c.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "jobs", PollInterval: 20 * time.Millisecond, Handler: stuck})
	require.NoError(t, err)
	g, err := c.NewGroup(consumergroup.Config{Topic: "events", Group: "g", PollInterval: 20 * time.Millisecond}, consumergroup.FromNow())
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", stuck, nil))
	require.NoError(t, c.Start(ctx))
	send(t, c, "jobs", 1, nil)
	send(t, c, "events", 1, nil)
	pgtest.Eventually(t, 10*time.Second, "both handlers running", func() bool { return running.Load() == 2 })

	stopCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	began := time.Now()
	err = c.StopAndCancel(stopCtx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// The handlers return only once released below: had StopAndCancel
	// waited for them, it would not have returned at all. The bound is ten
	// times the stop context's, whatever the machine's speed.
	require.Less(t, time.Since(began), 10*time.Second, "StopAndCancel waited for handlers that ignore their context")

	close(release) // the handlers return at last; the components finish stopping
	for _, done := range []<-chan struct{}{k.Stopped(), g.Stopped(), c.Stopped()} {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("a component did not finish stopping")
		}
	}
}

// A client on a schema that is not migrated, or migrated to an older
// version, fails at once with ErrNotMigrated; a send to such a schema says
// the same.
func TestNewClientRequiresAMigratedSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	empty := pgtest.NewEmptyDB(t)
	_, err := pgoutbox.NewClient(ctx, empty.Pool, pgoutbox.Config{Schema: "app"})
	require.ErrorIs(t, err, pgoutbox.ErrNotMigrated)
	require.Contains(t, err.Error(), "migrations.Up")

	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: "app", AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	_, err = producer.Send(ctx, empty.Pool, outbox.Message{Topic: "t", Payload: json.RawMessage(`{}`)})
	require.ErrorIs(t, err, migrations.ErrNotMigrated)

	_, err = empty.Pool.Exec(ctx, `CREATE SCHEMA app`)
	require.NoError(t, err)
	_, err = pgoutbox.NewClient(ctx, empty.Pool, pgoutbox.Config{Schema: "app"})
	require.ErrorIs(t, err, pgoutbox.ErrNotMigrated)

	require.NoError(t, migrations.Up(ctx, empty.Pool, migrations.Config{Schema: "app"}))
	_, err = empty.Pool.Exec(ctx, `UPDATE app.`+migrations.VersionTable+` SET version = version - 1`)
	require.NoError(t, err)
	_, err = pgoutbox.NewClient(ctx, empty.Pool, pgoutbox.Config{Schema: "app"})
	require.ErrorIs(t, err, pgoutbox.ErrNotMigrated, "an outdated schema")

	_, err = outbox.NewMessage("not a topic", 1)
	require.ErrorIs(t, err, outbox.ErrInvalidTopic)
}

// A group given a client takes its schema and logger: no Schema to repeat,
// and its logs go where the client's go.
func TestGroupTakesTheClientsSettings(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	logs := &lines{}
	c, err := pgoutbox.NewClient(ctx, db.Pool, pgoutbox.Config{Schema: db.Schema, Logger: logs.logger()})
	require.NoError(t, err)
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub}))
	g, err := consumergroup.New(db.Pool, consumergroup.Config{Client: c.Outbox(), Topic: "events", Group: "g"})
	require.NoError(t, err, "the schema comes from the client")
	require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return nil }, nil))
	require.NoError(t, g.Start(ctx, consumergroup.FromNow()))
	require.NoError(t, g.Stop(ctx))
	require.True(t, logs.contains("consumer group started"), "the group logs through the client's logger")
}

// Every message committed after Start returns reaches a router's group
// sources, as it reaches the client's groups: Start waits until the
// sources' groups are subscribed (they used to subscribe later, in their
// own goroutine, and FromNow missed what was sent meanwhile).
func TestStartReturnsOnceGroupSourcesAreSubscribed(t *testing.T) {
	for _, mode := range []outbox.TrackingMode{outbox.Bitmap, outbox.Counter, outbox.Offset} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewDB(t)
			ctx := context.Background()
			var delivered atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { delivered.Add(1) }))
			defer srv.Close()
			c := newClient(t, db)
			require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode}))
			rt, err := c.NewRouter(router.Config{AllowedHosts: []string{strings.TrimPrefix(srv.URL, "http://")},
				Pools: []router.PoolConfig{{Code: "P", Concurrency: 4}}})
			require.NoError(t, err)
			for _, group := range []string{"webhooks", "audit"} {
				gs, err := router.NewGroupSource(router.GroupSourceConfig{Pool: c.Pool(),
					Group: consumergroup.Config{Client: c.Outbox(), Topic: "events", Group: group, PollInterval: 20 * time.Millisecond}})
				require.NoError(t, err)
				rt.AddSource(gs)
			}
			require.NoError(t, c.Start(ctx))
			defer func() {
				stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				require.NoError(t, c.Stop(stopCtx))
			}()
			send(t, c, "events", 2, map[string]string{router.HeaderPool: "P", router.HeaderTarget: srv.URL + "/hook"})
			pgtest.Eventually(t, 10*time.Second, "both messages delivered to both groups", func() bool { return delivered.Load() == 4 })
		})
	}
}

// A component that fails to start makes Start stop the ones it started and
// return the error: nothing is left running (they used to keep running).
func TestStartStopsWhatItStartedWhenAComponentFails(t *testing.T) {
	db := pgtest.NewDB(t)
	ctx := context.Background()
	leaks := goleak.IgnoreCurrent()
	c := newClient(t, db)
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "jobs"}))
	var handled atomic.Int64
	k, err := c.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "jobs", PollInterval: 20 * time.Millisecond,
		Handler: func(context.Context, *outbox.Delivery) error { handled.Add(1); return nil }})
	require.NoError(t, err)
	g, err := c.NewGroup(consumergroup.Config{Topic: "never.configured", Group: "g"}, consumergroup.FromNow())
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return nil }, nil))

	err = c.Start(ctx)
	require.ErrorIs(t, err, outbox.ErrUnknownTopic)
	for what, done := range map[string]<-chan struct{}{"consumer": k.Stopped(), "client": c.Stopped()} {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("the %s still runs after Start failed", what)
		}
	}
	send(t, c, "jobs", 1, nil)
	time.Sleep(100 * time.Millisecond) // five poll intervals of a consumer that would still run
	require.Zero(t, handled.Load())
	db.VerifyNoLeaks(t, leaks)
	require.ErrorIs(t, c.Start(ctx), outbox.ErrUnknownTopic, "it fails the same way again")
	db.VerifyNoLeaks(t, leaks)
}

// A failing handler is logged once per kind and topic (or group) per
// LogInterval, the next record counting those left out: it was one WARN
// line per message and attempt (70 lines for two 10 s outages).
func TestHandlerFailuresAreLoggedAtMostOncePerInterval(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	logs := &lines{}
	const interval = 2 * time.Second // each burst must end within it, on a slow machine too
	c, err := pgoutbox.NewClient(ctx, db.Pool, pgoutbox.Config{Schema: db.Schema, Logger: logs.logger(), LogInterval: interval})
	require.NoError(t, err)
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "jobs", MaxAttempts: 1}))
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, MaxAttempts: 1}))
	failing := func(context.Context, *outbox.Delivery) error { return errors.New("receiver down") }
	_, err = c.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "jobs", PollInterval: 20 * time.Millisecond, Handler: failing})
	require.NoError(t, err)
	g, err := c.NewGroup(consumergroup.Config{Topic: "events", Group: "g", PollInterval: 20 * time.Millisecond}, consumergroup.FromNow())
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", failing, nil))
	require.NoError(t, c.Start(ctx))
	defer func() { require.NoError(t, c.Stop(ctx)) }()

	deadLetters := func() (queue, group int) {
		q, err := c.Admin().DeadLetters(ctx, "jobs", "", 0, 100)
		require.NoError(t, err)
		d, err := g.DeadLetters(ctx, 0, 100)
		require.NoError(t, err)
		return len(q), len(d)
	}
	burst := func(n, want int) {
		began := time.Now()
		send(t, c, "jobs", n, nil)
		send(t, c, "events", n, nil)
		pgtest.Eventually(t, 10*time.Second, "every message dead-lettered", func() bool {
			q, d := deadLetters()
			return q == want && d == want
		})
		require.Less(t, time.Since(began), interval, "the burst outlasted the log interval; the test proves nothing")
	}
	burst(10, 10)
	require.Equal(t, 1, logs.count("topic=jobs", "handler failed"), logs.String())
	require.Equal(t, 1, logs.count("group=g", "handler failed"), logs.String())
	time.Sleep(interval)
	burst(1, 11)
	require.Equal(t, 2, logs.count("topic=jobs", "handler failed"), logs.String())
	require.Equal(t, 2, logs.count("group=g", "handler failed"), logs.String())
	require.Equal(t, 2, logs.count("suppressed=9"), "the next record counts those left out:\n%s", logs.String())
}
