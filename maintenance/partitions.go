package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// partitions keeps outbox_published's range partitions ahead of the
// transactions that write into them, and drops those whose messages are
// all done. Safe with many instances: each step runs under the schema's
// partition lock (a transaction-scoped advisory lock), and an instance
// that finds it taken skips the step.
func (s *Service) partitions(ctx context.Context, _ *job, r *Report) error {
	return errors.Join(s.createAhead(ctx, r), s.dropDone(ctx, r))
}

// queryer is a pool or a transaction.
type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// partition is a row of outbox_partitions.
type partition struct {
	id         int64
	lo, hi     uint64
	createdAt  time.Time
	createdXid uint64
	sealedAt   *time.Time // nil until a pass saw it sealed
}

func (p partition) bounds() (lo, hi string) {
	return strconv.FormatUint(p.lo, 10), strconv.FormatUint(p.hi, 10)
}

// clock is what the database says about transaction ids now.
type clock struct {
	xmin uint64 // every xid below it has finished
	next uint64 // the next xid to be assigned
	now  time.Time
}

func (s *Service) readClock(ctx context.Context, db queryer) (clock, error) {
	var xmin, next string
	var c clock
	if err := db.QueryRow(ctx, s.pq.Clock).Scan(&xmin, &next, &c.now); err != nil {
		return clock{}, fmt.Errorf("partitions: read clock: %w", err)
	}
	var err1, err2 error
	c.xmin, err1 = strconv.ParseUint(xmin, 10, 64)
	c.next, err2 = strconv.ParseUint(next, 10, 64)
	return c, errors.Join(err1, err2)
}

func (s *Service) listPartitions(ctx context.Context, db queryer) ([]partition, error) {
	rows, err := db.Query(ctx, s.pq.List)
	if err != nil {
		return nil, fmt.Errorf("partitions: list: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (partition, error) {
		var p partition
		var lo, hi, createdXid string
		if err := row.Scan(&p.id, &lo, &hi, &p.createdAt, &createdXid, &p.sealedAt); err != nil {
			return p, err
		}
		var err1, err2, err3 error
		p.lo, err1 = strconv.ParseUint(lo, 10, 64)
		p.hi, err2 = strconv.ParseUint(hi, 10, 64)
		p.createdXid, err3 = strconv.ParseUint(createdXid, 10, 64)
		return p, errors.Join(err1, err2, err3)
	})
}

// Partition sizes, in transaction ids.
const (
	// minPartitionXids is the least a partition sized by the rate spans.
	minPartitionXids = 1_000
	// initialPartitionXids is what the first partitions span, before a
	// rate is known.
	initialPartitionXids = 1_000_000
	// maxPartitionXids is the most: far below the 2^31 transactions
	// after which PostgreSQL forces a wraparound vacuum.
	maxPartitionXids = 1 << 28
	// maxCreatesPerPass bounds how many partitions one pass adds.
	maxCreatesPerPass = 8
)

// width is how many transaction ids the next partition spans:
// PartitionSize if set, else as many as the database assigns in
// PartitionSpan at the rate measured since last was created, or, when that
// was too recent to tell or there is no last (the zero partition),
// initialPartitionXids or last's width if larger.
func (s *Service) width(last partition, c clock) uint64 {
	if s.cfg.PartitionSize > 0 {
		return max(uint64(s.cfg.PartitionSize), 1)
	}
	w := max(last.hi-last.lo, initialPartitionXids)
	if elapsed := c.now.Sub(last.createdAt); !last.createdAt.IsZero() && elapsed >= 10*time.Second && c.next > last.createdXid {
		rate := float64(c.next-last.createdXid) / elapsed.Seconds()
		w = uint64(rate * s.cfg.PartitionSpan.Seconds())
	}
	return min(max(w, minPartitionXids), maxPartitionXids)
}

// createAhead adds range partitions until they reach two partition widths
// past the next transaction id.
func (s *Service) createAhead(ctx context.Context, r *Report) error {
	for range maxCreatesPerPass {
		var created bool
		err := s.withDDLRetries(ctx, func(ctx context.Context, tx pgx.Tx) error {
			var err error
			created, err = s.createOne(ctx, tx)
			return err
		})
		if err != nil || !created {
			return err
		}
		r.PartitionsCreated++
		s.metrics.partitions.Add(ctx, 1, s.metrics.actionAttrs("created"))
	}
	return nil
}

// createOne adds the next range partition if the last one ends less than
// two widths past the next transaction id, reporting whether it did.
func (s *Service) createOne(ctx context.Context, tx pgx.Tx) (bool, error) {
	c, err := s.readClock(ctx, tx)
	if err != nil {
		return false, err
	}
	parts, err := s.listPartitions(ctx, tx)
	if err != nil {
		return false, err
	}
	// With none left (every range partition was dropped: the transaction
	// ids went past the last one before a pass added the next, as passes
	// of two instances can each find the other dropping and skip adding),
	// last is the zero partition: messages went to the default partition
	// meanwhile, and the ranges start again ahead of the next transaction
	// id (see the margin below).
	var last partition
	if len(parts) > 0 {
		last = parts[len(parts)-1]
	}
	w := s.width(last, c)
	if last.hi >= c.next+2*w {
		return false, nil
	}
	lo := last.hi
	if margin := max(w/100, minPartitionXids); lo < c.next+margin {
		// The database went past the last partition, or nearly (no
		// maintenance ran for a while): rows past it are in the default
		// partition, which the new range must not overlap, and neither
		// may the transactions that start while this one attaches it.
		lo = c.next + margin
	}
	hi := lo + w
	var id int64
	if err := tx.QueryRow(ctx, s.pq.Insert,
		pgx.StrictNamedArgs{"lo": strconv.FormatUint(lo, 10), "hi": strconv.FormatUint(hi, 10)}).Scan(&id); err != nil {
		return false, fmt.Errorf("partitions: record: %w", err)
	}
	for _, ddl := range s.pq.Create(id, lo, hi) {
		if _, err := tx.Exec(ctx, ddl); err != nil {
			return false, fmt.Errorf("partitions: create outbox_published_p%d: %w", id, err)
		}
	}
	return true, nil
}

// dropDone drops, oldest first, every sealed partition (no transaction
// that could still write into it is running; the first pass that sees it
// so records when) whose messages every topic is done with: finished by
// every group holding claims on them, and the topic's retention passed
// since it was sealed.
func (s *Service) dropDone(ctx context.Context, r *Report) error {
	stmt, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	c, err := s.readClock(stmt, s.pool)
	var parts []partition
	if err == nil {
		parts, err = s.listPartitions(stmt, s.pool)
	}
	cancel()
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range parts {
		if p.hi > c.xmin {
			break // not sealed, and neither are the ones after it
		}
		if p.sealedAt == nil {
			stmt, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
			err := s.pool.QueryRow(stmt, s.pq.Seal, pgx.StrictNamedArgs{"partition_id": p.id}).Scan(&p.sealedAt)
			cancel()
			if errors.Is(err, pgx.ErrNoRows) {
				continue // another instance dropped it
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("partitions: seal outbox_published_p%d: %w", p.id, err))
				continue
			}
		}
		dropped, holder, err := s.dropPartition(ctx, p, *p.sealedAt)
		switch {
		case err != nil:
			errs = append(errs, err)
		case holder != "":
			if r.PartitionsKept == nil {
				r.PartitionsKept = map[string]string{}
			}
			r.PartitionsKept["outbox_published_p"+strconv.FormatInt(p.id, 10)] = holder
		case dropped:
			r.PartitionsDropped = append(r.PartitionsDropped, "outbox_published_p"+strconv.FormatInt(p.id, 10))
			s.metrics.partitions.Add(ctx, 1, s.metrics.actionAttrs("dropped"))
		}
	}
	return errors.Join(errs...)
}

// dropPartition drops p unless a topic still holds one of its messages,
// which it then returns. It reports whether it dropped p: not when another
// instance did.
func (s *Service) dropPartition(ctx context.Context, p partition, sealed time.Time) (dropped bool, holder string, err error) {
	topics, err := s.partitionTopics(ctx, s.pool, p)
	if isUndefinedTable(err) {
		return false, "", nil // another instance dropped it
	}
	if err != nil {
		return false, "", err
	}
	for _, t := range topics {
		// Dead letters keep a copy of their message and stop holding it.
		if err := s.groups.CompleteDeadLetters(ctx, t.name); err != nil && !errors.Is(err, outbox.ErrUnknownTopic) {
			return false, "", err
		}
	}
	lo, hi := p.bounds()
	err = s.withDDLRetries(ctx, func(ctx context.Context, tx pgx.Tx) error {
		dropped, holder = false, ""
		var listed bool
		if err := tx.QueryRow(ctx, s.pq.Listed, pgx.StrictNamedArgs{"partition_id": p.id}).Scan(&listed); err != nil || !listed {
			return err // another instance dropped it
		}
		c, err := s.readClock(ctx, tx) // what was written from its xmin on is checked again under the lock
		if err != nil {
			return err
		}
		before := strconv.FormatUint(c.xmin, 10)
		topics, err := s.partitionTopics(ctx, tx, p)
		if err != nil {
			return err
		}
		counter := false
		for _, t := range topics {
			held, err := s.groups.PartitionHeld(ctx, tx, t.name, lo, hi, sealed)
			if err != nil {
				return err
			}
			if held {
				holder = t.name
				return errKept
			}
			counter = counter || t.dedupe
		}
		if counter {
			if _, err := tx.Exec(ctx, s.pq.ForgetCompletions(p.id)); err != nil {
				return fmt.Errorf("partitions: completions of outbox_published_p%d: %w", p.id, err)
			}
		}
		if _, err := tx.Exec(ctx, s.pq.LockParent); err != nil {
			return fmt.Errorf("partitions: drop outbox_published_p%d: %w", p.id, err)
		}
		var written bool
		if err := tx.QueryRow(ctx, s.pq.WrittenSince(p.id), pgx.StrictNamedArgs{"xmin": before}).Scan(&written); err != nil {
			return fmt.Errorf("partitions: drop outbox_published_p%d: %w", p.id, err)
		}
		if written {
			holder = writtenWhileChecked
			return errKept
		}
		if _, err := tx.Exec(ctx, s.pq.Drop(p.id)); err != nil {
			return fmt.Errorf("partitions: drop outbox_published_p%d: %w", p.id, err)
		}
		if _, err = tx.Exec(ctx, s.pq.Forget, pgx.StrictNamedArgs{"partition_id": p.id}); err != nil {
			return err
		}
		dropped = true
		return nil
	})
	if errors.Is(err, errKept) {
		return false, holder, nil
	}
	return dropped && err == nil, "", err
}

// writtenWhileChecked is the holder reported for a partition written to
// while it was checked (see sqlq.Partitions.WrittenSince).
const writtenWhileChecked = "(written to while checked)"

// errKept rolls back a drop that found its partition still held.
var errKept = errors.New("partition kept")

// partitionTopics lists the topics (and their tracking modes) with a row
// in p.
func (s *Service) partitionTopics(ctx context.Context, db queryer, p partition) ([]pubsubTopic, error) {
	stmt, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	defer cancel()
	rows, err := db.Query(stmt, s.pq.Topics(p.id))
	if err != nil {
		return nil, fmt.Errorf("partitions: topics of outbox_published_p%d: %w", p.id, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("partitions: topics of outbox_published_p%d: %w", p.id, err)
	}
	out := make([]pubsubTopic, 0, len(names))
	for _, name := range names {
		t := pubsubTopic{name: name}
		if cfg, err := s.cfg.Client.Topic(ctx, name); err == nil {
			t.mode = string(cfg.Tracking)
			t.dedupe = cfg.Tracking == outbox.Counter || cfg.ModeChanging
		}
		out = append(out, t)
	}
	return out, nil
}

// ddlAttempts is how often a partition step is tried in one pass when it
// could not get its locks within PartitionLockTimeout.
const ddlAttempts = 5

// withDDLRetries runs f in a transaction that holds the schema's partition
// lock (or does nothing when another instance holds it) and waits at most
// PartitionLockTimeout for each lock: a long transaction elsewhere that
// holds a lock on outbox_published makes it give up, so inserts never
// queue behind it for longer. The whole transaction is bounded by
// StatementTimeout (f's ctx). It retries a few times, after a growing
// pause, then leaves the step to the next pass.
func (s *Service) withDDLRetries(ctx context.Context, f func(ctx context.Context, tx pgx.Tx) error) error {
	var err error
	for attempt := range ddlAttempts {
		if attempt > 0 && !sleep(ctx, jittered(time.Duration(attempt)*s.cfg.PartitionLockTimeout*4)) {
			return ctx.Err()
		}
		stmt, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
		err = pgx.BeginFunc(stmt, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(stmt, sqlq.SetLockTimeout(s.cfg.PartitionLockTimeout.Milliseconds())); err != nil {
				return err
			}
			var mine bool
			if err := tx.QueryRow(stmt, s.pq.Lock).Scan(&mine); err != nil || !mine {
				return err
			}
			return f(stmt, tx)
		})
		cancel()
		if !isLockTimeout(err) {
			return err
		}
	}
	s.events.Log(slog.LevelWarn, "partition-locks", "pgoutbox: a partition step could not get its locks (a long transaction holds outbox_published?); it is tried again next pass",
		slog.Any("error", err))
	return nil
}

// isUndefinedTable reports whether err says a table does not exist.
func isUndefinedTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// isLockTimeout reports whether err is a lock wait cut short by
// lock_timeout.
func isLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}
