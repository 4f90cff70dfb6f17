package consumergroup_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Three groups each receive every one of 10,000 messages once; a message is
// complete only after all three.
func TestFanOutEveryGroupGetsEveryMessage(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			const n = 10000
			recs := make([]*recorder, 3)
			for i := range recs {
				recs[i] = newRecorder()
				g := b.newGroup(t, fmt.Sprintf("g%d", i))
				require.NoError(t, g.AddConsumer("m", recs[i].handler, nil))
				start(t, g, consumergroup.FromNow())
			}
			b.sendRange(t, 0, n)
			for i, r := range recs {
				pgtest.Eventually(t, 60*time.Second, fmt.Sprintf("group %d drained", i), func() bool { return r.distinct() == n })
				require.Zero(t, r.dups(), "group %d handled a message twice:\n%s", i, r.duplicates())
			}
			// Groups complete the same rows concurrently; they must lock
			// them in one order (a deadlock costs a second and a retry).
			time.Sleep(1100 * time.Millisecond) // statistics are flushed about once a second
			var deadlocks int64
			require.NoError(t, b.db.Pool.QueryRow(context.Background(),
				`SELECT deadlocks FROM pg_catalog.pg_stat_database WHERE datname = current_database()`).Scan(&deadlocks))
			require.Zero(t, deadlocks)
		})
	}
}

// Sixteen groups drain the same backlog at once, so their batches complete
// the same rows at the same moments: every completion locks its rows in
// one order, and none deadlocks. (Left to the plan, a Bitmap completion
// locked rows in the order a bitmap heap scan met them, which moves as
// the groups' updates move the rows: the benchmark's 16-group fan-out hit
// a deadlock every few seconds.)
func TestFanOutOfABacklogNeverDeadlocks(t *testing.T) {
	for _, mode := range []outbox.TrackingMode{outbox.Bitmap, outbox.Counter} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			const n, groups = 3000, 16
			ctx := context.Background()
			recs := make([]*recorder, groups)
			gs := make([]*consumergroup.Group, groups)
			for i := range gs {
				recs[i] = newRecorder()
				gs[i] = b.newGroup(t, fmt.Sprintf("g%d", i), func(c *consumergroup.Config) { c.BatchSize = 500; c.Concurrency = 4 })
				require.NoError(t, gs[i].AddConsumer("m", recs[i].handler, nil))
				require.NoError(t, gs[i].Start(ctx, consumergroup.FromNow()))
				require.NoError(t, gs[i].Stop(ctx)) // subscribed: the backlog waits for it
			}
			b.sendRange(t, 0, n)
			for _, g := range gs {
				start(t, g, consumergroup.FromNow())
			}
			for i, r := range recs {
				pgtest.Eventually(t, 60*time.Second, fmt.Sprintf("group %d drained", i), func() bool { return r.distinct() == n })
			}
			time.Sleep(1100 * time.Millisecond) // statistics are flushed about once a second
			var deadlocks int64
			require.NoError(t, b.db.Pool.QueryRow(ctx,
				`SELECT deadlocks FROM pg_catalog.pg_stat_database WHERE datname = current_database()`).Scan(&deadlocks))
			require.Zero(t, deadlocks)
			for i, r := range recs {
				require.Zero(t, r.dups(), "group %d handled a message twice:\n%s", i, r.duplicates())
			}
		})
	}
}
