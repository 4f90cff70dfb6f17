package consumergroup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// A transaction held open elsewhere in the database (here: a REPEATABLE
// READ transaction with an xid) keeps every later snapshot's xmin at its
// xid. A fetch must still read only what its previous snapshot had not
// seen, not every row written since that transaction began: after 3,000
// messages were delivered during the hold, the group's next fetch reads a
// handful of rows. Scanning from the previous snapshot's xmin, it read
// (and threw away) all 3,000.
func TestFetchUnderHeldXminReadsOnlyUnseenRows(t *testing.T) {
	for _, mode := range []outbox.TrackingMode{outbox.Bitmap, outbox.Counter, outbox.Offset} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			var handled atomic.Int64
			g, db, producer := runGroup(t, mode, false, 20*time.Millisecond, func(context.Context, *outbox.Delivery) error {
				handled.Add(1)
				return nil
			})

			held, err := pgx.ConnectConfig(ctx, db.Pool.Config().ConnConfig)
			require.NoError(t, err)
			defer held.Close(context.Background())
			tx, err := held.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
			require.NoError(t, err)
			defer tx.Rollback(context.Background())
			var heldXID string
			require.NoError(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&heldXID))

			const n = 3000
			for start := 0; start < n; start += 100 { // many transactions, fetched as they come
				msgs := make([]outbox.Message, 100)
				for i := range msgs {
					p, _ := json.Marshal(map[string]int{"seq": start + i})
					msgs[i] = outbox.Message{Topic: "events", Payload: p}
				}
				_, err := producer.SendBatch(ctx, db.Pool, msgs)
				require.NoError(t, err)
			}
			require.Eventually(t, func() bool { return handled.Load() == n }, 30*time.Second, 10*time.Millisecond)
			// The group fetches at least once more and so stands on a
			// snapshot taken after every message, with the held xid its xmin.
			var prev string
			require.Eventually(t, func() bool {
				err := db.Pool.QueryRow(ctx, `SELECT position::text FROM `+db.Table("outbox_subscription_offsets")+
					` WHERE subscription_id = $1 AND pair_cur IS NULL
					  AND pg_snapshot_xmax(position) > (SELECT max(xid) FROM `+db.Table("outbox_published")+`)`,
					g.sub.ID).Scan(&prev)
				return err == nil
			}, 10*time.Second, 10*time.Millisecond)
			var xmin string
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_snapshot_xmin($1::pg_snapshot)::text`, prev).Scan(&xmin))
			var heldBack bool
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT $1::xid8 <= $2::xid8`, xmin, heldXID).Scan(&heldBack))
			require.True(t, heldBack, "the held transaction (xid %s) holds the group's snapshots back (xmin %s)", heldXID, xmin)

			// The group's next fetch, one more message later, explained,
			// both ways a look reads (see engine.Fetcher.readAhead). The group stops first:
			// fetchRowsAhead reads nothing while its look holds the position.
			require.NoError(t, g.Stop(ctx))
			_, err = producer.SendBatch(ctx, db.Pool, []outbox.Message{{Topic: "events", Payload: []byte(`{"seq":-1}`)}})
			require.NoError(t, err)
			var cur string
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&cur))
			stream := g.tracking().Stream
			for _, f := range []struct {
				name, sql string
				args      []any
			}{
				{"FetchRows", g.q.FetchRows.Numbered, g.q.FetchRows.Bind(stream.Bind(sqlq.Args{"topic": "events", "prev": prev, "cur": cur,
					"after_xid": "0", "after_id": int64(0), "limit": 1000, "sub": g.sub.ID}))},
				{"FetchRowsAhead", g.q.FetchRowsAhead.Numbered, g.q.FetchRowsAhead.Bind(stream.Bind(sqlq.Args{"sub": g.sub.ID, "topic": "events", "limit": 1000}))},
			} {
				var plan []map[string]any
				require.NoError(t, db.Pool.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+f.sql, f.args...).Scan(&plan))
				read, returned := rowsRead(plan[0]["Plan"].(map[string]any)), num(plan[0]["Plan"].(map[string]any)["Actual Rows"])
				t.Logf("%s read %d rows of outbox_published", f.name, read)
				if read > 20 {
					out, _ := json.MarshalIndent(plan, "", " ")
					t.Logf("%s", out)
				}
				require.Equal(t, 1.0, returned, "%s returns the message sent after the position", f.name)
				require.LessOrEqual(t, read, 20, "rows read by %s after %d messages during the hold", f.name, n)
				// A fetch runs many times a second: compiling it with JIT (an
				// estimate past jit_above_cost) costs more than running it.
				require.NotContains(t, plan[0], "JIT", "%s was compiled with JIT (its estimated cost: %v)", f.name,
					plan[0]["Plan"].(map[string]any)["Total Cost"])
			}
		})
	}
}

// rowsRead sums, over a JSON plan, the rows scans of outbox_published
// (its partitions) returned and those their filters removed.
func rowsRead(node map[string]any) int {
	n := 0
	if name, _ := node["Relation Name"].(string); strings.HasPrefix(name, "outbox_published") { // the log or one of its partitions
		loops := num(node["Actual Loops"])
		n += int(loops * (num(node["Actual Rows"]) + num(node["Rows Removed by Filter"]) + num(node["Rows Removed by Index Recheck"])))
	}
	if kids, ok := node["Plans"].([]any); ok {
		for _, k := range kids {
			n += rowsRead(k.(map[string]any))
		}
	}
	return n
}

func num(v any) float64 {
	switch x := v.(type) {
	case float64:
		return x
	case nil:
		return 0
	default:
		panic(fmt.Sprintf("plan value %v (%T)", v, v))
	}
}

// An idle group looks for messages often, and each look that moved its
// position wrote a version of its offsets row: hundreds a second, none
// reclaimable while a transaction elsewhere holds the xmin back. Looks
// that find nothing move it at most once every idlePositionEvery (see
// package engine).
func TestIdleLooksWriteNoPositions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	g, db, _ := runGroup(t, outbox.Offset, false, 2*time.Millisecond, func(context.Context, *outbox.Delivery) error { return nil })

	versions := map[string]bool{}
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		var xmin string
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT xmin::text FROM `+db.Table("outbox_subscription_offsets")+
			` WHERE subscription_id = $1`, g.sub.ID).Scan(&xmin))
		versions[xmin] = true
	}
	require.LessOrEqual(t, len(versions), 3, "versions of the offsets row written in 1.5 s of idle looks")
}

// An idle instance asks with one statement, outside a transaction,
// whether there is anything to fetch, and looks in full (a transaction
// that locks its offsets row, and so takes a transaction id) only when
// there is: a thousand idle groups polling once a second were most of
// the database's work. Work that appears is still found: a message, a
// retry that falls due.
func TestIdleLooksLockNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var attempts atomic.Int64
	g, db, producer := runGroup(t, outbox.Bitmap, true, 2*time.Millisecond, func(context.Context, *outbox.Delivery) error {
		if attempts.Add(1) == 1 {
			return outbox.RetryAfter(300*time.Millisecond, errors.New("once more"))
		}
		return nil
	})

	lockers := func(d time.Duration) int {
		seen := map[string]bool{}
		for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			var xmax string
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT xmax::text FROM `+db.Table("outbox_subscription_offsets")+
				` WHERE subscription_id = $1`, g.sub.ID).Scan(&xmax))
			seen[xmax] = true
		}
		return len(seen)
	}
	time.Sleep(100 * time.Millisecond) // the first looks
	require.LessOrEqual(t, lockers(time.Second), 2, "transactions that locked the offsets row in 1 s of idle looks")

	_, err := producer.SendBatch(ctx, db.Pool, []outbox.Message{{Topic: "events", Payload: []byte(`{}`)}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return attempts.Load() == 2 }, 10*time.Second, 5*time.Millisecond,
		"the message, and its retry once due, are found without a notification")
}

// runGroup runs group "g" of a new PUB_SUB topic "events" (tracking mode)
// in a schema of its own, looking every poll (without notifications when
// pollOnly), with handler h, until the test ends.
func runGroup(t *testing.T, mode outbox.TrackingMode, pollOnly bool, poll time.Duration, h outbox.Handler) (*Group, *pgtest.DB, *outbox.Producer) {
	t.Helper()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema, PollOnly: pollOnly})
	require.NoError(t, err)
	require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode}))
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	g, err := New(db.Pool, Config{Client: client, Topic: "events", Group: "g", PollInterval: poll})
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("c", h, nil))
	require.NoError(t, g.Start(ctx, FromNow()))
	t.Cleanup(func() { _ = g.Stop(context.Background()) })
	return g, db, producer
}
