package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// subscriptions deletes subscriptions nobody needs any more:
//   - CANCELLED ones released longer ago than SubscriptionRetention, once
//     forgetting is done (a cancel dropped their retries and dead
//     letters already);
//   - DEAD ones released longer ago than SubscriptionRetention with no
//     dead letter left (their dead letters expire first), through the one
//     removal path (consumergroup.Maintainer.RemoveGroup), unless
//     KeepDeadGroups. Each is warned about in the log first, from a
//     warning horizon before it goes: half the retention, at most a day,
//     at least two intervals of this job.
//
// Safe with many instances: candidates are taken FOR UPDATE SKIP LOCKED,
// and a removal of a group already removed finds nothing.
func (s *Service) subscriptions(ctx context.Context, j *job, r *Report) error {
	var errs []error
	n, err := s.drain(ctx, j, func(ctx context.Context, limit int) (int64, error) {
		tag, err := s.pool.Exec(ctx, s.q.CancelledSubscriptions,
			pgx.StrictNamedArgs{"retention_us": s.cfg.SubscriptionRetention.Microseconds(), "batch_size": limit})
		return tag.RowsAffected(), err
	})
	r.deleted("outbox_topic_subscriptions", n)
	s.metrics.deleted.Add(ctx, n, s.metrics.attrs("subscriptions", "outbox_topic_subscriptions"))
	errs = append(errs, err)
	if !s.cfg.KeepDeadGroups {
		errs = append(errs, s.removeDeadGroups(ctx, r))
	}
	return errors.Join(errs...)
}

// deadGroupWarning is how long before its deletion a DEAD group is warned
// about.
func (s *Service) deadGroupWarning() time.Duration {
	return min(s.cfg.SubscriptionRetention/2, max(24*time.Hour, 2*s.cfg.SubscriptionCleanupInterval))
}

func (s *Service) removeDeadGroups(ctx context.Context, r *Report) error {
	stmt, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	rows, err := s.pool.Query(stmt, s.q.DeadGroupsDue, pgx.StrictNamedArgs{
		"warn_after_us": (s.cfg.SubscriptionRetention - s.deadGroupWarning()).Microseconds(),
		"retention_us":  s.cfg.SubscriptionRetention.Microseconds(),
	})
	if err != nil {
		cancel()
		return fmt.Errorf("dead groups due: %w", err)
	}
	type due struct {
		topic, group string
		at           time.Time
		now          bool
	}
	dues, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (due, error) {
		var d due
		return d, row.Scan(&d.topic, &d.group, &d.at, &d.now)
	})
	cancel()
	if err != nil {
		return fmt.Errorf("dead groups due: %w", err)
	}
	var errs []error
	for _, d := range dues {
		if !d.now {
			s.daily.Log(slog.LevelWarn, "dead-group-due|"+d.topic+"|"+d.group,
				"pgoutbox: a DEAD consumer group will be deleted (its subscription, position and name); an instance that comes back later starts as a new group. Set maintenance Config.KeepDeadGroups to keep DEAD groups",
				slog.String("topic", d.topic), slog.String("group", d.group), slog.Time("deleted_after", d.at))
			continue
		}
		if err := s.groups.RemoveGroup(ctx, d.topic, d.group); err != nil {
			errs = append(errs, fmt.Errorf("remove DEAD group %q of %q: %w", d.group, d.topic, err))
			continue
		}
		r.RemovedGroups = append(r.RemovedGroups, d.topic+"/"+d.group)
		s.metrics.deleted.Add(ctx, 1, s.metrics.attrs("subscriptions", "outbox_topic_subscriptions"))
		s.logger.Warn("pgoutbox: a DEAD consumer group was deleted after SubscriptionRetention",
			slog.String("topic", d.topic), slog.String("group", d.group))
	}
	return errors.Join(errs...)
}
