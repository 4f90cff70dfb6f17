package engine

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
)

// A look's transaction runs its statements in the order the look wrote
// them, a held-back one before the next statement, and commits them
// together, in every exec mode (PgBouncer needs the last three). Its
// settings end with it: the pool's connection commits synchronously
// again afterwards.
func TestALookRunsItsStatementsInOrderAndCommitsThemTogether(t *testing.T) {
	t.Parallel()
	db, table := lookTable(t)
	ctx := context.Background()
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			// The session commits synchronously (the test databases do not).
			pool := pgtest.NewPool(t, db.DSN+"&default_query_exec_mode="+mode+"&pool_max_conns=1&synchronous_commit=on")
			_, err := db.Pool.Exec(ctx, `TRUNCATE `+table)
			require.NoError(t, err)
			var first int
			var syncCommit string
			tx, err := BeginLook(ctx, pool.Acquire, func(b *pgx.Batch) {
				b.Queue(`INSERT INTO ` + table + ` VALUES (1) RETURNING x`).QueryRow(func(row pgx.Row) error { return row.Scan(&first) })
				b.Queue(`SELECT current_setting('synchronous_commit')`).QueryRow(func(row pgx.Row) error { return row.Scan(&syncCommit) })
			})
			require.NoError(t, err)
			require.Equal(t, 1, first)
			require.Equal(t, "off", syncCommit, "a look's commit does not wait for the disk")

			tx.Queue("insert 2", `INSERT INTO `+table+` VALUES (2)`)
			var seen int
			require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&seen))
			require.Equal(t, 2, seen, "a held-back statement runs before the next one")
			tx.Queue("insert 3", `INSERT INTO `+table+` VALUES (3)`)
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&seen))
			require.Zero(t, seen, "nothing is visible before the commit")
			require.NoError(t, tx.Commit(ctx))
			tx.End(ctx)
			require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&seen))
			require.Equal(t, 3, seen)

			require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&syncCommit))
			require.Equal(t, "on", syncCommit, "the look's settings ended with it")
		})
	}
}

// A held-back statement that fails fails the commit, names what failed,
// and nothing of the look is committed; its connection goes back to the
// pool out of any transaction.
func TestALookWhoseStatementFailsCommitsNothing(t *testing.T) {
	t.Parallel()
	db, table := lookTable(t)
	ctx := context.Background()
	pool := pgtest.NewPool(t, db.DSN+"&pool_max_conns=1")

	tx, err := BeginLook(ctx, pool.Acquire, func(b *pgx.Batch) { b.Queue(`INSERT INTO ` + table + ` VALUES (1)`) })
	require.NoError(t, err)
	tx.Queue("insert 2", `INSERT INTO `+table+` VALUES (2)`)
	tx.Queue("divide", `SELECT 1 / (SELECT count(*) - 2 FROM `+table+`)`)
	err = tx.Commit(ctx)
	require.ErrorContains(t, err, "divide: ")
	require.ErrorContains(t, err, "division by zero")
	tx.End(ctx)

	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n))
	require.Zero(t, n, "nothing of the look was committed")
	outsideATransaction(t, pool)

	// A failure in the statements that begin it ends the look at once.
	_, err = BeginLook(ctx, pool.Acquire, func(b *pgx.Batch) { b.Queue(`SELECT 1 / 0`) })
	require.ErrorContains(t, err, "division by zero")
	outsideATransaction(t, pool)
}

// outsideATransaction checks that the pool's connection is idle outside a
// transaction, and usable.
func outsideATransaction(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	require.Equal(t, byte('I'), conn.Conn().PgConn().TxStatus())
	_, err = conn.Exec(context.Background(), `SELECT 1`)
	require.NoError(t, err)
}

// lookTable is a new database with an empty table of ints for looks to
// write to.
func lookTable(t *testing.T) (*pgtest.DB, string) {
	db := pgtest.NewDB(t)
	table := db.Table("look_rows")
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE `+table+` (x int)`)
	require.NoError(t, err)
	return db, table
}
