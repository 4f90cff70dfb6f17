package completion

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Counter fixes each message's required groups at insert as a list of
// subscription ids and their count; a group has finished a message once
// its committed position has passed it with no retry of it pending (or
// it recorded the message, see Complete), and cleanup deletes a message
// every required group finished.
type Counter struct{ q *sqlq.PubSub }

// Mode implements Tracker.
func (*Counter) Mode() outbox.TrackingMode { return outbox.Counter }

// Complete implements Tracker: one INSERT of a record per message, beside
// it (a message recorded twice counts once).
func (c *Counter) Complete(ctx context.Context, tx DB, sub Subscription, ids []int64) error {
	_, err := exec(ctx, tx, "counter complete", c.q.CompleteRecords.Numbered, c.q.CompleteRecords.Bind(sqlq.Args{"message_ids": ids, "sub": sub.ID})...)
	return err
}

// Forget implements Tracker. A cancelled group is removed from every row
// that requires it, finished or not (its subscription is deleted later,
// and nothing could then say it finished one). A DEAD group is forgotten
// in two statements: lock the candidate rows, then re-check each under
// its lock with a fresh snapshot, so a completion by the group that
// committed in between is never undone into a count that another group's
// completion would then satisfy.
func (c *Counter) Forget(ctx context.Context, tx pgx.Tx, sub Subscription, cancelled bool, limit int) (int64, error) {
	if cancelled {
		return exec(ctx, tx, "counter strip", c.q.CounterStrip, pgx.StrictNamedArgs{"topic": sub.Topic, "sub": sub.ID, "limit": limit})
	}
	rows, err := tx.Query(ctx, c.q.CounterForgetCandidates, pgx.StrictNamedArgs{"topic": sub.Topic, "sub": sub.ID, "limit": limit})
	if err != nil {
		return 0, fmt.Errorf("completion: counter forget: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, fmt.Errorf("completion: counter forget: %w", err)
	}
	if len(ids) == 0 {
		return 0, nil
	}
	if _, err := exec(ctx, tx, "counter forget", c.q.CounterForget, pgx.StrictNamedArgs{"message_ids": ids, "sub": sub.ID}); err != nil {
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
	return holds(ctx, db, c.q.CounterHeld, topic, keep, lo, hi, sealed, nil)
}
