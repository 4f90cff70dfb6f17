package completion

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Bitmap fixes each message's required groups at insert as one bit per
// group (at most 64 groups); a group has finished a message once its
// committed position has passed it with no retry of it pending (or it
// recorded the message, see Complete), and cleanup deletes a message
// every required group finished.
type Bitmap struct{ q *sqlq.PubSub }

// Mode implements Tracker.
func (*Bitmap) Mode() outbox.TrackingMode { return outbox.Bitmap }

// Complete implements Tracker: one INSERT of a record per message, beside
// it (a message recorded twice counts once).
func (b *Bitmap) Complete(ctx context.Context, tx DB, sub Subscription, ids []int64) error {
	_, err := exec(ctx, tx, "bitmap complete", b.q.CompleteRecords.Numbered, b.q.CompleteRecords.Bind(sqlq.Args{"message_ids": ids, "sub": sub.ID})...)
	return err
}

// Forget implements Tracker: a cancelled group's bit is stripped from
// every row, so it can be given to another group.
func (b *Bitmap) Forget(ctx context.Context, tx pgx.Tx, sub Subscription, cancelled bool, limit int) (int64, error) {
	if cancelled {
		return exec(ctx, tx, "bitmap strip", b.q.BitmapStrip, pgx.StrictNamedArgs{"topic": sub.Topic, "bit": sub.Mask(), "limit": limit})
	}
	return exec(ctx, tx, "bitmap forget", b.q.BitmapForget,
		pgx.StrictNamedArgs{"topic": sub.Topic, "bit": sub.Mask(), "limit": limit, "sub": sub.ID})
}

// Cleanup implements Tracker.
func (b *Bitmap) Cleanup(ctx context.Context, db DB, topic string, keep Retention, limit int) (int64, error) {
	return cleanup(ctx, db, "bitmap cleanup", b.q.BitmapCleanup, topic, keep, limit)
}

// cleanup runs a cleanup statement that returns how many messages it
// deleted.
func cleanup(ctx context.Context, db DB, what, sql, topic string, keep Retention, limit int) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, sql, keep.cleanupArgs(topic, limit)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("completion: %s: %w", what, err)
	}
	return n, nil
}

// Holds implements Tracker.
func (b *Bitmap) Holds(ctx context.Context, db DB, topic string, keep Retention, lo, hi string, sealed time.Time) (bool, error) {
	return holds(ctx, db, b.q.BitmapHeld, topic, keep, lo, hi, sealed, nil)
}

// holds runs a partition check (sqlq's partitionHeld) with the arguments
// every mode's takes and more, those of its mode (its watermark).
func holds(ctx context.Context, db DB, sql, topic string, keep Retention, lo, hi string, sealed time.Time,
	more pgx.StrictNamedArgs) (bool, error) {
	var held bool
	args := keep.args(topic)
	args["lo"], args["hi"], args["sealed"] = lo, hi, sealed
	maps.Copy(args, more)
	err := db.QueryRow(ctx, sql, args).Scan(&held)
	if err != nil {
		return false, fmt.Errorf("completion: partition held: %w", err)
	}
	return held, nil
}
