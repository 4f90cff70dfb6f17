package migrations_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/migrations"
)

// Migration 10 makes outbox_published a partitioned table: the rows there
// are become its first partition, unchanged, ids continue from the one
// sequence QUEUE messages share, statements prepared before the upgrade
// keep working after it, and Down puts every row back in one table.
func TestPartitionedPublishedMigrationKeepsMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := migrations.Config{Schema: "p10"}
	db := atVersion(t, cfg, 9, `
INSERT INTO outbox (topic, payload, correlation_id) VALUES ('jobs', '{"n":1}', 'c1');
INSERT INTO outbox_published (topic, payload, correlation_id, status, required_bits, done_bits)
VALUES ('events', '{"n":2}', 'c2', 'PUBLISHED', 3, 1), ('events', '{"n":3}', 'c3', 'PUBLISHED', 1, 1)`)
	v9Indexes := indexDefs(t, db.Pool, "p10")
	published := rowsAsJSON(t, db.Pool, `SELECT * FROM p10.outbox_published`)
	require.Len(t, published, 2)

	// A connection of the previous release, with its statements prepared
	// (pgx caches them) before the upgrade.
	old, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer old.Release()
	const oldInsert = `INSERT INTO p10.outbox_published (id, topic, payload, correlation_id, status)
OVERRIDING SYSTEM VALUE SELECT nextval('p10.outbox_id_seq'), $1, '{}', 'c', 'PUBLISHED' RETURNING id`
	const oldLookup = `SELECT count(*) FROM p10.outbox_published WHERE id = ANY($1)`
	var id4 int64
	require.NoError(t, old.QueryRow(ctx, oldInsert, "events").Scan(&id4))
	require.Equal(t, int64(4), id4)
	var n int
	require.NoError(t, old.QueryRow(ctx, oldLookup, []int64{2, 4}).Scan(&n))
	require.Equal(t, 2, n)

	migrateTo(t, db.Pool, cfg, 10)
	require.Equal(t, append(published, rowsAsJSON(t, db.Pool, `SELECT * FROM p10.outbox_published WHERE id = 4`)...),
		rowsAsJSON(t, db.Pool, `SELECT * FROM p10.outbox_published_p1`), "the old rows are the first partition")
	require.Equal(t, []string{"outbox_published_default", "outbox_published_p1", "outbox_published_p2"},
		queryStrings(t, db.Pool, `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = 'p10.outbox_published'::regclass ORDER BY 1`))

	// The previous release's statements, prepared before the upgrade.
	var id5 int64
	require.NoError(t, old.QueryRow(ctx, oldInsert, "events").Scan(&id5))
	require.Equal(t, int64(5), id5, "ids continue")
	require.NoError(t, old.QueryRow(ctx, oldLookup, []int64{2, 4, 5}).Scan(&n))
	require.Equal(t, 3, n)
	var queued int64
	require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO p10.outbox (topic, payload, correlation_id) VALUES ('jobs', '{}', 'c') RETURNING id`).Scan(&queued))
	require.Equal(t, int64(6), queued, "QUEUE messages draw from the same sequence")
	var where string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM p10.outbox_published WHERE id = 5`).Scan(&where))
	require.Equal(t, "p10.outbox_published_p2", where, "a new message goes to the range partition after the upgrade's snapshot")

	all := rowsAsJSON(t, db.Pool, `SELECT * FROM p10.outbox_published`)
	migrateTo(t, db.Pool, cfg, 9)
	require.Equal(t, all, rowsAsJSON(t, db.Pool, `SELECT * FROM p10.outbox_published`), "Down keeps every row")
	require.Equal(t, v9Indexes, indexDefs(t, db.Pool, "p10"), "Down restores version 9's indexes")
	require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO p10.outbox (topic, payload, correlation_id) VALUES ('jobs', '{}', 'c') RETURNING id`).Scan(&queued))
	require.Equal(t, int64(7), queued, "and the sequence")
	var identity string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT pg_get_serial_sequence('p10.outbox_published', 'id')`).Scan(&identity))
	require.Equal(t, "p10.outbox_id_seq", identity)
}
