package consumergroup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// byMessageGroup configures a group to read its topic by message group.
func byMessageGroup(c *consumergroup.Config) { c.ByMessageGroup = true }

// sendGroups sends n messages to each of groups, interleaved, in batches
// of 50 (each a transaction), with their sequence in the payload.
func (b *bundle) sendGroups(t *testing.T, groups []string, n int) {
	t.Helper()
	var msgs []outbox.Message
	for i := range n {
		for _, g := range groups {
			p, _ := json.Marshal(seqPayload{Seq: i})
			msgs = append(msgs, outbox.Message{Topic: b.topic, Payload: p, Group: g})
		}
	}
	for len(msgs) > 0 {
		k := min(50, len(msgs))
		_, err := b.producer.SendBatch(context.Background(), b.db.Pool, msgs[:k])
		require.NoError(t, err)
		msgs = msgs[k:]
	}
}

// On a topic that is not ordered, a group reading by message group hands
// out one message group's messages one at a time, in order, with many
// handlers free: no two of a message group's messages are ever handled at
// once. (Read as a stream, the batch's messages go to every free handler.)
func TestByMessageGroupOneAtATime(t *testing.T) {
	t.Parallel()
	for _, mode := range []outbox.TrackingMode{queueTopic, outbox.Offset, outbox.Bitmap} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b, name := setupSubject(t, mode)
			groups := []string{"a", "b", "c", "d"}
			const n = 60
			var mu sync.Mutex
			busy, overlaps := map[string]bool{}, 0
			order := map[string][]int{}
			g := b.newGroup(t, name, byMessageGroup, func(c *consumergroup.Config) { c.Concurrency = 8 })
			require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
				p, err := outbox.Decode[seqPayload](d)
				if err != nil {
					return outbox.Permanent(err)
				}
				mu.Lock()
				if busy[d.Group] {
					overlaps++
				}
				busy[d.Group] = true
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				busy[d.Group] = false
				order[d.Group] = append(order[d.Group], p.Seq)
				mu.Unlock()
				return nil
			}, nil))
			start(t, g, consumergroup.FromNow())
			b.sendGroups(t, groups, n)
			pgtest.Eventually(t, 60*time.Second, "all handled", func() bool {
				mu.Lock()
				defer mu.Unlock()
				total := 0
				for _, o := range order {
					total += len(o)
				}
				return total == n*len(groups)
			})
			mu.Lock()
			defer mu.Unlock()
			require.Zero(t, overlaps, "two messages of one message group handled at once")
			for _, grp := range groups {
				for i, seq := range order[grp] {
					require.Equal(t, i, seq, "message group %s out of order: %v", grp, order[grp])
				}
			}
		})
	}
}

// A message group's backlog does not delay another's message: beside
// 20,000 queued messages of one message group, another's is handled while
// most of the backlog still waits.
func TestByMessageGroupColdBesideHot(t *testing.T) {
	t.Parallel()
	b := setupTopic(t, outbox.TopicConfig{Name: "jobs"})
	var hot atomic.Int64
	cold := make(chan struct{})
	g := b.newGroup(t, "(queue)", byMessageGroup, func(c *consumergroup.Config) { c.Concurrency = 4 })
	require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
		if d.Group == "cold" {
			close(cold)
			return nil
		}
		hot.Add(1)
		time.Sleep(time.Millisecond)
		return nil
	}, nil))
	start(t, g, consumergroup.FromNow())
	b.sendGroups(t, []string{"hot"}, 20_000)
	pgtest.Eventually(t, 30*time.Second, "the hot message group under way", func() bool { return hot.Load() > 0 })
	b.sendGroups(t, []string{"cold"}, 1)
	select {
	case <-cold:
	case <-time.After(30 * time.Second):
		t.Fatalf("the cold message waited behind the backlog (%d hot handled)", hot.Load())
	}
	require.Less(t, hot.Load(), int64(10_000), "the cold message was handled behind half the backlog")
}

// A group that starts reading by message group (a router upgraded to a
// version whose sources do) takes over a batch an instance reading the
// stream left behind: nothing of it is lost.
func TestByMessageGroupTakesOverAStreamBatch(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	b := setupTopic(t, outbox.TopicConfig{Name: "jobs", Lease: 30 * time.Second})
	withClock := func(c *consumergroup.Config) { c.Clock = clock; c.BatchSize = 10 }

	b.crashHoldingABatch(t, "(queue)", func() { b.sendGroups(t, []string{"a", "b"}, 5) }, withClock)

	r := newRecorder()
	upgraded := b.newGroup(t, "(queue)", withClock, byMessageGroup)
	require.NoError(t, upgraded.AddConsumer("m", r.handler, nil))
	start(t, upgraded, consumergroup.FromNow())
	b.sendGroups(t, []string{"c"}, 5)
	pgtest.Eventually(t, 10*time.Second, "the new messages handled and acked", func() bool {
		return r.distinct() == 5 && b.countIn(t, "outbox_group_retries", "true") == 0
	})
	clock.Advance(31 * time.Second) // the old batch's lease ends (only it was leased)
	pgtest.Eventually(t, 10*time.Second, fmt.Sprintf("the old batch taken over (%d of 15)", r.distinct()), func() bool { return r.distinct() == 15 })
	require.Zero(t, r.dups(), r.duplicates())
}

// A group that queued a burst analyzes its retry table at once (see
// internal/engine/analyze.go), without waiting for autovacuum: the plans
// made while the table was small would read the whole queue at each look.
func TestByMessageGroupAnalyzesAfterABurst(t *testing.T) {
	t.Parallel()
	b := setupTopic(t, outbox.TopicConfig{Name: "jobs"})
	g := b.newGroup(t, "(queue)", byMessageGroup)
	require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
		time.Sleep(time.Millisecond)
		return nil
	}, nil))
	start(t, g, consumergroup.FromNow())
	lastAnalyze := func() *time.Time {
		var at *time.Time
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT last_analyze FROM pg_stat_user_tables
			WHERE schemaname = $1 AND relname = 'outbox_group_retries'`, b.db.Schema).Scan(&at))
		return at
	}
	require.Nil(t, lastAnalyze(), "analyzed before any burst")
	b.sendGroups(t, []string{"hot"}, 12_000)
	pgtest.Eventually(t, 30*time.Second, "the retry table analyzed", func() bool { return lastAnalyze() != nil })
}

// A retry whose message no longer exists (the retention cap deleted it)
// is dropped by the instance's janitor, outside its looks: a look never
// reads the whole queue for it.
func TestRetriesOfDeletedMessagesAreDropped(t *testing.T) {
	t.Parallel()
	b := setupTopic(t, outbox.TopicConfig{Name: "jobs", BackoffInitial: time.Hour, BackoffMax: time.Hour})
	g := b.newGroup(t, "(queue)", byMessageGroup)
	require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
		return fmt.Errorf("receiver down")
	}, nil))
	start(t, g, consumergroup.FromNow())
	ids := b.send(t, 1, 2)
	pgtest.Eventually(t, 10*time.Second, "both waiting to be retried", func() bool {
		return b.countIn(t, "outbox_group_retries", "status = 'RETRY' AND attempts = 1") == 2
	})
	_, err := b.db.Pool.Exec(context.Background(), "DELETE FROM "+b.db.Table("outbox_published")+" WHERE id = $1", ids[0])
	require.NoError(t, err)
	pgtest.Eventually(t, 30*time.Second, "the deleted message's retry dropped", func() bool {
		return b.countIn(t, "outbox_group_retries", "message_id = $1", ids[0]) == 0
	})
	require.Equal(t, 1, b.countIn(t, "outbox_group_retries", "message_id = $1", ids[1]), "the other retry stays")
}
