package consumergroup_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Group A's handler blocks on one message; group B drains everything meanwhile.
func TestGroupsNeverBlockEachOther(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Bitmap)
	release := make(chan struct{})
	var blocked atomic.Bool
	a := b.newGroup(t, "a")
	require.NoError(t, a.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
		if blocked.CompareAndSwap(false, true) {
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
		}
		return nil
	}, nil))
	start(t, a, consumergroup.FromNow())
	rb := newRecorder()
	g := b.newGroup(t, "b")
	require.NoError(t, g.AddConsumer("m", rb.handler, nil))
	start(t, g, consumergroup.FromNow())
	b.sendRange(t, 0, 2000)
	pgtest.Eventually(t, 9*time.Second, "group B drained while A is blocked", func() bool { return rb.distinct() == 2000 })
	require.True(t, blocked.Load())
	close(release)
}

// Two instances of one group in separate pools (as two processes): each
// message handled once by the group.
func TestTwoInstancesShareAGroup(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			r := newRecorder()
			var perInstance [2]atomic.Int64
			for i := range 2 {
				pool := pgtest.NewPool(t, b.db.DSN)
				g := b.newGroupOn(t, pool, "shared", func(c *consumergroup.Config) { c.BatchSize = 20 })
				require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
					perInstance[i].Add(1)
					time.Sleep(100 * time.Microsecond)
					return r.handler(ctx, d)
				}, nil))
				start(t, g, consumergroup.FromNow())
			}
			b.sendRange(t, 0, 3000)
			pgtest.Eventually(t, 30*time.Second, "drained", func() bool { return r.distinct() == 3000 })
			time.Sleep(50 * time.Millisecond)
			require.Zero(t, r.dups(), r.duplicates())
			require.Positive(t, perInstance[0].Load())
			require.Positive(t, perInstance[1].Load())
		})
	}
}

// A member that dies mid-batch (pool closed, nothing completed): its batch
// is re-read by the other instance only after the lease, and handled there.
func TestCrashedMemberBatchRedeliveredAfterLease(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			clock := clocktest.New(time.Now())
			b := setup(t, mode)
			ctx := context.Background()
			require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub, Tracking: mode, Lease: 30 * time.Second}))
			withClock := func(c *consumergroup.Config) { c.Clock = clock; c.BatchSize = 10 }

			b.crashHoldingABatch(t, "g", func() { b.sendRange(t, 0, 10) }, withClock)

			r := newRecorder()
			survivor := b.newGroup(t, "g", withClock)
			require.NoError(t, survivor.AddConsumer("m", r.handler, nil))
			start(t, survivor, consumergroup.FromNow())
			time.Sleep(300 * time.Millisecond)
			require.Zero(t, r.distinct(), "nothing redelivered before the lease expires")
			clock.Advance(31 * time.Second)
			pgtest.Eventually(t, 10*time.Second, "batch re-read after the lease", func() bool { return r.distinct() == 10 })
			require.Zero(t, r.dups(), r.duplicates())
		})
	}
}

// Retries, backoff and dead letters per group; other groups unaffected.
func TestGroupRetryAndDeadLetter(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	b := setup(t, outbox.Counter)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub, Tracking: outbox.Counter,
		MaxAttempts: 2, BackoffInitial: 10 * time.Second, BackoffMax: time.Minute}))
	attempts := make(chan int, 10)
	var fail atomic.Bool
	fail.Store(true)
	g := b.newGroup(t, "flaky", func(c *consumergroup.Config) { c.Clock = clock })
	require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
		attempts <- d.Attempt
		if fail.Load() {
			return errors.New("downstream down")
		}
		return nil
	}, nil))
	start(t, g, consumergroup.FromNow())
	ok := newRecorder()
	other := b.newGroup(t, "healthy")
	require.NoError(t, other.AddConsumer("m", ok.handler, nil))
	start(t, other, consumergroup.FromNow())

	ids := b.send(t, 1)
	require.Equal(t, 1, <-attempts)
	pgtest.Eventually(t, 5*time.Second, "healthy group done", func() bool { return ok.distinct() == 1 })
	select {
	case a := <-attempts:
		t.Fatalf("attempt %d before the backoff", a)
	case <-time.After(200 * time.Millisecond):
	}
	clock.Advance(11 * time.Second)
	require.Equal(t, 2, <-attempts)
	pgtest.Eventually(t, 5*time.Second, "dead-lettered", func() bool {
		dl, err := g.DeadLetters(ctx, 0, 10)
		return err == nil && len(dl) == 1 && dl[0].ID == ids[0]
	})
	// The dead letter holds a copy of the message: the flaky group is done
	// with the message row, which cleanup may delete.
	pgtest.Eventually(t, 5*time.Second, "the dead letter's copy taken", func() bool {
		return b.countIn(t, "outbox_group_retries", "message_id = $1 AND status = 'DEAD_LETTER' AND payload IS NOT NULL", ids[0]) == 1
	})
	require.Equal(t, 1, b.count(t, "id = $1 AND required_count = 2 AND "+b.db.FinishedByAll(), ids[0]), "finished by both groups")
	fail.Store(false)
	n, err := g.ReplayDeadLetters(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Equal(t, 1, <-attempts)
	pgtest.Eventually(t, 5*time.Second, "completed by both", func() bool { return b.count(t, "id = $1 AND "+b.db.FinishedByAll(), ids[0]) == 1 })
}

// Completion is recorded only when every required group acked, per mode;
// cleanup deletes only then.
func TestCompletionNeedsEveryRequiredGroup(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			ctx := context.Background()
			require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub, Tracking: mode, Retention: time.Nanosecond}))
			fast := newRecorder()
			g1 := b.newGroup(t, "fast")
			require.NoError(t, g1.AddConsumer("m", fast.handler, nil))
			start(t, g1, consumergroup.FromNow())
			gate := make(chan struct{})
			slow := newRecorder()
			g2 := b.newGroup(t, "slow")
			require.NoError(t, g2.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
				<-gate
				return slow.handler(ctx, d)
			}, nil))
			start(t, g2, consumergroup.FromNow())
			b.sendRange(t, 0, 100)
			pgtest.Eventually(t, 10*time.Second, "fast group done", func() bool { return fast.distinct() == 100 })
			time.Sleep(50 * time.Millisecond)
			n, err := g1.Cleanup(ctx, 1000)
			require.NoError(t, err)
			require.Zero(t, n, "nothing deleted while the slow group has not acked")
			require.Equal(t, 100, b.count(t, "status = 'PUBLISHED'"))
			close(gate)
			pgtest.Eventually(t, 10*time.Second, "slow group done", func() bool { return slow.distinct() == 100 })
			pgtest.Eventually(t, 10*time.Second, "cleanup after both", func() bool {
				_, err := g1.Cleanup(ctx, 1000)
				return err == nil && b.count(t, "status = 'PUBLISHED'") == 0
			})
		})
	}
}

// Every valid transition works and every invalid one returns a typed error.
// Stop leaves the subscription ACTIVE and a restart gets what arrived meanwhile.
func TestStateMachine(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Bitmap)
	ctx := context.Background()
	states := []consumergroup.State{consumergroup.Active, consumergroup.Paused, consumergroup.Dead, consumergroup.Cancelled}
	valid := map[[2]consumergroup.State]bool{
		{consumergroup.Active, consumergroup.Paused}: true, {consumergroup.Paused, consumergroup.Active}: true,
		{consumergroup.Active, consumergroup.Dead}: true, {consumergroup.Dead, consumergroup.Active}: true,
		{consumergroup.Active, consumergroup.Cancelled}: true, {consumergroup.Paused, consumergroup.Cancelled}: true,
		{consumergroup.Dead, consumergroup.Cancelled}: true,
	}
	for _, from := range states {
		for _, to := range states {
			require.Equal(t, valid[[2]consumergroup.State{from, to}], consumergroup.CanTransition(from, to), "%s → %s", from, to)
		}
	}

	r := newRecorder()
	g := b.newGroup(t, "g")
	require.NoError(t, g.AddConsumer("m", r.handler, nil))
	require.NoError(t, g.Start(ctx, consumergroup.FromNow()))
	state := func() consumergroup.State {
		s, err := g.State(ctx)
		require.NoError(t, err)
		return s
	}
	require.Equal(t, consumergroup.Active, state())
	require.ErrorIs(t, g.Resume(ctx), consumergroup.ErrInvalidTransition)
	require.NoError(t, g.Pause(ctx))
	require.Equal(t, consumergroup.Paused, state())
	require.ErrorIs(t, g.Pause(ctx), consumergroup.ErrInvalidTransition)
	require.NoError(t, g.Resume(ctx))

	// Stop is not cancel; a new instance continues and receives what arrived meanwhile.
	require.NoError(t, g.Stop(ctx))
	require.Equal(t, consumergroup.Active, state())
	b.send(t, 1, 2, 3)
	g2 := b.newGroup(t, "g")
	require.NoError(t, g2.AddConsumer("m", r.handler, nil))
	start(t, g2, consumergroup.FromBeginning(false)) // options ignored: the subscription exists
	pgtest.Eventually(t, 5*time.Second, "messages sent while stopped", func() bool { return r.distinct() == 3 })
	require.NoError(t, g2.Stop(ctx))

	// ACTIVE → DEAD when heartbeats stop; DEAD → ACTIVE on restart (resurrection).
	_, err := b.db.Pool.Exec(ctx, `UPDATE `+b.db.Table("outbox_topic_subscriptions")+` SET last_heartbeat_at = now() - interval '2 minutes'`)
	require.NoError(t, err)
	g2.DetectDeadGroups(ctx)
	require.Equal(t, consumergroup.Dead, state())
	require.ErrorIs(t, g.Pause(ctx), consumergroup.ErrInvalidTransition, "DEAD → PAUSED")
	g3 := b.newGroup(t, "g")
	require.NoError(t, g3.AddConsumer("m", r.handler, nil))
	start(t, g3, consumergroup.FromNow())
	require.Equal(t, consumergroup.Active, state())

	// → CANCELLED is terminal for the subscription.
	require.NoError(t, g3.Cancel(ctx))
	require.Equal(t, consumergroup.Cancelled, state())
	for _, f := range []func(context.Context) error{g.Pause, g.Resume} {
		require.ErrorIs(t, f(ctx), consumergroup.ErrInvalidTransition)
	}
	require.NoError(t, g.Cancel(ctx), "Cancel again finishes what is left, or does nothing")
	// The name is free again: a new group, with a subscription of its own.
	g4 := b.newGroup(t, "g")
	require.NoError(t, g4.AddConsumer("m", r.handler, nil))
	start(t, g4, consumergroup.FromNow())
	require.Equal(t, consumergroup.Active, state())
	require.NotEqual(t, g3.Subscription().ID, g4.Subscription().ID)
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Bitmap)
	ctx := context.Background()
	noop := func(context.Context, *outbox.Delivery) error { return nil }
	cfg := consumergroup.Config{Topic: b.topic, Group: "g", Schema: b.db.Schema}

	bad := cfg
	bad.Group = ""
	_, err := consumergroup.New(b.db.Pool, bad)
	require.ErrorIs(t, err, consumergroup.ErrInvalidGroup)
	bad.Group = "has space"
	_, err = consumergroup.New(b.db.Pool, bad)
	require.ErrorIs(t, err, consumergroup.ErrInvalidGroup)

	g, err := consumergroup.New(b.db.Pool, cfg)
	require.NoError(t, err)
	require.ErrorIs(t, g.Start(ctx, consumergroup.FromNow()), consumergroup.ErrNoMembers)
	require.NoError(t, g.AddConsumer("m", noop, nil))
	require.ErrorIs(t, g.AddConsumer("m", noop, nil), consumergroup.ErrDuplicateMember)
	require.ErrorIs(t, g.RemoveConsumer("nobody"), consumergroup.ErrUnknownMember)
	require.ErrorIs(t, g.Start(ctx, consumergroup.SubscriptionOptions{Position: "SIDEWAYS"}), outbox.ErrInvalidConfig)
	for field, o := range map[string]consumergroup.SubscriptionOptions{
		"MaxBackfill":           {MaxBackfill: -1},
		"BackfillBatchSize":     {BackfillBatchSize: -1},
		"BackfillRate":          {BackfillRate: -1},
		"BackfillTargetLatency": {BackfillTargetLatency: -time.Second},
		"BackfillMaxSlowdown":   {BackfillMaxSlowdown: 1},
	} {
		o.Position, o.Backfill = consumergroup.StartBeginning, true
		err := g.Start(ctx, o)
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, field)
		require.ErrorContains(t, err, field)
	}
	for _, o := range []consumergroup.SubscriptionOptions{
		{BackfillMaxSlowdown: math.NaN()}, {BackfillRate: math.NaN()}, {BackfillRate: math.Inf(1)},
	} {
		o.Position = consumergroup.StartBeginning
		require.ErrorIs(t, g.Start(ctx, o), outbox.ErrInvalidConfig)
	}
	start(t, g, consumergroup.FromNow())
	require.ErrorIs(t, g.Start(ctx, consumergroup.FromNow()), outbox.ErrAlreadyStarted)
	require.ErrorIs(t, g.RemoveConsumer("m"), consumergroup.ErrLastMember)

	unknown := cfg
	unknown.Topic = "nope"
	u, err := consumergroup.New(b.db.Pool, unknown)
	require.NoError(t, err)
	require.NoError(t, u.AddConsumer("m", noop, nil))
	require.ErrorIs(t, u.Start(ctx, consumergroup.FromNow()), outbox.ErrUnknownTopic)

	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "jobs"}))
	queue := cfg
	queue.Topic = "jobs"
	q, err := consumergroup.New(b.db.Pool, queue)
	require.NoError(t, err)
	require.NoError(t, q.AddConsumer("m", noop, nil))
	require.ErrorIs(t, q.Start(ctx, consumergroup.FromNow()), outbox.ErrWrongSemantics)

	// The 65th bitmap group: typed error, nothing half-written.
	for i := 1; i < 64; i++ {
		c := cfg
		c.Group = fmt.Sprintf("g%d", i)
		gi, err := consumergroup.New(b.db.Pool, c)
		require.NoError(t, err)
		require.NoError(t, gi.AddConsumer("m", noop, nil))
		require.NoError(t, gi.Start(ctx, consumergroup.FromNow()))
		require.NoError(t, gi.Stop(ctx)) // the subscription (and its bit) stays
	}
	c := cfg
	c.Group = "g64"
	g65, err := consumergroup.New(b.db.Pool, c)
	require.NoError(t, err)
	require.NoError(t, g65.AddConsumer("m", noop, nil))
	require.ErrorIs(t, g65.Start(ctx, consumergroup.FromNow()), consumergroup.ErrTooManyGroups)
	var subs int
	var bits int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+b.db.Table("outbox_topic_subscriptions")+` WHERE topic = $1), subscribed_bits FROM `+
		b.db.Table("outbox_topics")+` WHERE topic = $1`, b.topic).Scan(&subs, &bits))
	require.Equal(t, 64, subs)
	require.Equal(t, int64(-1), bits, "all 64 bits, nothing for the refused group")
}

// A group that never subscribed is not found, whichever way it is asked
// about (dead letters and replays used to answer an empty list and 0); a
// replay of ids that are not the group's dead letters says so, and an
// unknown topic is not found either.
func TestUnknownGroupIsNotFound(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Bitmap)
	ctx := context.Background()
	ghost := b.newGroup(t, "never-started")
	_, err := ghost.State(ctx)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	_, err = ghost.DeadLetters(ctx, 0, 10)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	_, err = ghost.ReplayDeadLetters(ctx)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	_, err = ghost.ReplayDeadLetters(ctx, 1, 2)
	require.ErrorIs(t, err, outbox.ErrNotFound)

	g := b.newGroup(t, "real")
	require.NoError(t, g.AddConsumer("m", newRecorder().handler, nil))
	start(t, g, consumergroup.FromNow())
	dead, err := g.DeadLetters(ctx, 0, 10)
	require.NoError(t, err)
	require.Empty(t, dead)
	n, err := g.ReplayDeadLetters(ctx)
	require.NoError(t, err, "a subscribed group without dead letters replays nothing")
	require.Zero(t, n)
	n, err = g.ReplayDeadLetters(ctx, 42)
	require.ErrorIs(t, err, outbox.ErrNotFound, "42 is not a dead letter of the group")
	require.Zero(t, n)

	require.ErrorIs(t, outbox.ErrUnknownTopic, outbox.ErrNotFound)
	_, err = b.newGroup(t, "g", func(c *consumergroup.Config) { c.Topic = "no.such.topic" }).DeadLetters(ctx, 0, 1)
	require.ErrorIs(t, err, outbox.ErrNotFound)
}
