package consumergroup_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// A Counter group removed after it finished a message (by its position)
// is taken out of the message's required groups: once its subscription is
// gone nothing can say it finished the message, and cleanup must still
// delete it when the other group has.
func TestRemovedCounterGroupNoLongerHoldsMessagesItFinished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, outbox.Counter)
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub, Tracking: outbox.Counter, Retention: time.Nanosecond}))
	b.subscribe(t, "b") // subscribed, reads nothing yet
	ra := newRecorder()
	ga := b.startRecording(t, "a", ra)
	ids := b.send(t, 1)
	aSub := b.subID(t, "a")
	pgtest.Eventually(t, 10*time.Second, "a finished it", func() bool {
		return b.count(t, "id = $1 AND "+b.db.FinishedBy(aSub), ids[0]) == 1
	})
	require.NoError(t, ga.Stop(ctx))
	maint, err := consumergroup.NewMaintainer(b.db.Pool, b.client)
	require.NoError(t, err)
	require.NoError(t, maint.RemoveGroup(ctx, b.topic, "a"))
	rb := newRecorder()
	b.startRecording(t, "b", rb)
	bSub := b.subID(t, "b")
	pgtest.Eventually(t, 10*time.Second, "b finished it", func() bool {
		return rb.hasAll(ids) && b.count(t, "id = $1 AND "+b.db.FinishedBy(bSub), ids[0]) == 1
	})
	n, err := maint.Cleanup(ctx, b.topic, 100)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "both groups handled the message; cleanup deletes it")
	require.Zero(t, b.count(t, "id = $1", ids[0]))
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
			ctx := context.Background()
			require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub, Tracking: mode, Lease: 10 * time.Minute}))
			withClock := func(c *consumergroup.Config) { c.Clock = clock }

			doomedPool := pgtest.NewPool(t, b.db.DSN)
			doomed := b.newGroupOn(t, doomedPool, "g", withClock)
			var got2, got1 atomic.Int64
			require.NoError(t, doomed.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
				p, _ := outbox.Decode[seqPayload](d)
				if p.Seq == 1 {
					got1.Add(1)
					return nil
				}
				got2.Add(1)
				<-ctx.Done()
				return ctx.Err()
			}, nil))
			require.NoError(t, doomed.Start(ctx, consumergroup.FromNow()))
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
