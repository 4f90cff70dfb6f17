package consumergroup_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
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
