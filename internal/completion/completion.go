// Package completion records, for PUB_SUB topics, which consumer groups a
// message needs and which of them are done with it, in one of three modes
// behind the Tracker interface, one file each:
//
//   - Bitmap (bitmap.go): the required groups as a bit each (at most 64
//     per topic), fixed in the message row at insert.
//   - Counter (counter.go): the required groups as a list of ids and a
//     count, fixed in the message row at insert; unlimited groups.
//   - Offset (offset.go): nothing per message; a group's committed read
//     position says what it finished, and the topic watermark (the least
//     position of the subscribed groups, watermark.go) says what every
//     group finished.
//
// No mode writes anything per message when a group finishes it: a group
// has finished a message when its committed position has passed it and
// it holds no retry of it (sqlq's passedBy). Bitmap and Counter cleanup
// deletes a message once every required group has, so groups finishing
// the same messages never wait for each other's locks and a fan-out costs
// what it costs in Offset mode. Complete writes a record (message, group)
// beside the message, for what positions cannot say: an ack in a
// handler's own transaction inside an open batch, a force-complete, a
// dead letter discarded.
//
// A topic's mode may change while messages are stored: each message keeps
// the record of the mode it was written under, and until none written
// under an earlier mode is left, the Mixed tracker (mixed.go) reads each
// message's own.
//
// Package consumergroup drives the trackers; their SQL is sqlq's
// tracking_*.go.
package completion

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

// args are the arguments every cleanup and partition check of @topic
// takes from r: @now, @retention_us and @zero_subscription_us.
func (r Retention) args(topic string) pgx.StrictNamedArgs {
	return pgx.StrictNamedArgs{"topic": topic, "now": r.Now, "retention_us": r.Completed.Microseconds(),
		"zero_subscription_us": r.ZeroSubscription.Microseconds()}
}

// cleanupArgs are a cleanup's arguments: r's (see args), at most @limit
// rows, and only below @below (see Below).
func (r Retention) cleanupArgs(topic string, limit int) pgx.StrictNamedArgs {
	a := r.args(topic)
	a["limit"], a["below"] = limit, r.below()
	return a
}

// Tracker is one completion tracking mode.
type Tracker interface {
	// Mode names the mode.
	Mode() outbox.TrackingMode
	// Complete records, inside tx, that sub finished the messages ids,
	// where its position cannot say so (a force-complete, a discarded
	// dead letter). It is idempotent: a message completed twice counts
	// once.
	Complete(ctx context.Context, tx DB, sub Subscription, ids []int64) error
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
func ForTopic(topic outbox.TopicConfig, q *sqlq.PubSub) (Tracker, error) {
	if topic.ModeChanging {
		return NewMixed(topic.Tracking, q)
	}
	return New(topic.Tracking, q)
}

// NewMixed returns the Mixed tracker of a topic whose mode is now mode.
// It handles messages of every mode: a caller that read the topic's
// configuration outside its transaction uses it to complete messages
// that a mode change may have raced.
func NewMixed(mode outbox.TrackingMode, q *sqlq.PubSub) (*Mixed, error) {
	if _, err := New(mode, q); err != nil {
		return nil, err
	}
	return &Mixed{q: q, mode: mode}, nil
}

// New returns the tracker for mode, using the statements q (of the
// schema it works in).
func New(mode outbox.TrackingMode, q *sqlq.PubSub) (Tracker, error) {
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
		return 0, fmt.Errorf("completion: %s: %w", what, err)
	}
	return tag.RowsAffected(), nil
}
