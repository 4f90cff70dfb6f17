package consumergroup_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/netcut"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testlog"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testmetrics"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// The network path of a process holding messages under a 10-minute lease
// is cut without a FIN or a reset (its link goes down, as when its host
// vanishes): the server ends the process's LISTEN session within
// outbox.KeepaliveBound, and another instance handles the messages soon
// after, not when the lease ends.
func TestCutPathComesBackWithinTheKeepaliveBound(t *testing.T) {
	path := netcut.New(t)
	ctx := context.Background()
	host := pgtest.NewPool(t, path.HostDSN)
	require.NoError(t, migrations.Up(ctx, host, migrations.Config{}))
	var logs testlog.Buffer
	hostClient, err := outbox.NewClient(host, outbox.Config{Logger: logs.Logger()})
	require.NoError(t, err)
	require.NoError(t, hostClient.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub,
		Tracking: outbox.Offset, Lease: 10 * time.Minute}))

	farCfg, err := pgxpool.ParseConfig(path.FarDSN)
	require.NoError(t, err)
	farCfg.ConnConfig.DialFunc = path.Dial
	far, err := pgxpool.NewWithConfig(ctx, farCfg)
	require.NoError(t, err)
	defer far.Close()
	farClient, err := outbox.NewClient(far, outbox.Config{})
	require.NoError(t, err)

	reader := sdkmetric.NewManualReader()
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	group := func(client *outbox.Client, pool *pgxpool.Pool, instance string, h outbox.Handler) *consumergroup.Group {
		g, err := consumergroup.New(pool, consumergroup.Config{Client: client, Topic: "events", Group: "g", InstanceID: instance,
			BatchSize: 10, Concurrency: 10, PollInterval: 20 * time.Millisecond, HeartbeatInterval: time.Second, HeartbeatTimeout: time.Hour,
			MeterProvider: meters})
		require.NoError(t, err)
		require.NoError(t, g.AddConsumer("m", h, nil))
		require.NoError(t, g.Start(ctx, consumergroup.FromNow()))
		return g
	}
	var started atomic.Int64
	holder := group(farClient, far, "holder", func(ctx context.Context, _ *outbox.Delivery) error {
		started.Add(1)
		<-ctx.Done()
		return ctx.Err()
	})
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = holder.StopAndCancel(stopCtx)
	}()
	producer, err := outbox.NewProducer(outbox.ProducerConfig{})
	require.NoError(t, err)
	tx, err := host.Begin(ctx)
	require.NoError(t, err)
	for range 10 {
		_, err := producer.Send(ctx, tx, outbox.Message{Topic: "events", Payload: []byte(`{}`)})
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit(ctx))
	pgtest.Eventually(t, 30*time.Second, "the holder handling every message", func() bool { return started.Load() == 10 })
	var recorded int
	require.NoError(t, host.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{hostClient.Schema(), "outbox_live_instances"}.Sanitize()+` WHERE member = 'holder'`).Scan(&recorded))
	require.Equal(t, 1, recorded, "the holder is recorded alive")

	r := newRecorder()
	survivor := group(hostClient, host, "survivor", r.handler)
	defer func() { _ = survivor.Stop(ctx) }()
	cut := time.Now()
	path.Cut(t)
	pgtest.Eventually(t, outbox.KeepaliveBound+time.Minute, "the survivor handling the cut-off holder's messages", func() bool { return r.distinct() == 10 })
	took := time.Since(cut)
	t.Logf("the messages of the holder whose path was cut were handled %v after the cut", took.Round(time.Millisecond))
	// About KeepaliveBound and a second on a quiet machine; the bound
	// leaves room for a busy one, far below the 10-minute lease.
	require.Less(t, took, outbox.KeepaliveBound+10*time.Second, "taken back soon after the keepalive bound, not when the 10-minute lease ends")
	require.Zero(t, r.dups())
	require.NotEmpty(t, logs.Lines("took over messages of an instance that is gone", "reason=owner_gone", "member=holder", "messages=10"),
		"the takeover says why")
	var ownerGone float64
	for _, p := range testmetrics.Points(t, reader)["pgoutbox.group.taken_over"] {
		if p.Attr("reason") == "owner_gone" {
			ownerGone += p.Value
		}
	}
	require.Equal(t, float64(10), ownerGone, "pgoutbox.group.taken_over{reason=owner_gone}")
}
