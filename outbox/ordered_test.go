package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testmetrics"
	"github.com/pgoutbox/pgoutbox/outbox"
)

func orderedTopic(name string, policy outbox.DeadLetterPolicy) outbox.TopicConfig {
	return outbox.TopicConfig{Name: name, Ordered: true, OrderedDeadLetters: policy, MaxAttempts: 3,
		BackoffInitial: time.Second, BackoffMax: time.Second, Lease: 10 * time.Second}
}

// sendAll writes msgs in one transaction and returns their ids.
func (b *testBundle) sendAll(t *testing.T, msgs ...outbox.Message) []int64 {
	t.Helper()
	ids, err := b.producer.SendBatch(context.Background(), b.db.Pool, msgs)
	require.NoError(t, err)
	return ids
}

func groupMessage(topic, group string, seq int) outbox.Message {
	m := seqMessage(topic, seq)
	m.Group = group
	return m
}

func TestOrderedTopicConfiguration(t *testing.T) {
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	for name, cfg := range map[string]outbox.TopicConfig{
		"policy, not ordered": {Name: "a", OrderedDeadLetters: outbox.SkipDeadLetters},
		"unknown policy":      {Name: "a", Ordered: true, OrderedDeadLetters: "DROP"},
	} {
		require.ErrorIs(t, b.client.ConfigureTopic(ctx, cfg), outbox.ErrInvalidConfig, name)
	}

	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "ordered", Ordered: true}))
	got, err := b.client.Topic(ctx, "ordered")
	require.NoError(t, err)
	require.True(t, got.Ordered)
	require.Equal(t, outbox.BlockGroup, got.OrderedDeadLetters, "the default policy")
	// The policy may change; the ordering may not, either way.
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "ordered", Ordered: true, OrderedDeadLetters: outbox.SkipDeadLetters}))
	got, err = b.client.Topic(ctx, "ordered")
	require.NoError(t, err)
	require.Equal(t, outbox.SkipDeadLetters, got.OrderedDeadLetters)
	require.ErrorIs(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "ordered"}), outbox.ErrInvalidConfig)
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "plain"}))
	require.ErrorIs(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "plain", Ordered: true}), outbox.ErrInvalidConfig)
	// PUB_SUB topics are ordered per consumer group, in every tracking mode.
	for _, mode := range []outbox.TrackingMode{outbox.Bitmap, outbox.Counter, outbox.Offset} {
		name := "fanout-" + string(mode)
		require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: name, Semantics: outbox.PubSub, Tracking: mode, Ordered: true}))
		got, err := b.client.Topic(ctx, name)
		require.NoError(t, err)
		require.True(t, got.Ordered, name)
		require.ErrorIs(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: name, Semantics: outbox.PubSub, Tracking: mode}), outbox.ErrInvalidConfig)
	}

	// Messages sent before the first configuration were not written in
	// order: the topic cannot become ordered until they are gone.
	b.sendN(t, "early", 1)
	require.ErrorIs(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "early", Ordered: true}), outbox.ErrInvalidConfig)
}

// A send to an ordered group waits for the transaction that sent to the
// group before it, and draws its id only then: a group's ids follow
// commit order. Sends to other groups do not wait.
func TestOrderedSendsTakeIdsInCommitOrder(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			b := setup(t, outbox.Config{})
			ctx := context.Background()
			require.NoError(t, b.client.ConfigureTopic(ctx, orderedTopic("o", "")))
			send := func(tx pgx.Tx, group string) (int64, error) {
				if batch {
					ids, err := b.producer.SendBatch(ctx, tx, []outbox.Message{seqMessage("o", 0), groupMessage("o", group, 0)})
					if err != nil {
						return 0, err
					}
					return ids[1], nil
				}
				return b.producer.Send(ctx, tx, groupMessage("o", group, 0))
			}
			// Learn the topic first, so that no send below reads it.
			require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error { _, err := send(tx, "warm"); return err }))

			first, err := b.db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer first.Rollback(ctx)
			firstID, err := b.producer.Send(ctx, first, groupMessage("o", "g", 1))
			require.NoError(t, err)

			type result struct {
				id  int64
				err error
			}
			second := make(chan result, 1)
			var firstCommitted atomic.Bool
			go func() {
				var id int64
				err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
					var err error
					id, err = send(tx, "g")
					if err == nil && !firstCommitted.Load() {
						err = errors.New("the second send to the group returned before the first committed")
					}
					return err
				})
				second <- result{id, err}
			}()
			// The second send is waiting for the group; another group is not.
			require.Eventually(t, func() bool { return waitingForLock(t, b) }, 5*time.Second, 5*time.Millisecond)
			var otherID int64
			require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				otherID, err = send(tx, "h")
				return err
			}))
			firstCommitted.Store(true)
			require.NoError(t, first.Commit(ctx))
			r := <-second
			require.NoError(t, r.err)
			require.Greater(t, otherID, firstID)
			require.Greater(t, r.id, otherID, "the waiting send drew its id after the wait, not before")
		})
	}
}

// waitingForLock reports whether a backend of the test's database waits
// for an advisory lock.
func waitingForLock(t *testing.T, b *testBundle) bool {
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `
SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND NOT l.granted AND a.datname = current_database()`).Scan(&n))
	return n > 0
}

// claimIDs claims up to 100 messages and returns their ids.
func claimIDs(t *testing.T, c *outbox.Client, topic string) (map[int64]*outbox.Delivery, []int64) {
	t.Helper()
	ds, err := c.Claim(context.Background(), topic, "me", 100)
	require.NoError(t, err)
	byID := map[int64]*outbox.Delivery{}
	var ids []int64
	for _, d := range ds {
		byID[d.ID] = d
		ids = append(ids, d.ID)
	}
	return byID, ids
}

func TestOrderedClaimTakesOnlyGroupHeads(t *testing.T) {
	clock := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	b := setup(t, outbox.Config{Clock: clock})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, orderedTopic("o", "")))
	var msgs []outbox.Message
	for i := range 3 {
		for _, g := range []string{"a", "b", "c"} {
			msgs = append(msgs, groupMessage("o", g, i))
		}
	}
	msgs = append(msgs, seqMessage("o", 100), seqMessage("o", 101)) // no group
	ids := b.sendAll(t, msgs...)
	a, bb, c := []int64{ids[0], ids[3], ids[6]}, []int64{ids[1], ids[4], ids[7]}, []int64{ids[2], ids[5], ids[8]}

	got, claimed := claimIDs(t, b.client, "o")
	require.ElementsMatch(t, []int64{a[0], bb[0], c[0], ids[9], ids[10]}, claimed, "one head per group, and the ungrouped messages")
	_, claimed = claimIDs(t, b.client, "o")
	require.Empty(t, claimed, "every head is leased")

	require.NoError(t, b.client.Ack(ctx, got[a[0]]))
	require.NoError(t, b.client.Retry(ctx, got[bb[0]], time.Second, "boom"))
	require.NoError(t, b.client.Release(ctx, got[c[0]], true))
	got, claimed = claimIDs(t, b.client, "o")
	require.ElementsMatch(t, []int64{a[1], c[0]}, claimed, "a moves on; b waits for its retry; c's head comes back")

	clock.Advance(time.Second)
	got2, claimed := claimIDs(t, b.client, "o")
	require.Equal(t, []int64{bb[0]}, claimed, "b's head, once due, before anything behind it")
	require.Equal(t, 2, got2[bb[0]].Attempt)

	// A lease that expires (its consumer died) frees the head again, and
	// only the head.
	clock.Advance(11 * time.Second)
	_, claimed = claimIDs(t, b.client, "o")
	require.ElementsMatch(t, []int64{a[1], c[0], bb[0], ids[9], ids[10]}, claimed)
	_ = got
}

func TestOrderedDeadLetterPolicies(t *testing.T) {
	for _, policy := range []outbox.DeadLetterPolicy{outbox.BlockGroup, outbox.SkipDeadLetters} {
		t.Run(string(policy), func(t *testing.T) {
			b := setup(t, outbox.Config{})
			ctx := context.Background()
			require.NoError(t, b.client.ConfigureTopic(ctx, orderedTopic("o", policy)))
			ids := b.sendAll(t,
				groupMessage("o", "a", 0), groupMessage("o", "b", 0), groupMessage("o", "a", 1), groupMessage("o", "b", 1))
			got, claimed := claimIDs(t, b.client, "o")
			require.ElementsMatch(t, []int64{ids[0], ids[1]}, claimed)
			require.NoError(t, b.client.DeadLetter(ctx, got[ids[0]], "poison"))
			require.NoError(t, b.client.Ack(ctx, got[ids[1]]))

			_, claimed = claimIDs(t, b.client, "o")
			if policy == outbox.SkipDeadLetters {
				require.ElementsMatch(t, []int64{ids[2], ids[3]}, claimed, "a moves past its dead letter")
				return
			}
			require.Equal(t, []int64{ids[3]}, claimed, "a is blocked by its dead letter; b is not")

			// A replayed dead letter is the group's head again: delivered
			// first, then the rest.
			n, err := b.client.ReplayDeadLetters(ctx, "o", ids[0])
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			got, claimed = claimIDs(t, b.client, "o")
			require.Equal(t, []int64{ids[0]}, claimed)
			require.NoError(t, b.client.DeadLetter(ctx, got[ids[0]], "poison again"))
			_, claimed = claimIDs(t, b.client, "o")
			require.Empty(t, claimed)

			// A discarded one unblocks the group.
			_, err = b.client.DiscardDeadLetters(ctx, "o", ids[0], 12345)
			require.ErrorIs(t, err, outbox.ErrNotFound)
			require.Zero(t, b.countDead(t, "true"))
			_, claimed = claimIDs(t, b.client, "o")
			require.Equal(t, []int64{ids[2]}, claimed)
		})
	}
}

// The ordered guarantee under load: three consumers on pools of their own
// (as if three processes), four handlers each, 200 groups of 50 messages,
// handlers that take random time and fail one time in ten. Every group's
// messages are handled, first successes in the order they were sent (each
// group's producer commits one message before sending the next), and all
// groups move at once, not one after another.
func TestOrderedConsumersKeepEveryGroupInOrder(t *testing.T) {
	t.Run("priority 0", func(t *testing.T) { testOrderedConsumersKeepEveryGroupInOrder(t, false) })
	// Messages of every priority from 0 to 3, mixed within each group:
	// priority chooses between groups, never within one.
	t.Run("mixed priorities", func(t *testing.T) { testOrderedConsumersKeepEveryGroupInOrder(t, true) })
}

func testOrderedConsumersKeepEveryGroupInOrder(t *testing.T, prioritize bool) {
	const groups, perGroup = 200, 50
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	tc := orderedTopic("o", "")
	tc.MaxAttempts, tc.BackoffInitial, tc.BackoffMax = 50, time.Millisecond, 5*time.Millisecond
	require.NoError(t, b.client.ConfigureTopic(ctx, tc))

	var (
		mu         sync.Mutex
		handled    = map[string][]int{} // group -> seqs of first successes
		done       = map[int64]bool{}
		total      int
		atQuarter  int // groups with a success when a quarter of the messages were handled
		violations []string
	)
	handler := func(ctx context.Context, d *outbox.Delivery) error {
		time.Sleep(time.Duration(rand.IntN(1500)) * time.Microsecond)
		if rand.IntN(10) == 0 {
			return errors.New("flaky")
		}
		p, err := outbox.Decode[seqPayload](d)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if done[d.ID] {
			return nil // a redelivery after an expired lease
		}
		done[d.ID] = true
		seqs := handled[d.Group]
		if len(seqs) > 0 && seqs[len(seqs)-1] > p.Seq {
			violations = append(violations, fmt.Sprintf("%s: %d after %d", d.Group, p.Seq, seqs[len(seqs)-1]))
		}
		handled[d.Group] = append(seqs, p.Seq)
		total++
		if total == groups*perGroup/4 {
			atQuarter = len(handled)
		}
		return nil
	}
	for i := range 3 {
		client, err := outbox.NewClient(pgtest.NewPool(t, b.db.DSN), outbox.Config{Schema: b.db.Schema})
		require.NoError(t, err)
		startConsumer(t, client, outbox.ConsumerConfig{Topic: "o", Handler: handler, Concurrency: 4, BatchSize: 20,
			PollInterval: 20 * time.Millisecond, ID: fmt.Sprintf("c%d", i)})
	}

	// One producer per 20 groups, sending each group's next message in a
	// transaction of its own, groups interleaved.
	var wg sync.WaitGroup
	for p := range 10 {
		wg.Go(func() {
			for seq := range perGroup {
				for g := p * 20; g < (p+1)*20; g++ {
					require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
						m := groupMessage("o", fmt.Sprintf("g%03d", g), seq)
						if prioritize {
							m.Priority = rand.IntN(4)
						}
						_, err := b.producer.Send(ctx, tx, m)
						return err
					}))
				}
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return total == groups*perGroup
	}, 2*time.Minute, 50*time.Millisecond)
	// The last acks are written after their handlers returned.
	pgtest.Eventually(t, 10*time.Second, "every message acked", func() bool { return b.count(t, "true") == 0 })

	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, violations, "messages handled out of their group's order")
	for g, seqs := range handled {
		require.Len(t, seqs, perGroup, g)
	}
	require.Len(t, handled, groups)
	require.Greater(t, atQuarter, groups/2, "groups moved one after another, not together")
	t.Logf("%d groups had a message handled when a quarter of all were", atQuarter)
}

// A claim walks the groups from where the previous one ended: with room
// for two messages a claim, four groups take turns, two at a time. Groups
// go by their bytes (C and D before a and b), whatever the database's
// collation.
func TestOrderedClaimsTakeGroupsInTurn(t *testing.T) {
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, orderedTopic("o", "")))
	var msgs []outbox.Message
	for i := range 3 {
		for _, g := range []string{"b", "C", "a", "D"} {
			msgs = append(msgs, groupMessage("o", g, i))
		}
	}
	b.sendAll(t, msgs...)
	var turns []string
	for range 4 {
		ds, err := b.client.Claim(ctx, "o", "me", 2)
		require.NoError(t, err)
		turn := ""
		for _, d := range ds {
			p, err := outbox.Decode[seqPayload](d)
			require.NoError(t, err)
			turn += fmt.Sprintf("%s%d ", d.Group, p.Seq)
		}
		turns = append(turns, turn)
		require.NoError(t, b.client.Ack(ctx, ds...))
	}
	require.Equal(t, []string{"C0 D0 ", "b0 a0 ", "C1 D1 ", "b1 a1 "}, turns) // each turn in id order
}

// A failing head, and a dead letter on a topic that blocks on them, show
// as blocked groups, through BlockedGroups and the gauges of a consumer's
// client.
func TestOrderedBlockedGroupsAreVisible(t *testing.T) {
	clock := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	reader := sdkmetric.NewManualReader()
	b := setup(t, outbox.Config{Clock: clock, MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, orderedTopic("o", "")))
	ids := b.sendAll(t, groupMessage("o", "a", 0), groupMessage("o", "b", 0),
		groupMessage("o", "c", 0), groupMessage("o", "a", 1), groupMessage("o", "a", 2), groupMessage("o", "b", 1))
	got, _ := claimIDs(t, b.client, "o")
	require.NoError(t, b.client.Retry(ctx, got[ids[0]], time.Minute, "a is down"))
	clock.Advance(time.Second)
	require.NoError(t, b.client.DeadLetter(ctx, got[ids[1]], "b is poison"))
	require.NoError(t, b.client.Ack(ctx, got[ids[2]]))
	clock.Advance(time.Second)

	blocked, err := b.client.BlockedGroups(ctx, "o", 0)
	require.NoError(t, err)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	require.Len(t, blocked, 2)
	require.Equal(t, outbox.BlockedGroup{Group: "a", HeadID: ids[0], Attempts: 1, LastError: "a is down", Since: start, Behind: 2},
		withUTC(blocked[0]))
	require.Equal(t, outbox.BlockedGroup{Group: "b", HeadID: ids[1], Attempts: 1, LastError: "b is poison",
		Since: start.Add(time.Second), DeadLettered: true, Behind: 1}, withUTC(blocked[1]))

	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "o", Handler: func(context.Context, *outbox.Delivery) error { return nil },
		PollInterval: time.Hour})
	gauges := testmetrics.Gauges(t, reader)
	require.Equal(t, 2.0, gauges["pgoutbox.ordered.blocked_groups"].Value)
	require.Equal(t, 2.0, gauges["pgoutbox.ordered.oldest_blocked_age"].Value)

	// Replaying the dead letter takes b off the list.
	_, err = b.client.ReplayDeadLetters(ctx, "o")
	require.NoError(t, err)
	blocked, err = b.client.BlockedGroups(ctx, "o", 0)
	require.NoError(t, err)
	require.Len(t, blocked, 1)
	require.Equal(t, "a", blocked[0].Group)
}

func withUTC(g outbox.BlockedGroup) outbox.BlockedGroup {
	g.Since = g.Since.UTC()
	return g
}

// A send to a topic never configured, still open while the topic is
// configured ordered, makes the configuration wait for it and then refuse
// (the message was not written in order), rather than leave a message the
// ordered claim would never read.
func TestOrderedConfigurationWaitsForSendsInFlight(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			b := setup(t, outbox.Config{})
			ctx := context.Background()
			tx, err := b.db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			if batch {
				_, err = b.producer.SendBatch(ctx, tx, []outbox.Message{groupMessage("late", "a", 0)})
			} else {
				_, err = b.producer.Send(ctx, tx, groupMessage("late", "a", 0))
			}
			require.NoError(t, err)
			configured := make(chan error, 1)
			go func() { configured <- b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "late", Ordered: true}) }()
			select {
			case err := <-configured:
				t.Fatalf("configured while a send was in flight: %v", err)
			case <-time.After(300 * time.Millisecond):
			}
			require.NoError(t, tx.Commit(ctx))
			require.ErrorIs(t, <-configured, outbox.ErrInvalidConfig)
		})
	}
}

// Blocked groups right after where the walk starts, as many as a claim
// has room for, do not keep the groups behind them from being claimed.
func TestOrderedBlockedGroupsDoNotStopTheOthers(t *testing.T) {
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, orderedTopic("o", outbox.BlockGroup)))
	var msgs []outbox.Message
	for _, g := range []string{"a", "b", "c"} {
		msgs = append(msgs, groupMessage("o", g, 0), groupMessage("o", g, 1))
	}
	msgs = append(msgs, groupMessage("o", "x", 0), groupMessage("o", "y", 0))
	b.sendAll(t, msgs...)
	got, _ := claimIDs(t, b.client, "o")
	for _, d := range got {
		if d.Group == "x" || d.Group == "y" {
			require.NoError(t, b.client.Release(ctx, d, false))
		} else {
			require.NoError(t, b.client.DeadLetter(ctx, d, "poison"))
		}
	}
	seen := map[string]bool{}
	for range 6 {
		ds, err := b.client.Claim(ctx, "o", "me", 2)
		require.NoError(t, err)
		for _, d := range ds {
			seen[d.Group] = true
		}
		require.NoError(t, b.client.Ack(ctx, ds...))
	}
	require.Equal(t, map[string]bool{"x": true, "y": true}, seen)
}

// On a topic that skips dead letters, a replayed message goes to the back
// of its group, so the group still has one message out at a time.
func TestOrderedReplayUnderSkipKeepsOneAtATime(t *testing.T) {
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, orderedTopic("o", outbox.SkipDeadLetters)))
	ids := b.sendAll(t, groupMessage("o", "a", 0), groupMessage("o", "a", 1), groupMessage("o", "a", 2))
	got, _ := claimIDs(t, b.client, "o")
	require.NoError(t, b.client.DeadLetter(ctx, got[ids[0]], "poison"))
	got, claimed := claimIDs(t, b.client, "o")
	require.Equal(t, []int64{ids[1]}, claimed)
	n, err := b.client.ReplayDeadLetters(ctx, "o")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, claimed = claimIDs(t, b.client, "o")
	require.Empty(t, claimed, "a's message 1 is still out")
	require.NoError(t, b.client.Ack(ctx, got[ids[1]]))
	var order []int
	for range 2 {
		ds, err := b.client.Claim(ctx, "o", "me", 10)
		require.NoError(t, err)
		require.Len(t, ds, 1)
		p, err := outbox.Decode[seqPayload](ds[0])
		require.NoError(t, err)
		order = append(order, p.Seq)
		require.NoError(t, b.client.Ack(ctx, ds...))
	}
	require.Equal(t, []int{2, 0}, order, "the replayed message comes after the group's queued ones")
}

// A REPEATABLE READ transaction that began before the topic's first
// configuration still sends to it as to an unconfigured topic; the
// message, committed after the configuration, is picked up once a
// consumer of the topic starts.
func TestOrderedStragglerIsMarkedWhenAConsumerStarts(t *testing.T) {
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	tx, err := b.db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT 1`) // the snapshot predates the configuration
	require.NoError(t, err)
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "late", Ordered: true}))
	_, err = b.producer.Send(ctx, tx, groupMessage("late", "a", 0))
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	_, claimed := claimIDs(t, b.client, "late")
	require.Empty(t, claimed, "unmarked: no ordered claim sees it yet")

	handled := make(chan int64, 1)
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "late", PollInterval: 20 * time.Millisecond,
		Handler: func(_ context.Context, d *outbox.Delivery) error { handled <- d.ID; return nil }})
	select {
	case <-handled:
	case <-time.After(10 * time.Second):
		t.Fatal("the message sent while the topic was configured was never delivered")
	}
}

// After a switch from skipping dead letters to blocking on them: a replay
// whose group moved on goes to the back of it (its later message is out),
// and a group with two dead letters is reported by its oldest.
func TestOrderedPolicySwitchFromSkipToBlock(t *testing.T) {
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, orderedTopic("o", outbox.SkipDeadLetters)))
	ids := b.sendAll(t, groupMessage("o", "a", 0), groupMessage("o", "a", 1),
		groupMessage("o", "b", 0), groupMessage("o", "b", 1))
	for range 2 { // a0, b0, then b1 dead-lettered; a1 left leased
		got, _ := claimIDs(t, b.client, "o")
		for _, d := range got {
			if d.ID != ids[1] {
				require.NoError(t, b.client.DeadLetter(ctx, d, fmt.Sprintf("poison %d", d.ID)))
			}
		}
	}
	a1 := claimedDelivery(t, b, ids[1])
	require.NoError(t, b.client.ConfigureTopic(ctx, orderedTopic("o", outbox.BlockGroup)))

	blocked, err := b.client.BlockedGroups(ctx, "o", 0)
	require.NoError(t, err)
	require.Len(t, blocked, 2)
	byGroup := map[string]outbox.BlockedGroup{blocked[0].Group: blocked[0], blocked[1].Group: blocked[1]}
	require.Equal(t, ids[2], byGroup["b"].HeadID, "b is reported by its oldest dead letter")

	_, err = b.client.ReplayDeadLetters(ctx, "o", ids[0])
	require.NoError(t, err)
	_, claimed := claimIDs(t, b.client, "o")
	require.Empty(t, claimed, "a's later message is still out: the replay waits behind it")
	require.NoError(t, b.client.Ack(ctx, a1))
	got, _ := claimIDs(t, b.client, "o")
	require.Len(t, got, 1)
	for _, d := range got {
		p, err := outbox.Decode[seqPayload](d)
		require.NoError(t, err)
		require.Equal(t, "a", d.Group)
		require.Equal(t, 0, p.Seq, "the replayed message, after a1")
		require.Greater(t, d.ID, ids[3], "with a new id")
	}
}

// claimedDelivery finds the leased delivery of message id (its lease
// owner "me", as claimIDs claims).
func claimedDelivery(t *testing.T, b *testBundle, id int64) *outbox.Delivery {
	t.Helper()
	var attempt int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		`SELECT attempts FROM `+b.db.Table("outbox")+` WHERE id = $1 AND lease_owner IS NOT NULL`, id).Scan(&attempt))
	return &outbox.Delivery{ID: id, Attempt: attempt}
}

// A consumer takes a run of a group's messages in one claim and handles it
// in order; when one fails, the rest of the run goes back untried and
// waits for it, and a second consumer cannot take them meanwhile.
func TestOrderedConsumerHandsBackTheRunBehindAFailure(t *testing.T) {
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	tc := orderedTopic("o", "")
	tc.BackoffInitial, tc.BackoffMax = 200*time.Millisecond, 200*time.Millisecond
	require.NoError(t, b.client.ConfigureTopic(ctx, tc))
	var msgs []outbox.Message
	for i := range 10 {
		msgs = append(msgs, groupMessage("o", "a", i))
	}
	b.sendAll(t, msgs...)

	var (
		mu     sync.Mutex
		calls  []int // seqs in call order, failures included
		failed atomic.Bool
	)
	first := make(chan struct{})
	release := make(chan struct{})
	handler := func(ctx context.Context, d *outbox.Delivery) error {
		p, err := outbox.Decode[seqPayload](d)
		if err != nil {
			return err
		}
		if p.Seq == 0 && d.Attempt == 1 {
			close(first)
			<-release
		}
		mu.Lock()
		calls = append(calls, p.Seq)
		mu.Unlock()
		if p.Seq == 3 && failed.CompareAndSwap(false, true) {
			return errors.New("boom")
		}
		return nil
	}
	for i := range 2 {
		startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "o", Handler: handler, Concurrency: 4, BatchSize: 20,
			PollInterval: 10 * time.Millisecond, ID: fmt.Sprintf("c%d", i)})
	}
	<-first
	require.Equal(t, 10, b.count(t, "message_group = 'a' AND lease_owner IS NOT NULL"),
		"the head and the nine behind it leased together, as a run")
	close(release)
	pgtest.Eventually(t, 10*time.Second, "every message acked", func() bool { return b.count(t, "true") == 0 })
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9}, calls,
		"after 3 failed, nothing behind it ran before its retry succeeded")
}

// A head whose expired lease was its last attempt is dead-lettered when a
// consumer claims it again; the run claimed with it goes back untried
// (its attempt given back) and, under BlockGroup, waits for the dead
// letter.
func TestOrderedRunBehindAnExpiredLastAttemptWaits(t *testing.T) {
	clock := clocktest.New(time.Now())
	b := setup(t, outbox.Config{Clock: clock})
	ctx := context.Background()
	tc := orderedTopic("o", outbox.BlockGroup)
	tc.MaxAttempts = 1
	require.NoError(t, b.client.ConfigureTopic(ctx, tc))
	b.sendAll(t, groupMessage("o", "g", 0), groupMessage("o", "g", 1), groupMessage("o", "g", 2))
	ds, err := b.client.Claim(ctx, "o", "gone", 10) // takes the head, then its process dies
	require.NoError(t, err)
	require.Len(t, ds, 1)
	clock.Advance(tc.Lease + time.Second)

	var handled atomic.Int64
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "o", ID: "next", PollInterval: 10 * time.Millisecond,
		Handler: func(context.Context, *outbox.Delivery) error { handled.Add(1); return nil }})
	pgtest.Eventually(t, 5*time.Second, "the head dead-lettered, its run handed back", func() bool {
		return b.countDead(t, "true") == 1 && b.count(t, "lease_owner IS NULL AND attempts = 0") == 2
	})
	time.Sleep(200 * time.Millisecond) // twenty polls
	require.Zero(t, handled.Load(), "nothing behind the dead letter is handled while it blocks its group")
}

// A head whose handler hangs past its lease (ignoring its context) does
// not hold the run claimed behind it: the run goes back untried, its
// attempts given back, and is handled once the head is handled again.
func TestOrderedRunBehindAStuckHandlerGoesBack(t *testing.T) {
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	tc := orderedTopic("o", "")
	tc.Lease = time.Second
	require.NoError(t, b.client.ConfigureTopic(ctx, tc))
	b.sendAll(t, groupMessage("o", "g", 0), groupMessage("o", "g", 1), groupMessage("o", "g", 2))
	release := make(chan struct{})
	var mu sync.Mutex
	var calls []string
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "o", Concurrency: 2, PollInterval: 10 * time.Millisecond,
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			p, err := outbox.Decode[seqPayload](d)
			if err != nil {
				return err
			}
			mu.Lock()
			calls = append(calls, fmt.Sprintf("%d/%d", p.Seq, d.Attempt))
			mu.Unlock()
			if p.Seq == 0 && d.Attempt == 1 {
				<-release // ignores ctx
			}
			return nil
		}})
	t.Cleanup(func() { close(release) }) // before the consumer's Stop, which waits for the handler
	pgtest.Eventually(t, 10*time.Second, "every message acked", func() bool { return b.count(t, "true") == 0 })
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"0/1", "0/2", "1/1", "2/1"}, calls,
		"the run behind the stuck head waited for its redelivery, and was not charged an attempt")
}
