package consumergroup_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testlog"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// A backfill of 50,000 messages is throttled: never faster than
// BackfillRate (it takes at least the time the rate allows), and it
// pauses when its reads are slower than BackfillTargetLatency (here a
// target no read can meet), saying so.
func TestBackfillThrottleEngages(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Counter)
	ctx := context.Background()
	// Few enough reads (40 of 500) that a busy machine, where every read
	// is slow and so is every pause after it, still ends well within the
	// bound below; enough that the rate limit shows (a second at least).
	const n, rate = 20_000, 10_000
	b.sendRange(t, 0, n) // no group yet: kept for the zero-subscription floor
	logs := &testlog.Buffer{}
	r := newRecorder()
	g := b.newGroup(t, "late", func(c *consumergroup.Config) {
		c.Logger = logs.Logger()
		c.BatchSize, c.Concurrency = 500, 4
	})
	require.NoError(t, g.AddConsumer("m", r.handler, nil))
	began := time.Now()
	start(t, g, consumergroup.SubscriptionOptions{Position: consumergroup.StartBeginning, Backfill: true,
		BackfillBatchSize: 500, BackfillRate: rate, BackfillTargetLatency: time.Microsecond,
		BackfillMaxSlowdown: -1}) // the load rule is throttle_internal_test.go's
	// The latency rule pauses after every read for as long as reads take:
	// on a busy machine that is most of the time (an upper bound only).
	pgtest.Eventually(t, 3*time.Minute, "the backfill done", func() bool { return r.distinct() == n })
	took := time.Since(began)
	// The bucket starts with DefaultBackfillBatchSize tokens (more than
	// this BackfillBatchSize): the rest takes (n - 10,000) / rate s at
	// least.
	require.GreaterOrEqual(t, took, (n-consumergroup.DefaultBackfillBatchSize)*time.Second/rate, "faster than BackfillRate")
	require.Contains(t, logs.String(), "backfill yields", "the latency throttle never engaged")
	var p consumergroup.BackfillProgress
	pgtest.Eventually(t, 10*time.Second, "the backfill's end recorded", func() bool {
		var err error
		p, err = g.BackfillProgress(ctx)
		require.NoError(t, err)
		return p.Outcome == consumergroup.BackfillDone
	})
	require.EqualValues(t, n, p.Done)
	require.EqualValues(t, n, p.Total)
	require.Zero(t, r.dups())
	t.Logf("backfill of %d messages throttled at %d/s: %v", n, rate, took)
}

// CancelBackfill ends a backfill half-way: the old messages not read yet
// are not delivered, new ones still are, and cleanup no longer keeps the
// rest for the group.
func TestCancelBackfill(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Bitmap)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub, Tracking: outbox.Bitmap,
		Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond}))
	b.sendRange(t, 0, 2000) // nobody subscribed: cleanup may delete them at once, but for the backfill
	r := newRecorder()
	g := b.newGroup(t, "late")
	require.NoError(t, g.AddConsumer("m", r.handler, nil))
	start(t, g, consumergroup.SubscriptionOptions{Position: consumergroup.StartBeginning, Backfill: true,
		BackfillBatchSize: 50, BackfillRate: 500, BackfillMaxSlowdown: -1})
	admin := b.newGroup(t, "late")
	n, err := admin.Cleanup(ctx, 10_000)
	require.NoError(t, err)
	require.Zero(t, n, "a running backfill keeps its messages")
	pgtest.Eventually(t, 10*time.Second, "the backfill under way", func() bool { return r.distinct() >= 200 })
	cancelled, err := admin.CancelBackfill(ctx)
	require.NoError(t, err)
	require.True(t, cancelled)
	got := r.distinct()
	require.Less(t, got, 2000)
	b.send(t, 5000)
	pgtest.Eventually(t, 10*time.Second, "new messages still delivered", func() bool { return r.has(5000) })
	time.Sleep(300 * time.Millisecond)
	require.LessOrEqual(t, r.distinct(), got+50+1, "old messages kept coming after the cancel (beyond those in flight)")
	p, err := admin.BackfillProgress(ctx)
	require.NoError(t, err)
	require.Equal(t, consumergroup.BackfillCancelled, p.Outcome)
	require.False(t, p.Running)
	pgtest.Eventually(t, 10*time.Second, "cleanup no longer keeps them", func() bool {
		_, err := admin.Cleanup(ctx, 10_000)
		require.NoError(t, err)
		return b.count(t, "true") == 0
	})
	again, err := admin.CancelBackfill(ctx)
	require.NoError(t, err)
	require.False(t, again, "nothing left to cancel")
	_, err = b.newGroup(t, "ghost").CancelBackfill(ctx)
	require.ErrorIs(t, err, outbox.ErrNotFound)
}
