package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testlog"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// The messages of a crashed consumer, taken back one claim at a time, are
// logged once per LogInterval (WARN, with their count), not once a claim.
func TestQueueTakeoversLoggedRateLimited(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	logs := &testlog.Buffer{}
	b := setup(t, outbox.Config{Clock: clock, Logger: logs.Logger()})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "work", Lease: 30 * time.Second}))
	b.sendN(t, "work", 10)

	doomedPool := pgtest.NewPool(t, b.db.DSN)
	doomedClient, err := outbox.NewClient(doomedPool, outbox.Config{Schema: b.db.Schema, Clock: clock})
	require.NoError(t, err)
	var held atomic.Int64
	doomed, err := doomedClient.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "work", Concurrency: 10, BatchSize: 10, ID: "doomed",
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			held.Add(1)
			<-ctx.Done()
			return ctx.Err()
		}})
	require.NoError(t, err)
	require.NoError(t, doomed.Start(ctx))
	pgtest.Eventually(t, 10*time.Second, "the doomed consumer holds every message", func() bool { return held.Load() == 10 })
	doomedPool.Close() // a crash: nothing more reaches the database
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	_ = doomed.Stop(stopCtx)
	cancel()

	clock.Advance(31 * time.Second)
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "work", Concurrency: 1, BatchSize: 1, PollInterval: 20 * time.Millisecond,
		ID: "survivor", Handler: func(context.Context, *outbox.Delivery) error { return nil }})
	pgtest.Eventually(t, 10*time.Second, "every message taken back and handled", func() bool { return b.count(t, "true") == 0 })
	lines := logs.Lines("level=WARN", "took back messages whose lease expired")
	require.Len(t, lines, 1, "one record for ten takeovers:\n%s", logs.String())
	require.Contains(t, lines[0], "count=1")
	require.Contains(t, lines[0], "topic=work")
}
