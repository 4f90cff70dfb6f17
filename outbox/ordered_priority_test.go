package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/outbox"
)

// prioritized is a message of group g with sequence number seq and
// priority p.
func prioritized(topic, g string, seq, p int) outbox.Message {
	m := groupMessage(topic, g, seq)
	m.Priority = p
	return m
}

// claimTurn claims up to limit messages, acks them, and returns them as
// "<group><seq>" in the order Claim returned them (id order).
func (b *testBundle) claimTurn(t *testing.T, topic string, limit int) string {
	t.Helper()
	ctx := context.Background()
	ds, err := b.client.Claim(ctx, topic, "me", limit)
	require.NoError(t, err)
	var turn []string
	for _, d := range ds {
		p, err := outbox.Decode[seqPayload](d)
		require.NoError(t, err)
		turn = append(turn, fmt.Sprintf("%s%d", d.Group, p.Seq))
	}
	if len(ds) > 0 {
		require.NoError(t, b.client.Ack(ctx, ds...))
	}
	return strings.Join(turn, " ")
}

// orderedTurns configures the ordered topic "o", sends each batch in a
// transaction of its own, and returns the turns of claims claims of up
// to limit messages (see claimTurn).
func orderedTurns(t *testing.T, claims, limit int, batches ...[]outbox.Message) (*testBundle, []string) {
	t.Helper()
	b := setup(t, outbox.Config{})
	require.NoError(t, b.client.ConfigureTopic(context.Background(), orderedTopic("o", "")))
	for _, batch := range batches {
		b.sendAll(t, batch...)
	}
	var turns []string
	for range claims {
		turns = append(turns, b.claimTurn(t, "o", limit))
	}
	return b, turns
}

// Ten groups whose heads have priority 0, then one whose head has priority
// 9 and one at 5: a claim of one takes the priority-9 head, the next the
// priority-5 one, and only then the priority-0 heads, in turn.
func TestOrderedClaimTakesTheHighestPriorityHeadFirst(t *testing.T) {
	ctx := context.Background()
	var msgs []outbox.Message
	for g := range 10 {
		msgs = append(msgs, prioritized("o", fmt.Sprintf("a%d", g), 0, 0))
	}
	b, turns := orderedTurns(t, 4, 1, msgs, []outbox.Message{prioritized("o", "p", 0, 9)},
		[]outbox.Message{prioritized("o", "q", 0, 5)})
	require.Equal(t, []string{"p0", "q0", "a00", "a10"}, turns)

	// A claim with room for several takes the higher heads first too.
	b.sendAll(t, prioritized("o", "p", 1, 9), prioritized("o", "q", 1, 5))
	ds, err := b.client.Claim(ctx, "o", "me", 3)
	require.NoError(t, err)
	var groups []string
	for _, d := range ds {
		groups = append(groups, d.Group)
	}
	require.ElementsMatch(t, []string{"p", "q", "a2"}, groups)
}

// A consumer that claims one message at a time handles the priority-9
// head before the priority-0 heads that were there before it.
func TestOrderedConsumerHandlesTheHighestPriorityHeadFirst(t *testing.T) {
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, orderedTopic("o", "")))
	var msgs []outbox.Message
	for seq := range 3 {
		for g := range 10 {
			msgs = append(msgs, prioritized("o", fmt.Sprintf("a%d", g), seq, 0))
		}
	}
	b.sendAll(t, msgs...)
	b.sendAll(t, prioritized("o", "p", 0, 9))

	var mu sync.Mutex
	var handled []string
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "o", BatchSize: 1, Concurrency: 1,
		PollInterval: 10 * time.Millisecond,
		Handler: func(_ context.Context, d *outbox.Delivery) error {
			p, err := outbox.Decode[seqPayload](d)
			if err != nil {
				return err
			}
			mu.Lock()
			handled = append(handled, fmt.Sprintf("%s%d", d.Group, p.Seq))
			mu.Unlock()
			return nil
		}})
	require.Eventually(t, func() bool { return b.count(t, "true") == 0 }, 30*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, handled, 31)
	require.Equal(t, "p0", handled[0], "the priority-9 head first: %v", handled)
}

// Priority chooses between heads, never within a group: a priority-9
// message behind a priority-0 head waits for it, and goes as soon as it
// is its group's head. Claims of one, each acked:
//
//  1. h0 (priority 3) is the only head above 0 (g1 and g3 are not heads);
//  2. i0 and 3. g0: the priority-0 heads in turn, from h on;
//  4. g1, now g's head, at priority 9;
//  5. i1 and 6. g2 in turn;
//  7. g3, now g's head, at priority 5;
//  8. and 9. what is left.
func TestOrderedPriorityKeepsEachGroupInCommitOrder(t *testing.T) {
	_, turns := orderedTurns(t, 10, 1, []outbox.Message{
		prioritized("o", "g", 0, 0), prioritized("o", "g", 1, 9), prioritized("o", "g", 2, 0), prioritized("o", "g", 3, 5),
		prioritized("o", "h", 0, 3),
		prioritized("o", "i", 0, 0), prioritized("o", "i", 1, 0), prioritized("o", "i", 2, 0), prioritized("o", "i", 3, 0)})
	require.Equal(t, []string{"h0", "i0", "g0", "g1", "i1", "g2", "g3", "i2", "i3", ""}, turns)
}

// Priority and turn-taking together: heads of a higher priority go first,
// and the groups below them keep taking turns where the previous claim
// left off; heads of one priority take turns as priority-0 heads do, and
// a long backlog at a priority above 0 does not crowd out the other
// groups at that priority.
func TestOrderedPriorityKeepsTurns(t *testing.T) {
	t.Run("a busy higher-priority group does not stop the turns below it", func(t *testing.T) {
		var msgs []outbox.Message
		for i := range 2 {
			for _, g := range []string{"b", "C", "a", "D"} {
				msgs = append(msgs, groupMessage("o", g, i))
			}
		}
		for i := range 4 {
			msgs = append(msgs, prioritized("o", "z", i, 9))
		}
		_, turns := orderedTurns(t, 4, 3, msgs)
		require.Equal(t, []string{"C0 D0 z0", "b0 a0 z1", "C1 D1 z2", "b1 a1 z3"}, turns)
	})
	t.Run("heads of one priority take turns", func(t *testing.T) {
		var msgs []outbox.Message
		for i := range 3 {
			for _, g := range []string{"b", "C", "a", "D"} {
				msgs = append(msgs, prioritized("o", g, i, 5))
			}
		}
		_, turns := orderedTurns(t, 4, 2, msgs)
		require.Equal(t, []string{"C0 D0", "b0 a0", "C1 D1", "b1 a1"}, turns)
	})
	t.Run("a long backlog above 0 does not crowd out its peers", func(t *testing.T) {
		var msgs []outbox.Message
		for i := range 300 {
			msgs = append(msgs, prioritized("o", "a", i, 5))
		}
		_, turns := orderedTurns(t, 4, 1, msgs, []outbox.Message{prioritized("o", "b", 0, 5), prioritized("o", "c", 0, 0)})
		require.Equal(t, []string{"a0", "b0", "a1", "a2"}, turns)
	})
}

// Messages without a group are claimed by priority as on any QUEUE topic,
// even behind many older ones.
func TestOrderedUngroupedMessagesKeepTheirPriority(t *testing.T) {
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs, seqMessage("o", i))
	}
	urgent := seqMessage("o", 9)
	urgent.Priority = 9
	_, turns := orderedTurns(t, 2, 1, msgs, []outbox.Message{urgent})
	require.Equal(t, []string{"9", "0"}, turns)
}

// A head above priority 0 whose group is held back by a dead letter is not
// claimed under BlockGroup; under SkipDeadLetters it is.
func TestOrderedPriorityHeadBehindADeadLetter(t *testing.T) {
	for policy, want := range map[outbox.DeadLetterPolicy][]string{
		outbox.BlockGroup: {"b0", ""}, outbox.SkipDeadLetters: {"a1", "b0"},
	} {
		t.Run(string(policy), func(t *testing.T) {
			b := setup(t, outbox.Config{})
			ctx := context.Background()
			require.NoError(t, b.client.ConfigureTopic(ctx, orderedTopic("o", policy)))
			b.sendAll(t, prioritized("o", "a", 0, 0), prioritized("o", "a", 1, 9), prioritized("o", "b", 0, 0))
			ds, err := b.client.Claim(ctx, "o", "me", 1)
			require.NoError(t, err)
			require.Len(t, ds, 1)
			require.Equal(t, "a", ds[0].Group)
			require.NoError(t, b.client.DeadLetter(ctx, ds[0], "boom"))
			var turns []string
			for range len(want) {
				turns = append(turns, b.claimTurn(t, "o", 1))
			}
			require.Equal(t, want, turns)
		})
	}
}
