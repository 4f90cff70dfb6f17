package migrations_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/pgfind"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func tables(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	return queryStrings(t, pool, `SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1`, schema)
}

// queryStrings returns the first column of query's rows.
func queryStrings(t *testing.T, pool *pgxpool.Pool, query string, args ...any) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), query, args...)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

var wantTables = []string{"outbox", "outbox_consumer_groups", "outbox_dead_letters", "outbox_deleted_subscriptions", "outbox_group_batches", "outbox_group_retries", "outbox_group_set_aside", "outbox_idempotency_keys", "outbox_inbox", "outbox_live_instances", "outbox_partitions", "outbox_published", "outbox_published_default", "outbox_published_p1", "outbox_published_p2", "outbox_router_leaders", "outbox_router_limits", "outbox_router_permits", "outbox_subscription_offsets", "outbox_topic_subscriptions", "outbox_topic_watermarks", "outbox_topics", migrations.VersionTable}

func TestUpConcurrentIdempotentDownUp(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmptyDB(t)
	ctx := context.Background()
	cfg := migrations.Config{Schema: "svc_outbox"}

	// Four service instances booting at once.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = migrations.Up(ctx, db.Pool, cfg)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, wantTables, tables(t, db.Pool, "svc_outbox"))
	v, err := migrations.Version(ctx, db.Pool, cfg)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
	require.NotZero(t, v)
	require.Empty(t, tables(t, db.Pool, "public"), "nothing leaks into public")

	// Up again: nothing to do, nothing lost.
	_, err = db.Pool.Exec(ctx, `INSERT INTO svc_outbox.outbox_published (topic, payload, correlation_id, status) VALUES ('t', '{}', 'c', 'PUBLISHED')`)
	require.NoError(t, err)
	require.NoError(t, migrations.Up(ctx, db.Pool, cfg))
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM svc_outbox.outbox_published`).Scan(&n))
	require.Equal(t, 1, n)

	// Down, then Up from a DSN.
	require.NoError(t, migrations.Down(ctx, db.Pool, cfg))
	require.Equal(t, []string{migrations.VersionTable}, tables(t, db.Pool, "svc_outbox"))
	v, err = migrations.Version(ctx, db.Pool, cfg)
	require.NoError(t, err)
	require.Zero(t, v)
	require.NoError(t, migrations.UpDSN(ctx, db.DSN, cfg))
	require.Equal(t, wantTables, tables(t, db.Pool, "svc_outbox"))
	require.NoError(t, migrations.DownDSN(ctx, db.DSN, cfg))
	require.NoError(t, migrations.UpDSN(ctx, db.DSN, cfg))
}

func TestTwoSchemasSideBySide(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmptyDB(t)
	ctx := context.Background()
	require.NoError(t, migrations.Up(ctx, db.Pool, migrations.Config{Schema: "a"}))
	require.NoError(t, migrations.Up(ctx, db.Pool, migrations.Config{}))
	require.Equal(t, wantTables, tables(t, db.Pool, "a"))
	require.Equal(t, wantTables, tables(t, db.Pool, "public"))
	require.NoError(t, migrations.Down(ctx, db.Pool, migrations.Config{Schema: "a"}))
	require.Equal(t, wantTables, tables(t, db.Pool, "public"), "down in one schema leaves the other alone")
}

func TestInvalidSchemaAndCancelledContext(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmptyDB(t)
	ctx := context.Background()
	for _, s := range []string{`x"; DROP SCHEMA public; --`, "Upper", "1abc", "with space", string(make([]byte, 64))} {
		require.ErrorIs(t, migrations.Up(ctx, db.Pool, migrations.Config{Schema: s}), migrations.ErrInvalidSchema, "%q", s)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.Error(t, migrations.Up(cancelled, db.Pool, migrations.Config{Schema: "c"}))
	require.Empty(t, tables(t, db.Pool, "c"))
	require.ErrorContains(t, migrations.UpDSN(ctx, "not a dsn ::", migrations.Config{}), "parse DSN")
}

// The SQL for another migration tool builds the same tables as Up, in one
// transaction, and leaves the schema current for Check and Up; the part
// after a version upgrades a schema at that version.
func TestSQLForOtherTools(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmptyDB(t)
	ctx := context.Background()
	script, err := migrations.SQL("by_hand", 0)
	require.NoError(t, err)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, script)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, wantTables, tables(t, db.Pool, "by_hand"))
	require.NoError(t, migrations.Check(ctx, db.Pool, migrations.Config{Schema: "by_hand"}))
	v, err := migrations.Version(ctx, db.Pool, migrations.Config{Schema: "by_hand"})
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
	require.NoError(t, migrations.Up(ctx, db.Pool, migrations.Config{Schema: "by_hand"}), "Up after the script")

	upgrade, err := migrations.SQL("by_hand", migrations.Latest()-1)
	require.NoError(t, err)
	require.NotContains(t, upgrade, "000001_outbox.up.sql")
	require.Contains(t, upgrade, "CREATE SCHEMA IF NOT EXISTS")
	_, err = migrations.SQL("Bad-Name", 0)
	require.ErrorIs(t, err, migrations.ErrInvalidSchema)
}

// A server that cannot be reached is said to be one, with the address,
// database and user tried: not as a migration or version problem.
func TestUnreachableDatabaseIsNamed(t *testing.T) {
	t.Parallel()
	port, err := pgfind.FreePort() // nothing listens there
	require.NoError(t, err)
	dsn := fmt.Sprintf("postgres://app@127.0.0.1:%d/shop?sslmode=disable&connect_timeout=5", port)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	defer pool.Close()
	want := fmt.Sprintf(`cannot connect to the database at 127.0.0.1:%d (database "shop", user "app")`, port)
	for name, err := range map[string]error{
		"Up":    migrations.Up(ctx, pool, migrations.Config{}),
		"UpDSN": migrations.UpDSN(ctx, dsn, migrations.Config{}),
		"Check": migrations.Check(ctx, pool, migrations.Config{}),
	} {
		require.ErrorIs(t, err, migrations.ErrNoConnection, name)
		require.ErrorContains(t, err, want, name)
		var ce *pgconn.ConnectError
		require.ErrorAs(t, err, &ce, name) // the driver's error stays in the chain
	}
}
