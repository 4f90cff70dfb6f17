package consumergroup_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// A running group deletes expired idempotency keys (and only those), so a
// service that runs no QUEUE consumer does not keep them forever.
func TestGroupExpiresIdempotencyKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Offset)
	ctx := context.Background()
	clock := clocktest.New(time.Now())
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: b.db.Schema, Clock: clock})
	require.NoError(t, err)
	send := func(key string) {
		t.Helper()
		_, err := producer.Send(ctx, b.db.Pool, outbox.Message{Topic: b.topic, Payload: json.RawMessage(`{}`), IdempotencyKey: key})
		require.NoError(t, err)
	}
	keys := func() []string {
		rows, err := b.db.Pool.Query(ctx, `SELECT idempotency_key FROM `+b.db.Table("outbox_idempotency_keys")+` ORDER BY 1`)
		require.NoError(t, err)
		ks, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return ks
	}
	send("old")
	clock.Advance(outbox.DefaultIdempotencyWindow)
	send("new")
	require.Equal(t, []string{"new", "old"}, keys())

	g := b.newGroup(t, "g", func(c *consumergroup.Config) { c.Clock = clock; c.HeartbeatInterval = 20 * time.Millisecond })
	require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return nil }, nil))
	start(t, g, consumergroup.FromNow())
	pgtest.Eventually(t, 10*time.Second, "the expired key deleted", func() bool { return len(keys()) == 1 })
	time.Sleep(100 * time.Millisecond) // five heartbeats
	require.Equal(t, []string{"new"}, keys(), "the live key is kept")
}
