package outbox

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// DeadLetter is a message that used up its attempts or was rejected
// permanently. It is kept (in the outbox_dead_letters table) until replayed.
type DeadLetter struct {
	Delivery
	// DeadLetteredAt is when it was parked.
	DeadLetteredAt time.Time
	// LastError is the last handler error (or "lease expired ...").
	LastError string
}

// DefaultDeadLetterPage is the page size of DeadLetters when limit is 0.
const DefaultDeadLetterPage = 100

// DeadLetters lists a topic's dead letters with id > afterID in id order,
// at most limit of them (DefaultDeadLetterPage when 0). Page through them by
// passing the last id seen.
func (c *Client) DeadLetters(ctx context.Context, topic string, afterID int64, limit int) ([]DeadLetter, error) {
	if err := ValidateTopic(topic); err != nil {
		return nil, err
	}
	if limit < 0 {
		return nil, fmt.Errorf("%w: negative limit", ErrInvalidConfig)
	}
	limit = cmp.Or(limit, DefaultDeadLetterPage)
	rows, err := c.pool.Query(ctx, c.sql.ListDeadLetters, topic, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		dl := DeadLetter{Delivery: Delivery{Topic: topic}}
		var prio int16
		err := r.Scan(&dl.ID, &dl.Payload, &dl.Headers, &dl.CorrelationID, &dl.Group, &prio,
			&dl.Attempt, &dl.CreatedAt, &dl.DeadLetteredAt, &dl.LastError)
		dl.Priority = int(prio)
		return dl, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: list dead letters: %w", err)
	}
	return out, nil
}

// ReplayDeadLetters puts dead letters of topic back in the queue,
// deliverable at once (keeping their ids, except as below),
// with a fresh attempt budget: the ones with the given ids, or all of the
// topic's dead letters when no id is given. It returns how many it replayed;
// when ids are given and some are not dead letters of topic, the error wraps
// ErrNotFound (the others are still replayed).
//
// On an ordered topic that blocks groups on dead letters (BlockGroup) a
// replayed message keeps its place: it is its group's oldest message
// again, delivered before the group's later ones. On one that skips them
// (SkipDeadLetters), or where a later message of its group is leased
// (after a switch from skipping to blocking), the group has moved on, so
// a replayed message of a group goes to the back of it with a new id, as
// a new send would.
func (c *Client) ReplayDeadLetters(ctx context.Context, topic string, ids ...int64) (int64, error) {
	return c.changeDeadLetters(ctx, "replay", c.sql.ReplayDeadLetters, topic, ids)
}

// DiscardDeadLetters deletes dead letters of topic for good: the ones with
// the given ids, or all of the topic's dead letters when no id is given.
// On an ordered topic that blocks groups on dead letters (BlockGroup), a
// group whose dead letters are all replayed or discarded flows again. It
// returns how many it deleted; when ids are given and some are not dead
// letters of topic, the error wraps ErrNotFound (the others are still
// deleted).
func (c *Client) DiscardDeadLetters(ctx context.Context, topic string, ids ...int64) (int64, error) {
	return c.changeDeadLetters(ctx, "discard", c.sql.DiscardDeadLetters, topic, ids)
}

// changeDeadLetters runs query (replay or discard: $1 topic, $2 ids or
// NULL for all) and reports ids it did not find.
func (c *Client) changeDeadLetters(ctx context.Context, what, query, topic string, ids []int64) (int64, error) {
	if err := ValidateTopic(topic); err != nil {
		return 0, err
	}
	var filter []int64 // nil: all
	if len(ids) > 0 {
		seen := make(map[int64]bool, len(ids))
		for _, id := range ids {
			if !seen[id] {
				seen[id] = true
				filter = append(filter, id)
			}
		}
		ids = filter
	}
	tag, err := c.pool.Exec(ctx, query, topic, filter)
	if err != nil {
		return 0, fmt.Errorf("outbox: %s dead letters: %w", what, err)
	}
	n := tag.RowsAffected()
	if len(ids) > 0 && n < int64(len(ids)) {
		return n, fmt.Errorf("%w: %d of %d ids are not dead letters of topic %q", ErrNotFound, int64(len(ids))-n, len(ids), topic)
	}
	return n, nil
}
