package maintenance_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// rangePartition is a row of outbox_partitions.
type rangePartition struct {
	id     int64
	lo, hi uint64
}

func (p rangePartition) table() string { return "outbox_published_p" + strconv.FormatInt(p.id, 10) }

func partitionsOf(t *testing.T, b *bundle) []rangePartition {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT p.id, p.lo::text, p.hi::text FROM `+b.db.Table("outbox_partitions")+` AS p ORDER BY p.lo`)
	require.NoError(t, err)
	defer rows.Close()
	var out []rangePartition
	for rows.Next() {
		var p rangePartition
		var lo, hi string
		require.NoError(t, rows.Scan(&p.id, &lo, &hi))
		p.lo, _ = strconv.ParseUint(lo, 10, 64)
		p.hi, _ = strconv.ParseUint(hi, 10, 64)
		out = append(out, p)
	}
	require.NoError(t, rows.Err())
	return out
}

func nextXid(t *testing.T, b *bundle) uint64 {
	t.Helper()
	var next string
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT pg_snapshot_xmax(pg_current_snapshot())::text`).Scan(&next))
	n, err := strconv.ParseUint(next, 10, 64)
	require.NoError(t, err)
	return n
}

// enterPartition runs s's partition job and burns transaction ids until the
// next one is the first of a range partition with room left. On a young
// server the last partition is still the one the migrations made (10,000
// ids from when the template was migrated), which reaches too far ahead
// for the job to add one: it burns ids past it first.
func enterPartition(t *testing.T, b *bundle, s *maintenance.Service) {
	t.Helper()
	for range 3 {
		_, err := s.RunOnce(context.Background())
		require.NoError(t, err)
		next := nextXid(t, b)
		parts := partitionsOf(t, b)
		require.NotEmpty(t, parts, "range partitions")
		for _, p := range parts {
			if p.lo >= next && p.hi-p.lo >= 500 {
				if p.lo > next {
					burnXids(t, b, int(p.lo-next))
				}
				return
			}
		}
		if last := parts[len(parts)-1]; last.hi > next {
			burnXids(t, b, int(last.hi-next))
		}
	}
	t.Fatal("no partition ahead of the next transaction id")
}

// partitionOf returns the range partition holding the messages with these
// ids, sent in one transaction so that they share one: the transaction ids
// other clients of the server take meanwhile may well have moved the next
// one past the partition enterPartition entered.
func partitionOf(t *testing.T, b *bundle, ids []int64) rangePartition {
	t.Helper()
	rows, err := b.db.Pool.Query(context.Background(), `SELECT DISTINCT c.relname::text FROM `+b.db.Table("outbox_published")+` AS m
JOIN pg_catalog.pg_class AS c ON c.oid = m.tableoid WHERE m.id = ANY($1)`, ids)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, tables, 1, "the messages are in one partition")
	for _, p := range partitionsOf(t, b) {
		if p.table() == tables[0] {
			require.Equal(t, len(ids), b.count(t, p.table(), "true"), "the partition holds these messages alone")
			return p
		}
	}
	t.Fatalf("the messages are in %s, not in a range partition", tables[0])
	return rangePartition{}
}

// testPartitionSize is the PartitionSize of the tests of partitions.
const testPartitionSize = 2000

// sealPartition burns transaction ids until none can still write into p,
// then waits for the transactions that could, elsewhere on the server
// (another test process, another client), to end: the service drops or
// keeps a partition only once every transaction id in it has finished.
func sealPartition(t *testing.T, b *bundle, p rangePartition) {
	t.Helper()
	if next := nextXid(t, b); next <= p.hi {
		burnXids(t, b, int(p.hi-next)+1)
	}
	pgtest.Eventually(t, 2*time.Minute, "the transactions that could write into the partition ended", func() bool {
		var xmin string
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT pg_snapshot_xmin(pg_current_snapshot())::text`).Scan(&xmin))
		n, err := strconv.ParseUint(xmin, 10, 64)
		require.NoError(t, err)
		return n >= p.hi
	})
}

// dropped runs s's jobs until they drop p. A group that handled every
// message has not necessarily written that down yet (its acks are
// written in batches, behind the handlers): until it has, the partition
// is held.
func dropped(t *testing.T, s *maintenance.Service, p rangePartition, why string) {
	t.Helper()
	pgtest.Eventually(t, 10*time.Second, p.table()+" dropped: "+why, func() bool {
		r, err := s.RunOnce(context.Background())
		require.NoError(t, err)
		return slices.Contains(r.PartitionsDropped, p.table())
	})
}

// holder is a way a group keeps a partition: set up before the messages
// are sent, it returns what to wait for once they are, and how to let go.
type holder struct {
	name  string
	setup func(t *testing.T, b *bundle, topic string) (sent, release func())
}

var holders = []holder{
	{name: "a live group that has not read it", setup: func(t *testing.T, b *bundle, topic string) (func(), func()) {
		slow := newCounter()
		g := b.group(t, topic, "slow", slow.handle, consumergroup.FromNow())
		require.NoError(t, g.Stop(context.Background())) // subscribed, not reading
		return func() {}, func() {
			b.group(t, topic, "slow", slow.handle, consumergroup.FromNow())
			pgtest.Eventually(t, 10*time.Second, "the slow group caught up", func() bool { return slow.distinct() == 20 })
		}
	}},
	{name: "a pending retry", setup: func(t *testing.T, b *bundle, topic string) (func(), func()) {
		retry := newCounter()
		var failedOnce atomic.Bool
		b.group(t, topic, "retry", func(ctx context.Context, d *outbox.Delivery) error {
			if failedOnce.CompareAndSwap(false, true) {
				return errors.New("not now") // retried after the topic's backoff, an hour
			}
			return retry.handle(ctx, d)
		}, consumergroup.FromNow())
		return func() {
				pgtest.Eventually(t, 10*time.Second, "the retry group handled all but one", func() bool { return retry.distinct() == 19 })
			}, func() {
				b.exec(t, `UPDATE `+b.db.Table("outbox_group_retries")+` SET available_at = now() WHERE status = 'RETRY'`)
				pgtest.Eventually(t, 10*time.Second, "the retry is delivered", func() bool { return retry.distinct() == 20 })
			}
	}},
	{name: "a DEAD group within the topic's ZombieTTL", setup: func(t *testing.T, b *bundle, topic string) (func(), func()) {
		zombie := b.group(t, topic, "zombie", newCounter().handle, consumergroup.FromNow(), func(c *consumergroup.Config) {
			c.HeartbeatInterval, c.HeartbeatTimeout = 50*time.Millisecond, 300*time.Millisecond
		})
		require.NoError(t, zombie.Stop(context.Background())) // stops beating: the service declares it DEAD
		return func() { time.Sleep(400 * time.Millisecond) }, func() {
			cfg, err := b.client.Topic(context.Background(), topic)
			require.NoError(t, err)
			cfg.ZombieTTL = time.Millisecond
			b.topic(t, cfg)
		}
	}},
}

// A partition is dropped only once nothing holds it: a live group that
// has not read it, a pending retry of one of its messages, a DEAD group
// within the topic's ZombieTTL. Each holds it alone, then lets go. A dead
// letter does not hold it (it keeps a copy) and stays replayable after the
// drop. No message is deleted row by row meanwhile. The topic's name has
// '.', ':' and '-' in it.
func TestPartitionDroppedOnlyWhenNothingHoldsIt(t *testing.T) {
	for _, mode := range modes {
		for _, h := range holders {
			t.Run(string(mode)+"/"+h.name, func(t *testing.T) {
				b := setup(t)
				ctx := context.Background()
				topic := "orders.events:v1-" + strings.ToLower(string(mode))
				b.topic(t, outbox.TopicConfig{Name: topic, Semantics: outbox.PubSub, Tracking: mode,
					Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond, ZombieTTL: time.Hour,
					BackoffInitial: time.Hour, BackoffMax: time.Hour})
				s := b.service(t, maintenance.Config{PartitionSize: testPartitionSize, RowCleanupDelay: time.Hour})

				fast, dlq := newCounter(), newCounter()
				b.group(t, topic, "fast", fast.handle, consumergroup.FromNow())
				var refuse atomic.Bool
				refuse.Store(true)
				dlqGroup := b.group(t, topic, "dlq", func(ctx context.Context, d *outbox.Delivery) error {
					if refuse.Load() {
						return outbox.Permanent(errors.New("refused"))
					}
					return dlq.handle(ctx, d)
				}, consumergroup.FromNow())

				sent, release := h.setup(t, b, topic)
				enterPartition(t, b, s)
				ids := b.send(t, topic, 20)
				p := partitionOf(t, b, ids)
				sent()
				pgtest.Eventually(t, 10*time.Second, "fast handled everything, dlq dead-lettered it", func() bool {
					letters, err := dlqGroup.DeadLetters(ctx, 0, 100)
					require.NoError(t, err)
					return fast.distinct() == 20 && len(letters) == 20
				})
				sealPartition(t, b, p)

				for range 2 {
					r, err := s.RunOnce(ctx)
					require.NoError(t, err)
					require.Equal(t, topic, r.PartitionsKept[p.table()], "held by %s", h.name)
					require.NotContains(t, r.PartitionsDropped, p.table())
					require.Equal(t, 20, b.count(t, p.table(), "true"), "no message is deleted row by row meanwhile")
				}
				release()
				dropped(t, s, p, "nothing holds it any more")
				require.Zero(t, b.count(t, "outbox_published", "id = ANY($1)", ids))
				var exists bool
				require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, b.db.Table(p.table())).Scan(&exists))
				require.False(t, exists)

				// The dead letters outlived their partition and can be replayed.
				refuse.Store(false)
				n, err := dlqGroup.ReplayDeadLetters(ctx, ids...)
				require.NoError(t, err)
				require.Equal(t, int64(20), n)
				pgtest.Eventually(t, 10*time.Second, "the replayed dead letters are delivered", func() bool { return dlq.distinct() == 20 })
				require.Zero(t, fast.dups()+dlq.dups())
				require.Empty(t, b.logs.errors())
			})
		}
	}
}

// Topics named with '.', ':' and '-', and one of the longest name allowed,
// share partitions (named from the partition's number, never from a
// topic). A topic whose group does not read holds the partition, but only
// its own messages in it: the other topics' finished messages are deleted
// one by one once RowCleanupDelay passed. When the slow group catches up,
// the partition is dropped.
func TestSlowTopicHoldsOnlyItsOwnMessages(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	s := b.service(t, maintenance.Config{PartitionSize: testPartitionSize, RowCleanupDelay: 50 * time.Millisecond})
	topics := []string{"orders.created", "billing:invoices", "user-events", strings.Repeat("Long.Name:x-", 21) + "xyz"}
	require.Len(t, topics[3], outbox.MaxTopicBytes)
	slowTopic := "slow.topic"
	recs := map[string]*counter{}
	for _, topic := range append(topics, slowTopic) {
		b.topic(t, outbox.TopicConfig{Name: topic, Semantics: outbox.PubSub, Tracking: outbox.Offset,
			Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond})
		recs[topic] = newCounter()
		g := b.group(t, topic, "g", recs[topic].handle, consumergroup.FromNow())
		if topic == slowTopic {
			require.NoError(t, g.Stop(ctx))
		}
	}
	enterPartition(t, b, s)
	p := partitionOf(t, b, b.sendTo(t, append(topics, slowTopic), 10))
	pgtest.Eventually(t, 10*time.Second, "the live groups handled their topics", func() bool {
		for _, topic := range topics {
			if recs[topic].distinct() != 10 {
				return false
			}
		}
		return true
	})
	sealPartition(t, b, p)
	time.Sleep(60 * time.Millisecond) // RowCleanupDelay
	r, err := s.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, slowTopic, r.PartitionsKept[p.table()])
	require.Equal(t, 10, b.count(t, p.table(), "true"), "only the slow topic's messages are left")
	require.Equal(t, 10, b.count(t, p.table(), "topic = $1", slowTopic))

	b.group(t, slowTopic, "g", recs[slowTopic].handle, consumergroup.FromNow())
	pgtest.Eventually(t, 10*time.Second, "the slow group caught up", func() bool { return recs[slowTopic].distinct() == 10 })
	dropped(t, s, p, "the slow group caught up")
	require.Zero(t, b.count(t, "outbox_published", "true"))
	require.Empty(t, b.logs.errors())
}

// A DEAD group within its topic's ZombieTTL holds the partition of what
// it owed and no other, in every mode: the partition of the messages
// written after it died is dropped once the live group finished them.
func TestDeadGroupHoldsOnlyThePartitionOfWhatItOwes(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			b := setup(t)
			ctx := context.Background()
			b.topic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode,
				Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond, ZombieTTL: time.Hour})
			s := b.service(t, maintenance.Config{PartitionSize: testPartitionSize, RowCleanupDelay: time.Hour})
			live := newCounter()
			b.group(t, "events", "live", live.handle, consumergroup.FromNow())
			require.NoError(t, b.group(t, "events", "zombie", newCounter().handle, consumergroup.FromNow()).Stop(ctx))

			enterPartition(t, b, s)
			owed := b.send(t, "events", 10)
			owedIn := partitionOf(t, b, owed)
			b.exec(t, `UPDATE `+b.db.Table("outbox_topic_subscriptions")+` SET last_heartbeat_at = now() - interval '2 hours' WHERE group_name = 'zombie'`)
			r, err := s.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, []string{"events/zombie"}, r.DeadGroups)

			enterPartition(t, b, s)
			laterIn := partitionOf(t, b, b.send(t, "events", 20))
			pgtest.Eventually(t, 10*time.Second, "the live group done", func() bool { return live.distinct() == 30 })
			sealPartition(t, b, laterIn)
			pgtest.Eventually(t, 10*time.Second, "the partition written after it died dropped", func() bool {
				r, err := s.RunOnce(ctx)
				require.NoError(t, err)
				require.Equal(t, "events", r.PartitionsKept[owedIn.table()], "held by the DEAD group")
				return slices.Contains(r.PartitionsDropped, laterIn.table())
			})
			require.Equal(t, 10, b.count(t, "outbox_published", "id = ANY($1)", owed))
			require.Empty(t, b.logs.errors())
		})
	}
}

// When every range partition is gone (the transaction ids passed the last
// one before a pass added the next, and it was dropped: two instances'
// passes can each find the other dropping and skip adding), the next pass
// starts the ranges again ahead of the next transaction id. Before, the
// service added none from then on: every message went to the default
// partition, which is never dropped.
func TestPartitionsStartAgainAfterTheLastWasDropped(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	topic := "orders"
	b.topic(t, outbox.TopicConfig{Name: topic, Semantics: outbox.PubSub, Tracking: outbox.Offset,
		Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond})
	s := b.service(t, maintenance.Config{PartitionSize: testPartitionSize})
	for _, p := range partitionsOf(t, b) { // what the last drop of a pass leaves
		b.exec(t, `DROP TABLE `+b.db.Table(p.table()))
		b.exec(t, `DELETE FROM `+b.db.Table("outbox_partitions")+` WHERE id = $1`, p.id)
	}
	require.Empty(t, partitionsOf(t, b))

	r, err := s.RunOnce(ctx)
	require.NoError(t, err)
	require.Positive(t, r.PartitionsCreated, "partitions added")
	parts := partitionsOf(t, b)
	require.NotEmpty(t, parts)
	require.Greater(t, parts[len(parts)-1].hi, nextXid(t, b)+testPartitionSize, "the partitions reach past the next transaction id")
	enterPartition(t, b, s)
	partitionOf(t, b, b.send(t, topic, 5)) // in a range partition, not the default one
	require.Empty(t, b.logs.errors())
}
