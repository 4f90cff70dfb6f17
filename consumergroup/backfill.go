package consumergroup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Backfill outcomes (BackfillProgress.Outcome).
const (
	// BackfillDone: every message of the backfill was handed out.
	BackfillDone = "DONE"
	// BackfillCapped: MaxBackfill messages were handed out; the older
	// messages beyond them were not.
	BackfillCapped = "CAPPED"
	// BackfillCancelled: CancelBackfill ended it.
	BackfillCancelled = "CANCELLED"
	// BackfillForgotten: the group stayed DEAD past its topic's ZombieTTL
	// and was forgotten, backfill included.
	BackfillForgotten = "FORGOTTEN"
)

// BackfillProgress says how far a group's latest backfill got.
type BackfillProgress struct {
	// Running: it still reads (it may also have batches in flight after
	// it ended).
	Running bool `json:"running"`
	// Outcome is how it ended (BackfillDone, BackfillCapped,
	// BackfillCancelled, BackfillForgotten), or "" while it runs or when
	// the group never had one.
	Outcome string `json:"outcome,omitempty"`
	// Done is how many messages it handed out; Left how many more
	// MaxBackfill allows; Total its estimated size (at most MaxBackfill),
	// 0 until its first read.
	Done  int64 `json:"done"`
	Left  int64 `json:"left"`
	Total int64 `json:"total"`
	// StartedAt and EndedAt bound it (EndedAt is zero while it runs).
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// Rate is how many messages a second it handed out since it started;
	// ETA how long the rest of Total takes at that rate (0 when unknown
	// or done).
	Rate float64       `json:"rate_per_second"`
	ETA  time.Duration `json:"-"`
}

// MarshalJSON writes ETA in seconds.
func (p BackfillProgress) MarshalJSON() ([]byte, error) {
	type plain BackfillProgress
	return json.Marshal(struct {
		plain
		ETA float64 `json:"eta_seconds"`
	}{plain(p), p.ETA.Seconds()})
}

// BackfillProgress reads the group's latest backfill (zero when it never
// had one). It works on a Group value that was never started, and fails
// with outbox.ErrNotFound when the group has no subscription.
func (g *Group) BackfillProgress(ctx context.Context) (BackfillProgress, error) {
	var p BackfillProgress
	var started, ended *time.Time
	var now time.Time
	err := g.pool.QueryRow(ctx, g.q.BackfillState, pgx.StrictNamedArgs{"topic": g.cfg.Topic, "group_name": g.cfg.Group}).Scan(&p.Running, &p.Outcome, &p.Done, &p.Left,
		&p.Total, &started, &ended, &now)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, fmt.Errorf("%w: group %q has no subscription to %q", outbox.ErrNotFound, g.cfg.Group, g.cfg.Topic)
	}
	if err != nil {
		return p, fmt.Errorf("consumergroup: backfill progress: %w", err)
	}
	if started == nil {
		return BackfillProgress{}, nil
	}
	p.StartedAt = *started
	end := now
	if ended != nil {
		p.EndedAt, end = *ended, *ended
	}
	if secs := end.Sub(p.StartedAt).Seconds(); secs > 0 {
		p.Rate = float64(p.Done) / secs
	}
	if rest := p.Total - p.Done; p.Running && rest > 0 && p.Rate > 0 {
		p.ETA = time.Duration(float64(rest) / p.Rate * float64(time.Second))
	}
	return p, nil
}

// CancelBackfill ends the group's running backfill: no more old messages
// are read (those in flight are still handled), and cleanup no longer
// keeps the rest for it. It reports whether one was running. It works on
// a Group value that was never started.
func (g *Group) CancelBackfill(ctx context.Context) (bool, error) {
	if _, err := g.State(ctx); err != nil {
		return false, err
	}
	tag, err := g.pool.Exec(ctx, g.q.CancelBackfill, pgx.StrictNamedArgs{"topic": g.cfg.Topic, "group_name": g.cfg.Group})
	if err != nil {
		return false, fmt.Errorf("consumergroup: cancel backfill: %w", err)
	}
	if tag.RowsAffected() > 0 {
		g.logger.Info("pgoutbox: backfill cancelled")
	}
	return tag.RowsAffected() > 0, nil
}

// fetchCatchup reads the pending backfill's next rows as a catch-up
// batch, as the throttle allows, moves its cursor (a checkpoint: another
// instance, or this one after a crash, resumes there) and commits. It
// returns how many rows it handed out.
func (r *runner) fetchCatchup(ctx context.Context, tx *engine.LookTx, b *backfill, limit int) (int, error) {
	g := r.g
	now := time.Now()
	n := r.catchupSize(b, limit)
	if n <= 0 { // MaxBackfill 0, or spent by another instance's last read
		return 0, r.endCatchup(ctx, tx, b, 0, nil, BackfillCapped)
	}
	if !r.throttle.ready(now, n) {
		return 0, nil // throttled: the stream goes on meanwhile
	}
	total := int64(0)
	if b.total == 0 { // what it handed out, and its estimate of the pair it reads now
		args := sqlq.Args{"topic": g.cfg.Topic, "prev": b.from, "cur": b.upto, "limit": b.left}
		if err := tx.QueryRow(ctx, g.q.CatchupSize.Numbered, g.q.CatchupSize.Bind(args)...).Scan(&total); err != nil {
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
	args := catchupFor(g.subRow).bind(sqlq.Args{"topic": g.cfg.Topic, "prev": b.from, "cur": b.upto,
		"after_xid": b.afterXID, "after_id": b.afterID, "limit": take, "sub": g.sub.ID,
		"done_bit": g.tracking().stream.bit, "done_sub": g.sub.ID})
	start := time.Now()
	got, err := r.readRows(ctx, tx, g.q.CatchupRows.Numbered, g.q.CatchupRows.Bind(args)...)
	if err != nil {
		return 0, fmt.Errorf("backfill rows: %w", err)
	}
	if capped && len(got) > n {
		got = got[:n]
		return len(got), r.endCatchup(ctx, tx, b, total, got, BackfillCapped)
	}
	if p95 := r.throttle.observe(time.Now(), len(got), time.Since(start)); p95 > 0 {
		g.metrics.backfillPauses.Add(ctx, 1)
		if time.Since(r.throttle.lastPause) >= 30*time.Second {
			r.throttle.lastPause = time.Now()
			g.logger.Info("pgoutbox: backfill yields: its reads are slower than BackfillTargetLatency (the database is busy); it pauses",
				slog.Duration("p95", p95), slog.Duration("target", r.throttle.target))
		}
	}
	if len(got) < take { // the pair is read
		if b.more {
			return r.nextCatchupPair(ctx, tx, b, total, got, limit)
		}
		return len(got), r.endCatchup(ctx, tx, b, total, got, BackfillDone)
	}
	last := got[len(got)-1]
	if _, err := tx.Exec(ctx, g.q.CatchupProgress, pgx.StrictNamedArgs{"sub": g.sub.ID, "after_xid": last.xid, "after_id": last.d.ID,
		"handed_out": len(got), "ended": false, "outcome": "", "total": total}); err != nil {
		return 0, fmt.Errorf("backfill progress: %w", err)
	}
	if err := r.recordBatch(ctx, tx, b.from, b.upto, b.afterXID, b.afterID, got, true); err != nil {
		return 0, err
	}
	g.metrics.backfilled.Add(ctx, int64(len(got)))
	if time.Since(r.throttle.lastLog) >= 30*time.Second {
		r.throttle.lastLog = time.Now()
		r.logProgress(b, int64(len(got)), "pgoutbox: backfill progress")
	}
	return len(got), nil
}

// nextCatchupPair hands out got, the last rows of the pair the backfill
// read, and moves it to the next pair it queues (committing when there
// are rows, else reading on from that pair in tx).
func (r *runner) nextCatchupPair(ctx context.Context, tx *engine.LookTx, b *backfill, total int64, got []row, limit int) (int, error) {
	g := r.g
	if err := r.catchupProgress(ctx, tx, got, total, ""); err != nil {
		return 0, err
	}
	read := *b // the pair got was read from, for its batch
	if err := tx.QueryRow(ctx, g.q.NextBackfillPair, pgx.StrictNamedArgs{"sub": g.sub.ID}).Scan(&b.from, &b.upto, &b.afterXID, &b.afterID, &b.more); err != nil {
		return 0, fmt.Errorf("backfill next pair: %w", err)
	}
	b.left -= int64(len(got))
	b.done += int64(len(got))
	b.total = 0
	if len(got) == 0 {
		return r.fetchCatchup(ctx, tx, b, limit)
	}
	if err := r.recordBatch(ctx, tx, read.from, read.upto, read.afterXID, read.afterID, got, true); err != nil {
		return 0, err
	}
	g.metrics.backfilled.Add(ctx, int64(len(got)))
	return len(got), nil
}

// catchupSize is how many rows the backfill's next read takes: a batch,
// within what the instance has room for, what the bucket holds or else a
// second's worth at the throttle's current rate (a slowed backfill reads
// small batches often, not a large one now and then), and what
// MaxBackfill has left.
func (r *runner) catchupSize(b *backfill, limit int) int {
	l := r.throttle.limiter
	n := min(limit, r.g.opts.BackfillBatchSize, max(1, int(max(float64(l.Limit()), l.Tokens()))))
	return int(min(int64(n), b.left))
}

// endCatchup ends the reading with outcome and hands out the last rows,
// committing, if there are any (else the caller goes on in tx).
func (r *runner) endCatchup(ctx context.Context, tx *engine.LookTx, b *backfill, total int64, got []row, outcome string) error {
	g := r.g
	if err := r.catchupProgress(ctx, tx, got, total, outcome); err != nil {
		return err
	}
	if len(got) > 0 { // else the caller's fetch commits it
		if err := r.recordBatch(ctx, tx, b.from, b.upto, b.afterXID, b.afterID, got, true); err != nil {
			return err
		}
	}
	g.metrics.backfilled.Add(ctx, int64(len(got)))
	r.logProgress(b, int64(len(got)), "pgoutbox: backfill read to its end: "+outcome)
	return nil
}

// catchupProgress records, in tx, that the backfill handed out got (the
// last rows of a pair, or of its reading), total its estimated size, and
// that its reading ended with outcome (unless "").
func (r *runner) catchupProgress(ctx context.Context, tx *engine.LookTx, got []row, total int64, outcome string) error {
	var lastXID *string
	var lastID *int64
	if len(got) > 0 {
		last := got[len(got)-1]
		lastXID, lastID = &last.xid, &last.d.ID
	}
	_, err := tx.Exec(ctx, r.g.q.CatchupProgress, pgx.StrictNamedArgs{"sub": r.g.sub.ID, "after_xid": lastXID, "after_id": lastID,
		"handed_out": len(got), "ended": outcome != "", "outcome": outcome, "total": total})
	if err != nil {
		return fmt.Errorf("backfill progress: %w", err)
	}
	return nil
}

func (r *runner) logProgress(b *backfill, n int64, msg string) {
	done := b.done + n
	attrs := []any{slog.Int64("done", done), slog.Int64("total", b.total)}
	if secs := time.Since(b.startedAt).Seconds(); secs > 0 {
		rate := float64(done) / secs
		attrs = append(attrs, slog.Float64("per_second", rate))
		if rest := b.total - done; rest > 0 && rate > 0 {
			attrs = append(attrs, slog.Duration("eta", time.Duration(float64(rest)/rate*float64(time.Second))))
		}
	}
	r.g.logger.Info(msg, attrs...)
}
