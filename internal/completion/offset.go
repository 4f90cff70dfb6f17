package completion

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Offset tracks nothing per message: groups' committed positions do.
type Offset struct{ q *sqlq.PubSub }

// Mode implements Tracker.
func (*Offset) Mode() outbox.TrackingMode { return outbox.Offset }

// Complete implements Tracker: nothing to write per message.
func (*Offset) Complete(context.Context, DB, Subscription, []int64) error { return nil }

// Forget implements Tracker: a group that left holds the watermark back
// no more (a DEAD one, within its ZombieTTL, only what it owes).
func (*Offset) Forget(context.Context, pgx.Tx, Subscription, bool, int) (int64, error) { return 0, nil }

// Cleanup implements Tracker: it deletes rows visible in keep.Watermark
// (the least committed position of the ACTIVE and PAUSED groups, from
// CleanupBounds), or, with no such group, past the zero-subscription
// floor, that no DEAD group within its ZombieTTL owes (written before it
// died, past its position).
func (o *Offset) Cleanup(ctx context.Context, db DB, topic string, keep Retention, limit int) (int64, error) {
	args := keep.cleanupArgs(topic, limit)
	args["watermark"] = snapshotOrNull(keep.Watermark)
	return exec(ctx, db, "offset cleanup", o.q.OffsetCleanup, args)
}

// Holds implements Tracker: the watermark (see Bounds.Watermark) must see every
// message of the range, and no DEAD group within its ZombieTTL may owe
// one.
func (o *Offset) Holds(ctx context.Context, db DB, topic string, keep Retention, lo, hi string, sealed time.Time) (bool, error) {
	wm, err := watermark(ctx, db, o.q, topic)
	if err != nil {
		return false, err
	}
	return holds(ctx, db, o.q.OffsetHeld, topic, keep, lo, hi, sealed, pgx.StrictNamedArgs{"watermark": snapshotOrNull(wm)})
}

// snapshotOrNull is a pg_snapshot argument: NULL for "" (no group holds
// claims).
func snapshotOrNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
