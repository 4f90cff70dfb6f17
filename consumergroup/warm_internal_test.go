package consumergroup

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// A started instance has, before any message arrives, several of its
// pool's connections ready for its looks: the look's read of the log and
// the idle check prepared and planned on each. Before, only the first
// look's connection was, and the first messages waited for the server to
// plan the read (8–18 ms) on each connection the pool opened as work
// began.
func TestStartReadiesConnectionsForLooks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, db, _ := runGroup(t, outbox.Offset, false, time.Hour, func(context.Context, *outbox.Delivery) error { return nil })
	ready := func() int {
		conns := db.Pool.AcquireAllIdle(ctx)
		defer func() {
			for _, c := range conns {
				c.Release()
			}
		}()
		n := 0
		for _, c := range conns {
			var planned bool
			require.NoError(t, c.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE generic_plans > 0) = 2 FROM pg_prepared_statements WHERE statement IN ($1, $2)`,
				g.q.FetchRowsAhead.Numbered, g.q.AnyWork.Numbered).Scan(&planned))
			if planned {
				n++
			}
		}
		return n
	}
	pgtest.Eventually(t, 10*time.Second, "connections ready for looks", func() bool { return ready() >= 2 })
}
