package maintenance_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/outbox"
)

var modes = []outbox.TrackingMode{outbox.Bitmap, outbox.Counter, outbox.Offset}

// A group whose instances all stopped is declared DEAD by the service
// alone, with no instance of any group running on the topic, no later
// than its heartbeat timeout plus the job's interval (it stayed ACTIVE for
// ever when no instance ran on its topic).
func TestDeadGroupDetectedWithNoInstanceRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.topic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter})
	g := b.group(t, "events", "gone", newCounter().handle, consumergroup.FromNow(), func(c *consumergroup.Config) {
		c.HeartbeatInterval, c.HeartbeatTimeout = 100*time.Millisecond, time.Second
	})
	require.NoError(t, g.Stop(ctx)) // a graceful stop: ACTIVE, no more heartbeats
	stopped := time.Now()
	s := b.service(t, maintenance.Config{DeadGroupInterval: 200 * time.Millisecond})
	require.NoError(t, s.Start(ctx))
	pgtest.Eventually(t, 10*time.Second, "the group DEAD", func() bool {
		st, err := g.State(ctx)
		require.NoError(t, err)
		return st == consumergroup.Dead
	})
	// Heartbeat timeout (1 s) + interval (0.2 s, ±10%), + slack for a busy machine.
	require.Less(t, time.Since(stopped), 3*time.Second, "declared DEAD late")
	require.Contains(t, b.logs.String(), "consumer group is DEAD")
}

// Cleanup deletes, in every mode, what every group holding claims
// finished past the topic's retention, and nothing a group still needs.
func TestCleanupDeletesWhatEveryGroupFinished(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			b.topic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode,
				Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond})
			fast, slow := newCounter(), newCounter()
			b.group(t, "events", "fast", fast.handle, consumergroup.FromNow())
			gs := b.group(t, "events", "slow", slow.handle, consumergroup.FromNow())
			first := b.send(t, "events", 30)
			pgtest.Eventually(t, 10*time.Second, "both groups done", func() bool { return fast.distinct() == 30 && slow.distinct() == 30 })
			require.NoError(t, gs.Pause(ctx))
			time.Sleep(100 * time.Millisecond) // the pause reaches the instance
			second := b.send(t, "events", 20)
			pgtest.Eventually(t, 10*time.Second, "the fast group done", func() bool { return fast.distinct() == 50 })

			s := b.service(t, maintenance.Config{})
			pgtest.Eventually(t, 10*time.Second, "what both finished deleted", func() bool {
				_, err := s.RunOnce(ctx)
				require.NoError(t, err)
				return b.count(t, "outbox_published", "id = ANY($1)", first) == 0
			})
			require.Equal(t, 20, b.count(t, "outbox_published", "id = ANY($1)", second), "the paused group still needs them")
			require.NoError(t, gs.Resume(ctx))
			pgtest.Eventually(t, 10*time.Second, "the slow group done", func() bool { return slow.distinct() == 50 })
			pgtest.Eventually(t, 10*time.Second, "the rest deleted", func() bool {
				_, err := s.RunOnce(ctx)
				require.NoError(t, err)
				return b.count(t, "outbox_published", "true") == 0
			})
			require.Zero(t, fast.dups()+slow.dups())
			require.Empty(t, b.logs.errors())
		})
	}
}

// No message outlives the topic's MaxRetention because a PAUSED group holds
// it: the cap deletes it, counts it for the group and says so; the group,
// resumed, does not look for it and receives what came after.
func TestRetentionCapReleasesRowsAPausedGroupHolds(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			b.topic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode,
				Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond, MaxRetention: time.Second})
			live, paused := newCounter(), newCounter()
			b.group(t, "events", "live", live.handle, consumergroup.FromNow())
			gp := b.group(t, "events", "paused", paused.handle, consumergroup.FromNow())
			require.NoError(t, gp.Pause(ctx))
			time.Sleep(100 * time.Millisecond)
			old := b.send(t, "events", 25)
			pgtest.Eventually(t, 10*time.Second, "the live group done", func() bool { return live.distinct() == 25 })

			s := b.service(t, maintenance.Config{})
			r, err := s.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, 25, b.count(t, "outbox_published", "true"), "within MaxRetention the paused group keeps them")
			require.Empty(t, r.DroppedUnread)

			time.Sleep(1100 * time.Millisecond)
			r, err = s.RunOnce(ctx)
			require.NoError(t, err)
			require.Zero(t, b.count(t, "outbox_published", "true"))
			require.Equal(t, map[string]int64{"events/paused": 25}, r.DroppedUnread, "counted for the group that had not read them, not the other")
			require.Contains(t, b.logs.String(), "MaxRetention were deleted before this group finished them")
			require.Contains(t, b.logs.String(), "messages=25")

			require.NoError(t, gp.Resume(ctx))
			late := b.send(t, "events", 5)
			pgtest.Eventually(t, 10*time.Second, "new messages delivered to the resumed group", func() bool {
				return paused.distinct() == 5
			})
			for _, id := range old {
				require.False(t, paused.has(id), "message %d was dropped; it must not come", id)
			}
			for _, id := range late {
				require.True(t, paused.has(id))
			}
		})
	}
}

// A DEAD group keeps its claim on what it had not finished for the
// topic's ZombieTTL, then it is forgotten and cleanup deletes those
// messages.
func TestZombieTTLReleasesADeadGroupsClaims(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			b.topic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode,
				Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond, ZombieTTL: 2 * time.Second})
			live, dead := newCounter(), newCounter()
			b.group(t, "events", "live", live.handle, consumergroup.FromNow())
			gd := b.group(t, "events", "zombie", dead.handle, consumergroup.FromNow(), func(c *consumergroup.Config) {
				c.HeartbeatInterval, c.HeartbeatTimeout = 100*time.Millisecond, 500*time.Millisecond
			})
			require.NoError(t, gd.Stop(ctx))
			s := b.service(t, maintenance.Config{})
			pgtest.Eventually(t, 10*time.Second, "the stopped group DEAD", func() bool {
				r, err := s.RunOnce(ctx)
				require.NoError(t, err)
				return len(r.DeadGroups) == 1
			})
			died := time.Now()
			b.send(t, "events", 20)
			pgtest.Eventually(t, 10*time.Second, "the live group done", func() bool { return live.distinct() == 20 })
			_, err := s.RunOnce(ctx)
			require.NoError(t, err)
			if mode == outbox.Offset {
				// Its position still counts: everything after it is kept.
				require.Equal(t, 20, b.count(t, "outbox_published", "true"))
			} else {
				// New messages no longer needed it: they go.
				require.Zero(t, b.count(t, "outbox_published", "true"))
			}
			time.Sleep(time.Until(died.Add(2100 * time.Millisecond)))
			_, err = s.RunOnce(ctx)
			require.NoError(t, err)
			require.Zero(t, b.count(t, "outbox_published", "true"), "past ZombieTTL nothing is kept for it")
			require.Zero(t, b.count(t, "outbox_topic_subscriptions", "forget_pending"), "forgotten")
			require.Empty(t, b.logs.errors())
		})
	}
}

// A DEAD group keeps its claim on what it had not finished: cleanup
// leaves those messages alone within the topic's ZombieTTL.
func TestDeadGroupWithinZombieTTLPinsWhatItOwes(t *testing.T) {
	for _, mode := range []outbox.TrackingMode{outbox.Bitmap, outbox.Counter} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			b.topic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode,
				Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond})
			live, slow := newCounter(), newCounter()
			b.group(t, "events", "live", live.handle, consumergroup.FromNow())
			gd := b.group(t, "events", "owes", slow.handle, consumergroup.FromNow(), func(c *consumergroup.Config) {
				c.HeartbeatInterval, c.HeartbeatTimeout = 100*time.Millisecond, 500*time.Millisecond
			})
			require.NoError(t, gd.Pause(ctx))
			time.Sleep(100 * time.Millisecond)
			owed := b.send(t, "events", 10)
			pgtest.Eventually(t, 10*time.Second, "the live group done", func() bool { return live.distinct() == 10 })
			require.NoError(t, gd.Resume(ctx))
			require.NoError(t, gd.Stop(ctx)) // and dies before it reads them
			s := b.service(t, maintenance.Config{})
			pgtest.Eventually(t, 10*time.Second, "the group DEAD", func() bool {
				st, err := gd.State(ctx)
				require.NoError(t, err)
				if st != consumergroup.Dead {
					_, err = s.RunOnce(ctx)
					require.NoError(t, err)
				}
				return st == consumergroup.Dead
			})
			_, err := s.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, len(owed), b.count(t, "outbox_published", "id = ANY($1)", owed), "kept for the DEAD group")
		})
	}
}

// A group's dead letters keep a copy of their message: the message row
// can go (here by the retention cap) while the dead letter stays listable
// and replayable, and is delivered from its copy. Dead letters (QUEUE and
// group) are deleted after DeadLetterRetention.
func TestDeadLettersOutliveTheirMessageThenExpire(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.topic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Bitmap, MaxAttempts: 1,
		Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond, MaxRetention: time.Second})
	c := newCounter()
	c.fail.Store(true)
	g := b.group(t, "events", "g", c.handle, consumergroup.FromNow())
	ids := b.send(t, "events", 3)
	pgtest.Eventually(t, 10*time.Second, "dead-lettered", func() bool {
		dl, err := g.DeadLetters(ctx, 0, 10)
		require.NoError(t, err)
		return len(dl) == 3
	})
	s := b.service(t, maintenance.Config{})
	_, err := s.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, b.count(t, "outbox_published", "true"), "a dead letter no longer keeps its message (it has a copy)")
	dl, err := g.DeadLetters(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, dl, 3)
	require.JSONEq(t, `{"seq":0}`, string(dl[0].Payload))

	c.fail.Store(false)
	n, err := g.ReplayDeadLetters(ctx, ids[0])
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	pgtest.Eventually(t, 10*time.Second, "the replayed dead letter delivered from its copy", func() bool { return c.has(ids[0]) })

	// QUEUE dead letters too; then both expire.
	b.topic(t, outbox.TopicConfig{Name: "jobs", MaxAttempts: 1})
	k, err := b.client.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "jobs", PollInterval: 20 * time.Millisecond,
		Handler: func(context.Context, *outbox.Delivery) error { return outbox.Permanent(fmt.Errorf("no")) }})
	require.NoError(t, err)
	require.NoError(t, k.Start(ctx))
	defer k.Stop(ctx)
	b.send(t, "jobs", 2)
	pgtest.Eventually(t, 10*time.Second, "QUEUE dead letters", func() bool { return b.count(t, "outbox_dead_letters", "true") == 2 })
	short := b.service(t, maintenance.Config{DeadLetterRetention: time.Millisecond})
	time.Sleep(10 * time.Millisecond)
	r, err := short.RunOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, r.Deleted["outbox_dead_letters"])
	require.EqualValues(t, 2, r.Deleted["outbox_group_retries"])
	dl, err = g.DeadLetters(ctx, 0, 10)
	require.NoError(t, err)
	require.Empty(t, dl)
}

// Expired idempotency keys are deleted by the service (consumers and
// groups no longer do it), and only those.
func TestIdempotencyKeysExpire(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.topic(t, outbox.TopicConfig{Name: "short", IdempotencyWindow: time.Millisecond})
	b.topic(t, outbox.TopicConfig{Name: "long"})
	for _, topic := range []string{"short", "long"} {
		_, err := b.producer.Send(ctx, b.db.Pool, outbox.Message{Topic: topic, Payload: []byte(`{}`), IdempotencyKey: "k"})
		require.NoError(t, err)
	}
	time.Sleep(10 * time.Millisecond)
	r, err := b.service(t, maintenance.Config{}).RunOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, r.Deleted["outbox_idempotency_keys"])
	require.Equal(t, 1, b.count(t, "outbox_idempotency_keys", "topic = 'long'"))
}

// CANCELLED subscriptions past SubscriptionRetention are deleted; DEAD
// ones are warned about, then removed (their name freed, an instance that
// comes back starts a new group and says so), unless KeepDeadGroups. A
// cancelled group's name makes a new group at once.
func TestSubscriptionCleanup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.topic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Bitmap})
	c := newCounter()
	cancelled := b.group(t, "events", "cancelled", c.handle, consumergroup.FromNow())
	require.NoError(t, cancelled.Cancel(ctx))
	again := b.group(t, "events", "cancelled", c.handle, consumergroup.FromNow())
	require.NotEqual(t, cancelled.Subscription().ID, again.Subscription().ID, "a new group under the cancelled name")
	require.NoError(t, again.Stop(ctx))

	dead := b.group(t, "events", "dead", c.handle, consumergroup.FromNow())
	require.NoError(t, dead.Stop(ctx))
	b.exec(t, `UPDATE `+b.db.Table("outbox_topic_subscriptions")+` SET subscription_status = 'DEAD', released_at = now() - interval '29 days 12 hours'
WHERE group_name = 'dead'`)
	b.exec(t, `UPDATE `+b.db.Table("outbox_topic_subscriptions")+` SET released_at = now() - interval '31 days'
WHERE subscription_status = 'CANCELLED'`)

	kept := b.service(t, maintenance.Config{KeepDeadGroups: true})
	r, err := kept.RunOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, r.Deleted["outbox_topic_subscriptions"], "the cancelled subscription")
	require.Equal(t, 2, b.count(t, "outbox_topic_subscriptions", "true"))
	require.NotContains(t, b.logs.String(), "will be deleted")

	s := b.service(t, maintenance.Config{})
	r, err = s.RunOnce(ctx)
	require.NoError(t, err)
	require.Empty(t, r.RemovedGroups, "not due yet")
	require.Contains(t, b.logs.String(), "a DEAD consumer group will be deleted")

	b.exec(t, `UPDATE `+b.db.Table("outbox_topic_subscriptions")+` SET released_at = now() - interval '31 days' WHERE group_name = 'dead'`)
	r, err = s.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"events/dead"}, r.RemovedGroups)
	require.Zero(t, b.count(t, "outbox_topic_subscriptions", "group_name = 'dead'"))

	back := b.group(t, "events", "dead", c.handle, consumergroup.FromNow())
	require.Equal(t, 1, strings.Count(b.logs.String(), "subscription was deleted (it had been DEAD for too long); it starts as a NEW group"), b.logs.String())
	require.Equal(t, 1, strings.Count(b.logs.String(), "name was cancelled before; it starts as a NEW group"))
	st, err := back.State(ctx)
	require.NoError(t, err)
	require.Equal(t, consumergroup.Active, st)
}

// Every setting is checked, naming the field.
func TestConfigIsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for field, cfg := range map[string]maintenance.Config{
		"Client":                      {},
		"DeadGroupInterval":           {Client: b.client, DeadGroupInterval: -time.Second},
		"CleanupInterval":             {Client: b.client, CleanupInterval: -time.Second},
		"SubscriptionCleanupInterval": {Client: b.client, SubscriptionCleanupInterval: -time.Second},
		"BatchSize":                   {Client: b.client, BatchSize: -1},
		"StatementTimeout":            {Client: b.client, StatementTimeout: -time.Second},
		"BatchPause":                  {Client: b.client, BatchPause: -time.Second},
		"DeadLetterRetention":         {Client: b.client, DeadLetterRetention: -time.Second},
		"SubscriptionRetention":       {Client: b.client, SubscriptionRetention: time.Minute},
	} {
		_, err := maintenance.New(b.db.Pool, cfg)
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, field)
		require.Contains(t, err.Error(), field)
	}
	for name, preset := range map[string]maintenance.Config{"low": maintenance.ForLowThroughput(),
		"high": maintenance.ForHighThroughput(), "critical": maintenance.ForCriticalSystem()} {
		preset.Client = b.client
		_, err := maintenance.New(b.db.Pool, preset)
		require.NoError(t, err, name)
	}
}
