package consumergroup

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/backoff"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/pubsub"
)

// retryDelay is the handler's RetryAfter delay, else the topic's backoff.
func retryDelay(err error, attempt int, topic outbox.TopicConfig) time.Duration {
	if d, ok := outbox.RetryDelay(err); ok {
		return d
	}
	return backoff.Exponential(attempt, topic.BackoffInitial, topic.BackoffMax)
}

// detectDead marks ACTIVE groups of the topic whose heartbeats stopped as
// DEAD, takes them out of the subscribed set, and removes them from the
// required sets of the messages they had not finished. Safe when many
// instances run it at once (SKIP LOCKED, idempotent updates).
func (g *Group) detectDead(ctx context.Context, pool *pgxpool.Pool) {
	// Most beats find nobody dead: check without taking the topic row's lock,
	// which every insert reads.
	var found bool
	if err := pool.QueryRow(ctx, g.q.AnyDeadCandidate, g.cfg.Topic).Scan(&found); err != nil || !found {
		if err != nil && ctx.Err() == nil {
			g.logger.Error("pgoutbox: dead group detection failed", slog.Any("error", err))
		}
		return
	}
	var dead []subscriptionRef
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var semantics, tracking string
		if err := tx.QueryRow(ctx, g.q.LockTopic, g.cfg.Topic).Scan(&semantics, &tracking); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, g.q.DeadCandidates, g.cfg.Topic)
		if err != nil {
			return err
		}
		var ref subscriptionRef
		if _, err := pgx.ForEachRow(rows, []any{&ref.id, &ref.bit}, func() error { dead = append(dead, ref); return nil }); err != nil {
			return err
		}
		for _, d := range dead {
			if _, err := tx.Exec(ctx, g.q.SetStatus, d.id, string(Dead)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, g.q.RemoveSubscribed, g.cfg.Topic, mask(d.bit), d.id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		if ctx.Err() == nil {
			g.logger.Error("pgoutbox: dead group detection failed", slog.Any("error", err))
		}
		return
	}
	for _, d := range dead {
		g.logger.Warn("pgoutbox: consumer group is DEAD (no heartbeat within its timeout)", slog.Int64("subscription", d.id))
		if err := g.forgetAll(ctx, d, false); err != nil {
			g.logger.Error("pgoutbox: releasing a dead group's messages failed", slog.Any("error", err))
		}
	}
}

// DetectDeadGroups runs dead-group detection for the group's topic once
// (running instances do it every heartbeat interval).
func (g *Group) DetectDeadGroups(ctx context.Context) { g.detectDead(ctx, g.pool) }

// Cleanup deletes up to limit messages of the topic that every group that
// needs them has finished and that the topic's retention lets go; it
// returns how many it deleted. Safe to run from many instances at once.
func (g *Group) Cleanup(ctx context.Context, limit int) (int64, error) {
	topic, err := g.client.Topic(ctx, g.cfg.Topic)
	if err != nil {
		return 0, err
	}
	if topic.Semantics != outbox.PubSub {
		return 0, fmt.Errorf("%w: %q", outbox.ErrWrongSemantics, g.cfg.Topic)
	}
	tracker, err := pubsub.New(topic.Tracking, g.schema)
	if err != nil {
		return 0, err
	}
	return tracker.Cleanup(ctx, g.pool, g.cfg.Topic, pubsub.Retention{Now: g.now(), Completed: topic.Retention,
		ZeroSubscription: topic.ZeroSubscriptionRetention}, limit)
}

// DeadLetters lists the group's dead-lettered messages with id > afterID.
func (g *Group) DeadLetters(ctx context.Context, afterID int64, limit int) ([]outbox.DeadLetter, error) {
	if limit <= 0 {
		limit = outbox.DefaultDeadLetterPage
	}
	rows, err := g.pool.Query(ctx, g.q.ListDeadLetters, g.sub.ID, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("consumergroup: dead letters: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.DeadLetter, error) {
		dl := outbox.DeadLetter{Delivery: outbox.Delivery{Topic: g.cfg.Topic}}
		var prio int16
		err := r.Scan(&dl.ID, &dl.Payload, &dl.Headers, &dl.CorrelationID, &dl.Group, &prio, &dl.Attempt,
			&dl.CreatedAt, &dl.DeadLetteredAt, &dl.LastError)
		dl.Priority = int(prio)
		return dl, err
	})
}

// ReplayDeadLetters makes the group's dead letters (the given ids, or all)
// deliverable to it again with a fresh attempt budget.
func (g *Group) ReplayDeadLetters(ctx context.Context, ids ...int64) (int64, error) {
	var filter []int64
	if len(ids) > 0 {
		filter = ids
	}
	tag, err := g.pool.Exec(ctx, g.q.ReplayDeadLetters, g.sub.ID, filter)
	if err != nil {
		return 0, fmt.Errorf("consumergroup: replay: %w", err)
	}
	return tag.RowsAffected(), nil
}
