package pubsub_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/pubsub"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A Counter-mode message that group g2 was forgotten on (it was DEAD) and
// that g2's instance completes while g2 comes back and is backfilled: in
// either order, the message ends with as many completions as required
// groups, so cleanup deletes it. (The backfill used to decide on a
// snapshot taken before the completion committed and raise the message
// on g2 again: required twice, completed once, kept for ever.)
func TestCounterCompletionRacingABackfill(t *testing.T) {
	for _, backfillFirst := range []bool{false, true} {
		name := "completion first"
		if backfillFirst {
			name = "backfill first"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := pgtest.NewDB(t)
			client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
			require.NoError(t, err)
			require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter}))
			subs := map[string]pubsub.Subscription{}
			for _, name := range []string{"g1", "g2"} { // registered, then stopped: the message requires both
				g, err := consumergroup.New(db.Pool, consumergroup.Config{Topic: "events", Group: name, Schema: db.Schema})
				require.NoError(t, err)
				require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return nil }, nil))
				require.NoError(t, g.Start(ctx, consumergroup.FromNow()))
				require.NoError(t, g.Stop(ctx))
				s := pubsub.Subscription{Topic: "events", Group: name, Bit: -1}
				require.NoError(t, db.Pool.QueryRow(ctx, `SELECT id FROM `+db.Table("outbox_topic_subscriptions")+` WHERE group_name = $1`, name).Scan(&s.ID))
				subs[name] = s
			}
			producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema})
			require.NoError(t, err)
			id, err := producer.Send(ctx, db.Pool, outbox.Message{Topic: "events", Payload: []byte(`{}`)})
			require.NoError(t, err)
			tracker, err := pubsub.New(outbox.Counter, db.Schema)
			require.NoError(t, err)
			inTx := func(f func(pgx.Tx) error) { require.NoError(t, pgx.BeginFunc(ctx, db.Pool, f)) }

			// g1 completes it; g2 is forgotten on it.
			inTx(func(tx pgx.Tx) error { return tracker.Complete(ctx, tx, subs["g1"], []int64{id}) })
			inTx(func(tx pgx.Tx) error { _, err := tracker.Forget(ctx, tx, subs["g2"], false, 100); return err })

			complete, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer complete.Rollback(ctx)
			backfill, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer backfill.Rollback(ctx)
			everything := pubsub.Range{Position: "1:1:", All: true}
			first, second := complete, backfill
			run := map[pgx.Tx]func() error{
				complete: func() error { return tracker.Complete(ctx, complete, subs["g2"], []int64{id}) },
				backfill: func() error { _, _, err := tracker.Backfill(ctx, backfill, subs["g2"], everything, 100); return err },
			}
			if backfillFirst {
				first, second = backfill, complete
			}
			require.NoError(t, run[first]())
			done := make(chan error, 1)
			go func() { done <- run[second]() }()
			time.Sleep(200 * time.Millisecond) // the second waits for the first's row lock (or has finished)
			require.NoError(t, first.Commit(ctx))
			require.NoError(t, <-done)
			require.NoError(t, second.Commit(ctx))

			var required, completed int
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT required_count, completed_count FROM `+db.Table("outbox_published")+` WHERE id = $1`, id).
				Scan(&required, &completed))
			require.Equal(t, required, completed, "completions must match the required groups")
			deleted, err := tracker.Cleanup(ctx, db.Pool, "events", pubsub.Retention{}, 100)
			require.NoError(t, err)
			require.EqualValues(t, 1, deleted, "cleanup deletes the finished message")
		})
	}
}
