package maintenance

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// deadGroups declares DEAD the ACTIVE groups whose heartbeats stopped, on
// every topic that has one, and forgets the groups whose claims ran out
// (CANCELLED, or DEAD past the topic's ZombieTTL). Safe with many
// instances: candidates are locked FOR UPDATE SKIP LOCKED, and a group
// fetching right now (its position row locked) is not dead.
func (s *Service) deadGroups(ctx context.Context, _ *job, r *Report) error {
	stale, err := s.topics(ctx, s.q.StaleTopics)
	if err != nil {
		return err
	}
	var errs []error
	for _, topic := range stale {
		dead, err := s.groups.DetectDead(ctx, topic)
		errs = append(errs, err)
		for _, g := range dead {
			r.DeadGroups = append(r.DeadGroups, topic+"/"+g)
		}
		s.metrics.deadGroups.Add(ctx, int64(len(dead)))
	}
	forget, err := s.topics(ctx, s.q.ForgetTopics)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, topic := range forget {
		errs = append(errs, s.groups.ForgetPending(ctx, topic))
	}
	return errors.Join(errs...)
}

// topics runs a statement listing topic names.
func (s *Service) topics(ctx context.Context, query string) ([]string, error) {
	stmt, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	defer cancel()
	rows, err := s.pool.Query(stmt, query)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
