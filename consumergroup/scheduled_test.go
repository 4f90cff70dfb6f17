package consumergroup_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// scheduledMessage is message seq of b's topic in message group group,
// available from notBefore (the zero time: at once).
func (b *bundle) scheduledMessage(seq int, group string, notBefore time.Time) outbox.Message {
	p, _ := json.Marshal(seqPayload{Seq: seq})
	return outbox.Message{Topic: b.topic, Payload: p, Group: group, NotBefore: notBefore}
}

// sendMessages sends msgs in one transaction, with a producer whose clock
// is clock (the one the group reads them by), and returns their ids.
func (b *bundle) sendMessages(t *testing.T, clock outbox.Clock, msgs ...outbox.Message) []int64 {
	t.Helper()
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: b.db.Schema, Clock: clock})
	require.NoError(t, err)
	ids, err := producer.SendBatch(context.Background(), b.db.Pool, msgs)
	require.NoError(t, err)
	return ids
}

// deliveryLog records the order and attempt of every delivery.
type deliveryLog struct {
	mu       sync.Mutex
	seqs     []int
	attempts map[int][]int
}

func newDeliveryLog() *deliveryLog { return &deliveryLog{attempts: map[int][]int{}} }

func (l *deliveryLog) handler(ctx context.Context, d *outbox.Delivery) error {
	p, err := outbox.Decode[seqPayload](d)
	if err != nil {
		return outbox.Permanent(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seqs = append(l.seqs, p.Seq)
	l.attempts[p.Seq] = append(l.attempts[p.Seq], d.Attempt)
	return nil
}

// of returns the attempts each delivery of seq had.
func (l *deliveryLog) of(seq int) []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.attempts[seq]...)
}

func (l *deliveryLog) order() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.seqs...)
}

// notYet waits a moment (long enough for a delivery that was handed out
// with the messages already seen to arrive) and fails if seq came.
func (l *deliveryLog) notYet(t *testing.T, seq int, why string) {
	t.Helper()
	time.Sleep(300 * time.Millisecond)
	require.Empty(t, l.of(seq), why)
}

// startLogging starts group "g" on b's topic, from now, on clock, logging
// every delivery.
func (b *bundle) startLogging(t *testing.T, clock outbox.Clock) (*consumergroup.Group, *deliveryLog) {
	t.Helper()
	log := newDeliveryLog()
	g := b.newGroup(t, "g", func(c *consumergroup.Config) { c.Clock = clock })
	require.NoError(t, g.AddConsumer("m", log.handler, nil))
	start(t, g, consumergroup.FromNow())
	return g, log
}

// A message sent with Delay or NotBefore reaches a group when it is due,
// not when the group reads it; the messages read with it are not held
// back, and it is delivered once, as a first attempt.
func TestScheduledMessagesWaitUntilDue(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			clock := clocktest.New(time.Now())
			b := setup(t, mode)
			g, log := b.startLogging(t, clock)

			b.sendMessages(t, clock, b.scheduledMessage(1, "", clock.Now().Add(time.Hour)), b.scheduledMessage(2, "", time.Time{}))
			pgtest.Eventually(t, 20*time.Second, "the message due at once is delivered", func() bool { return len(log.of(2)) > 0 })
			log.notYet(t, 1, "a message due in an hour was delivered at once")
			require.Equal(t, 1, b.countIn(t, "outbox_group_retries", "status = 'RETRY' AND attempts = 0"),
				"the scheduled message waits in the group's retry table")
			h, err := g.Health(context.Background(), 0)
			require.NoError(t, err)
			require.EqualValues(t, 1, h.Scheduled)
			require.Zero(t, h.Queued+h.Waiting, "queued %d, waiting %d", h.Queued, h.Waiting)

			clock.Advance(time.Hour + time.Second)
			pgtest.Eventually(t, 20*time.Second, "the scheduled message is delivered once due", func() bool { return len(log.of(1)) > 0 })
			time.Sleep(200 * time.Millisecond)
			require.Equal(t, []int{1}, log.of(1), "delivered once, as its first attempt")
			require.Equal(t, []int{1}, log.of(2))
			pgtest.Eventually(t, 20*time.Second, "nothing is left in the retry table", func() bool {
				return b.countIn(t, "outbox_group_retries", "true") == 0
			})
		})
	}
}

// On an ordered topic a scheduled message holds its message group until it
// is due (the messages behind it wait), and no other message group.
func TestScheduledMessageHoldsOnlyItsMessageGroup(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			clock := clocktest.New(time.Now())
			b := setupOrdered(t, mode, outbox.BlockGroup)
			_, log := b.startLogging(t, clock)

			b.sendMessages(t, clock, b.scheduledMessage(1, "late", clock.Now().Add(time.Hour)), b.scheduledMessage(2, "late", time.Time{}),
				b.scheduledMessage(3, "other", time.Time{}))
			pgtest.Eventually(t, 20*time.Second, "the other message group is delivered", func() bool { return len(log.of(3)) > 0 })
			log.notYet(t, 1, "a message due in an hour was delivered at once")
			require.Empty(t, log.of(2), "a message overtook the scheduled one ahead of it in its message group")

			clock.Advance(time.Hour + time.Second)
			pgtest.Eventually(t, 20*time.Second, "the message group goes on once its head is due", func() bool { return len(log.of(2)) > 0 })
			order := log.order()
			require.Equal(t, []int{3, 1, 2}, order, "delivery order")
		})
	}
}

// A member that crashed holding a batch that had a scheduled message: the
// batch is taken over when its lease runs out, and the scheduled message
// still waits for its time, delivered once then.
func TestTakeoverKeepsScheduledMessagesWaiting(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			clock := clocktest.New(time.Now())
			b := setup(t, mode)
			withClock := func(c *consumergroup.Config) { c.Clock = clock }
			var doomedGot atomic.Int64
			doomed, doomedPool := b.startDoomed(t, mode, 30*time.Second, clock, func(ctx context.Context, d *outbox.Delivery) error {
				doomedGot.Add(1)
				<-ctx.Done()
				return ctx.Err()
			})
			b.sendMessages(t, clock, b.scheduledMessage(1, "", clock.Now().Add(time.Hour)), b.scheduledMessage(2, "", time.Time{}))
			pgtest.Eventually(t, 10*time.Second, "the doomed member holds the batch", func() bool { return doomedGot.Load() > 0 })
			crash(doomed, doomedPool)

			log := newDeliveryLog()
			survivor := b.newGroup(t, "g", withClock)
			require.NoError(t, survivor.AddConsumer("m", log.handler, nil))
			start(t, survivor, consumergroup.FromNow())
			clock.Advance(time.Minute) // the batch's lease runs out; the scheduled message is not due
			pgtest.Eventually(t, 20*time.Second, "the batch is taken over", func() bool { return len(log.of(2)) > 0 })
			log.notYet(t, 1, "the takeover delivered a message due in an hour")

			clock.Advance(time.Hour)
			pgtest.Eventually(t, 20*time.Second, "the scheduled message is delivered once due", func() bool { return len(log.of(1)) > 0 })
			time.Sleep(200 * time.Millisecond)
			require.Equal(t, []int{1}, log.of(1), "delivered once, as its first attempt")
			require.Equal(t, []int{2}, log.of(2), "the crashed member's delivery spent an attempt")
		})
	}
}

// A group with a clock of its own (a test's, standing still) reading
// messages from a producer without one: nothing is scheduled, so the
// ordered queue hands them out at once, whatever the two clocks say.
func TestOrderedGroupOnItsOwnClockQueuesMessagesDueNow(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now().Add(-time.Minute))
	b := setupOrdered(t, outbox.Offset, outbox.BlockGroup)
	_, log := b.startLogging(t, clock)
	b.sendMessages(t, nil, b.scheduledMessage(1, "x", time.Time{}), b.scheduledMessage(2, "x", time.Time{}))
	pgtest.Eventually(t, 20*time.Second, "both delivered", func() bool { return len(log.order()) == 2 })
	require.Equal(t, []int{1, 2}, log.order())
}

// startDoomed configures b's topic (mode) with lease and starts an
// instance of group "g" with handler h on clock, on a pool of its own, so
// that the test can crash it (see crash).
func (b *bundle) startDoomed(t *testing.T, mode outbox.TrackingMode, lease time.Duration, clock outbox.Clock, h outbox.Handler) (*consumergroup.Group, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub, Tracking: mode, Lease: lease}))
	pool := pgtest.NewPool(t, b.db.DSN)
	g := b.newGroupOn(t, pool, "g", func(c *consumergroup.Config) { c.Clock = clock })
	require.NoError(t, g.AddConsumer("m", h, nil))
	require.NoError(t, g.Start(ctx, consumergroup.FromNow()))
	return g, pool
}

// A scheduled message parked out of its batch, delivered and acked while
// the batch is still open, is not delivered again when the batch is taken
// over after a crash: the takeover reads the batch's rows again and skips
// it.
func TestTakeoverSkipsAScheduledMessageAlreadyHandled(t *testing.T) {
	t.Parallel()
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			clock := clocktest.New(time.Now())
			b := setup(t, mode)
			withClock := func(c *consumergroup.Config) { c.Clock = clock }
			var got2, got1 atomic.Int64
			doomed, doomedPool := b.startDoomed(t, mode, 10*time.Minute, clock, func(ctx context.Context, d *outbox.Delivery) error {
				p, _ := outbox.Decode[seqPayload](d)
				if p.Seq == 1 {
					got1.Add(1)
					return nil
				}
				got2.Add(1)
				<-ctx.Done()
				return ctx.Err()
			})
			b.sendMessages(t, clock, b.scheduledMessage(1, "", clock.Now().Add(time.Minute)), b.scheduledMessage(2, "", time.Time{}))
			pgtest.Eventually(t, 10*time.Second, "the doomed member holds the batch", func() bool { return got2.Load() > 0 })
			clock.Advance(2 * time.Minute) // 1 is due; the batch's lease (10 min) still holds
			pgtest.Eventually(t, 10*time.Second, "the scheduled message is delivered and acked", func() bool {
				return got1.Load() > 0 && b.countIn(t, "outbox_group_retries", "true") == 0
			})
			crash(doomed, doomedPool)

			log := newDeliveryLog()
			survivor := b.newGroup(t, "g", withClock)
			require.NoError(t, survivor.AddConsumer("m", log.handler, nil))
			start(t, survivor, consumergroup.FromNow())
			clock.Advance(time.Hour) // the batch's lease runs out
			pgtest.Eventually(t, 20*time.Second, "the batch is taken over", func() bool { return len(log.of(2)) > 0 })
			time.Sleep(500 * time.Millisecond)
			t.Logf("mode %s: survivor got seq 1 %d times (acked once before the crash)", mode, len(log.of(1)))
			require.Empty(t, log.of(1), "the scheduled message, acked before the crash, was delivered again")
		})
	}
}

// A stopped group's health counts a message sent to be available later,
// which it has not read, as scheduled, not as unread, and not in its lag.
func TestUnreadScheduledMessageIsNotLag(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := clocktest.New(time.Now())
	b := setup(t, outbox.Offset)
	g, _ := b.startLogging(t, clock)
	require.NoError(t, g.Stop(ctx))
	b.sendMessages(t, clock, b.scheduledMessage(1, "", clock.Now().Add(time.Hour)))
	h, err := g.Health(ctx, 0)
	require.NoError(t, err)
	require.Zero(t, h.Unread)
	require.EqualValues(t, 1, h.Scheduled)
	require.Zero(t, h.Lag)
	b.sendMessages(t, clock, b.scheduledMessage(2, "", time.Time{}))
	h, err = g.Health(ctx, 0)
	require.NoError(t, err)
	require.EqualValues(t, 1, h.Unread)
	require.EqualValues(t, 1, h.Scheduled)
	require.Positive(t, h.Lag)
}
