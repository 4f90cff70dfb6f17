package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/backoff"
	"github.com/pgoutbox/pgoutbox/internal/completion"
	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Maintainer does the work that concerns every group of a topic rather
// than one instance: dead-group detection, forgetting groups that left
// (CANCELLED, or DEAD past the topic's ZombieTTL), deleting the messages
// every group finished, the retention cap. It needs no Group and no
// running instance. Every method is safe while other processes run the
// same on the same topic: rows are taken FOR UPDATE SKIP LOCKED or under a
// transaction-scoped lock, and every step is idempotent (nothing holds a
// session-level lock, so it works through transaction pooling).
//
// The maintenance service (package maintenance) runs it for every topic;
// a running group instance runs detection and forgetting for its own.
type Maintainer struct {
	pool   *pgxpool.Pool
	client *outbox.Client
	q      *sqlq.PubSub
	mq     *sqlq.Maintenance
	logger *slog.Logger
}

// NewMaintainer returns a maintainer for the topics of client's schema,
// working through pool. It logs through client's logger.
func NewMaintainer(pool *pgxpool.Pool, client *outbox.Client) (*Maintainer, error) {
	if pool == nil || client == nil {
		return nil, fmt.Errorf("%w: a Maintainer needs a pool and a client", outbox.ErrInvalidConfig)
	}
	schema, err := ident.Schema(client.Schema())
	if err != nil {
		return nil, err
	}
	return newMaintainer(pool, client, schema), nil
}

func newMaintainer(pool *pgxpool.Pool, client *outbox.Client, schema string) *Maintainer {
	return &Maintainer{pool: pool, client: client, q: sqlq.ForPubSub(schema), mq: sqlq.ForMaintenance(schema),
		logger: client.Logger()}
}

type deadGroup struct {
	id   int64
	name string
	bit  int
}

// DetectDead marks the ACTIVE groups of topic whose heartbeats stopped
// (none within their HeartbeatTimeout, by database time) DEAD and takes
// them out of the subscribed set, then forgets the groups whose claims
// ran out. A group whose offsets row a fetch holds is fetching, so not
// dead. It returns the names of the groups it declared DEAD.
func (m *Maintainer) DetectDead(ctx context.Context, topic string) ([]string, error) {
	dead, err := m.detectDeadAndForget(ctx, m.pool, topic)
	names := make([]string, len(dead))
	for i, d := range dead {
		names[i] = d.name
	}
	return names, err
}

func (m *Maintainer) detectDead(ctx context.Context, db beginQuerier, topic string) ([]deadGroup, error) {
	// Most looks find nobody dead: check without taking any lock.
	var found bool
	if err := db.QueryRow(ctx, m.q.AnyDeadCandidate, pgx.StrictNamedArgs{"topic": topic}).Scan(&found); err != nil || !found {
		if err != nil {
			return nil, fmt.Errorf("consumergroup: dead group detection: %w", err)
		}
		return nil, nil
	}
	var dead []deadGroup
	// The topic's lock waits at most topicLockTimeout for producer
	// transactions: a few tries, then the next pass.
	err := backoff.Retry(ctx, 5, 20*time.Millisecond, 500*time.Millisecond, func(err error) bool { return !lockConflict(err) }, func() (err error) {
		dead, err = m.declareDead(ctx, db, topic)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("consumergroup: dead group detection: %w", err)
	}
	for _, d := range dead {
		m.logger.Warn("pgoutbox: consumer group is DEAD (no heartbeat within its timeout); new messages no longer need it, and what it had not finished is kept for it for the topic's ZombieTTL",
			slog.String("topic", topic), slog.String("dead_group", d.name), slog.Int64("subscription", d.id))
	}
	return dead, nil
}

// declareDead declares DEAD, in one transaction, the candidates of topic
// whose offsets row no fetch holds, and returns them.
func (m *Maintainer) declareDead(ctx context.Context, db beginQuerier, topic string) ([]deadGroup, error) {
	var dead []deadGroup
	err := pgx.BeginTxFunc(ctx, db, sqlq.ShortTx, func(tx pgx.Tx) error {
		dead = nil
		rows, err := tx.Query(ctx, m.q.DeadCandidates, pgx.StrictNamedArgs{"topic": topic})
		if err != nil {
			return err
		}
		var cands []deadGroup
		var d deadGroup
		if _, err := pgx.ForEachRow(rows, []any{&d.id, &d.name, &d.bit}, func() error { cands = append(cands, d); return nil }); err != nil {
			return err
		}
		ids := make([]int64, len(cands))
		for i, c := range cands {
			ids[i] = c.id
		}
		rows, err = tx.Query(ctx, m.q.LockOffsetsSkipLocked, pgx.StrictNamedArgs{"subs": ids})
		if err != nil {
			return err
		}
		locked, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return err
		}
		for _, c := range cands {
			for _, id := range locked {
				if id == c.id {
					dead = append(dead, c)
				}
			}
		}
		if len(dead) == 0 {
			return nil
		}
		if err := lockTopic(ctx, tx, m.q, topic); err != nil {
			return err
		}
		for _, d := range dead {
			if _, err := tx.Exec(ctx, m.q.SetStatus, pgx.StrictNamedArgs{"sub": d.id, "status": string(Dead)}); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, m.q.RemoveSubscribed, pgx.StrictNamedArgs{"topic": topic, "bit_mask": mask(d.bit), "sub": d.id}); err != nil {
				return err
			}
		}
		return nil
	})
	return dead, err
}

// detectDeadAndForget is detectDead, then forgetting what is due.
func (m *Maintainer) detectDeadAndForget(ctx context.Context, db beginQuerier, topic string) ([]deadGroup, error) {
	dead, err := m.detectDead(ctx, db, topic)
	return dead, errors.Join(err, m.forgetPending(ctx, db, topic))
}

// forgetBatch is how many rows one forgetting statement changes.
const forgetBatch = 10_000

// ForgetPending forgets every group of topic that left and whose claims
// ran out (CANCELLED, or DEAD for longer than the topic's ZombieTTL) and
// may still be referred to. A pass cut off by a crash is finished by the
// next one.
func (m *Maintainer) ForgetPending(ctx context.Context, topic string) error {
	return m.forgetPending(ctx, m.pool, topic)
}

func (m *Maintainer) forgetPending(ctx context.Context, db beginQuerier, topic string) error {
	rows, err := db.Query(ctx, m.q.PendingForgets, pgx.StrictNamedArgs{"topic": topic})
	if err != nil {
		return fmt.Errorf("consumergroup: looking for groups to forget: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(ids) == 0 {
		return err
	}
	t, err := m.client.Topic(ctx, topic)
	if err != nil {
		return err
	}
	var errs []error
	for _, id := range ids {
		if err := m.forget(ctx, db, t, id); err != nil {
			errs = append(errs, fmt.Errorf("consumergroup: forgetting subscription %d: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// forget removes subscription id from the required sets of the rows that
// still refer to it, in batches, each under the subscription row's lock:
// a group that comes back meanwhile (its resurrection waits for the batch
// in progress) is never stripped. When a pass finds nothing, forgetting
// is done (and a CANCELLED group's bit is free).
func (m *Maintainer) forget(ctx context.Context, db beginQuerier, topic outbox.TopicConfig, id int64) error {
	tracker, err := completion.ForTopic(topic, m.q)
	if err != nil {
		return err
	}
	for {
		var n int64
		done := false
		err := pgx.BeginTxFunc(ctx, db, sqlq.ShortTx, func(tx pgx.Tx) error {
			var status string
			var bit int
			var pending, holds bool
			err := tx.QueryRow(ctx, m.q.LockForget, pgx.StrictNamedArgs{"sub": id}).Scan(&status, &bit, &pending, &holds)
			if errors.Is(err, pgx.ErrNoRows) {
				done = true
				return nil
			}
			if err != nil {
				return err
			}
			st := State(status)
			if !pending || (st != Dead && st != Cancelled) || holds {
				done = true // back, or DEAD within its ZombieTTL: its claims stand
				return nil
			}
			sub := completion.Subscription{ID: id, Topic: topic.Name, Bit: bit}
			if n, err = tracker.Forget(ctx, tx, sub, st == Cancelled, forgetBatch); err != nil {
				return err
			}
			if n == 0 {
				done = true
				_, err = tx.Exec(ctx, m.q.ForgetDone, pgx.StrictNamedArgs{"sub": id})
			}
			return err
		})
		if err != nil || done {
			return err
		}
	}
}

// CompleteDeadLetters records the messages of topic's group dead letters
// as completed by their groups, once each dead letter holds a copy of its
// message: a dead letter then no longer keeps its message from cleanup
// (it is listed and replayed from its copy). Cleanup calls it first.
func (m *Maintainer) CompleteDeadLetters(ctx context.Context, topic string) error {
	t, err := m.client.Topic(ctx, topic)
	if err != nil || !onLog(t) || (t.Tracking == outbox.Offset && !t.ModeChanging) {
		return err // Offset records nothing per message: its positions pass them
	}
	tracker, err := completion.NewMixed(t.Tracking, m.q) // by each message's own record: t may be stale
	if err != nil {
		return err
	}
	return pgx.BeginTxFunc(ctx, m.pool, sqlq.ShortTx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, m.q.DeadLettersToComplete, pgx.StrictNamedArgs{"topic": topic})
		if err != nil {
			return err
		}
		type due struct {
			sub completion.Subscription
			ids []int64
		}
		dues, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (due, error) {
			d := due{sub: completion.Subscription{Topic: topic}}
			return d, row.Scan(&d.sub.ID, &d.sub.Bit, &d.ids)
		})
		if err != nil {
			return err
		}
		for _, d := range dues {
			if err := tracker.Complete(ctx, tx, d.sub, d.ids); err != nil {
				return err
			}
		}
		return nil
	})
}

// Cleanup deletes up to limit messages of topic that every group holding
// claims on them has finished and that the topic's retention lets go, and
// returns how many it deleted; a pass that deletes fewer than limit found
// no more. It scans the topic's rows in commit order from the oldest, and
// no further than the slowest group's position or the first message the
// retention keeps: the rows an unfinished group holds are not read pass
// after pass. It records the Offset watermark.
func (m *Maintainer) Cleanup(ctx context.Context, topic string, limit int) (int64, error) {
	return m.CleanupOlder(ctx, topic, limit, 0)
}

// CleanupOlder is Cleanup for messages older than the topic's retention
// plus delay. The maintenance service, which drops whole partitions of
// messages, deletes rows one by one only when their partition has been
// kept past the delay (another topic's messages hold it).
func (m *Maintainer) CleanupOlder(ctx context.Context, topic string, limit int, delay time.Duration) (int64, error) {
	t, err := m.client.Topic(ctx, topic)
	if err != nil {
		return 0, err
	}
	if !onLog(t) {
		return 0, fmt.Errorf("%w: %q", outbox.ErrWrongSemantics, topic)
	}
	if err := m.CompleteDeadLetters(ctx, topic); err != nil {
		return 0, fmt.Errorf("consumergroup: cleanup of %q: %w", topic, err)
	}
	var n int64
	err = pgx.BeginTxFunc(ctx, m.pool, sqlq.ShortTx, func(tx pgx.Tx) error {
		// Like a producer: a subscription change (which may start a
		// backfill) waits for this cleanup, and a later one sees it.
		if _, err := tx.Exec(ctx, m.q.LockTopicShared, pgx.StrictNamedArgs{"topic": topic}); err != nil {
			return err
		}
		// Read under the lock: a change of tracking mode waits for it.
		t, err := m.client.LoadTopic(ctx, tx, topic)
		if err != nil {
			return err
		}
		tracker, err := completion.ForTopic(t, m.q)
		if err != nil {
			return err
		}
		keep := completion.Retention{Now: m.client.Now(), Completed: t.Retention + delay, ZeroSubscription: t.ZeroSubscriptionRetention + delay}
		if keep.Bounds, err = completion.CleanupBounds(ctx, tx, m.q, t, keep); err != nil {
			return err
		}
		if n, err = tracker.Cleanup(ctx, tx, topic, keep, limit); err != nil || !t.ModeChanging {
			return err
		}
		// The change is over once no message written under an earlier
		// mode is left (a later change waits for the lock this holds).
		over, err := tx.Exec(ctx, m.q.ModeChangeOver, pgx.StrictNamedArgs{"topic": topic})
		if err == nil && over.RowsAffected() > 0 {
			m.logger.Info("pgoutbox: the tracking mode change is complete: no message written under the earlier mode is left",
				slog.String("topic", topic), slog.String("mode", string(t.Tracking)))
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("consumergroup: cleanup of %q: %w", topic, err)
	}
	return n, nil
}

// PartitionHeld reports, inside tx, whether topic may still need a
// message with an xid in [lo, hi) (xid8s as text), a range no transaction
// writes into any more since sealed: a group holding claims has not
// finished one (its position has not passed it), a retry of one is
// pending, a backfill may still read it, or the topic's retention has not
// passed since sealed (see completion.Tracker.Holds). It takes the topic's
// lock in shared mode, like Cleanup, so the answer stands until tx ends: a
// subscription change that would start a backfill waits for tx. Run
// CompleteDeadLetters first.
func (m *Maintainer) PartitionHeld(ctx context.Context, tx pgx.Tx, topic, lo, hi string, sealed time.Time) (bool, error) {
	t, err := m.client.Topic(ctx, topic)
	if errors.Is(err, outbox.ErrUnknownTopic) {
		return false, nil // a topic no longer configured: no group can hold its rows
	}
	if err != nil {
		return false, err
	}
	if !t.Configured {
		// Messages of a topic without a configuration (sent while a
		// configuration by the send itself was not yet committed, or
		// whose configuration was deleted by hand) wait for the
		// configuration that gives the topic its consumers: its group
		// reads every message from the first.
		return true, nil
	}
	if !onLog(t) {
		return false, nil
	}
	if _, err := tx.Exec(ctx, m.q.LockTopicShared, pgx.StrictNamedArgs{"topic": topic}); err != nil {
		return false, fmt.Errorf("consumergroup: partition check of %q: %w", topic, err)
	}
	// Read under the lock: a change of tracking mode waits for it.
	if t, err = m.client.LoadTopic(ctx, tx, topic); err != nil {
		return false, err
	}
	tracker, err := completion.ForTopic(t, m.q)
	if err != nil {
		return false, err
	}
	keep := completion.Retention{Now: m.client.Now(), Completed: t.Retention, ZeroSubscription: t.ZeroSubscriptionRetention}
	held, err := tracker.Holds(ctx, tx, topic, keep, lo, hi, sealed)
	if err != nil {
		return false, fmt.Errorf("consumergroup: partition check of %q: %w", topic, err)
	}
	return held, nil
}

// CapRetention deletes up to limit messages of topic older than the
// topic's MaxRetention, whoever still holds them (a PAUSED group, one that
// is stuck or keeps failing, a DEAD one within its ZombieTTL). It returns
// how many it deleted and, per group, how many of them the group had not
// finished: those are lost to it, and it does not look for them again (its
// stream no longer finds them; a retry of one is dropped). A pass that
// deletes fewer than limit found no more.
func (m *Maintainer) CapRetention(ctx context.Context, topic string, limit int) (int64, map[string]int64, error) {
	t, err := m.client.Topic(ctx, topic)
	if err != nil {
		return 0, nil, err
	}
	if !onLog(t) {
		return 0, nil, fmt.Errorf("%w: %q", outbox.ErrWrongSemantics, topic)
	}
	if t.Semantics == outbox.Queue {
		return 0, nil, nil // a queue keeps its messages until they are consumed
	}
	var total int64
	var unread map[string]int64
	err = pgx.BeginTxFunc(ctx, m.pool, sqlq.ShortTx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, m.q.LockTopicShared, pgx.StrictNamedArgs{"topic": topic}); err != nil {
			return err
		}
		keep := completion.Retention{Now: m.client.Now(), Completed: t.MaxRetention, ZeroSubscription: t.MaxRetention}
		below, err := completion.RetentionFrontier(ctx, tx, m.q, topic, keep)
		if err != nil {
			return err
		}
		rows, err := tx.Query(ctx, m.mq.RetentionCap, pgx.StrictNamedArgs{
			"topic": topic, "below_xid": below, "now": keep.Now,
			"max_retention_us": t.MaxRetention.Microseconds(), "batch_size": limit,
		})
		if err != nil {
			return err
		}
		total, unread = 0, map[string]int64{}
		var group string
		var n int64
		_, err = pgx.ForEachRow(rows, []any{&group, &n}, func() error {
			if group == "" {
				total = n
			} else {
				unread[group] = n
			}
			return nil
		})
		return err
	})
	if err != nil {
		return 0, nil, fmt.Errorf("consumergroup: retention cap of %q: %w", topic, err)
	}
	return total, unread, nil
}

// RemoveGroup deletes group's subscription to topic for good, the one
// removal path: the group is cancelled (it leaves the subscribed set; its
// batches, retries and dead letters are dropped; its running instances
// stop), forgotten on every message (a Bitmap group's bit is free again),
// and its subscription deleted, so its name is free. An instance that
// starts later under the name starts a new group and says so. It fails
// with outbox.ErrNotFound when the group has no subscription.
func (m *Maintainer) RemoveGroup(ctx context.Context, topic, group string) error {
	g, err := New(m.pool, Config{Client: m.client, Topic: topic, Group: group})
	if err != nil {
		return err
	}
	before, err := g.State(ctx)
	if err != nil {
		return err
	}
	sub, err := g.cancel(ctx)
	if err != nil {
		return err
	}
	t, err := m.client.Topic(ctx, topic)
	if err != nil {
		return err
	}
	if err := m.forget(ctx, m.pool, t, sub.id); err != nil {
		return err
	}
	if before == Cancelled {
		before = "" // removing a cancelled group leaves no tombstone: its name was free already
	}
	if _, err := m.pool.Exec(ctx, m.mq.DeleteSubscription, pgx.StrictNamedArgs{"sub": sub.id, "last_status": string(before)}); err != nil {
		return fmt.Errorf("consumergroup: remove group %q of %q: %w", group, topic, err)
	}
	m.logger.Info("pgoutbox: consumer group removed", slog.String("topic", topic), slog.String("removed_group", group),
		slog.String("was", string(before)))
	return nil
}

// Inconsistency is a kind of stored PUB_SUB message whose completion
// record does not add up (see Maintainer.Inconsistencies).
type Inconsistency struct {
	Topic string `json:"topic"`
	// Kind is InconsistentCount, InconsistentGroup or InconsistentMode.
	Kind string `json:"kind"`
	// Messages is how many such messages the topic stores, at most the
	// limit Inconsistencies was given.
	Messages int64 `json:"messages"`
	// FirstID is the lowest such message's id.
	FirstID int64 `json:"first_id"`
}

// Kinds of Inconsistency.
const (
	// InconsistentCount: a Counter record requires another number of
	// groups than it lists.
	InconsistentCount = "COUNT"
	// InconsistentGroup: a message requires a group (by id or bit) that
	// has no subscription left that could complete it, so cleanup would
	// keep it until the topic's MaxRetention.
	InconsistentGroup = "GROUP"
	// InconsistentMode: a message carries another tracking mode's record
	// than its topic's while no change of mode is under way.
	InconsistentMode = "MODE"
)

// Inconsistencies reads every stored PUB_SUB message and reports, per
// topic and kind, those whose completion record does not add up (counting
// at most limit of each). None should exist: each is a bug or a hand edit
// of the tables, and holds its message back from cleanup or lets it go
// early. It reads the whole table: run it by hand or rarely, not per
// scrape.
func (m *Maintainer) Inconsistencies(ctx context.Context, limit int) ([]Inconsistency, error) {
	if limit < 1 {
		return nil, fmt.Errorf("%w: limit %d: must be at least 1", outbox.ErrInvalidConfig, limit)
	}
	rows, err := m.pool.Query(ctx, m.q.Inconsistencies, pgx.StrictNamedArgs{"limit": limit})
	if err != nil {
		return nil, fmt.Errorf("consumergroup: inconsistencies: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Inconsistency, error) {
		var i Inconsistency
		return i, row.Scan(&i.Topic, &i.Kind, &i.Messages, &i.FirstID)
	})
	if err != nil {
		return nil, fmt.Errorf("consumergroup: inconsistencies: %w", err)
	}
	return out, nil
}
