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
