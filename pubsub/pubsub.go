// Package pubsub records, for PUB_SUB topics, which consumer groups a
// message needs and which of them are done with it, in one of three modes
// behind the Tracker interface:
//
//   - Bitmap: the required groups as a bit each (at most 64 per topic),
//     fixed in the message row at insert.
//   - Counter: the required groups as a list of ids and a count, fixed in
//     the message row at insert; unlimited groups.
//   - Offset: nothing per message; a group's committed read position says
//     what it finished, and the topic watermark (the least position of the
//     subscribed groups) says what every group finished.
//
// No mode writes the message row when a group finishes it: Bitmap and
// Counter groups insert a completion record (message, group) beside it,
// one INSERT per batch, and cleanup deletes a message with its records
// once every required group recorded it. Groups finishing the same
// messages therefore never wait for each other's locks.
//
// A topic's mode may change while messages are stored: each message keeps
// the record of the mode it was written under, and until none written
// under an earlier mode is left, the Mixed tracker reads each message's
// own.
//
// Package consumergroup drives the trackers; most programs never call this
// package directly.
package pubsub

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// DB is what trackers run their statements with: a pgx.Tx or a pool.
type DB interface {
	outbox.Executor
	outbox.QueryRower
}

// Subscription identifies a group's subscription to a topic.
type Subscription struct {
	ID    int64
	Topic string
	Group string
	// Bit is the group's bit in Bitmap mode, -1 otherwise.
	Bit int
}

// Mask is the subscription's bitmap mask (0 without a bit).
func (s Subscription) Mask() int64 {
	if s.Bit < 0 {
		return 0
	}
	return int64(1) << uint(s.Bit)
}

// Retention says which finished rows cleanup may delete.
type Retention struct {
	// Now is the time base (nil: database time).
	Now *time.Time
	// Completed rows older than this go.
	Completed time.Duration
	// Rows no group was subscribed to go only after this floor.
	ZeroSubscription time.Duration
	// Bounds of the pass (see CleanupBounds); the zero value scans every
	// row of the topic.
	Bounds
}

// maxXid8 sorts after every transaction id.
const maxXid8 = "18446744073709551615"

func (r Retention) below() string { return cmp.Or(r.Below, maxXid8) }

// Tracker is one completion tracking mode.
type Tracker interface {
	// Mode names the mode.
	Mode() outbox.TrackingMode
	// Complete records, inside tx, that sub finished the messages ids.
	// It is idempotent: a message completed twice counts once.
	Complete(ctx context.Context, tx DB, sub Subscription, ids []int64) error
	// Completed returns which of ids sub already finished, for re-read
	// batches. Offset mode cannot tell per message and returns none.
	Completed(ctx context.Context, db DB, sub Subscription, ids []int64) (map[int64]bool, error)
	// Forget removes sub from the required sets of at most limit rows it
	// had not finished (the group died or was cancelled), inside tx,
	// returning how many rows it looked at; fewer than limit means none
	// is left. For a cancelled group it also drops its completions, so
	// that nothing refers to it afterwards. Forgetting is idempotent, and
	// never counts a completion that commits while it runs as another
	// group's.
	Forget(ctx context.Context, tx pgx.Tx, sub Subscription, cancelled bool, limit int) (int64, error)
	// Cleanup deletes at most limit rows of topic that every required group
	// finished and that retention lets go, returning how many it deleted.
	// Run it in a transaction holding the topic's lock in shared mode (as
	// consumergroup.Group.Cleanup does), so that a subscription change that
	// starts a backfill is never overtaken by a cleanup that missed it.
	Cleanup(ctx context.Context, db DB, topic string, keep Retention, limit int) (int64, error)
	// Holds reports whether topic may still need a row with an xid in
	// [lo, hi) (xid8s as text), a range no transaction writes into any
	// more since sealed: a group holding claims has not finished one,
	// has a retry of one pending or a backfill that may read it, or the
	// topic's retention (keep's, without Bounds) has not passed since
	// sealed. It errs on the side of holding (a backfill holds ranges past
	// its start's xmin). Run it like Cleanup.
	Holds(ctx context.Context, db DB, topic string, keep Retention, lo, hi string, sealed time.Time) (bool, error)
}

// ForTopic returns the tracker for topic: its mode's, or, while messages
// written under an earlier mode may be stored (topic.ModeChanging),
// Mixed.
func ForTopic(topic outbox.TopicConfig, schema string) (Tracker, error) {
	if topic.ModeChanging {
		return NewMixed(topic.Tracking, schema)
	}
	return New(topic.Tracking, schema)
}

// NewMixed returns the Mixed tracker of a topic whose mode is now mode.
// It handles messages of every mode: a caller that read the topic's
// configuration outside its transaction uses it to complete messages
// that a mode change may have raced.
func NewMixed(mode outbox.TrackingMode, schema string) (*Mixed, error) {
	if _, err := New(mode, schema); err != nil {
		return nil, err
	}
	return &Mixed{q: sqlq.ForPubSub(schema), mode: mode}, nil
}

// New returns the tracker for mode, using the statements for schema.
func New(mode outbox.TrackingMode, schema string) (Tracker, error) {
	q := sqlq.ForPubSub(schema)
	switch mode {
	case outbox.Bitmap:
		return &Bitmap{q: q}, nil
	case outbox.Counter:
		return &Counter{q: q}, nil
	case outbox.Offset:
		return &Offset{q: q}, nil
	}
	return nil, fmt.Errorf("%w: unknown tracking mode %q", outbox.ErrInvalidConfig, mode)
}

func exec(ctx context.Context, db DB, what, sql string, args ...any) (int64, error) {
	tag, err := db.Exec(ctx, sql, args...)
	if err != nil {
		return 0, fmt.Errorf("pubsub: %s: %w", what, err)
	}
	return tag.RowsAffected(), nil
}

func idSet(ctx context.Context, db DB, what, sql string, args ...any) (map[int64]bool, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("pubsub: %s: %w", what, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("pubsub: %s: %w", what, err)
	}
	out := make(map[int64]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out, nil
}

// Bitmap fixes each message's required groups at insert as one bit per
// group (at most 64 groups); a group records finishing a message in its
// own row of the completion table, never in the message row.
type Bitmap struct{ q *sqlq.PubSub }

// Mode implements Tracker.
func (*Bitmap) Mode() outbox.TrackingMode { return outbox.Bitmap }

// Complete implements Tracker: one INSERT for the whole batch.
func (b *Bitmap) Complete(ctx context.Context, tx DB, sub Subscription, ids []int64) error {
	_, err := exec(ctx, tx, "bitmap complete", b.q.CompleteRecords, ids, sub.ID)
	return err
}

// Completed implements Tracker.
func (b *Bitmap) Completed(ctx context.Context, db DB, sub Subscription, ids []int64) (map[int64]bool, error) {
	return idSet(ctx, db, "bitmap completed", b.q.BitmapCompleted, ids, sub.Mask(), sub.ID)
}

// Forget implements Tracker: a cancelled group's bit is stripped from
// every row, so it can be given to another group.
func (b *Bitmap) Forget(ctx context.Context, tx pgx.Tx, sub Subscription, cancelled bool, limit int) (int64, error) {
	if cancelled {
		return exec(ctx, tx, "bitmap strip", b.q.BitmapStrip, sub.Topic, sub.Mask(), limit)
	}
	return exec(ctx, tx, "bitmap forget", b.q.BitmapForget, sub.Topic, sub.Mask(), limit, sub.ID)
}

// Cleanup implements Tracker.
func (b *Bitmap) Cleanup(ctx context.Context, db DB, topic string, keep Retention, limit int) (int64, error) {
	return cleanup(ctx, db, "bitmap cleanup", b.q.BitmapCleanup, topic, keep, limit)
}

// cleanup runs a cleanup statement that returns how many messages it
// deleted.
func cleanup(ctx context.Context, db DB, what, sql, topic string, keep Retention, limit int) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, sql, topic, keep.Now, keep.Completed.Microseconds(), limit,
		keep.ZeroSubscription.Microseconds(), keep.below()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("pubsub: %s: %w", what, err)
	}
	return n, nil
}

// Holds implements Tracker.
func (b *Bitmap) Holds(ctx context.Context, db DB, topic string, keep Retention, lo, hi string, sealed time.Time) (bool, error) {
	return holds(ctx, db, b.q.BitmapHeld, topic, keep, lo, hi, sealed)
}

func holds(ctx context.Context, db DB, sql, topic string, keep Retention, lo, hi string, sealed time.Time, more ...any) (bool, error) {
	var held bool
	args := append([]any{topic, keep.Now, keep.Completed.Microseconds(), lo, keep.ZeroSubscription.Microseconds(), sealed, hi}, more...)
	err := db.QueryRow(ctx, sql, args...).Scan(&held)
	if err != nil {
		return false, fmt.Errorf("pubsub: partition held: %w", err)
	}
	return held, nil
}

// Counter tracks completion with dedupe rows and a counter per message.
type Counter struct{ q *sqlq.PubSub }

// Mode implements Tracker.
func (*Counter) Mode() outbox.TrackingMode { return outbox.Counter }

// Complete implements Tracker: one INSERT for the whole batch (a
// redelivered message is recorded once).
func (c *Counter) Complete(ctx context.Context, tx DB, sub Subscription, ids []int64) error {
	_, err := exec(ctx, tx, "counter complete", c.q.CompleteRecords, ids, sub.ID)
	return err
}

// Completed implements Tracker.
func (c *Counter) Completed(ctx context.Context, db DB, sub Subscription, ids []int64) (map[int64]bool, error) {
	return idSet(ctx, db, "counter completed", c.q.CounterCompleted, ids, sub.ID)
}

// Forget implements Tracker in two statements: lock the candidate rows,
// then re-check each under its lock with a fresh snapshot, so a completion
// by the group that committed in between is never undone into a count that
// another group's completion would then satisfy.
func (c *Counter) Forget(ctx context.Context, tx pgx.Tx, sub Subscription, _ bool, limit int) (int64, error) {
	rows, err := tx.Query(ctx, c.q.CounterForgetCandidates, sub.Topic, sub.ID, limit)
	if err != nil {
		return 0, fmt.Errorf("pubsub: counter forget: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, fmt.Errorf("pubsub: counter forget: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	if _, err := exec(ctx, tx, "counter forget", c.q.CounterForget, ids, sub.ID); err != nil {
		return 0, err
	}
	return int64(len(ids)), nil
}

// Cleanup implements Tracker.
func (c *Counter) Cleanup(ctx context.Context, db DB, topic string, keep Retention, limit int) (int64, error) {
	return cleanup(ctx, db, "counter cleanup", c.q.CounterCleanup, topic, keep, limit)
}

// Holds implements Tracker.
func (c *Counter) Holds(ctx context.Context, db DB, topic string, keep Retention, lo, hi string, sealed time.Time) (bool, error) {
	return holds(ctx, db, c.q.CounterHeld, topic, keep, lo, hi, sealed)
}

// Offset tracks nothing per message: groups' committed positions do.
type Offset struct{ q *sqlq.PubSub }

// Mode implements Tracker.
func (*Offset) Mode() outbox.TrackingMode { return outbox.Offset }

// Complete implements Tracker: nothing to write per message.
func (*Offset) Complete(context.Context, DB, Subscription, []int64) error { return nil }

// Completed implements Tracker: offset mode cannot tell per message.
func (*Offset) Completed(context.Context, DB, Subscription, []int64) (map[int64]bool, error) {
	return nil, nil
}

// Forget implements Tracker: a group that left holds the watermark back
// no more (a DEAD one, within its ZombieTTL, only what it owes).
func (*Offset) Forget(context.Context, pgx.Tx, Subscription, bool, int) (int64, error) { return 0, nil }

// Cleanup implements Tracker: it deletes rows visible in keep.Watermark
// (the least committed position of the ACTIVE and PAUSED groups, from
// CleanupBounds), or, with no such group, past the zero-subscription
// floor, that no DEAD group within its ZombieTTL owes (written before it
// died, past its position).
func (o *Offset) Cleanup(ctx context.Context, db DB, topic string, keep Retention, limit int) (int64, error) {
	return exec(ctx, db, "offset cleanup", o.q.OffsetCleanup, topic, keep.Now, keep.Completed.Microseconds(), limit,
		keep.ZeroSubscription.Microseconds(), snapshotOrNull(keep.Watermark), keep.below())
}

// Holds implements Tracker: the watermark (see Watermark) must see every
// message of the range, and no DEAD group within its ZombieTTL may owe
// one.
func (o *Offset) Holds(ctx context.Context, db DB, topic string, keep Retention, lo, hi string, sealed time.Time) (bool, error) {
	wm, err := watermark(ctx, db, o.q, topic)
	if err != nil {
		return false, err
	}
	return holds(ctx, db, o.q.OffsetHeld, topic, keep, lo, hi, sealed, snapshotOrNull(wm))
}

// snapshotOrNull is a pg_snapshot argument: NULL for "" (no group holds
// claims).
func snapshotOrNull(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

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
// Offset mode; in the others each gets one too, so that a backfill (the
// way a DEAD group comes back there) skips those the group completed.
func (m *Mixed) Complete(ctx context.Context, tx DB, sub Subscription, ids []int64) error {
	sql := m.q.CompleteRecords
	if m.mode == outbox.Offset {
		sql = m.q.CompleteTracked
	}
	_, err := exec(ctx, tx, "complete", sql, ids, sub.ID)
	return err
}

// Completed implements Tracker.
func (m *Mixed) Completed(ctx context.Context, db DB, sub Subscription, ids []int64) (map[int64]bool, error) {
	done, err := idSet(ctx, db, "counter completed", m.q.CounterCompleted, ids, sub.ID)
	if err != nil || sub.Mask() == 0 {
		return done, err
	}
	bits, err := idSet(ctx, db, "bitmap completed", m.q.BitmapCompleted, ids, sub.Mask(), sub.ID)
	for id := range bits {
		done[id] = true
	}
	return done, err
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
	err := db.QueryRow(ctx, m.q.MixedCleanup, topic, keep.Now, keep.Completed.Microseconds(), limit,
		keep.ZeroSubscription.Microseconds(), snapshotOrNull(keep.Watermark), keep.below()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("pubsub: cleanup: %w", err)
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
	return holds(ctx, db, m.q.MixedHeld, topic, keep, lo, hi, sealed, snapshotOrNull(wm))
}
