package consumergroup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testmetrics"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// setupOrdered is setup with an ordered topic.
func setupOrdered(t *testing.T, mode outbox.TrackingMode, policy outbox.DeadLetterPolicy) *bundle {
	t.Helper()
	return setupTopic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode,
		Ordered: true, OrderedDeadLetters: policy, MaxAttempts: 50,
		BackoffInitial: time.Millisecond, BackoffMax: 5 * time.Millisecond})
}

func (b *bundle) groupMessage(group string, seq int) outbox.Message {
	p, _ := json.Marshal(seqPayload{Seq: seq})
	return outbox.Message{Topic: b.topic, Payload: p, Group: group}
}

// orderLog records, per message group, the sequence of first successes.
type orderLog struct {
	mu         sync.Mutex
	handled    map[string][]int
	done       map[int64]bool
	total      int
	violations []string
	atQuarter  int // message groups with a success when a quarter of the messages were handled
	quarter    int
}

func newOrderLog(quarter int) *orderLog {
	return &orderLog{handled: map[string][]int{}, done: map[int64]bool{}, quarter: quarter}
}

// success records d's first success.
func (l *orderLog) success(d *outbox.Delivery, seq int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done[d.ID] {
		return // a redelivery after an expired lease
	}
	l.done[d.ID] = true
	seqs := l.handled[d.Group]
	if len(seqs) > 0 && seqs[len(seqs)-1] > seq {
		l.violations = append(l.violations, fmt.Sprintf("%s: %d after %d", d.Group, seq, seqs[len(seqs)-1]))
	}
	l.handled[d.Group] = append(seqs, seq)
	l.total++
	if l.total == l.quarter {
		l.atQuarter = len(l.handled)
	}
}

func (l *orderLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Three instances (each with its own pool, as if three processes) of four
// executors each handle 200 message groups × 50 messages, with random
// handler delays and 10% failures that are retried, while ten producers
// commit out of id order (each holds its transaction open a random while
// after its send): per message group, the first successes follow the
// commit order, and the message groups progress together. In every
// tracking mode.
func TestOrderedGroupKeepsEveryMessageGroupInOrder(t *testing.T) {
	const groups, perGroup = 200, 50
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			b := setupOrdered(t, mode, outbox.BlockGroup)
			ctx := context.Background()
			log := newOrderLog(groups * perGroup / 4)
			handler := func(ctx context.Context, d *outbox.Delivery) error {
				time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
				if rand.IntN(10) == 0 {
					return errors.New("flaky")
				}
				p, err := outbox.Decode[seqPayload](d)
				if err != nil {
					return err
				}
				log.success(d, p.Seq)
				return nil
			}
			for i := range 3 {
				g := b.newGroupOn(t, pgtest.NewPool(t, b.db.DSN), "g", func(c *consumergroup.Config) {
					c.InstanceID, c.Concurrency, c.BatchSize = fmt.Sprintf("i%d", i), 4, 20
				})
				require.NoError(t, g.AddConsumer("m", handler, nil))
				start(t, g, consumergroup.SubscriptionOptions{})
			}

			var wg sync.WaitGroup
			for p := range 10 {
				wg.Go(func() {
					for seq := range perGroup {
						for g := p * 20; g < (p+1)*20; g++ {
							require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
								_, err := b.producer.Send(ctx, tx, b.groupMessage(fmt.Sprintf("g%03d", g), seq))
								if rand.IntN(10) == 0 {
									time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond) // later ids commit first
								}
								return err
							}))
						}
					}
				})
			}
			wg.Wait()
			pgtest.Eventually(t, 3*time.Minute, "every message handled", func() bool { return log.count() == groups*perGroup })

			log.mu.Lock()
			defer log.mu.Unlock()
			require.Empty(t, log.violations, "messages handled out of their message group's order")
			for g, seqs := range log.handled {
				require.Len(t, seqs, perGroup, g)
			}
			require.Len(t, log.handled, groups)
			require.Greater(t, log.atQuarter, groups/2, "message groups moved one after another, not together")
			t.Logf("%d message groups had a message handled when a quarter of all were", log.atQuarter)
		})
	}
}

// A message that is dead-lettered blocks its message group under
// BlockGroup until it is discarded (or replayed), and is passed under
// SkipDeadLetters; other message groups go on either way.
func TestOrderedGroupDeadLetterPolicies(t *testing.T) {
	for _, policy := range []outbox.DeadLetterPolicy{outbox.BlockGroup, outbox.SkipDeadLetters} {
		t.Run(string(policy), func(t *testing.T) {
			b := setupOrdered(t, outbox.Offset, policy)
			ctx := context.Background()
			var mu sync.Mutex
			var got []string
			handler := func(ctx context.Context, d *outbox.Delivery) error {
				p, err := outbox.Decode[seqPayload](d)
				if err != nil {
					return err
				}
				if d.Group == "a" && p.Seq == 1 {
					return outbox.Permanent(errors.New("poison"))
				}
				mu.Lock()
				got = append(got, fmt.Sprintf("%s%d", d.Group, p.Seq))
				mu.Unlock()
				return nil
			}
			seen := func(s string) bool {
				mu.Lock()
				defer mu.Unlock()
				for _, x := range got {
					if x == s {
						return true
					}
				}
				return false
			}
			g := b.newGroup(t, "g")
			require.NoError(t, g.AddConsumer("m", handler, nil))
			start(t, g, consumergroup.SubscriptionOptions{})
			_, err := b.producer.SendBatch(ctx, b.db.Pool, []outbox.Message{
				b.groupMessage("a", 0), b.groupMessage("a", 1), b.groupMessage("a", 2), b.groupMessage("b", 0), b.groupMessage("b", 1)})
			require.NoError(t, err)
			pgtest.Eventually(t, 10*time.Second, "the other message group done", func() bool { return seen("b1") && seen("a0") })
			var dead []outbox.DeadLetter
			pgtest.Eventually(t, 10*time.Second, "the dead letter recorded", func() bool {
				var err error
				dead, err = g.DeadLetters(ctx, 0, 0)
				require.NoError(t, err)
				return len(dead) == 1
			})
			if policy == outbox.SkipDeadLetters {
				pgtest.Eventually(t, 10*time.Second, "the message after the dead letter", func() bool { return seen("a2") })
				return
			}
			time.Sleep(200 * time.Millisecond) // ten polls
			require.False(t, seen("a2"), "a message passed its message group's dead letter")
			blocked, err := g.BlockedGroups(ctx, 0)
			require.NoError(t, err)
			require.Len(t, blocked, 1)
			require.Equal(t, "a", blocked[0].Group)
			require.Equal(t, dead[0].ID, blocked[0].HeadID)
			require.True(t, blocked[0].DeadLettered)
			require.Equal(t, 1, blocked[0].Behind)
			require.Contains(t, blocked[0].LastError, "poison")
			require.False(t, blocked[0].Since.IsZero())

			_, err = g.DiscardDeadLetters(ctx, 12345)
			require.ErrorIs(t, err, outbox.ErrNotFound)
			n, err := g.DiscardDeadLetters(ctx, dead[0].ID)
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			pgtest.Eventually(t, 10*time.Second, "the message group goes on", func() bool { return seen("a2") })
			dead, err = g.DeadLetters(ctx, 0, 0)
			require.NoError(t, err)
			require.Empty(t, dead)
			blocked, err = g.BlockedGroups(ctx, 0)
			require.NoError(t, err)
			require.Empty(t, blocked)
		})
	}
}

// A batch handler of an ordered group gets each message group's messages
// in commit order; a message after one of its group that failed is handed
// back, whatever the handler returned for it, and comes again after the
// failed one succeeded: the last success of each message follows the
// commit order.
func TestOrderedGroupBatchHandlerHandsBackWhatFollowsAFailure(t *testing.T) {
	b := setupOrdered(t, outbox.Bitmap, outbox.BlockGroup)
	ctx := context.Background()
	var mu sync.Mutex
	var calls [][]int // each call's messages (seqs), in the order given
	var successes []int
	g := b.newGroup(t, "g")
	require.NoError(t, g.SetBatchHandler(func(ctx context.Context, ds []*outbox.Delivery) []error {
		mu.Lock()
		defer mu.Unlock()
		errs := make([]error, len(ds))
		var call []int
		for i, d := range ds {
			p, err := outbox.Decode[seqPayload](d)
			if err != nil {
				errs[i] = err
				continue
			}
			call = append(call, p.Seq)
			if p.Seq == 3 && len(calls) == 0 {
				errs[i] = errors.New("once")
				continue
			}
			successes = append(successes, p.Seq)
		}
		calls = append(calls, call)
		return errs
	}))
	msgs := make([]outbox.Message, 8)
	for i := range msgs {
		msgs[i] = b.groupMessage("k", i)
	}
	start(t, g, consumergroup.SubscriptionOptions{})
	_, err := b.producer.SendBatch(ctx, b.db.Pool, msgs)
	require.NoError(t, err)
	pgtest.Eventually(t, 10*time.Second, "every message completed", func() bool {
		return b.count(t, b.db.FinishedByAll()) == len(msgs)
	})

	mu.Lock()
	defer mu.Unlock()
	for _, call := range calls {
		require.IsIncreasing(t, call, "a call's messages in commit order")
	}
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, calls[0], "the first call: the whole run")
	last := map[int]int{} // seq -> index of its last success
	for i, s := range successes {
		last[s] = i
	}
	for seq := 1; seq < len(msgs); seq++ {
		require.Less(t, last[seq-1], last[seq], "message %d's last success came before %d's", seq, seq-1)
	}
}

// A message group whose head keeps failing is listed by BlockedGroups
// with its head, attempts, last error and what waits behind it; the other
// message groups go on. Unknown groups fail with outbox.ErrNotFound.
func TestOrderedGroupBlockedGroupsAreVisible(t *testing.T) {
	b := setupOrdered(t, outbox.Counter, outbox.BlockGroup)
	ctx := context.Background()
	var mu sync.Mutex
	handled := map[string]int{}
	reader := sdkmetric.NewManualReader()
	g := b.newGroup(t, "g", func(c *consumergroup.Config) {
		c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	})
	require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
		if d.Group == "stuck" {
			return outbox.RetryAfter(time.Hour, errors.New("downstream says no"))
		}
		mu.Lock()
		handled[d.Group]++
		mu.Unlock()
		return nil
	}, nil))
	start(t, g, consumergroup.SubscriptionOptions{})
	var msgs []outbox.Message
	for i := range 4 {
		msgs = append(msgs, b.groupMessage("stuck", i), b.groupMessage("free", i))
	}
	ids, err := b.producer.SendBatch(ctx, b.db.Pool, msgs)
	require.NoError(t, err)
	pgtest.Eventually(t, 10*time.Second, "the free message group done", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled["free"] == 4
	})
	var blocked []outbox.BlockedGroup
	pgtest.Eventually(t, 10*time.Second, "the stuck message group listed", func() bool {
		blocked, err = g.BlockedGroups(ctx, 0)
		require.NoError(t, err)
		return len(blocked) == 1
	})
	require.Equal(t, "stuck", blocked[0].Group)
	require.Equal(t, ids[0], blocked[0].HeadID)
	require.Equal(t, 1, blocked[0].Attempts)
	require.False(t, blocked[0].DeadLettered)
	require.Equal(t, 3, blocked[0].Behind)
	require.Contains(t, blocked[0].LastError, "downstream says no")

	// The gauges say the same, with the topic and group as attributes.
	gauges := testmetrics.Gauges(t, reader)
	require.Equal(t, 1.0, gauges["pgoutbox.ordered.blocked_groups"].Value)
	require.Equal(t, "g", gauges["pgoutbox.ordered.blocked_groups"].Attr("group"))
	require.Greater(t, gauges["pgoutbox.ordered.oldest_blocked_age"].Value, 0.0)
	require.Less(t, gauges["pgoutbox.ordered.oldest_blocked_age"].Value, 60.0)

	_, err = b.newGroup(t, "nobody").BlockedGroups(ctx, 0)
	require.ErrorIs(t, err, outbox.ErrNotFound)
}
