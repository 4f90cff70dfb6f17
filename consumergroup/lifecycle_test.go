package consumergroup_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/startstop/startstoptest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// A topic with churn (groups that come, complete messages and are
// cancelled) never runs out of bitmap bits: a cancelled group's bit is
// stripped from every row and freed.
func TestCancelledGroupsFreeTheirBits(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Bitmap)
	ctx := context.Background()
	for i := range 70 {
		r := newRecorder()
		g := b.newGroup(t, fmt.Sprintf("churn-%d", i))
		require.NoError(t, g.AddConsumer("m", r.handler, nil))
		require.NoError(t, g.Start(ctx, consumergroup.FromNow()), "group %d", i)
		b.send(t, i)
		pgtest.Eventually(t, 10*time.Second, "message handled", func() bool { return r.distinct() == 1 })
		require.NoError(t, g.Cancel(ctx))
		require.Zero(t, b.count(t, "required_bits & $1 <> 0", g.Subscription().Mask()),
			"no row refers to the cancelled group %d's bit", i)
	}
}

// A DEAD group past its ZombieTTL that was not forgotten (its instance
// crashed between the two steps, or forgetting failed) is forgotten by the
// next heartbeat of any running instance on the topic.
func TestForgettingIsFinishedByAnyInstance(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Counter)
	ctx := context.Background()
	gone := b.newGroup(t, "gone")
	require.NoError(t, gone.AddConsumer("m", newRecorder().handler, nil))
	require.NoError(t, gone.Start(ctx, consumergroup.FromNow()))
	require.NoError(t, gone.Stop(ctx))
	b.sendRange(t, 0, 50)
	id := gone.Subscription().ID
	// What dead-group detection commits before it forgets: DEAD, out of the
	// subscribed set, forgetting pending; and its ZombieTTL has run out.
	_, err := b.db.Pool.Exec(ctx, `UPDATE `+b.db.Table("outbox_topic_subscriptions")+`
SET subscription_status = 'DEAD', forget_pending = true, released_at = now() - interval '8 days' WHERE id = $1`, id)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `UPDATE `+b.db.Table("outbox_topics")+` SET subscribed_ids = array_remove(subscribed_ids, $1)`, id)
	require.NoError(t, err)
	require.Equal(t, 50, b.count(t, "$1 = ANY(required_ids)", id))

	other := b.newGroup(t, "other", func(c *consumergroup.Config) { c.HeartbeatInterval = 50 * time.Millisecond })
	require.NoError(t, other.AddConsumer("m", newRecorder().handler, nil))
	start(t, other, consumergroup.FromNow())
	pgtest.Eventually(t, 10*time.Second, "the dead group forgotten", func() bool {
		return b.count(t, "$1 = ANY(required_ids)", id) == 0
	})
	pgtest.Eventually(t, 10*time.Second, "forgetting recorded as done", func() bool {
		var pending bool
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT forget_pending FROM `+b.db.Table("outbox_topic_subscriptions")+` WHERE id = $1`, id).Scan(&pending))
		return !pending
	})
}

// An instance whose subscription row was deleted stops on its own and says
// why, instead of looking for it again and again.
func TestDeletedSubscriptionStopsTheInstance(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			ctx := context.Background()
			g := b.newGroup(t, "g")
			require.NoError(t, g.AddConsumer("m", newRecorder().handler, nil))
			start(t, g, consumergroup.FromNow())
			require.Nil(t, g.Err())
			_, err := b.db.Pool.Exec(ctx, `DELETE FROM `+b.db.Table("outbox_topic_subscriptions")+` WHERE group_name = 'g'`)
			require.NoError(t, err)
			select {
			case <-g.Stopped():
			case <-time.After(5 * time.Second):
				t.Fatal("the instance did not stop")
			}
			require.ErrorIs(t, g.Err(), consumergroup.ErrSubscriptionGone)
			require.NoError(t, g.Stop(ctx))
		})
	}
}

// Cancel by another instance (or an operator's Group value) stops every
// running instance of the group, which reports ErrCancelled.
func TestCancelStopsOtherInstances(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Offset)
	ctx := context.Background()
	g := b.newGroup(t, "g")
	require.NoError(t, g.AddConsumer("m", newRecorder().handler, nil))
	start(t, g, consumergroup.FromNow())
	admin := b.newGroup(t, "g")
	require.NoError(t, admin.Cancel(ctx))
	select {
	case <-g.Stopped():
	case <-time.After(5 * time.Second):
		t.Fatal("the instance did not stop")
	}
	require.ErrorIs(t, g.Err(), consumergroup.ErrCancelled)
}

// Dead letters are listed and replayed through a Group value that was
// never started (an operator's tool).
func TestDeadLettersOfAnUnstartedGroup(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Bitmap)
	ctx := context.Background()
	g := b.newGroup(t, "g")
	require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error {
		return outbox.Permanent(fmt.Errorf("no"))
	}, nil))
	start(t, g, consumergroup.FromNow())
	ids := b.send(t, 1, 2)
	admin := b.newGroup(t, "g")
	pgtest.Eventually(t, 10*time.Second, "dead letters", func() bool {
		dl, err := admin.DeadLetters(ctx, 0, 10)
		require.NoError(t, err)
		return len(dl) == 2
	})
	n, err := admin.ReplayDeadLetters(ctx, ids[0])
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
}

// A handler that ignores its context past HandlerTimeout costs one retry
// of its message; the instance's other messages, and its Stop, go on.
func TestHungHandlerIsAbandoned(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Offset)
	ctx := context.Background()
	release := make(chan struct{})
	defer close(release)
	r := newRecorder()
	g := b.newGroup(t, "g", func(c *consumergroup.Config) { c.HandlerTimeout = 100 * time.Millisecond; c.Concurrency = 1 })
	require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
		if p, _ := outbox.Decode[seqPayload](d); p.Seq == 0 && d.Attempt == 1 {
			<-release
		}
		return r.handler(ctx, d)
	}, nil))
	start(t, g, consumergroup.FromNow())
	b.send(t, 0, 1, 2, 3)
	pgtest.Eventually(t, 5*time.Second, "every message, the hung one by its retry", func() bool { return r.distinct() == 4 })
	stopCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, g.Stop(stopCtx), context.DeadlineExceeded, "Stop reports the call still running")
}

// An instance keeps the leases of what it works on alive: a handler that
// takes 2.5 times the topic's lease (within its HandlerTimeout) is not
// taken over, and its batch completes once.
func TestLeasesKeptWhileHandling(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			ctx := context.Background()
			require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub, Tracking: mode, Lease: time.Second}))
			r := newRecorder()
			g := b.newGroup(t, "g", func(c *consumergroup.Config) { c.HandlerTimeout = 10 * time.Second })
			require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
				if p, _ := outbox.Decode[seqPayload](d); p.Seq == 0 {
					time.Sleep(2500 * time.Millisecond)
				}
				return r.handler(ctx, d)
			}, nil))
			start(t, g, consumergroup.FromNow())
			b.send(t, 0, 1, 2)
			pgtest.Eventually(t, 10*time.Second, "all handled", func() bool { return r.distinct() == 3 })
			time.Sleep(200 * time.Millisecond)
			require.Zero(t, r.dups(), "nothing handled twice:\n%s", r.duplicates())
			require.Zero(t, b.countIn(t, "outbox_group_retries", "true"), "no lease ran out")
		})
	}
}

// A group instance started and stopped from ten goroutines at once, over
// and over, never runs twice at once and never hangs a Stop; stopped, it
// starts again, continues its subscription and receives what was sent
// meanwhile.
func TestGroupStartStopStress(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Counter)
	r := newRecorder()
	g := b.newGroup(t, "g")
	require.NoError(t, g.AddConsumer("m", r.handler, nil))
	startstoptest.Stress(t, groupService{g}, 10)

	b.send(t, 1, 2, 3)
	require.NoError(t, g.Start(context.Background(), consumergroup.FromNow()))
	pgtest.Eventually(t, 10*time.Second, "messages sent while stopped delivered after a restart", func() bool { return r.distinct() == 3 })
	require.NoError(t, g.Stop(context.Background()))
	require.Zero(t, r.dups(), r.duplicates())
}

// groupService is a Group as a service that starts FromNow.
type groupService struct{ *consumergroup.Group }

func (g groupService) Start(ctx context.Context) error {
	return g.Group.Start(ctx, consumergroup.FromNow())
}
