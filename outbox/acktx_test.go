package outbox_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// AckTx commits a handler's writes and the ack together: a holder whose
// lease expired and whose message was claimed again cannot ack, so its
// transaction rolls back and only the redelivery's effect remains; and a
// holder that acked in a transaction still open keeps the message from
// any other claim.
func TestAckTxTakesEffectOnce(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	b := setup(t, outbox.Config{Clock: clock})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "work", Lease: 30 * time.Second}))
	effects := b.db.Table("effects")
	_, err := b.db.Pool.Exec(ctx, `CREATE TABLE `+effects+` (message_id bigint, holder text)`)
	require.NoError(t, err)
	effect := func(d *outbox.Delivery, holder string) func(pgx.Tx) error {
		return func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` VALUES ($1, $2)`, d.ID, holder); err != nil {
				return err
			}
			return b.client.AckTx(ctx, tx, d)
		}
	}
	b.sendN(t, "work", 2)

	// A stale holder: its lease ran out and the message went to another.
	stale, err := b.client.Claim(ctx, "work", "slow", 1)
	require.NoError(t, err)
	clock.Advance(31 * time.Second)
	fresh, err := b.client.Claim(ctx, "work", "fast", 2)
	require.NoError(t, err)
	require.Len(t, fresh, 2)
	require.ErrorIs(t, pgx.BeginFunc(ctx, b.db.Pool, effect(stale[0], "slow")), outbox.ErrLeaseLost)
	for _, d := range fresh {
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, effect(d, "fast")))
	}

	// A holder that acked in a transaction still open, its lease run out
	// meanwhile: no other claim takes the message, and after the commit
	// it is gone.
	b.sendN(t, "work", 1)
	held, err := b.client.Claim(ctx, "work", "holder", 1)
	require.NoError(t, err)
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	require.NoError(t, effect(held[0], "holder")(tx))
	clock.Advance(31 * time.Second)
	other, err := b.client.Claim(ctx, "work", "other", 10)
	require.NoError(t, err)
	require.Empty(t, other, "the row is locked by the ack in flight")
	require.NoError(t, tx.Commit(ctx))
	other, err = b.client.Claim(ctx, "work", "other", 10)
	require.NoError(t, err)
	require.Empty(t, other)

	var n, distinct int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM `+effects).Scan(&n, &distinct))
	require.Equal(t, 3, n, "one effect per message")
	require.Equal(t, 3, distinct)
	require.Zero(t, b.count(t, "true"), "every message acked")
	require.ErrorIs(t, b.client.AckTx(ctx, nil, held[0]), outbox.ErrNilExecutor)
}

// A consumer's handler that acks in its own transaction: every message
// has its effect once, with several consumers competing, and the
// consumer's own ack afterwards changes nothing.
func TestConsumerHandlerAcksInItsTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "work"}))
	effects := b.db.Table("effects")
	_, err := b.db.Pool.Exec(ctx, `CREATE TABLE `+effects+` (message_id bigint)`)
	require.NoError(t, err)
	const n = 300
	b.sendN(t, "work", n)
	var mu sync.Mutex
	calls := 0
	for range 3 {
		startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "work", PollInterval: 20 * time.Millisecond, Concurrency: 4,
			Handler: func(ctx context.Context, d *outbox.Delivery) error {
				mu.Lock()
				calls++
				mu.Unlock()
				return pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` VALUES ($1)`, d.ID); err != nil {
						return err
					}
					return b.client.AckTx(ctx, tx, d)
				})
			}})
	}
	pgtest.Eventually(t, 30*time.Second, "every message handled", func() bool { return b.count(t, "true") == 0 })
	var rows, distinct int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT message_id) FROM `+effects).Scan(&rows, &distinct))
	require.Equal(t, n, rows)
	require.Equal(t, n, distinct)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, n, calls, "no redelivery")
}
