package consumergroup

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/completion"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// beginQuerier is what lifecycle work runs on: the main or the heartbeat pool.
type beginQuerier interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DetectDeadGroups runs dead-group detection for the group's topic once,
// and forgets groups that left (running instances do both every heartbeat
// interval, the maintenance service for every topic). It works on a Group
// value that was never started.
func (g *Group) DetectDeadGroups(ctx context.Context) {
	if _, err := g.maint.detectDeadAndForget(ctx, g.pool, g.cfg.Topic); err != nil && ctx.Err() == nil {
		g.logger.Warn("pgoutbox: dead group detection failed; the next look tries again", slog.Any("error", err))
	}
}

// Cleanup deletes up to limit messages of the topic that every group that
// needs them has finished and that the topic's retention lets go; it
// returns how many it deleted. The maintenance service runs it for every
// topic; safe to run from many instances at once.
func (g *Group) Cleanup(ctx context.Context, limit int) (int64, error) {
	return g.maint.Cleanup(ctx, g.cfg.Topic, limit)
}

// DeadLetters lists the group's dead-lettered messages with id > afterID,
// at most limit of them (outbox.DefaultDeadLetterPage when 0). It works on
// a Group value that was never started, and fails with outbox.ErrNotFound
// when the group has no subscription to its topic.
func (g *Group) DeadLetters(ctx context.Context, afterID int64, limit int) ([]outbox.DeadLetter, error) {
	if limit < 0 {
		return nil, fmt.Errorf("%w: negative limit", outbox.ErrInvalidConfig)
	}
	limit = cmp.Or(limit, outbox.DefaultDeadLetterPage)
	rows, err := g.pool.Query(ctx, g.q.ListDeadLetters, pgx.StrictNamedArgs{
		"topic": g.cfg.Topic, "group_name": g.cfg.Group, "after_id": afterID, "limit": limit,
	})
	if err != nil {
		return nil, fmt.Errorf("consumergroup: dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.DeadLetter, error) {
		dl := outbox.DeadLetter{Delivery: outbox.Delivery{Topic: g.cfg.Topic}}
		var prio int16
		err := r.Scan(&dl.ID, &dl.Payload, &dl.Headers, &dl.CorrelationID, &dl.Group, &prio, &dl.Attempt,
			&dl.CreatedAt, &dl.DeadLetteredAt, &dl.LastError)
		dl.Priority = int(prio)
		return dl, err
	})
	if err != nil {
		return nil, fmt.Errorf("consumergroup: dead letters: %w", err)
	}
	if len(out) == 0 {
		if _, err := g.State(ctx); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ReplayDeadLetters makes the group's dead letters (the given ids, or all)
// deliverable to it again with a fresh attempt budget, and returns how
// many it replayed. It works on a Group value that was never started. It
// fails with outbox.ErrNotFound when the group has no subscription to its
// topic; when ids are given and some are not dead letters of the group,
// the error wraps outbox.ErrNotFound (the others are still replayed).
func (g *Group) ReplayDeadLetters(ctx context.Context, ids ...int64) (int64, error) {
	var filter []int64
	if len(ids) > 0 {
		filter = slices.Compact(slices.Sorted(slices.Values(ids)))
	}
	tag, err := g.pool.Exec(ctx, g.q.ReplayDeadLetters,
		pgx.StrictNamedArgs{"topic": g.cfg.Topic, "group_name": g.cfg.Group, "message_ids": filter})
	if err != nil {
		return 0, fmt.Errorf("consumergroup: replay: %w", err)
	}
	n := tag.RowsAffected()
	return n, g.deadLettersFound(ctx, n, filter)
}

// DiscardDeadLetters deletes the group's dead letters (the given ids, or
// all) and returns how many it deleted: the group gives up on those
// messages. On an ordered topic that blocks message groups on dead letters
// (outbox.BlockGroup), that is how a blocked message group goes on
// without its dead letter; ReplayDeadLetters is the other way. It works
// on a Group value that was never started, and fails like
// ReplayDeadLetters on unknown names and ids.
func (g *Group) DiscardDeadLetters(ctx context.Context, ids ...int64) (int64, error) {
	var filter []int64
	if len(ids) > 0 {
		filter = slices.Compact(slices.Sorted(slices.Values(ids)))
	}
	topic, err := g.client.Topic(ctx, g.cfg.Topic)
	if err != nil {
		return 0, err
	}
	var n int64
	err = pgx.BeginTxFunc(ctx, g.pool, sqlq.ShortTx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, g.q.DiscardDeadLetters,
			pgx.StrictNamedArgs{"topic": g.cfg.Topic, "group_name": g.cfg.Group, "message_ids": filter})
		if err != nil {
			return err
		}
		sub := completion.Subscription{Topic: g.cfg.Topic, Group: g.cfg.Group}
		var gone []int64
		var id int64
		if _, err := pgx.ForEachRow(rows, []any{&sub.ID, &sub.Bit, &id}, func() error {
			gone = append(gone, id)
			return nil
		}); err != nil {
			return err
		}
		n = int64(len(gone))
		if n == 0 {
			return nil
		}
		// Completed, so that cleanup may delete the message (a dead letter
		// not yet completed by maintenance would otherwise hold it), by
		// its own record (none for an Offset message: the group's
		// position is past it): the topic's mode may have changed since
		// it was read.
		tracker, err := completion.NewMixed(topic.Tracking, g.q)
		if err != nil {
			return err
		}
		slices.Sort(gone)
		return tracker.Complete(ctx, tx, sub, gone)
	})
	if err != nil {
		return 0, fmt.Errorf("consumergroup: discard dead letters: %w", err)
	}
	return n, g.deadLettersFound(ctx, n, filter)
}

// deadLettersFound is the error of a dead-letter action that changed n of
// the dead letters filter names (all of the group's when nil): nil, or
// one that wraps outbox.ErrNotFound for an unknown group or ids that are
// not its dead letters.
func (g *Group) deadLettersFound(ctx context.Context, n int64, filter []int64) error {
	if n < int64(len(filter)) || n == 0 {
		if _, err := g.State(ctx); err != nil {
			return err
		}
	}
	if n < int64(len(filter)) {
		return fmt.Errorf("%w: %d of %d ids are not dead letters of group %q of %q",
			outbox.ErrNotFound, int64(len(filter))-n, len(filter), g.cfg.Group, g.cfg.Topic)
	}
	return nil
}

// BlockedGroups lists up to limit (outbox.DefaultBlockedGroupsPage when 0)
// message groups that hold this group back on an ordered topic, the
// longest blocked first: each one's oldest queued message failed and
// waits for its retry, or was dead-lettered on a topic that blocks
// message groups on dead letters (outbox.BlockGroup). A topic that is not
// ordered has none. It reads an index of failed messages, not the queue,
// and counts the messages queued behind each head. It works on a Group
// value that was never started, and fails with outbox.ErrNotFound when
// the group has no subscription to its topic.
func (g *Group) BlockedGroups(ctx context.Context, limit int) ([]outbox.BlockedGroup, error) {
	if limit < 0 {
		return nil, fmt.Errorf("%w: negative limit", outbox.ErrInvalidConfig)
	}
	topic, err := g.client.Topic(ctx, g.cfg.Topic)
	if err != nil {
		return nil, err
	}
	if _, err := g.State(ctx); err != nil {
		return nil, err
	}
	if !topic.Ordered {
		return nil, nil
	}
	rows, err := g.pool.Query(ctx, g.q.BlockedMessageGroups, pgx.StrictNamedArgs{
		"topic": g.cfg.Topic, "group_name": g.cfg.Group,
		"dead_letter_blocks": topic.OrderedDeadLetters == outbox.BlockGroup,
		"limit":              cmp.Or(limit, outbox.DefaultBlockedGroupsPage),
	})
	if err != nil {
		return nil, fmt.Errorf("consumergroup: blocked groups: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.BlockedGroup, error) {
		var b outbox.BlockedGroup
		err := r.Scan(&b.Group, &b.HeadID, &b.Attempts, &b.LastError, &b.Since, &b.DeadLettered, &b.Behind)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("consumergroup: blocked groups: %w", err)
	}
	return out, nil
}

// Resurrect brings a DEAD group back. With backfill it is Resume: the
// group's new messages flow at once, and a backfill delivers beside them,
// up to MaxBackfill, every stored message it had not completed. Without,
// the group starts from now: the messages it had not completed when it
// died and those written while it was DEAD are not delivered to it and
// wait for it no more (cleanup may delete them once the other groups are
// done); its retries and dead letters stay. It fails with
// ErrInvalidTransition unless the group is DEAD, and works on a Group
// value that was never started.
func (g *Group) Resurrect(ctx context.Context, backfill bool) error {
	if !backfill {
		if err := g.releaseOwed(ctx); err != nil {
			return err
		}
	}
	return g.changeTx(ctx, func(tx pgx.Tx) error {
		sub, err := g.deadSubscription(ctx, tx)
		if err != nil {
			return err
		}
		if backfill {
			return g.resurrectTx(ctx, tx, sub, g.subscriptionOptions())
		}
		return g.resurrectFromNowTx(ctx, tx, sub)
	})
}

// subscriptionRef reads the group's subscription (ErrNotFound: none).
func (g *Group) subscriptionRef(ctx context.Context) (completion.Subscription, error) {
	var sub completion.Subscription
	err := pgx.BeginTxFunc(ctx, g.pool, sqlq.ShortTx, func(tx pgx.Tx) error {
		s, err := g.foundSubscription(ctx, tx)
		if err == nil {
			sub = s.ref(g.cfg.Topic, g.cfg.Group)
		}
		return err
	})
	return sub, err
}

// foundSubscription is selectSubscription that fails with ErrNotFound
// when the group has none.
func (g *Group) foundSubscription(ctx context.Context, tx pgx.Tx) (*subscription, error) {
	sub, err := g.selectSubscription(ctx, tx)
	if err == nil && sub == nil {
		err = fmt.Errorf("%w: group %q has no subscription to %q", outbox.ErrNotFound, g.cfg.Group, g.cfg.Topic)
	}
	return sub, err
}

// deadSubscription reads and locks the group's subscription, which must
// be DEAD.
func (g *Group) deadSubscription(ctx context.Context, tx pgx.Tx) (*subscription, error) {
	sub, err := g.foundSubscription(ctx, tx)
	if err == nil && sub.status != Dead {
		err = fmt.Errorf("%w: %s → %s by resurrection (group %q); only a DEAD group comes back",
			ErrInvalidTransition, sub.status, Active, g.cfg.Group)
	}
	return sub, err
}

// mixedTracker returns the tracker that completes and forgets the
// group's messages by each one's own record, whatever mode the topic had
// when each was written (an operator's action reads the topic's mode
// outside its transactions: a change may race it).
func (g *Group) mixedTracker(ctx context.Context) (*completion.Mixed, error) {
	topic, err := g.client.Topic(ctx, g.cfg.Topic)
	if err != nil {
		return nil, err
	}
	if !onLog(topic) {
		return nil, fmt.Errorf("%w: %q is a %s topic", outbox.ErrWrongSemantics, g.cfg.Topic, topic.Semantics)
	}
	return completion.NewMixed(topic.Tracking, g.q)
}

// releaseOwed drops the DEAD group from every stored message it had not
// completed, in batches, each under the subscription row's lock: a DEAD
// group requires no message written since it died, so afterwards none
// waits for it.
func (g *Group) releaseOwed(ctx context.Context) error {
	tracker, err := g.mixedTracker(ctx)
	if err != nil {
		return err
	}
	for {
		var n int64
		err := pgx.BeginTxFunc(ctx, g.pool, sqlq.ShortTx, func(tx pgx.Tx) error {
			sub, err := g.deadSubscription(ctx, tx)
			if err != nil {
				return err
			}
			n, err = tracker.Forget(ctx, tx, sub.ref(g.cfg.Topic, g.cfg.Group), false, forgetBatch)
			return err
		})
		if err != nil || n == 0 {
			return err
		}
	}
}

// resurrectFromNowTx makes DEAD subscription sub ACTIVE and subscribed
// again, its stream starting now (see Resurrect). sub is locked.
func (g *Group) resurrectFromNowTx(ctx context.Context, tx pgx.Tx, sub *subscription) error {
	if err := g.lockOffset(ctx, tx, sub.id); err != nil {
		return err
	}
	if err := g.lockTopic(ctx, tx); err != nil {
		return err
	}
	for _, step := range []struct {
		sql  string
		args pgx.StrictNamedArgs
	}{
		{g.q.SetStatus, pgx.StrictNamedArgs{"sub": sub.id, "status": string(Active)}},
		{g.q.AddSubscribed, pgx.StrictNamedArgs{"topic": g.cfg.Topic, "bit_mask": mask(sub.bit), "sub": sub.id}},
		{g.q.ResurrectFromNow, pgx.StrictNamedArgs{"sub": sub.id}},
	} {
		if _, err := tx.Exec(ctx, step.sql, step.args); err != nil {
			return fmt.Errorf("consumergroup: resurrect: %w", err)
		}
	}
	g.logger.Warn("pgoutbox: consumer group came back from DEAD without a backfill; it starts from now, and what it had not completed is not delivered to it")
	return nil
}

// ForceComplete gives up the group's messages written more than olderThan
// ago that it has not completed, so they no longer hold cleanup back: the
// group's retries and dead letters of them are dropped, each stored one
// is recorded as completed by the group, and its read position moves past
// those it had not read (when no batch of it is open: it is meant for a
// group that holds old messages back, DEAD within its ZombieTTL, PAUSED
// or stuck; a group whose instances are busy may still receive those its
// position had not passed). A retry an instance is handling is left
// alone. It returns how many retries, dead letters and per-message
// records it gave up (Offset mode records nothing per message: there the
// moved position alone lets its messages go). It works on a Group value
// that was never started.
func (g *Group) ForceComplete(ctx context.Context, olderThan time.Duration) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: negative age %s", outbox.ErrInvalidConfig, olderThan)
	}
	tracker, err := g.mixedTracker(ctx)
	if err != nil {
		return 0, err
	}
	var xmax string
	var cutoff time.Time
	if err := g.pool.QueryRow(ctx, g.q.SnapshotXmax).Scan(&xmax, &cutoff); err != nil {
		return 0, fmt.Errorf("consumergroup: force complete: %w", err)
	}
	if now := g.now(); now != nil {
		cutoff = *now
	}
	cutoff = cutoff.Add(-olderThan)
	// Where the position may move to is decided first: every message it
	// will pass has committed by then, so the passes below see each one,
	// with the group's bit as it is by then.
	sub, err := g.subscriptionRef(ctx)
	if err != nil {
		return 0, err
	}
	var target string
	if err := g.pool.QueryRow(ctx, g.q.ForceTarget,
		pgx.StrictNamedArgs{"sub": sub.ID, "topic": g.cfg.Topic, "before": cutoff}).Scan(&target); err != nil {
		return 0, fmt.Errorf("consumergroup: force complete: %w", err)
	}
	if sub, err = g.subscriptionRef(ctx); err != nil {
		return 0, err
	}
	var total, retries int64
	// complete runs sql, which returns message ids, and records them as
	// completed by the group in the same transaction.
	complete := func(sql string, args pgx.StrictNamedArgs) ([]int64, error) {
		var ids []int64
		err := pgx.BeginTxFunc(ctx, g.pool, sqlq.ShortTx, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, sql, args)
			if err != nil {
				return err
			}
			if ids, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil || len(ids) == 0 {
				return err
			}
			slices.Sort(ids)
			return tracker.Complete(ctx, tx, sub, ids)
		})
		if err != nil {
			return nil, fmt.Errorf("consumergroup: force complete: %w", err)
		}
		total += int64(len(ids))
		return ids, nil
	}
	for {
		ids, err := complete(g.q.ForceCompleteRetries,
			pgx.StrictNamedArgs{"sub": sub.ID, "before": cutoff, "limit": forceBatch})
		if err != nil {
			return total, err
		}
		retries += int64(len(ids))
		if len(ids) < forceBatch {
			break
		}
	}
	for after := int64(0); ; {
		ids, err := complete(g.q.ForceCompleteRows, pgx.StrictNamedArgs{
			"topic": g.cfg.Topic, "before": cutoff, "bit_mask": sub.Mask(), "sub": sub.ID,
			"after_id": after, "limit": forceBatch,
		})
		if err != nil {
			return total, err
		}
		if len(ids) < forceBatch {
			break
		}
		after = ids[len(ids)-1]
	}
	// Its position passes them too, where it can (no batch open): the
	// scan bound of cleanup, and in Offset mode the watermark, go by it.
	var moved bool
	err = pgx.BeginTxFunc(ctx, g.pool, sqlq.ShortTx, func(tx pgx.Tx) error {
		if err := g.lockOffset(ctx, tx, sub.ID); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, g.q.ForceAdvance, pgx.StrictNamedArgs{"sub": sub.ID, "target": target})
		moved = tag.RowsAffected() > 0
		return err
	})
	if err != nil {
		return total, fmt.Errorf("consumergroup: force complete: %w", err)
	}
	g.logger.Warn("pgoutbox: messages force-completed for the group; it will not receive them",
		slog.Int64("messages", total), slog.Int64("retries_and_dead_letters", retries), slog.Time("written_before", cutoff),
		slog.Bool("position_moved", moved))
	return total, nil
}

// forceBatch is how many messages one ForceComplete statement takes.
const forceBatch = 1000
