package engine

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
)

// LookTx is the transaction of one look for work (see consumergroup's
// fetchOnce), on a connection of its own. It spends fewer round trips
// than pgx.Tx, which spends one on BEGIN and one on COMMIT:
//   - BeginLook sends BEGIN in the same round trip as the look's first
//     statements;
//   - Queue holds back a statement whose result the look does not need at
//     once; it goes to the server with the next statement, or with COMMIT.
//
// A look that reads new rows runs in two round trips: the position's
// lock, the group's state and the read (see Fetcher.readAhead),
// then the position's move and the batch's record with the commit.
// Statements still run one after the other, in the order the look wrote
// them, each with its own snapshot.
type LookTx struct {
	conn    *pgxpool.Conn
	pending pgx.Batch
	labels  []string // what each pending statement does, for errors
}

// lookSettings are a look's transaction's settings:
//   - it may sit idle for sqlq's IdleInTransaction at most (see ShortTx there);
//   - its commit does not wait for the server to flush it to disk. A look
//     writes leases, batches and positions, never a message or a
//     completion: if the server crashes before its commit reaches the
//     disk, the look is forgotten and its messages are delivered again (a
//     completion or a handler's transaction that committed after it
//     flushed it too). The wait was a third of a look's time.
const lookSettings = `
SELECT set_config('idle_in_transaction_session_timeout', '` + sqlq.IdleInTransaction + `', true), set_config('synchronous_commit', 'off', true)`

// BeginLook takes a connection (from acquire) and begins a look's
// transaction on it, in one round trip with the statements first queues
// (whose callbacks read their results). On an error the transaction is
// over.
func BeginLook(ctx context.Context, acquire func(context.Context) (*pgxpool.Conn, error), first func(*pgx.Batch)) (*LookTx, error) {
	conn, err := acquire(ctx)
	if err != nil {
		return nil, err
	}
	t := &LookTx{conn: conn}
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue(lookSettings)
	first(&b)
	if err := conn.SendBatch(ctx, &b).Close(); err != nil {
		t.End(ctx)
		return nil, err
	}
	return t, nil
}

// Queue holds a statement back until the next one, or the commit, goes to
// the server. Its error, if any, is the error of that statement or commit,
// prefixed with what.
func (t *LookTx) Queue(what, sql string, args ...any) *pgx.QueuedQuery {
	t.labels = append(t.labels, what)
	return t.pending.Queue(sql, args...)
}

// Flush sends what Queue held back, in one round trip. An error names
// the statement that failed.
func (t *LookTx) Flush(ctx context.Context) error {
	if t.pending.Len() == 0 {
		return nil
	}
	b, labels := t.pending, t.labels
	t.pending, t.labels = pgx.Batch{}, nil
	at := 0 // the statement whose result is being read
	for i, qq := range b.QueuedQueries {
		read := qq.Fn
		qq.Fn = func(br pgx.BatchResults) error {
			at = i
			if read == nil {
				_, err := br.Exec()
				return err
			}
			return read(br)
		}
	}
	if err := t.conn.SendBatch(ctx, &b).Close(); err != nil {
		return fmt.Errorf("%s: %w", labels[at], err)
	}
	return nil
}

// Exec runs sql after whatever Queue held back.
func (t *LookTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.Flush(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.conn.Exec(ctx, sql, args...)
}

// Query runs sql after whatever Queue held back.
func (t *LookTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.Flush(ctx); err != nil {
		return nil, err
	}
	return t.conn.Query(ctx, sql, args...)
}

// QueryRow runs sql after whatever Queue held back.
func (t *LookTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.Flush(ctx); err != nil {
		return errRow{err}
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

// Commit sends what Queue held back and COMMIT, in one round trip.
func (t *LookTx) Commit(ctx context.Context) error {
	t.Queue("commit", "COMMIT").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() == "ROLLBACK" { // a statement before it failed
			return pgx.ErrTxCommitRollback
		}
		return nil
	})
	return t.Flush(ctx)
}

// End rolls the transaction back unless it committed, and gives the
// connection back to the pool (which closes it if it is still in a
// transaction, or broken).
func (t *LookTx) End(ctx context.Context) {
	if t.conn == nil {
		return
	}
	if t.conn.Conn().PgConn().TxStatus() != 'I' {
		_, _ = t.conn.Exec(ctx, "ROLLBACK")
	}
	t.conn.Release()
	t.conn = nil
}

// errRow is a pgx.Row whose Scan reports err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
