package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/jackc/pgx/v5"
)

// cleanup deletes, in batches until a batch is not full:
//   - on every topic on the log (PUB_SUB topics, and QUEUE topics whose
//     messages live there), the messages every group holding claims
//     finished, past the topic's retention (and records the Offset
//     watermark), then the messages past its MaxRetention whoever holds
//     them, counting per group those it had not finished;
//   - dead letters past DeadLetterRetention (a dead letter first gets a
//     copy of its message, so none is lost with its message row);
//   - expired idempotency keys and inbox keys (package inbox);
//   - Counter dedupe rows whose message is gone (a sweep over the table,
//     one batch per pass).
//
// Safe with many instances: every delete takes its rows FOR UPDATE SKIP
// LOCKED, and topic cleanups run under the topic's lock in shared mode
// (like producers), so subscription changes never interleave with them.
func (s *Service) cleanup(ctx context.Context, j *job, r *Report) error {
	var errs []error
	stmt, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	_, err := s.pool.Exec(stmt, s.q.CopyDeadLetters, pgx.StrictNamedArgs{"sub": nil}) // of every group
	cancel()
	errs = append(errs, err)

	topics, err := s.pubsubTopics(ctx)
	errs = append(errs, err)
	for _, t := range topics {
		n, err := s.drain(ctx, j, func(ctx context.Context, limit int) (int64, error) {
			return s.groups.CleanupOlder(ctx, t.name, limit, s.cfg.RowCleanupDelay)
		})
		r.deleted("outbox_published", n)
		s.metrics.deleted.Add(ctx, n, s.metrics.attrs("cleanup", "outbox_published"))
		errs = append(errs, err)
		errs = append(errs, s.capRetention(ctx, j, r, t))
	}

	for _, d := range []struct {
		table, query string
		args         pgx.StrictNamedArgs // all but @batch_size, which each batch sets
	}{
		{"outbox_group_retries", s.q.ExpireGroupDeadLetters,
			pgx.StrictNamedArgs{"retention_us": s.cfg.DeadLetterRetention.Microseconds()}},
		{"outbox_idempotency_keys", s.q.ExpireIdempotencyKeys, pgx.StrictNamedArgs{"now": s.cfg.Client.Now()}},
		{"outbox_inbox", s.q.ExpireInbox, pgx.StrictNamedArgs{"now": s.cfg.Client.Now()}},
	} {
		n, err := s.drain(ctx, j, func(ctx context.Context, limit int) (int64, error) {
			args := pgx.StrictNamedArgs{"batch_size": limit}
			maps.Copy(args, d.args)
			tag, err := s.pool.Exec(ctx, d.query, args)
			return tag.RowsAffected(), err
		})
		r.deleted(d.table, n)
		s.metrics.deleted.Add(ctx, n, s.metrics.attrs("cleanup", d.table))
		errs = append(errs, err)
	}
	errs = append(errs, s.counterOrphans(ctx, j, r))
	return errors.Join(errs...)
}

type pubsubTopic struct {
	name, mode   string
	maxRetention time.Duration
	dedupe       bool // messages may have Counter dedupe rows (Counter mode, or a mode change)
}

func (s *Service) pubsubTopics(ctx context.Context) ([]pubsubTopic, error) {
	stmt, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	defer cancel()
	rows, err := s.pool.Query(stmt, s.q.PubSubTopics)
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (pubsubTopic, error) {
		var t pubsubTopic
		var us int64
		err := row.Scan(&t.name, &t.mode, &us)
		t.maxRetention = time.Duration(us) * time.Microsecond
		return t, err
	})
}

// capRetention deletes t's messages past its MaxRetention and reports, per
// group, those it had not finished: in the report and a metric each pass,
// and in a WARN per topic and group at most daily (by the client's
// clock), with the count since the last one.
func (s *Service) capRetention(ctx context.Context, j *job, r *Report, t pubsubTopic) error {
	lost := map[string]int64{}
	n, err := s.drain(ctx, j, func(ctx context.Context, limit int) (int64, error) {
		n, unread, err := s.groups.CapRetention(ctx, t.name, limit)
		for g, c := range unread {
			lost[g] += c
		}
		return n, err
	})
	r.deleted("outbox_published", n)
	s.metrics.deleted.Add(ctx, n, s.metrics.attrs("retention-cap", "outbox_published"))
	for g, c := range lost {
		if r.DroppedUnread == nil {
			r.DroppedUnread = map[string]int64{}
		}
		r.DroppedUnread[t.name+"/"+g] += c
		s.metrics.droppedUnread.Add(ctx, c, s.metrics.groupAttrs(t.name, g))
		s.daily.Sum(slog.LevelWarn, "dropped-unread|"+t.name+"|"+g,
			"pgoutbox: messages older than the topic's MaxRetention were deleted before this group finished them; it will not receive them",
			"messages", c, slog.String("topic", t.name), slog.String("group", g), slog.Duration("max_retention", t.maxRetention))
	}
	return err
}

// counterOrphans deletes one batch of a sweep over the Counter dedupe
// table: rows of messages that are gone. The sweep's position is kept
// between passes and starts over at the end.
func (s *Service) counterOrphans(ctx context.Context, j *job, r *Report) error {
	stmt, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	defer cancel()
	var next *int64
	var n int64
	if err := s.pool.QueryRow(stmt, s.q.CounterOrphans,
		pgx.StrictNamedArgs{"after_id": s.orphanCursor.Load(), "batch_size": j.batchSize()}).Scan(&next, &n); err != nil {
		return fmt.Errorf("counter orphans: %w", err)
	}
	if next == nil {
		s.orphanCursor.Store(0) // the end: the next sweep starts over
	} else {
		s.orphanCursor.Store(*next)
	}
	r.deleted("outbox_consumer_groups", n)
	s.metrics.deleted.Add(ctx, n, s.metrics.attrs("cleanup", "outbox_consumer_groups"))
	return nil
}
