package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/backoff"
	"github.com/pgoutbox/pgoutbox/internal/completion"
	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// The subscription lifecycle: creating, continuing and resurrecting a
// subscription, Pause, Resume and Cancel, dead-group detection and
// forgetting a group that left.
//
// Every change follows the invariant "a group's required set and its read
// stream agree at every instant":
//   - Producers hold the topic row FOR KEY SHARE until they commit, and a
//     change of the subscribed set locks it FOR UPDATE: the change waits
//     for every transaction that read the old set, and later ones read the
//     new set.
//   - A change of state locks the group's offsets row, which a fetch holds
//     until it commits: no fetch runs under a state it did not see.
//   - Locks are taken in one order: subscription row, offsets row, topic
//     row (a new subscription: topic row first, nothing else exists yet).
//   - What a change leaves to do later (forgetting a group that left,
//     backfilling one that came back) is recorded in its rows and done by
//     idempotent, re-runnable steps: a crash between two statements
//     leaves work that the next instance finishes.

// tracking returns the instance's current tracking (after Start).
func (g *Group) tracking() *engine.Tracking { return g.track.Load() }

// setTracking records how the group tracks messages, as the database
// says: the group's bit (-1: none), the topic's mode, and whether it is
// mixing modes. It reports whether that changed.
func (g *Group) setTracking(bit int, mode outbox.TrackingMode, mixing bool) (bool, error) {
	cur := g.track.Load()
	if cur != nil && cur.Sub.Bit == bit && cur.Mode == mode && cur.Mixing == mixing {
		return false, nil
	}
	tracker, err := completion.ForTopic(outbox.TopicConfig{Tracking: mode, ModeChanging: mixing}, g.q)
	if err != nil {
		return false, err
	}
	row := g.subRow
	row.bit = bit
	g.track.Store(&engine.Tracking{Sub: row.ref(g.cfg.Topic, g.cfg.Group), Stream: streamFor(mode, mixing, row),
		Tracker: tracker, Mode: mode, Mixing: mixing})
	if cur != nil {
		g.logger.Info("pgoutbox: the topic's tracking mode changed", slog.String("mode", string(mode)),
			slog.Bool("mixing", mixing), slog.Int("bit", bit))
	}
	return true, nil
}

// subscription is a group's subscription row, as a lifecycle change reads it.
type subscription struct {
	id     int64
	status State
	bit    int
	kind   Position
	fromTS *time.Time
	fromID *int64
}

func (s subscription) ref(topic, group string) completion.Subscription {
	return completion.Subscription{ID: s.id, Topic: topic, Group: group, Bit: s.bit}
}

// selectSubscription reads and locks the group's subscription (nil: none).
func (g *Group) selectSubscription(ctx context.Context, tx pgx.Tx) (*subscription, error) {
	s := &subscription{}
	var status, kind string
	err := tx.QueryRow(ctx, g.q.SelectSubscription, pgx.StrictNamedArgs{"topic": g.cfg.Topic, "group_name": g.cfg.Group}).Scan(&s.id, &status, &s.bit, &kind, &s.fromTS, &s.fromID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("consumergroup: read subscription: %w", err)
	}
	s.status, s.kind = State(status), Position(kind)
	return s, nil
}

// topicLockTimeout bounds each wait for the topic's lock. Producers of the
// topic queue behind a change that waits, so a change held up by a long
// producer transaction gives up after this long, lets them through, and
// tries again (see changeTx).
const topicLockTimeout = "200ms"

// lockTopic takes the topic's lock and row (waiting for the producers that
// read the subscribed set) and checks it is a PUB_SUB topic, or a QUEUE
// topic on the log.
func (g *Group) lockTopic(ctx context.Context, tx pgx.Tx) error {
	return lockTopic(ctx, tx, g.q, g.cfg.Topic)
}

func lockTopic(ctx context.Context, tx pgx.Tx, q *sqlq.PubSub, topic string) error {
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+topicLockTimeout+"'"); err != nil {
		return fmt.Errorf("consumergroup: lock topic: %w", err)
	}
	var semantics, tracking string
	err := tx.QueryRow(ctx, q.LockTopic, pgx.StrictNamedArgs{"topic": topic}).Scan(&semantics, &tracking)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %q (configure it as a PUB_SUB topic first)", outbox.ErrUnknownTopic, topic)
	}
	if err != nil {
		return fmt.Errorf("consumergroup: lock topic: %w", err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = DEFAULT"); err != nil {
		return fmt.Errorf("consumergroup: lock topic: %w", err)
	}
	if outbox.Semantics(semantics) != outbox.PubSub && tracking == "" {
		return fmt.Errorf("%w: %q is a %s topic; use pgoutbox.Client.NewConsumer", outbox.ErrWrongSemantics, topic, semantics)
	}
	return nil
}

// onLog reports whether topic's messages live on the log, read by groups:
// a PUB_SUB topic's, and a QUEUE topic's that has a tracking mode (its
// consumers are the members of its one group, sqlq.QueueGroup).
func onLog(topic outbox.TopicConfig) bool {
	return topic.Semantics == outbox.PubSub || topic.Tracking != ""
}

// changeTx runs a lifecycle change in a transaction, and runs it again
// after a lock timeout on the topic or a deadlock with another change,
// with backoff, until ctx ends.
func (g *Group) changeTx(ctx context.Context, f func(pgx.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := pgx.BeginTxFunc(ctx, g.pool, sqlq.ShortTx, f)
		if !lockConflict(err) {
			return err
		}
		if attempt%10 == 0 {
			g.logger.Warn("pgoutbox: a subscription change keeps waiting for producer transactions of the topic",
				slog.Int("attempts", attempt))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("consumergroup: waiting for producer transactions of %q: %w", g.cfg.Topic, ctx.Err())
		case <-time.After(backoff.Exponential(attempt, 20*time.Millisecond, 2*time.Second)):
		}
	}
}

// lockConflict reports whether err is a lock timeout or a deadlock, after
// which a lifecycle change runs again.
func lockConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01")
}

// lockOffset waits for a fetch of the group in progress to commit.
func (g *Group) lockOffset(ctx context.Context, tx pgx.Tx, id int64) error {
	if _, err := tx.Exec(ctx, g.q.LockOffsetWait, pgx.StrictNamedArgs{"sub": id}); err != nil {
		return fmt.Errorf("consumergroup: lock position: %w", err)
	}
	return nil
}

type registration struct {
	topic   outbox.TopicConfig
	sub     subscription
	created bool
}

// register creates, continues or resurrects the group's subscription.
func (g *Group) register(ctx context.Context, opts SubscriptionOptions) (*registration, error) {
	var reg *registration
	err := g.changeTx(ctx, func(tx pgx.Tx) error {
		var err error
		reg, err = g.registerTx(ctx, tx, opts)
		return err
	})
	return reg, err
}

func (g *Group) registerTx(ctx context.Context, tx pgx.Tx, opts SubscriptionOptions) (*registration, error) {
	sub, err := g.selectSubscription(ctx, tx)
	if err != nil {
		return nil, err
	}
	if g.cfg.Group == sqlq.QueueGroup && sub == nil { // it is created with the topic's move to the log
		return nil, fmt.Errorf("%w: %q is not a QUEUE topic whose messages live on the log", outbox.ErrWrongSemantics, g.cfg.Topic)
	}
	created := false
	if sub == nil || sub.status == Cancelled {
		// Creating (a cancelled group's name makes a new group): the topic
		// lock serialises creators; look again under it, another instance
		// may have just created it.
		if err := g.lockTopic(ctx, tx); err != nil {
			return nil, err
		}
		if sub, err = g.selectSubscription(ctx, tx); err != nil {
			return nil, err
		}
		if sub == nil || sub.status == Cancelled {
			if err := g.warnIfDeletedBefore(ctx, tx, sub); err != nil {
				return nil, err
			}
			created = true
			if sub, err = g.createSubscription(ctx, tx, opts); err != nil {
				return nil, err
			}
		}
	}
	switch sub.status {
	case Dead:
		if err := g.resurrectTx(ctx, tx, sub, opts); err != nil {
			return nil, err
		}
		sub.status = Active
	}
	// Registering is the instance's first heartbeat, and sets the group's
	// heartbeat timeout to its own.
	if _, err := tx.Exec(ctx, g.q.Heartbeat, g.heartbeatArgs(sub.id)); err != nil {
		return nil, fmt.Errorf("consumergroup: subscribe: %w", err)
	}
	topic, err := g.client.LoadTopic(ctx, tx, g.cfg.Topic)
	if err != nil {
		return nil, err
	}
	if topic.Semantics != outbox.PubSub && (g.cfg.Group != sqlq.QueueGroup || !onLog(topic)) {
		return nil, fmt.Errorf("%w: %q is a %s topic; use pgoutbox.Client.NewConsumer", outbox.ErrWrongSemantics, g.cfg.Topic, topic.Semantics)
	}
	return &registration{topic: topic, sub: *sub, created: created}, nil
}

// warnIfDeletedBefore says loudly that a group starts as a new one because
// its previous subscription was cancelled (before, which is the latest
// cancelled one of its name) or deleted by subscription cleanup.
func (g *Group) warnIfDeletedBefore(ctx context.Context, tx pgx.Tx, before *subscription) error {
	var last string
	var deletedAt time.Time
	err := tx.QueryRow(ctx, g.q.DeletedTombstone, pgx.StrictNamedArgs{"topic": g.cfg.Topic, "group_name": g.cfg.Group}).Scan(&last, &deletedAt)
	switch {
	case err == nil:
		g.logger.Warn("pgoutbox: this group's subscription was deleted (it had been "+last+" for too long); it starts as a NEW group, from its start position",
			slog.Time("deleted_at", deletedAt))
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("consumergroup: subscribe: %w", err)
	case before != nil:
		g.logger.Warn("pgoutbox: this group's name was cancelled before; it starts as a NEW group, from its start position",
			slog.Int64("cancelled_subscription", before.id))
	}
	return nil
}

// createSubscription inserts a new subscription under the topic lock: its
// start position is taken after every producer that read the old
// subscribed set committed, and every later message requires it.
func (g *Group) createSubscription(ctx context.Context, tx pgx.Tx, opts SubscriptionOptions) (*subscription, error) {
	topic, err := g.client.LoadTopic(ctx, tx, g.cfg.Topic)
	if err != nil {
		return nil, err
	}
	sub := &subscription{status: Active, kind: opts.Position, bit: -1}
	if topic.Tracking == outbox.Bitmap {
		if sub.bit, err = g.allocateBit(ctx, tx); err != nil {
			return nil, err
		}
	}
	var bitArg *int
	if sub.bit >= 0 {
		bitArg = &sub.bit
	}
	switch opts.Position {
	case StartTimestamp:
		sub.fromTS = &opts.Timestamp
	case StartMessageID:
		sub.fromID = &opts.MessageID
	}
	if err := tx.QueryRow(ctx, g.q.InsertSubscription, pgx.StrictNamedArgs{
		"topic": g.cfg.Topic, "group_name": g.cfg.Group, "bit": bitArg, "start_position": string(opts.Position),
		"start_from_timestamp": sub.fromTS, "start_from_message_id": sub.fromID,
		"heartbeat_timeout_us": g.cfg.HeartbeatTimeout.Microseconds(),
	}).Scan(&sub.id); err != nil {
		return nil, fmt.Errorf("consumergroup: subscribe: %w", err)
	}
	backfill := 0
	if opts.Backfill && opts.Position != StartNow {
		backfill = opts.MaxBackfill
	}
	if _, err := tx.Exec(ctx, g.q.InsertOffset, pgx.StrictNamedArgs{"sub": sub.id, "from_now": opts.Position == StartNow,
		"max_backfill": backfill}); err != nil {
		return nil, fmt.Errorf("consumergroup: subscribe: %w", err)
	}
	if _, err := tx.Exec(ctx, g.q.AddSubscribed, pgx.StrictNamedArgs{"topic": g.cfg.Topic, "bit_mask": mask(sub.bit), "sub": sub.id}); err != nil {
		return nil, fmt.Errorf("consumergroup: subscribe: %w", err)
	}
	return sub, nil
}

// allocateBit picks the lowest bit no subscription of the topic holds. A
// group keeps its bit while it may come back (ACTIVE, PAUSED, DEAD); a
// CANCELLED group's bit is freed once forgetting removed it from every row.
func (g *Group) allocateBit(ctx context.Context, tx pgx.Tx) (int, error) {
	rows, err := tx.Query(ctx, g.q.SubscribedBits, pgx.StrictNamedArgs{"topic": g.cfg.Topic})
	if err != nil {
		return 0, fmt.Errorf("consumergroup: bits: %w", err)
	}
	bits, err := pgx.CollectRows(rows, pgx.RowTo[int16])
	if err != nil {
		return 0, fmt.Errorf("consumergroup: bits: %w", err)
	}
	var held uint64
	for _, b := range bits {
		held |= 1 << uint(b)
	}
	for b := range 64 {
		if held&(1<<uint(b)) == 0 {
			return b, nil
		}
	}
	return 0, fmt.Errorf("%w: topic %q", ErrTooManyGroups, g.cfg.Topic)
}

// resurrectTx makes a DEAD subscription ACTIVE and subscribed again. Its
// stream starts now, and a backfill reads beside it, oldest first, every
// stored message it had not completed (up to MaxBackfill): what it owed
// when it died, and what was written while it was DEAD and is still
// stored. Its open batches are expired so that their messages are
// retried. sub is locked by the caller.
func (g *Group) resurrectTx(ctx context.Context, tx pgx.Tx, sub *subscription, opts SubscriptionOptions) error {
	if err := g.lockOffset(ctx, tx, sub.id); err != nil {
		return err
	}
	if err := g.lockTopic(ctx, tx); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, g.q.SetStatus, pgx.StrictNamedArgs{"sub": sub.id, "status": string(Active)}); err != nil {
		return fmt.Errorf("consumergroup: resurrect: %w", err)
	}
	if _, err := tx.Exec(ctx, g.q.AddSubscribed, pgx.StrictNamedArgs{"topic": g.cfg.Topic, "bit_mask": mask(sub.bit), "sub": sub.id}); err != nil {
		return fmt.Errorf("consumergroup: resurrect: %w", err)
	}
	// The group's backfill reads exactly what it had not read: no mode
	// records per message what a group finished.
	if _, err := tx.Exec(ctx, g.q.ResurrectOffset, pgx.StrictNamedArgs{"sub": sub.id, "max_backfill": opts.MaxBackfill}); err != nil {
		return fmt.Errorf("consumergroup: resurrect: %w", err)
	}
	g.logger.Warn("pgoutbox: consumer group came back from DEAD; new messages flow at once, and a backfill delivers what it had not completed beside them",
		slog.Int("max_backfill", opts.MaxBackfill))
	return nil
}

// resurrect is resurrectTx in a transaction of its own, for an instance
// whose heartbeat found the group DEAD.
func (g *Group) resurrect(ctx context.Context, opts SubscriptionOptions) error {
	return g.changeTx(ctx, func(tx pgx.Tx) error {
		sub, err := g.selectSubscription(ctx, tx)
		if err != nil || sub == nil || sub.status != Dead {
			return err
		}
		return g.resurrectTx(ctx, tx, sub, opts)
	})
}

// streamFor says which rows of its snapshot pairs a group handles: those
// that require it, plus, for starts before the subscription, the old ones
// its start position selects. Offset mode has no required sets: a group's
// position alone decides. While the topic's mode changes (mixing, see
// completion.Mixed), rows may require the group by bit or by id, and rows
// written in Offset mode by neither: a group that started now reads every
// row after its position (all of which require it, or were written in
// Offset mode), and one that started earlier also those its start
// selects, as in Offset mode.
func streamFor(mode outbox.TrackingMode, mixing bool, sub subscription) engine.Stream {
	s := engine.Stream{}
	if mode == outbox.Bitmap || mixing {
		s.Bit = mask(sub.bit)
	}
	if mode != outbox.Offset || mixing {
		// Counter: rows requiring the subscription; both: rows it recorded
		// finishing are skipped on a re-read.
		id := sub.id
		s.SubID = &id
	}
	switch sub.kind {
	case StartNow:
		s.All = mode == outbox.Offset || mixing
	case StartBeginning:
		s.All = true
	case StartTimestamp:
		s.From = sub.fromTS
	case StartMessageID:
		s.FromID = sub.fromID
	}
	return s
}

// catchupFor says which rows of a backfill's pair sub reads: for a
// group that started now (and came back from DEAD), every row; else the
// rows its start position selects.
func catchupFor(sub subscription) engine.CatchupRange {
	return engine.CatchupRange{All: sub.kind == StartNow || sub.kind == StartBeginning, From: sub.fromTS, FromID: sub.fromID}
}

func mask(bit int) int64 {
	if bit < 0 {
		return 0
	}
	return int64(1) << uint(bit)
}

// transition applies Pause or Resume (or resurrects a DEAD group on
// Resume). It waits for a fetch in progress, so every instance's next
// fetch, within its poll interval, runs under the new state.
func (g *Group) transition(ctx context.Context, to State) error {
	return g.changeTx(ctx, func(tx pgx.Tx) error {
		sub, err := g.selectSubscription(ctx, tx)
		if err != nil {
			return err
		}
		if sub == nil {
			return fmt.Errorf("%w: group %q has no subscription to %q", ErrNotStarted, g.cfg.Group, g.cfg.Topic)
		}
		if !CanTransition(sub.status, to) {
			return fmt.Errorf("%w: %s → %s (group %q)", ErrInvalidTransition, sub.status, to, g.cfg.Group)
		}
		if to == Active && sub.status == Dead {
			return g.resurrectTx(ctx, tx, sub, g.subscriptionOptions())
		}
		if err := g.lockOffset(ctx, tx, sub.id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, g.q.SetStatus, pgx.StrictNamedArgs{"sub": sub.id, "status": string(to)}); err != nil {
			return fmt.Errorf("consumergroup: set state: %w", err)
		}
		return nil
	})
}

// cancel makes the subscription CANCELLED (or finds it so): it leaves the
// subscribed set, its batches and retries are dropped, and forgetting it
// becomes pending. It returns the subscription.
func (g *Group) cancel(ctx context.Context) (*subscription, error) {
	if g.cfg.Group == sqlq.QueueGroup { // its messages wait for its consumers, however long they are away
		return nil, fmt.Errorf("%w: a QUEUE topic's consumers cannot be cancelled or removed", ErrInvalidTransition)
	}
	var sub *subscription
	err := g.changeTx(ctx, func(tx pgx.Tx) error {
		var err error
		if sub, err = g.selectSubscription(ctx, tx); err != nil {
			return err
		}
		if sub == nil {
			return fmt.Errorf("%w: group %q has no subscription to %q", ErrNotStarted, g.cfg.Group, g.cfg.Topic)
		}
		if sub.status == Cancelled {
			return nil // a Cancel that failed half-way: only forgetting is left
		}
		if err := g.lockOffset(ctx, tx, sub.id); err != nil {
			return err
		}
		if err := g.lockTopic(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, g.q.SetStatus, pgx.StrictNamedArgs{"sub": sub.id, "status": string(Cancelled)}); err != nil {
			return fmt.Errorf("consumergroup: cancel: %w", err)
		}
		if _, err := tx.Exec(ctx, g.q.RemoveSubscribed, pgx.StrictNamedArgs{"topic": g.cfg.Topic, "bit_mask": mask(sub.bit), "sub": sub.id}); err != nil {
			return fmt.Errorf("consumergroup: cancel: %w", err)
		}
		if _, err := tx.Exec(ctx, g.q.DeleteGroupState, pgx.StrictNamedArgs{"sub": sub.id}); err != nil {
			return fmt.Errorf("consumergroup: cancel: %w", err)
		}
		return nil
	})
	return sub, err
}
