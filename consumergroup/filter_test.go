package consumergroup_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Members split messages by filter; a message every filter rejects counts as
// processed for the group (it completes and can be cleaned up).
func TestMemberFiltersAndRejectedMessages(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Bitmap)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub, Tracking: outbox.Bitmap, Retention: time.Nanosecond}))
	var even, odd atomic.Int64
	g := b.newGroup(t, "g")
	isSeq := func(pred func(int) bool) consumergroup.Filter {
		return func(d *outbox.Delivery) bool {
			p, err := outbox.Decode[seqPayload](d)
			return err == nil && p.Seq >= 0 && pred(p.Seq)
		}
	}
	require.NoError(t, g.AddConsumer("even", func(context.Context, *outbox.Delivery) error { even.Add(1); return nil }, isSeq(func(s int) bool { return s%2 == 0 })))
	require.NoError(t, g.AddConsumer("odd", func(context.Context, *outbox.Delivery) error { odd.Add(1); return nil }, isSeq(func(s int) bool { return s%2 == 1 })))
	start(t, g, consumergroup.FromNow())
	b.send(t, 0, 1, 2, 3, 4, -1) // -1: rejected by both filters
	pgtest.Eventually(t, 5*time.Second, "all handled or filtered", func() bool {
		return b.count(t, "required_bits <> 0 AND "+b.db.FinishedByAll()) == 6
	})
	require.EqualValues(t, 3, even.Load())
	require.EqualValues(t, 2, odd.Load())
	n, err := g.Cleanup(ctx, 100)
	require.NoError(t, err)
	require.EqualValues(t, 6, n)
}

// A topic that blocks writes while nobody subscribes refuses sends with a
// typed error and writes nothing; messages written with no subscriber are
// kept for the zero-subscription floor.
func TestZeroSubscriptionTopics(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Counter)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "strict", Semantics: outbox.PubSub, Tracking: outbox.Counter,
		BlockWritesOnZeroSubscriptions: true}))
	_, err := b.producer.Send(ctx, b.db.Pool, outbox.Message{Topic: "strict", Payload: []byte(`{}`)})
	require.ErrorIs(t, err, outbox.ErrNoSubscriptions)
	_, err = b.producer.SendBatch(ctx, b.db.Pool, []outbox.Message{{Topic: "events", Payload: []byte(`{}`)}, {Topic: "strict", Payload: []byte(`{}`)}})
	require.ErrorIs(t, err, outbox.ErrNoSubscriptions)
	require.Zero(t, b.count(t, "topic = 'strict'"))

	// Once a group subscribes, sends go through.
	strict := b.newGroup(t, "g", func(c *consumergroup.Config) { c.Topic = "strict" })
	require.NoError(t, strict.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return nil }, nil))
	start(t, strict, consumergroup.FromNow())
	_, err = b.producer.Send(ctx, b.db.Pool, outbox.Message{Topic: "strict", Payload: []byte(`{}`)})
	require.NoError(t, err)

	// "events" has nobody subscribed: its message stays for the floor (24h by default).
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub, Tracking: outbox.Counter, Retention: time.Nanosecond}))
	b.send(t, 1)
	g := b.newGroup(t, "cleaner")
	n, err := g.Cleanup(ctx, 100)
	require.NoError(t, err)
	require.Zero(t, n, "kept for the zero-subscription floor")
	require.Equal(t, 1, b.count(t, "topic = $1 AND required_count = 0", b.topic))
}
