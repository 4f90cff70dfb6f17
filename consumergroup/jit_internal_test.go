package consumergroup

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// No statement of a fetch is compiled with JIT, on a topic of 100,000
// stored messages written by 100 transactions. A fetch reads a batch in
// about a millisecond, many times a second; the planner's estimates of
// snapshot reads (it takes pg_snapshot_xip for 50 transactions, whatever
// the snapshot holds) put some of them past jit_above_cost, and JIT then
// compiled every fetch: 86 ms of an 87 ms fetch in a drain, a third of
// its throughput, and every catch-up read of a backfill.
func TestFetchesAreNotCompiledWithJIT(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, db, _ := runGroup(t, outbox.Offset, false, time.Hour, func(context.Context, *outbox.Delivery) error { return nil })
	require.NoError(t, g.Stop(ctx))
	for range 100 {
		_, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Table("outbox_published")+` (topic, payload, correlation_id, status)
SELECT 'events', '{"seq": 1}', 'c', 'PUBLISHED' FROM generate_series(1, 1000)`)
		require.NoError(t, err)
	}
	_, err := db.Pool.Exec(ctx, `ANALYZE `+db.Table("outbox_published"))
	require.NoError(t, err)

	var prev, cur string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT position::text, pg_current_snapshot()::text FROM `+
		db.Table("outbox_subscription_offsets")+` WHERE subscription_id = $1`, g.sub.ID).Scan(&prev, &cur))
	stream := g.tracking().Stream
	pair := func() sqlq.Args {
		return sqlq.Args{"topic": "events", "prev": prev, "cur": cur, "after_xid": "0", "after_id": int64(0),
			"limit": 1000, "sub": g.sub.ID}
	}
	catchup := catchupFor(g.subRow).Bind(pair())
	catchup["done_bit"], catchup["done_sub"] = int64(0), g.sub.ID
	statements := []struct {
		name string
		sql  string
		args []any
	}{
		{"FetchRows", g.q.FetchRows.Numbered, g.q.FetchRows.Bind(stream.Bind(pair()))},
		{"FetchRowsAhead", g.q.FetchRowsAhead.Numbered, g.q.FetchRowsAhead.Bind(stream.Bind(sqlq.Args{"sub": g.sub.ID, "topic": "events", "limit": 1000}))},
		{"CatchupRows", g.q.CatchupRows.Numbered, g.q.CatchupRows.Bind(catchup)},
		{"TakeAhead", g.q.TakeAhead.Numbered, g.q.TakeAhead.Bind(stream.Bind(sqlq.Args{"sub": g.sub.ID, "topic": "events", "snapshot": cur,
			"position": prev, "pair_cur": nil, "resume_xid": nil, "resume_id": nil, "now": nil, "limit": 1000}))},
		{"ClaimRetries", g.q.ClaimRetries.Numbered, g.q.ClaimRetries.Bind(sqlq.Args{"sub": g.sub.ID, "member": "m", "now": nil,
			"lease_us": int64(1000), "limit": 1000})},
	}

	// A fetch's statements run in its transaction, after LockOffset.
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	rows, err := tx.Query(ctx, g.q.LockOffset.Numbered, g.q.LockOffset.Bind(sqlq.Args{"sub": g.sub.ID})...)
	require.NoError(t, err)
	rows.Close()
	require.NoError(t, rows.Err())
	for _, s := range statements {
		var plan []map[string]any
		require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+s.sql, s.args...).Scan(&plan), s.name)
		_, jit := plan[0]["JIT"]
		require.False(t, jit, "%s is compiled with JIT (estimated cost %v)", s.name, cost(plan))
	}

	// An idle instance's look runs alone.
	var plan []map[string]any
	args := stream.Bind(sqlq.Args{"sub": g.sub.ID, "topic": "events", "now": nil})
	require.NoError(t, db.Pool.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+g.q.AnyWork.Numbered, g.q.AnyWork.Bind(args)...).Scan(&plan))
	_, jit := plan[0]["JIT"]
	require.False(t, jit, "AnyWork is compiled with JIT (estimated cost %v)", cost(plan))
}

func cost(plan []map[string]any) string {
	return fmt.Sprint(plan[0]["Plan"].(map[string]any)["Total Cost"])
}
