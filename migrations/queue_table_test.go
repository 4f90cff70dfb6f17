package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/migrations"
)

// migrateTo moves the schema to version v, up or down.
func migrateTo(t *testing.T, pool *pgxpool.Pool, cfg migrations.Config, v uint) {
	t.Helper()
	require.NoError(t, migrations.MigrateTo(context.Background(), pool, cfg, v))
}

// queueColumns are the columns of a QUEUE message in every version.
const queueColumns = `id, topic, payload, headers, correlation_id, message_group, priority, idempotency_key, status,
	attempts, available_at, lease_owner, lease_until, last_error, created_at, dead_lettered_at, xid`

// atVersion returns a fresh database whose schema is at version v, with
// rows written by setup (SQL run with the schema on the search path).
func atVersion(t *testing.T, cfg migrations.Config, v uint, setup string) *pgtest.DB {
	t.Helper()
	db := pgtest.NewEmptyDB(t)
	migrateTo(t, db.Pool, cfg, v)
	_, err := db.Pool.Exec(context.Background(), `SET search_path = `+cfg.Schema+`;`+setup+`;RESET search_path`)
	require.NoError(t, err)
	return db
}

// indexDefs lists the definitions of the indexes in schema.
func indexDefs(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	return queryStrings(t, pool, `SELECT indexdef FROM pg_indexes WHERE schemaname = '`+schema+`' ORDER BY indexname`)
}

func rowsAsJSON(t *testing.T, pool *pgxpool.Pool, query string) []string {
	t.Helper()
	return queryStrings(t, pool, `SELECT to_jsonb(r)::text FROM (`+query+`) AS r ORDER BY r.id`)
}

// Migration 6 moves QUEUE messages out of the shared table, unchanged and
// with their ids, and Down moves them back.
func TestQueueTableMigrationKeepsMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := migrations.Config{Schema: "q6"}
	db := atVersion(t, cfg, 5, `
INSERT INTO outbox_topics (topic, semantics, tracking_mode, retention, max_attempts, backoff_initial, backoff_max, lease_duration)
VALUES ('events', 'PUB_SUB', 'BITMAP', '1 day', 3, '1s', '1m', '30s');
INSERT INTO outbox (topic, payload, headers, correlation_id, message_group, priority, idempotency_key)
VALUES ('jobs', '{"n":1}', '{"h":"v"}', 'c1', 'g', 5, 'key-1');
INSERT INTO outbox (topic, payload, correlation_id, status, attempts, lease_owner, lease_until)
VALUES ('jobs', '{"n":2}', 'c2', 'PROCESSING', 1, 'worker-1', now() + interval '30 seconds');
INSERT INTO outbox (topic, payload, correlation_id, status, attempts, last_error, dead_lettered_at)
VALUES ('jobs', '{"n":3}', 'c3', 'DEAD_LETTER', 3, 'boom', now());
INSERT INTO outbox (topic, payload, correlation_id, status, required_bits, done_bits)
VALUES ('events', '{"n":4}', 'c4', 'PUBLISHED', 3, 1)`)
	v5Indexes := indexDefs(t, db.Pool, "q6")
	queue := rowsAsJSON(t, db.Pool, `SELECT `+queueColumns+` FROM q6.outbox WHERE status <> 'PUBLISHED'`)
	published := rowsAsJSON(t, db.Pool, `SELECT * FROM q6.outbox WHERE status = 'PUBLISHED'`)
	require.Len(t, queue, 3)
	require.Len(t, published, 1)

	migrateTo(t, db.Pool, cfg, 6)
	require.Equal(t, queue, rowsAsJSON(t, db.Pool, `SELECT `+queueColumns+` FROM q6.outbox`))
	require.Equal(t, published, rowsAsJSON(t, db.Pool, `SELECT * FROM q6.outbox_published`))
	// New messages of either kind draw ids from the one sequence.
	var queued, pub int64
	require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO q6.outbox (topic, payload, correlation_id) VALUES ('jobs', '{}', 'c5') RETURNING id`).Scan(&queued))
	require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO q6.outbox_published (topic, payload, correlation_id, status) VALUES ('events', '{}', 'c6', 'PUBLISHED') RETURNING id`).Scan(&pub))
	require.Equal(t, int64(5), queued)
	require.Equal(t, int64(6), pub)
	_, err := db.Pool.Exec(ctx, `INSERT INTO q6.outbox (topic, payload, correlation_id, idempotency_key) VALUES ('jobs', '{}', 'c7', 'key-1')`)
	require.ErrorContains(t, err, "outbox_idempotency_idx", "the idempotency key moved with its message")

	migrateTo(t, db.Pool, cfg, 5)
	all := rowsAsJSON(t, db.Pool, `SELECT `+queueColumns+` FROM q6.outbox WHERE id < 5`)
	require.Equal(t, queue, all[:3], "QUEUE messages are back, unchanged")
	require.Equal(t, published, rowsAsJSON(t, db.Pool, `SELECT * FROM q6.outbox WHERE id = 4`))
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM q6.outbox`).Scan(&n))
	require.Equal(t, 6, n)
	require.Equal(t, v5Indexes, indexDefs(t, db.Pool, "q6"), "Down restores version 5's indexes")
}

// Migration 7 moves dead letters and idempotency keys out of the message
// tables and keeps a lease's end in available_at; Down puts them back.
func TestLeanQueueMigrationKeepsMessages(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := migrations.Config{Schema: "q7"}
	db := atVersion(t, cfg, 6, `
INSERT INTO outbox (topic, payload, headers, correlation_id, message_group, priority, idempotency_key)
VALUES ('jobs', '{"n":1}', '{"h":"v"}', 'c1', 'g', 5, 'key-1');
INSERT INTO outbox (topic, payload, correlation_id, status, attempts, lease_owner, lease_until, last_error)
VALUES ('jobs', '{"n":2}', 'c2', 'PROCESSING', 2, 'worker-1', now() + interval '30 seconds', 'timeout');
INSERT INTO outbox (topic, payload, correlation_id, status, attempts, last_error, dead_lettered_at)
VALUES ('jobs', '{"n":3}', 'c3', 'DEAD_LETTER', 3, 'boom', now());
INSERT INTO outbox_published (topic, payload, correlation_id, status, idempotency_key, required_bits, done_bits)
VALUES ('events', '{"n":4}', 'c4', 'PUBLISHED', 'key-1', 3, 1)`)
	v6Indexes := indexDefs(t, db.Pool, "q7")
	queue := rowsAsJSON(t, db.Pool, `SELECT `+queueColumns+` FROM q7.outbox`)
	published := rowsAsJSON(t, db.Pool, `SELECT * FROM q7.outbox_published`)

	migrateTo(t, db.Pool, cfg, 7)
	require.Equal(t, []string{
		`{"id": 1, "pending": true, "attempts": 0, "last_error": null, "lease_owner": null, "available_kept": true}`,
		`{"id": 2, "pending": false, "attempts": 2, "last_error": "timeout", "lease_owner": "worker-1", "available_kept": false}`,
	}, rowsAsJSON(t, db.Pool, `SELECT id, lease_owner IS NULL AS pending, attempts, lease_owner, last_error,
		available_at = created_at AS available_kept FROM q7.outbox`), "the lease's end is the leased row's available_at")
	require.Equal(t, []string{`{"id": 3, "attempts": 3, "last_error": "boom", "correlation_id": "c3"}`},
		rowsAsJSON(t, db.Pool, `SELECT id, attempts, last_error, correlation_id FROM q7.outbox_dead_letters`))
	require.Equal(t, []string{"jobs key-1 1", "events key-1 4"},
		queryStrings(t, db.Pool, `SELECT topic || ' ' || idempotency_key || ' ' || message_id FROM q7.outbox_idempotency_keys ORDER BY message_id`))
	var expiresInADay bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT bool_and(expires_at > now() + interval '23 hours') FROM q7.outbox_idempotency_keys`).Scan(&expiresInADay))
	require.True(t, expiresInADay, "keys of the messages there are kept for a window from the upgrade")
	var leaseEnd bool
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT available_at > now() + interval '20 seconds' FROM q7.outbox WHERE id = 2`).Scan(&leaseEnd))
	require.True(t, leaseEnd)

	migrateTo(t, db.Pool, cfg, 6)
	require.Equal(t, queue, rowsAsJSON(t, db.Pool, `SELECT `+queueColumns+` FROM q7.outbox`), "QUEUE messages are back, unchanged")
	require.Equal(t, published, rowsAsJSON(t, db.Pool, `SELECT * FROM q7.outbox_published`), "and PUB_SUB ones")
	require.Equal(t, v6Indexes, indexDefs(t, db.Pool, "q7"), "Down restores version 6's indexes")
}
