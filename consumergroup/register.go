package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/pubsub"
)

// streamArgs are the bind values of sqlq's stream filter: which rows of a
// snapshot pair belong to the group.
type streamArgs struct {
	bit    int64      // Bitmap: rows requiring the group's bit
	subID  *int64     // Counter: rows requiring the subscription
	all    bool       // every row (offset mode, or a start from the beginning)
	from   *time.Time // rows written from this time
	fromID *int64     // rows from this id
}

func (s streamArgs) binds() []any { return []any{s.bit, s.subID, s.all, s.from, s.fromID} }

type registration struct {
	topic    outbox.TopicConfig
	sub      pubsub.Subscription
	stream   streamArgs
	created  bool
	backfill *pubsub.Range // set when Start must backfill
}

type subscriptionRef struct {
	id  int64
	bit int
}

// register creates, continues or resurrects the group's subscription in one
// transaction holding the topic row's lock, so the subscribed set every
// insert copies changes atomically with it.
func (g *Group) register(ctx context.Context, opts SubscriptionOptions) (*registration, error) {
	reg := &registration{}
	err := pgx.BeginFunc(ctx, g.pool, func(tx pgx.Tx) error {
		var semantics, tracking string
		err := tx.QueryRow(ctx, g.q.LockTopic, g.cfg.Topic).Scan(&semantics, &tracking)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %q (configure it as a PUB_SUB topic first)", outbox.ErrUnknownTopic, g.cfg.Topic)
		}
		if err != nil {
			return fmt.Errorf("consumergroup: lock topic: %w", err)
		}
		if outbox.Semantics(semantics) != outbox.PubSub {
			return fmt.Errorf("%w: %q is a %s topic; use outbox.Consumer", outbox.ErrWrongSemantics, g.cfg.Topic, semantics)
		}
		if reg.topic, err = g.client.LoadTopic(ctx, tx, g.cfg.Topic); err != nil {
			return err
		}
		var (
			id       int64
			status   string
			bit      int
			kind     string
			fromTS   *time.Time
			fromID   *int64
			position = opts.Position
		)
		err = tx.QueryRow(ctx, g.q.SelectSubscription, g.cfg.Topic, g.cfg.Group).Scan(&id, &status, &bit, &kind, &fromTS, &fromID)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			if bit, err = g.allocateBit(ctx, tx, reg.topic.Tracking); err != nil {
				return err
			}
			var bitArg *int
			if bit >= 0 {
				bitArg = &bit
			}
			switch position {
			case StartTimestamp:
				fromTS = &opts.Timestamp
			case StartMessageID:
				fromID = &opts.MessageID
			}
			kind = string(position)
			if err := tx.QueryRow(ctx, g.q.InsertSubscription, g.cfg.Topic, g.cfg.Group, bitArg, kind, fromTS, fromID,
				g.cfg.HeartbeatTimeout.Microseconds()).Scan(&id); err != nil {
				return fmt.Errorf("consumergroup: subscribe: %w", err)
			}
			if _, err := tx.Exec(ctx, g.q.InsertOffset, id, position == StartNow); err != nil {
				return fmt.Errorf("consumergroup: subscribe: %w", err)
			}
			if _, err := tx.Exec(ctx, g.q.AddSubscribed, g.cfg.Topic, mask(bit), id); err != nil {
				return fmt.Errorf("consumergroup: subscribe: %w", err)
			}
			reg.created = true
			if opts.Backfill && position != StartNow {
				reg.backfill = &pubsub.Range{Position: "1:1:", All: position == StartBeginning, From: fromTS, FromID: fromID}
			}
		case err != nil:
			return fmt.Errorf("consumergroup: read subscription: %w", err)
		case State(status) == Cancelled:
			return fmt.Errorf("%w: group %q on %q is CANCELLED (terminal); delete it or use another group name",
				ErrInvalidTransition, g.cfg.Group, g.cfg.Topic)
		case State(status) == Dead:
			if err := g.resurrectTx(ctx, tx, subscriptionRef{id: id, bit: bit}); err != nil {
				return err
			}
			pos, err := g.committedPosition(ctx, tx, id)
			if err != nil {
				return err
			}
			reg.backfill = &pubsub.Range{Position: pos, All: true}
		}
		reg.sub = pubsub.Subscription{ID: id, Topic: g.cfg.Topic, Group: g.cfg.Group, Bit: bit}
		reg.stream = streamFor(reg.topic.Tracking, reg.sub, Position(kind), fromTS, fromID)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return reg, nil
}

// streamFor says which rows of its snapshot pairs a group handles: those
// that require it, plus, for starts before the subscription, the old ones
// its start position selects. Offset mode has no required sets: a group's
// position alone decides.
func streamFor(mode outbox.TrackingMode, sub pubsub.Subscription, kind Position, fromTS *time.Time, fromID *int64) streamArgs {
	s := streamArgs{}
	switch mode {
	case outbox.Bitmap:
		s.bit = sub.Mask()
	case outbox.Counter:
		id := sub.ID
		s.subID = &id
	}
	switch kind {
	case StartNow:
		s.all = mode == outbox.Offset
	case StartBeginning:
		s.all = true
	case StartTimestamp:
		s.from = fromTS
	case StartMessageID:
		s.fromID = fromID
	}
	return s
}

func mask(bit int) int64 {
	if bit < 0 {
		return 0
	}
	return int64(1) << uint(bit)
}

// allocateBit picks the lowest bit no subscription of the topic holds. A
// CANCELLED subscription's bit is reused only once no message of the topic
// refers to it any more (so a new group never inherits completions).
func (g *Group) allocateBit(ctx context.Context, tx pgx.Tx, mode outbox.TrackingMode) (int, error) {
	if mode != outbox.Bitmap {
		return -1, nil
	}
	rows, err := tx.Query(ctx, g.q.SubscribedBits, g.cfg.Topic)
	if err != nil {
		return 0, fmt.Errorf("consumergroup: bits: %w", err)
	}
	held := map[int]string{}
	var bit int
	var status string
	if _, err := pgx.ForEachRow(rows, []any{&bit, &status}, func() error { held[bit] = status; return nil }); err != nil {
		return 0, fmt.Errorf("consumergroup: bits: %w", err)
	}
	for b := 0; b < 64; b++ {
		st, taken := held[b]
		if !taken {
			return b, nil
		}
		if State(st) != Cancelled {
			continue
		}
		var referenced bool
		if err := tx.QueryRow(ctx, g.q.BitStillReferenced, g.cfg.Topic, mask(b)).Scan(&referenced); err != nil {
			return 0, fmt.Errorf("consumergroup: bits: %w", err)
		}
		if !referenced {
			if _, err := tx.Exec(ctx, g.q.ReleaseBit, g.cfg.Topic, b); err != nil {
				return 0, fmt.Errorf("consumergroup: bits: %w", err)
			}
			return b, nil
		}
	}
	return 0, fmt.Errorf("%w: topic %q", ErrTooManyGroups, g.cfg.Topic)
}

// committedPosition is the snapshot below which the group finished everything.
func (g *Group) committedPosition(ctx context.Context, db pubsub.DB, subID int64) (string, error) {
	rows, err := db.Query(ctx, g.q.CommittedPosition, g.cfg.Topic)
	if err != nil {
		return "", fmt.Errorf("consumergroup: position: %w", err)
	}
	var id int64
	var pos, found string
	if _, err := pgx.ForEachRow(rows, []any{&id, &pos}, func() error {
		if id == subID {
			found = pos
		}
		return nil
	}); err != nil {
		return "", fmt.Errorf("consumergroup: position: %w", err)
	}
	if found == "" {
		return "1:1:", nil
	}
	return found, nil
}

// backfill raises the group on unfinished old messages, in batches.
func (g *Group) backfill(ctx context.Context, r pubsub.Range, opts SubscriptionOptions) error {
	tracker, err := pubsub.New(g.topic.Tracking, g.schema)
	if err != nil {
		return err
	}
	var total int64
	for total < int64(opts.MaxBackfill) {
		limit := min(int64(opts.BackfillBatchSize), int64(opts.MaxBackfill)-total)
		n, err := tracker.Backfill(ctx, g.pool, g.sub, r, int(limit))
		if err != nil {
			return err
		}
		total += n
		if n < limit {
			break
		}
	}
	g.logger.Info("pgoutbox: backfill done", slog.Int64("messages", total))
	return nil
}

// transition applies a state change the state machine allows, under the
// topic lock; leaving or rejoining the subscribed set goes with it.
func (g *Group) transition(ctx context.Context, to State) error {
	return pgx.BeginFunc(ctx, g.pool, func(tx pgx.Tx) error {
		var semantics, tracking string
		if err := tx.QueryRow(ctx, g.q.LockTopic, g.cfg.Topic).Scan(&semantics, &tracking); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("%w: %q", outbox.ErrUnknownTopic, g.cfg.Topic)
			}
			return fmt.Errorf("consumergroup: lock topic: %w", err)
		}
		var (
			id             int64
			status, kind   string
			bit            int
			fromTS, fromID any
		)
		err := tx.QueryRow(ctx, g.q.SelectSubscription, g.cfg.Topic, g.cfg.Group).Scan(&id, &status, &bit, &kind, &fromTS, &fromID)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: group %q has no subscription to %q", ErrNotStarted, g.cfg.Group, g.cfg.Topic)
		}
		if err != nil {
			return fmt.Errorf("consumergroup: read subscription: %w", err)
		}
		from := State(status)
		if !CanTransition(from, to) {
			return fmt.Errorf("%w: %s → %s (group %q)", ErrInvalidTransition, from, to, g.cfg.Group)
		}
		if to == Active && from == Dead {
			return g.resurrectTx(ctx, tx, subscriptionRef{id: id, bit: bit})
		}
		if _, err := tx.Exec(ctx, g.q.SetStatus, id, string(to)); err != nil {
			return fmt.Errorf("consumergroup: set state: %w", err)
		}
		if to == Cancelled && from != Dead { // a DEAD group already left
			if _, err := tx.Exec(ctx, g.q.RemoveSubscribed, g.cfg.Topic, mask(bit), id); err != nil {
				return fmt.Errorf("consumergroup: unsubscribe: %w", err)
			}
		}
		return nil
	})
}

// resurrectTx makes a DEAD subscription ACTIVE and subscribed again.
func (g *Group) resurrectTx(ctx context.Context, tx pgx.Tx, ref subscriptionRef) error {
	if _, err := tx.Exec(ctx, g.q.SetStatus, ref.id, string(Active)); err != nil {
		return fmt.Errorf("consumergroup: resurrect: %w", err)
	}
	if _, err := tx.Exec(ctx, g.q.AddSubscribed, g.cfg.Topic, mask(ref.bit), ref.id); err != nil {
		return fmt.Errorf("consumergroup: resurrect: %w", err)
	}
	g.logger.Warn("pgoutbox: consumer group resurrected")
	return nil
}

// forgetAll removes a group that left (DEAD or CANCELLED) from the required
// sets of the messages it had not finished, in batches, and for a cancelled
// group drops its batches and retries.
func (g *Group) forgetAll(ctx context.Context, ref subscriptionRef, cancelled bool) error {
	topic, err := g.client.Topic(ctx, g.cfg.Topic)
	if err != nil {
		return err
	}
	tracker, err := pubsub.New(topic.Tracking, g.schema)
	if err != nil {
		return err
	}
	sub := pubsub.Subscription{ID: ref.id, Topic: g.cfg.Topic, Group: g.cfg.Group, Bit: ref.bit}
	const batch = 10_000
	for {
		n, err := tracker.Forget(ctx, g.pool, sub, batch)
		if err != nil {
			return err
		}
		if n < batch {
			break
		}
	}
	if cancelled {
		if _, err := g.pool.Exec(ctx, g.q.DeleteGroupState, ref.id); err != nil {
			return fmt.Errorf("consumergroup: drop state of cancelled group: %w", err)
		}
	}
	return nil
}
