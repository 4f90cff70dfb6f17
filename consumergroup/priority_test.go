package consumergroup_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// prioritized is message seq with priority prio.
func (b *bundle) prioritized(seq, prio int) outbox.Message {
	p, _ := json.Marshal(seqPayload{Seq: seq})
	return outbox.Message{Topic: b.topic, Payload: p, Priority: prio}
}

// A message of a higher priority, sent behind a backlog the group is
// draining (in each mode, and a QUEUE topic's consumers), is handled long
// before the backlog is: the group takes it
// ahead of its stream. The stream, reaching it later, skips it (one
// delivery), and the group's record of having taken it goes once the
// group is past it.
//
// CI runs it with 20,000 messages; PGOUTBOX_PRIORITY_BACKLOG sets another
// number (BENCHMARKS.md reports 100,000).
func TestPrioritizedMessageOvertakesTheBacklog(t *testing.T) {
	t.Parallel()
	const urgent = -1
	backlog := 20_000
	if n, err := strconv.Atoi(os.Getenv("PGOUTBOX_PRIORITY_BACKLOG")); err == nil && n > 0 {
		backlog = n
	}
	for _, mode := range append(slices.Clone(modes), queueTopic) {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b, group := setupSubject(t, mode)
			b.subscribe(t, group)
			b.sendRange(t, 0, backlog)

			var mu sync.Mutex
			handled := map[int]int{}
			var urgentAt time.Time
			var backlogLeft int
			g := b.newGroup(t, group, func(c *consumergroup.Config) {
				if mode == queueTopic {
					c.BatchSize = outbox.DefaultBatchSize // a QUEUE consumer's
				}
			})
			require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
				p, err := outbox.Decode[seqPayload](d)
				if err != nil {
					return outbox.Permanent(err)
				}
				mu.Lock()
				defer mu.Unlock()
				handled[p.Seq]++
				if p.Seq == urgent {
					urgentAt, backlogLeft = time.Now(), backlog-(len(handled)-1)
				}
				return nil
			}, nil))
			start(t, g, consumergroup.FromNow())
			count := func() int { mu.Lock(); defer mu.Unlock(); return len(handled) }
			pgtest.Eventually(t, 30*time.Second, "the group drains the backlog", func() bool { return count() >= 500 })

			sent := time.Now()
			b.sendMessages(t, nil, b.prioritized(urgent, 10))
			pgtest.Eventually(t, time.Duration(backlog/100)*time.Second, "every message handled", func() bool { return count() == backlog+1 })
			mu.Lock()
			latency, left := urgentAt.Sub(sent), backlogLeft
			mu.Unlock()
			t.Logf("the priority-10 message was handled %v after its send, %d of %d backlog messages still waiting", latency, left, backlog)
			require.Greater(t, left, backlog/2, "the prioritized message overtook the backlog")

			time.Sleep(200 * time.Millisecond) // a second delivery would show by now
			mu.Lock()
			for seq, n := range handled {
				require.Equal(t, 1, n, "message %d handled once", seq)
			}
			mu.Unlock()
			pgtest.Eventually(t, 10*time.Second, "the record of the message taken ahead goes once the group is past it", func() bool {
				return b.countIn(t, "outbox_group_set_aside", "true") == 0
			})
		})
	}
}

// A member takes a prioritized message ahead and handles it; the batch it
// then reads past that message is taken over after the member crashes. The
// takeover reads the batch's rows again and must skip the message: it was
// handled, and is not delivered again.
func TestTakeoverSkipsAMessageTakenAhead(t *testing.T) {
	t.Parallel()
	const urgent = 1000
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			ctx := context.Background()
			require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub,
				Tracking: mode, Lease: time.Second}))
			b.subscribe(t, "g")
			b.sendRange(t, 0, 200)
			b.sendMessages(t, nil, b.prioritized(urgent, 5))
			b.sendRange(t, 200, 210) // the batch that spans the prioritized message

			doomedPool := pgtest.NewPool(t, b.db.DSN)
			// As many handlers as a batch holds: its first claim is a whole
			// batch too (a new instance claims no more than its handlers
			// can start), so the batches are 0–99, 100–199 and 200–209.
			doomed := b.newGroupOn(t, doomedPool, "g", func(c *consumergroup.Config) { c.BatchSize, c.Concurrency = 100, 100 })
			doomedLog := newDeliveryLog()
			var stuck atomic.Int64
			require.NoError(t, doomed.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
				p, err := outbox.Decode[seqPayload](d)
				if err != nil {
					return outbox.Permanent(err)
				}
				if p.Seq >= 200 && p.Seq < urgent {
					stuck.Add(1)
					<-ctx.Done()
					return ctx.Err()
				}
				return doomedLog.handler(ctx, d)
			}, nil))
			require.NoError(t, doomed.Start(ctx, consumergroup.FromNow()))
			pgtest.Eventually(t, 30*time.Second, "the doomed member handled the rest and holds the last batch", func() bool {
				return stuck.Load() == 10 && len(doomedLog.order()) == 201
			})
			require.Equal(t, []int{1}, doomedLog.of(urgent), "the prioritized message was handled, once")
			require.NotEqual(t, urgent, doomedLog.order()[200], "it was taken ahead of the backlog")
			// Handled is not yet recorded: completions are written after the
			// handler returns. Until they are, a crash makes them come again,
			// the prioritized message too, as it should.
			pgtest.Eventually(t, 30*time.Second, "the doomed member recorded all but its last batch", func() bool {
				return b.countIn(t, "outbox_group_batches", "true") == 1 &&
					b.countIn(t, "outbox_group_retries", "message_id IN (SELECT id FROM "+b.db.Table("outbox_published")+
						" WHERE priority > 0)") == 0
			})
			crash(doomed, doomedPool)

			survivorLog := newDeliveryLog()
			survivor := b.newGroup(t, "g")
			require.NoError(t, survivor.AddConsumer("m", survivorLog.handler, nil))
			start(t, survivor, consumergroup.FromNow())
			pgtest.Eventually(t, 30*time.Second, "the crashed member's batch is taken over", func() bool {
				return len(survivorLog.order()) >= 10
			})
			time.Sleep(300 * time.Millisecond)
			require.Empty(t, survivorLog.of(urgent), "the takeover delivered the message taken ahead again")
			require.Len(t, survivorLog.order(), 10)
		})
	}
}
