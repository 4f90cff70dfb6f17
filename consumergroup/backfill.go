package consumergroup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Backfill outcomes (BackfillProgress.Outcome).
const (
	// BackfillDone: every message of the backfill was handed out.
	BackfillDone = engine.BackfillDone
	// BackfillCapped: MaxBackfill messages were handed out; the older
	// messages beyond them were not.
	BackfillCapped = engine.BackfillCapped
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
