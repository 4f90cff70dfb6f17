package consumergroup_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/completion"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// A member of group B stops in the middle of completing a batch (a
// process frozen by SIGSTOP, a pause in the garbage collector, a lost
// network path): its completion transaction stays open, with whatever it
// wrote and locked. Group A, finishing the same messages meanwhile, must
// neither wait for it nor slow down. Each group records its completions
// in rows of its own; when a completion updated the message row (the
// group's bit, a counter), B's open transaction held the row locks every
// A completion needed, and A finished nothing until B's transaction ended.
func TestGroupsNeverWaitForAnotherGroupsCompletion(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, mode)
			b.subscribe(t, "b")
			a := newRecorder()
			b.startRecording(t, "a", a)

			ids := b.send(t, seqs(0, 200)...)

			// B completes all 200 in a transaction that does not end while
			// A works: the statements B's completer runs, on the rows A needs.
			frozen, err := b.db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = frozen.Rollback(ctx) }()
			require.NoError(t, completeAs(ctx, frozen, b, "b", mode, ids))

			// A handles and completes the same messages, and more sent while
			// B stays frozen, in the time it would have without B.
			ids = append(ids, b.send(t, seqs(200, 400)...)...)
			aSub := b.subID(t, "a")
			pgtest.Eventually(t, 30*time.Second, "group a handled and completed every message while b was frozen", func() bool {
				return a.hasAll(ids) && b.countIn(t, "outbox_group_batches", "subscription_id = $1", aSub) == 0
			})
			require.Zero(t, a.dups())
			if mode != outbox.Offset { // once its position is past the last snapshot pair it read
				pgtest.Eventually(t, 10*time.Second, "group a finished every message", func() bool {
					return b.count(t, "topic = $1 AND "+b.db.FinishedBy(aSub), b.topic) == len(ids)
				})
			}
			// Nothing A did wrote a message row.
			require.Equal(t, len(ids), b.count(t, "topic = $1 AND xmax = 0", b.topic),
				"no message row was updated or locked by a completion")
		})
	}
}

// completeAs records, in tx, that group finished ids, as its completer
// would.
func completeAs(ctx context.Context, tx pgx.Tx, b *bundle, group string, mode outbox.TrackingMode, ids []int64) error {
	var sub completion.Subscription
	if err := tx.QueryRow(ctx, `SELECT id, topic, group_name, coalesce(bit, -1) FROM `+b.db.Table("outbox_topic_subscriptions")+
		` WHERE topic = $1 AND group_name = $2`, b.topic, group).Scan(&sub.ID, &sub.Topic, &sub.Group, &sub.Bit); err != nil {
		return fmt.Errorf("subscription of %s: %w", group, err)
	}
	tracker, err := completion.New(mode, sqlq.ForPubSub(b.db.Schema))
	if err != nil {
		return err
	}
	return tracker.Complete(ctx, tx, sub, ids)
}

// seqs returns the sequence numbers from up to to (excluded).
func seqs(from, to int) []int {
	s := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}
