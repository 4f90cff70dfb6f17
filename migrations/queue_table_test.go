package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
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

func rowsAsJSON(t *testing.T, pool *pgxpool.Pool, query string) []string {
	t.Helper()
	return queryStrings(t, pool, `SELECT to_jsonb(r)::text FROM (`+query+`) AS r ORDER BY r.id`)
}

// Migration 6 moves QUEUE messages out of the shared table, unchanged and
// with their ids, and Down moves them back.
func TestQueueTableMigrationKeepsMessages(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmptyDB(t)
	ctx := context.Background()
	cfg := migrations.Config{Schema: "q6"}
	migrateTo(t, db.Pool, cfg, 5)
	_, err := db.Pool.Exec(ctx, `SET search_path = q6;
INSERT INTO outbox_topics (topic, semantics, tracking_mode, retention, max_attempts, backoff_initial, backoff_max, lease_duration)
VALUES ('events', 'PUB_SUB', 'BITMAP', '1 day', 3, '1s', '1m', '30s');
INSERT INTO outbox (topic, payload, headers, correlation_id, message_group, priority, idempotency_key)
VALUES ('jobs', '{"n":1}', '{"h":"v"}', 'c1', 'g', 5, 'key-1');
INSERT INTO outbox (topic, payload, correlation_id, status, attempts, lease_owner, lease_until)
VALUES ('jobs', '{"n":2}', 'c2', 'PROCESSING', 1, 'worker-1', now() + interval '30 seconds');
INSERT INTO outbox (topic, payload, correlation_id, status, attempts, last_error, dead_lettered_at)
VALUES ('jobs', '{"n":3}', 'c3', 'DEAD_LETTER', 3, 'boom', now());
INSERT INTO outbox (topic, payload, correlation_id, status, required_bits, done_bits)
VALUES ('events', '{"n":4}', 'c4', 'PUBLISHED', 3, 1);
RESET search_path`)
	require.NoError(t, err)
	indexes := func() []string {
		return queryStrings(t, db.Pool, `SELECT indexdef FROM pg_indexes WHERE schemaname = 'q6' ORDER BY indexname`)
	}
	v5Indexes := indexes()
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
	_, err = db.Pool.Exec(ctx, `INSERT INTO q6.outbox (topic, payload, correlation_id, idempotency_key) VALUES ('jobs', '{}', 'c7', 'key-1')`)
	require.ErrorContains(t, err, "outbox_idempotency_idx", "the idempotency key moved with its message")

	migrateTo(t, db.Pool, cfg, 5)
	all := rowsAsJSON(t, db.Pool, `SELECT `+queueColumns+` FROM q6.outbox WHERE id < 5`)
	require.Equal(t, queue, all[:3], "QUEUE messages are back, unchanged")
	require.Equal(t, published, rowsAsJSON(t, db.Pool, `SELECT * FROM q6.outbox WHERE id = 4`))
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM q6.outbox`).Scan(&n))
	require.Equal(t, 6, n)
	require.Equal(t, v5Indexes, indexes(), "Down restores version 5's indexes")
}

// Migration 7 folds a QUEUE message's lease end and dead-lettering time
// into available_at, and Down gives them their columns back.
func TestLeaseTimesMigration(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmptyDB(t)
	ctx := context.Background()
	cfg := migrations.Config{Schema: "q7"}
	migrateTo(t, db.Pool, cfg, 6)
	_, err := db.Pool.Exec(ctx, `SET search_path = q7;
INSERT INTO outbox (topic, payload, headers, correlation_id, message_group, priority, idempotency_key, available_at)
VALUES ('jobs', '{"n":1}', '{"h":"v"}', 'c1', 'g', 5, 'key-1', '2030-01-01T00:00:00Z');
INSERT INTO outbox (topic, payload, correlation_id, status, attempts, lease_owner, lease_until, available_at)
VALUES ('jobs', '{"n":2}', 'c2', 'PROCESSING', 1, 'worker-1', '2030-01-02T00:00:00Z', '2029-01-01T00:00:00Z');
INSERT INTO outbox (topic, payload, correlation_id, status, attempts, last_error, dead_lettered_at, available_at)
VALUES ('jobs', '{"n":3}', 'c3', 'DEAD_LETTER', 3, 'boom', '2030-01-03T00:00:00Z', '2029-01-01T00:00:00Z');
RESET search_path`)
	require.NoError(t, err)
	indexes := func() []string {
		return queryStrings(t, db.Pool, `SELECT indexdef FROM pg_indexes WHERE schemaname = 'q7' ORDER BY indexname`)
	}
	v6Indexes := indexes()
	const kept = `id, topic, payload, headers, correlation_id, message_group, priority, idempotency_key, status,
	attempts, lease_owner, last_error, created_at, xid`
	before := rowsAsJSON(t, db.Pool, `SELECT `+kept+` FROM q7.outbox`)

	migrateTo(t, db.Pool, cfg, 7)
	require.Equal(t, before, rowsAsJSON(t, db.Pool, `SELECT `+kept+` FROM q7.outbox`))
	require.Equal(t, []string{"2030-01-01 00:00:00+00", "2030-01-02 00:00:00+00", "2030-01-03 00:00:00+00"},
		queryStrings(t, db.Pool, `SELECT (available_at AT TIME ZONE 'UTC')::text || '+00' FROM q7.outbox ORDER BY id`),
		"available_at: the delivery time, the lease's end, the dead-lettering time")
	require.Empty(t, queryStrings(t, db.Pool, `SELECT column_name::text FROM information_schema.columns
		WHERE table_schema = 'q7' AND table_name = 'outbox' AND column_name IN ('lease_until', 'dead_lettered_at')`))
	var id int64
	require.NoError(t, db.Pool.QueryRow(ctx, `INSERT INTO q7.outbox (topic, payload, correlation_id) VALUES ('jobs', '{}', 'c4') RETURNING id`).Scan(&id))
	require.Equal(t, int64(4), id, "ids continue from the same sequence")
	_, err = db.Pool.Exec(ctx, `INSERT INTO q7.outbox (topic, payload, correlation_id, idempotency_key) VALUES ('jobs', '{}', 'c5', 'key-1')`)
	require.ErrorContains(t, err, "outbox_idempotency_idx", "the idempotency key moved with its message")

	migrateTo(t, db.Pool, cfg, 6)
	require.Equal(t, before, rowsAsJSON(t, db.Pool, `SELECT `+kept+` FROM q7.outbox WHERE id < 4`))
	require.Equal(t, []string{"1||", "2|2030-01-02 00:00:00+00|", "3||2030-01-03 00:00:00+00", "4||"},
		queryStrings(t, db.Pool, `SELECT id || '|' || coalesce((lease_until AT TIME ZONE 'UTC')::text || '+00', '')
			|| '|' || coalesce((dead_lettered_at AT TIME ZONE 'UTC')::text || '+00', '') FROM q7.outbox ORDER BY id`))
	require.Equal(t, v6Indexes, indexes(), "Down restores version 6's indexes")
}
