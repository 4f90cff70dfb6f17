package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// Statistics of the retry table. A group that reads by message group
// queues everything it reads there (see ordered.go), so a burst of
// 100,000 messages grows the table from a few rows to 100,000 in seconds.
// The plans PostgreSQL keeps for prepared statements were made while it
// was small, where reading all of it looks cheapest, and they stay until
// the table is analyzed again: autovacuum does so up to a minute or more
// later. Meanwhile each look read the whole queue, several times (a claim
// took 30–90 ms beside 100,000 queued messages, where it takes under a
// millisecond). So an instance that queued analyzeAfterParked rows since
// its last ANALYZE runs one itself, at most every analyzeEvery: the new
// statistics replace the plans of every session.

const (
	analyzeAfterParked = 10_000
	analyzeEvery       = 10 * time.Second
	analyzeLockWait    = 100 * time.Millisecond // another ANALYZE or a VACUUM is refreshing them already
)

// parked counts n rows the fetcher queued in the retry table and, past
// analyzeAfterParked, analyzes the table in the background (the fetcher's
// goroutine only).
func (f *Fetcher) parked(n int) {
	f.parkedSinceAnalyze += n
	if f.parkedSinceAnalyze < analyzeAfterParked || time.Since(f.lastAnalyze) < analyzeEvery {
		return
	}
	f.parkedSinceAnalyze, f.lastAnalyze = 0, time.Now()
	f.tasks.Go(func() { f.analyzeRetries(f.ctx) })
}

// analyzeRetries runs ANALYZE on the retry table. A failure (the role
// does not own the table, the lock was busy) costs only the plans'
// freshness: it is logged at Debug.
func (f *Fetcher) analyzeRetries(ctx context.Context) {
	start := time.Now()
	err := pgx.BeginFunc(ctx, f.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", analyzeLockWait.String()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, f.Statements.AnalyzeRetries)
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			f.Logger.Debug("pgoutbox: analyzing the retry table failed; its plans stay until autovacuum analyzes it", slog.Any("error", err))
		}
		return
	}
	f.Logger.Debug("pgoutbox: analyzed the retry table after queuing many messages", slog.Duration("took", time.Since(start)))
}
