package engine

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
)

// How a backfill's reading ended, as the fetcher records it (consumergroup's
// BackfillProgress reads it).
const (
	// BackfillDone: every message of the backfill was handed out.
	BackfillDone = "DONE"
	// BackfillCapped: its cap (MaxBackfill) was handed out; the older
	// messages beyond it were not.
	BackfillCapped = "CAPPED"
)

// fetchCatchup reads the pending backfill's next rows as a catch-up
// batch, as the throttle allows, moves its cursor (a checkpoint: another
// instance, or this one after a crash, resumes there) and commits. It
// returns how many rows it handed out.
func (f *Fetcher) fetchCatchup(ctx context.Context, tx *LookTx, b *backfill, limit int) (int, error) {
	now := time.Now()
	n := f.catchupSize(b, limit)
	if n <= 0 { // MaxBackfill 0, or spent by another instance's last read
		return 0, f.endCatchup(ctx, tx, b, 0, nil, BackfillCapped)
	}
	if !f.throttle.ready(now, n) {
		return 0, nil // throttled: the stream goes on meanwhile
	}
	total := int64(0)
	if b.total == 0 { // what it handed out, and its estimate of the pair it reads now
		args := sqlq.Args{"topic": f.cfg.Topic, "prev": b.from, "cur": b.upto, "limit": b.left}
		if err := tx.QueryRow(ctx, f.Statements.CatchupSize.Numbered, f.Statements.CatchupSize.Bind(args)...).Scan(&total); err != nil {
			return 0, fmt.Errorf("backfill size: %w", err)
		}
		total += b.done
		b.total = total
	}
	// When this read may spend the last of MaxBackfill, one row more says
	// whether rows are left behind (CAPPED) or none was (DONE).
	capped := int64(n) >= b.left
	take := n
	if capped {
		take++
	}
	args := f.cfg.Catchup.Bind(sqlq.Args{"topic": f.cfg.Topic, "prev": b.from, "cur": b.upto,
		"after_xid": b.afterXID, "after_id": b.afterID, "limit": take, "sub": f.Subscription,
		"done_bit": f.cfg.Tracking().Stream.Bit, "done_sub": f.Subscription})
	start := time.Now()
	got, err := f.readRows(ctx, tx, f.Statements.CatchupRows.Numbered, f.Statements.CatchupRows.Bind(args)...)
	if err != nil {
		return 0, fmt.Errorf("backfill rows: %w", err)
	}
	if capped && len(got) > n {
		got = got[:n]
		return len(got), f.endCatchup(ctx, tx, b, total, got, BackfillCapped)
	}
	if p95 := f.throttle.observe(time.Now(), len(got), time.Since(start)); p95 > 0 {
		f.cfg.BackfillPauses(ctx, 1)
		if time.Since(f.throttle.lastPause) >= 30*time.Second {
			f.throttle.lastPause = time.Now()
			f.Logger.Info("pgoutbox: backfill yields: its reads are slower than BackfillTargetLatency (the database is busy); it pauses",
				slog.Duration("p95", p95), slog.Duration("target", f.throttle.target))
		}
	}
	if len(got) < take { // the pair is read
		if b.more {
			return f.nextCatchupPair(ctx, tx, b, total, got, limit)
		}
		return len(got), f.endCatchup(ctx, tx, b, total, got, BackfillDone)
	}
	last := got[len(got)-1]
	if _, err := tx.Exec(ctx, f.Statements.CatchupProgress.Numbered, f.Statements.CatchupProgress.Bind(sqlq.Args{"sub": f.Subscription, "after_xid": last.xid, "after_id": last.d.ID,
		"handed_out": len(got), "ended": false, "outcome": "", "total": total})...); err != nil {
		return 0, fmt.Errorf("backfill progress: %w", err)
	}
	if err := f.recordBatch(ctx, tx, b.from, b.upto, b.afterXID, b.afterID, got, true); err != nil {
		return 0, err
	}
	f.cfg.Backfilled(ctx, int64(len(got)))
	if time.Since(f.throttle.lastLog) >= 30*time.Second {
		f.throttle.lastLog = time.Now()
		f.logProgress(b, int64(len(got)), "pgoutbox: backfill progress")
	}
	return len(got), nil
}

// nextCatchupPair hands out got, the last rows of the pair the backfill
// read, and moves it to the next pair it queues (committing when there
// are rows, else reading on from that pair in tx).
func (f *Fetcher) nextCatchupPair(ctx context.Context, tx *LookTx, b *backfill, total int64, got []row, limit int) (int, error) {
	if err := f.catchupProgress(ctx, tx, got, total, ""); err != nil {
		return 0, err
	}
	read := *b // the pair got was read from, for its batch
	if err := tx.QueryRow(ctx, f.Statements.NextBackfillPair.Numbered, f.Statements.NextBackfillPair.Bind(sqlq.Args{"sub": f.Subscription})...).Scan(&b.from, &b.upto, &b.afterXID, &b.afterID, &b.more); err != nil {
		return 0, fmt.Errorf("backfill next pair: %w", err)
	}
	b.left -= int64(len(got))
	b.done += int64(len(got))
	b.total = 0
	if len(got) == 0 {
		return f.fetchCatchup(ctx, tx, b, limit)
	}
	if err := f.recordBatch(ctx, tx, read.from, read.upto, read.afterXID, read.afterID, got, true); err != nil {
		return 0, err
	}
	f.cfg.Backfilled(ctx, int64(len(got)))
	return len(got), nil
}

// catchupSize is how many rows the backfill's next read takes: a batch,
// within what the instance has room for, what the bucket holds or else a
// second's worth at the throttle's current rate (a slowed backfill reads
// small batches often, not a large one now and then), and what
// MaxBackfill has left.
func (f *Fetcher) catchupSize(b *backfill, limit int) int {
	l := f.throttle.limiter
	n := min(limit, f.cfg.Backfill.BatchSize, max(1, int(max(float64(l.Limit()), l.Tokens()))))
	return int(min(int64(n), b.left))
}

// endCatchup ends the reading with outcome and hands out the last rows,
// committing, if there are any (else the caller goes on in tx).
func (f *Fetcher) endCatchup(ctx context.Context, tx *LookTx, b *backfill, total int64, got []row, outcome string) error {
	if err := f.catchupProgress(ctx, tx, got, total, outcome); err != nil {
		return err
	}
	if len(got) > 0 { // else the caller's fetch commits it
		if err := f.recordBatch(ctx, tx, b.from, b.upto, b.afterXID, b.afterID, got, true); err != nil {
			return err
		}
	}
	f.cfg.Backfilled(ctx, int64(len(got)))
	f.logProgress(b, int64(len(got)), "pgoutbox: backfill read to its end: "+outcome)
	return nil
}

// catchupProgress records, in tx, that the backfill handed out got (the
// last rows of a pair, or of its reading), total its estimated size, and
// that its reading ended with outcome (unless "").
func (f *Fetcher) catchupProgress(ctx context.Context, tx *LookTx, got []row, total int64, outcome string) error {
	var lastXID *string
	var lastID *int64
	if len(got) > 0 {
		last := got[len(got)-1]
		lastXID, lastID = &last.xid, &last.d.ID
	}
	_, err := tx.Exec(ctx, f.Statements.CatchupProgress.Numbered, f.Statements.CatchupProgress.Bind(sqlq.Args{"sub": f.Subscription, "after_xid": lastXID, "after_id": lastID,
		"handed_out": len(got), "ended": outcome != "", "outcome": outcome, "total": total})...)
	if err != nil {
		return fmt.Errorf("backfill progress: %w", err)
	}
	return nil
}

func (f *Fetcher) logProgress(b *backfill, n int64, msg string) {
	done := b.done + n
	attrs := []any{slog.Int64("done", done), slog.Int64("total", b.total)}
	if secs := time.Since(b.startedAt).Seconds(); secs > 0 {
		rate := float64(done) / secs
		attrs = append(attrs, slog.Float64("per_second", rate))
		if rest := b.total - done; rest > 0 && rate > 0 {
			attrs = append(attrs, slog.Duration("eta", time.Duration(float64(rest)/rate*float64(time.Second))))
		}
	}
	f.Logger.Info(msg, attrs...)
}
