package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// MessageState says where a consumer group stands with one message.
type MessageState string

// A consumer group's MessageState.
const (
	// MessageFinished: the group finished the message (a handler acked it,
	// a filter skipped it, or it was force-completed), or, in Offset mode,
	// the group subscribed after it was written (its position is past it).
	MessageFinished MessageState = "FINISHED"
	// MessagePending: the group has not read it yet, or it waits in the
	// group for its turn (ordered topics) or its time.
	MessagePending MessageState = "PENDING"
	// MessageInFlight: read by an instance of the group, which has not
	// finished it.
	MessageInFlight MessageState = "IN_FLIGHT"
	// MessageRetrying: a delivery to the group failed; it waits for its
	// next attempt (MessageGroup.NextAttempt).
	MessageRetrying MessageState = "RETRYING"
	// MessageDeadLettered: the group gave up on it (see DeadLetters).
	MessageDeadLettered MessageState = "DEAD_LETTER"
	// MessageNotRequired: the message does not need the group (it was
	// DEAD or not yet subscribed when the message was written, or it was
	// forgotten after ZombieTTL).
	MessageNotRequired MessageState = "NOT_REQUIRED"
)

// MessageGroup is where one consumer group stands with a message (see
// Admin.MessageGroups).
type MessageGroup struct {
	// ConsumerGroup is the group's name, Status its subscription's state.
	ConsumerGroup string              `json:"group"`
	Status        consumergroup.State `json:"status"`
	State         MessageState        `json:"state"`
	// Attempts and LastError are those of a message being retried or
	// dead-lettered (0 and "" otherwise); NextAttempt is when a retry is
	// due, or when a message sent with Delay or NotBefore is.
	Attempts    int        `json:"attempts"`
	LastError   string     `json:"last_error,omitempty"`
	NextAttempt *time.Time `json:"next_attempt,omitempty"`
}

// MessageGroups answers which consumer groups finished message id of
// PUB_SUB topic topic, and where each of the others stands, from the
// groups' records and positions (every tracking mode), one entry per
// group that is not cancelled, by name. A message cleanup has deleted
// (every group it required finished it, or retention dropped it) or that
// was never stored is outbox.ErrNotFound. A QUEUE topic has one entry,
// its consumers' group (named "(queue)").
func (a *Admin) MessageGroups(ctx context.Context, topic string, id int64) ([]MessageGroup, error) {
	_, err := a.topicConfig(ctx, topic)
	if err != nil {
		return nil, err
	}
	rows, err := a.pool.Query(ctx, a.q.MessageGroups, pgx.StrictNamedArgs{"topic": topic, "message_id": id})
	if err != nil {
		return nil, fmt.Errorf("admin: message %d of %q: %w", id, topic, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (MessageGroup, error) {
		var m MessageGroup
		err := r.Scan(&m.ConsumerGroup, &m.Status, &m.State, &m.Attempts, &m.LastError, &m.NextAttempt)
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("admin: message %d of %q: %w", id, topic, err)
	}
	if len(out) == 0 {
		var stored bool
		if err := a.pool.QueryRow(ctx, a.q.MessageStored, pgx.StrictNamedArgs{"topic": topic, "message_id": id}).Scan(&stored); err != nil {
			return nil, fmt.Errorf("admin: message %d of %q: %w", id, topic, err)
		}
		if !stored {
			return nil, fmt.Errorf("%w: admin: message %d of %q is not stored (every group it needed finished it and cleanup deleted it, retention dropped it, or it was never sent)",
				outbox.ErrNotFound, id, topic)
		}
	}
	return out, nil
}
