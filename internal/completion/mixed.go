package completion

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Mixed tracks a topic whose mode changed while messages were stored:
// each message by the record it carries (required bits: Bitmap; required
// count: Counter; neither: Offset). Completing a batch costs a statement
// per record kind a group can have.
type Mixed struct {
	q    *sqlq.PubSub
	mode outbox.TrackingMode
}

// Mode implements Tracker: the mode new messages are written under.
func (m *Mixed) Mode() outbox.TrackingMode { return m.mode }

// Complete implements Tracker: the group's completion record on Bitmap
// and Counter messages. Offset messages need none while the topic is in
// Offset mode (the watermark judges them); in the others each gets one
// too.
func (m *Mixed) Complete(ctx context.Context, tx DB, sub Subscription, ids []int64) error {
	stmt := m.q.CompleteRecords
	if m.mode == outbox.Offset {
		stmt = m.q.CompleteTracked
	}
	_, err := exec(ctx, tx, "complete", stmt.Numbered, stmt.Bind(sqlq.Args{"message_ids": ids, "sub": sub.ID})...)
	return err
}

// Forget implements Tracker: Bitmap and Counter messages as their
// trackers forget them.
func (m *Mixed) Forget(ctx context.Context, tx pgx.Tx, sub Subscription, cancelled bool, limit int) (int64, error) {
	var n int64
	if sub.Mask() != 0 {
		var err error
		if n, err = (&Bitmap{q: m.q}).Forget(ctx, tx, sub, cancelled, limit); err != nil || n >= int64(limit) {
			return n, err
		}
	}
	c, err := (&Counter{q: m.q}).Forget(ctx, tx, sub, cancelled, limit)
	return n + c, err
}

// Cleanup implements Tracker: each message as its own mode's cleanup
// would delete it (keep.Watermark for Offset messages).
func (m *Mixed) Cleanup(ctx context.Context, db DB, topic string, keep Retention, limit int) (int64, error) {
	var n int64
	args := keep.cleanupArgs(topic, limit)
	args["watermark"] = snapshotOrNull(keep.Watermark)
	err := db.QueryRow(ctx, m.q.MixedCleanup, args).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("completion: cleanup: %w", err)
	}
	return n, nil
}

// Holds implements Tracker: a message of the range its own record says is
// unfinished holds it.
func (m *Mixed) Holds(ctx context.Context, db DB, topic string, keep Retention, lo, hi string, sealed time.Time) (bool, error) {
	wm, err := watermark(ctx, db, m.q, topic)
	if err != nil {
		return false, err
	}
	return holds(ctx, db, m.q.MixedHeld, topic, keep, lo, hi, sealed, pgx.StrictNamedArgs{"watermark": snapshotOrNull(wm)})
}
