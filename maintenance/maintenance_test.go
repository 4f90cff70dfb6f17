package maintenance_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
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
	// Heartbeat timeout (1 s) + interval (0.2 s, ±10%) is 1.2 s; the bound
	// leaves five times that for a busy machine and is still far below the
	// default timeout and interval (minutes), which it would take otherwise.
	require.Less(t, time.Since(stopped), 6*time.Second, "declared DEAD late")
	// The WARN follows the commit that made the group DEAD.
	pgtest.Eventually(t, 5*time.Second, "the DEAD group logged", func() bool {
		return strings.Contains(b.logs.String(), "consumer group is DEAD")
	})
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

// The retention cap deletes a message a group still retries, and counts
// and logs it for the group, in every mode (in Offset mode the group's
// position has passed it: the position alone does not say it is
// unfinished). The retry goes with it: the group's Health no longer
// counts it as waiting, and it is never delivered.
func TestRetentionCapCountsPendingRetries(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			clock := clocktest.New(time.Now())
			b := setup(t, func(c *outbox.Config) { c.Clock = clock })
			ctx := context.Background()
			b.topic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode,
				Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond, MaxRetention: 10 * time.Minute})
			c := newCounter()
			var seq atomic.Int64
			g := b.group(t, "events", "g", func(ctx context.Context, d *outbox.Delivery) error {
				if seq.Add(1)%40 == 0 {
					return outbox.RetryAfter(time.Hour, errors.New("not now"))
				}
				return c.handle(ctx, d)
			}, consumergroup.FromNow())
			b.send(t, "events", 80)
			pgtest.Eventually(t, 10*time.Second, "78 handled, 2 waiting for their retry", func() bool {
				h, err := g.Health(ctx, 0)
				require.NoError(t, err)
				return c.distinct() == 78 && h.Waiting == 2
			})

			clock.Advance(11 * time.Minute) // past MaxRetention
			r, err := b.service(t, maintenance.Config{}).RunOnce(ctx)
			require.NoError(t, err)
			require.Zero(t, b.count(t, "outbox_published", "true"))
			require.Equal(t, map[string]int64{"events/g": 2}, r.DroppedUnread, "the retries the cap deleted")
			require.Len(t, b.logs.Lines("level=WARN", "MaxRetention were deleted before this group finished them", "messages=2"), 1)
			h, err := g.Health(ctx, 0)
			require.NoError(t, err)
			require.Zero(t, h.Waiting, "the deleted messages no longer wait")
			require.Zero(t, b.count(t, "outbox_group_retries", "true"))
			require.Equal(t, 78, c.distinct())
		})
	}
}

// The retention cap's WARN comes at most once a day for a topic and
// group, and says how many messages were lost since the last one; the
// report (and the metric) count every pass.
func TestRetentionCapWarnsAtMostDaily(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	b := setup(t, func(c *outbox.Config) { c.Clock = clock })
	ctx := context.Background()
	b.topic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Bitmap,
		Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond, MaxRetention: 10 * time.Minute})
	g := b.group(t, "events", "paused", newCounter().handle, consumergroup.FromNow())
	require.NoError(t, g.Pause(ctx))
	s := b.service(t, maintenance.Config{})
	warnings := func() []string {
		return b.logs.Lines("level=WARN", "MaxRetention were deleted before this group finished them")
	}
	pass := func(messages int, advance time.Duration) {
		t.Helper()
		b.send(t, "events", messages)
		clock.Advance(advance)
		r, err := s.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, map[string]int64{"events/paused": int64(messages)}, r.DroppedUnread)
	}

	pass(5, 11*time.Minute)
	require.Len(t, warnings(), 1)
	require.Contains(t, warnings()[0], "messages=5")
	pass(7, 11*time.Minute)
	require.Len(t, warnings(), 1, "a second WARN within a day")
	pass(3, 24*time.Hour)
	require.Len(t, warnings(), 2)
	require.Contains(t, warnings()[1], "messages=10", "the messages lost since the last WARN")
}

// A DEAD group keeps its claim on what it had not finished for the
// topic's ZombieTTL, then it is forgotten and cleanup deletes those
// messages. What was written after it died was never its claim.
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
			owed := b.send(t, "events", 10)
			s := b.service(t, maintenance.Config{})
			pgtest.Eventually(t, 10*time.Second, "the stopped group DEAD", func() bool {
				r, err := s.RunOnce(ctx)
				require.NoError(t, err)
				return len(r.DeadGroups) == 1
			})
			died := time.Now()
			b.send(t, "events", 20)
			pgtest.Eventually(t, 10*time.Second, "the live group done", func() bool { return live.distinct() == 30 })
			// New messages no longer need it: they go once the live
			// group's completions are recorded (its handlers returned
			// before that).
			pgtest.Eventually(t, 10*time.Second, "the messages written after it died deleted", func() bool {
				_, err := s.RunOnce(ctx)
				require.NoError(t, err)
				return b.count(t, "outbox_published", "true") == len(owed)
			})
			require.Equal(t, len(owed), b.count(t, "outbox_published", "id = ANY($1)", owed), "what it owes is kept")
			time.Sleep(time.Until(died.Add(2100 * time.Millisecond)))
			_, err := s.RunOnce(ctx)
			require.NoError(t, err)
			require.Zero(t, b.count(t, "outbox_published", "true"), "past ZombieTTL nothing is kept for it")
			require.Zero(t, b.count(t, "outbox_topic_subscriptions", "forget_pending"), "forgotten")
			require.Empty(t, b.logs.errors())
		})
	}
}

// A DEAD group keeps, within the topic's ZombieTTL (an hour here), only
// what it had not finished when it died, in every mode: the messages
// written after it died are deleted once the live group finished them.
// When it comes back with MaxBackfill 100 while 300 more old messages are
// stored (the live group, paused, keeps them), it receives 100 old ones,
// oldest first (what it owed among them), through a backfill that
// BackfillProgress shows, and every new one.
func TestDeadGroupKeepsOnlyWhatItOwes(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			b.topic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode,
				Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond, ZombieTTL: time.Hour})
			live, zombie := newCounter(), newCounter()
			gl := b.group(t, "events", "live", live.handle, consumergroup.FromNow())
			gz := b.group(t, "events", "zombie", zombie.handle, consumergroup.FromNow(), func(c *consumergroup.Config) {
				c.HeartbeatInterval, c.HeartbeatTimeout = 100*time.Millisecond, 500*time.Millisecond
			})
			require.NoError(t, gz.Stop(ctx)) // it goes away without a goodbye: its heartbeats stop
			owed := b.send(t, "events", 10)  // written before it dies
			s := b.service(t, maintenance.Config{})
			pgtest.Eventually(t, 10*time.Second, "the group DEAD", func() bool {
				r, err := s.RunOnce(ctx)
				require.NoError(t, err)
				return slices.Contains(r.DeadGroups, "events/zombie")
			})
			var later []int64
			for range 4 {
				later = append(later, b.send(t, "events", 500)...)
			}
			pgtest.Eventually(t, 20*time.Second, "the live group done", func() bool { return live.distinct() == 2010 })
			pgtest.Eventually(t, 10*time.Second, "what was written after it died deleted", func() bool {
				_, err := s.RunOnce(ctx)
				require.NoError(t, err)
				require.Equal(t, len(owed), b.count(t, "outbox_published", "id = ANY($1)", owed), "what it owes is kept for it")
				return b.count(t, "outbox_published", "id = ANY($1)", later) == 0
			})

			require.NoError(t, gl.Pause(ctx))
			time.Sleep(100 * time.Millisecond) // the pause reaches the live instance
			kept := b.send(t, "events", 300)   // written while it is DEAD, kept by the paused group
			opts := consumergroup.FromNow()
			opts.MaxBackfill = 100
			back := b.group(t, "events", "zombie", zombie.handle, opts)
			fresh := b.send(t, "events", 20)
			var p consumergroup.BackfillProgress
			pgtest.Eventually(t, 10*time.Second, "the new messages and a backfill of 100", func() bool {
				var err error
				p, err = back.BackfillProgress(ctx)
				require.NoError(t, err)
				for _, id := range fresh {
					if !zombie.has(id) {
						return false
					}
				}
				return p.Outcome == consumergroup.BackfillCapped
			})
			require.EqualValues(t, 100, p.Done, "the backfill hands out MaxBackfill old messages")
			time.Sleep(200 * time.Millisecond) // more old messages would come meanwhile
			old := 0
			for _, id := range append(slices.Clone(owed), kept...) {
				if zombie.has(id) {
					old++
				}
			}
			require.Equal(t, 100, old, "MaxBackfill old messages, no more")
			for _, id := range owed {
				require.True(t, zombie.has(id), "what it owed is the oldest: the backfill reads it first")
			}
			for _, id := range later {
				require.False(t, zombie.has(id), "deleted while it was DEAD")
			}
			require.Equal(t, 120, zombie.distinct())
			require.Zero(t, zombie.dups())
			require.Empty(t, b.logs.errors())
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

	// A QUEUE topic's dead letters (its group's) too; then all expire.
	b.topic(t, outbox.TopicConfig{Name: "jobs", MaxAttempts: 1})
	k, err := consumergroup.New(b.db.Pool, consumergroup.Config{Topic: "jobs", Group: sqlq.QueueGroup, Client: b.client,
		PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, k.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return outbox.Permanent(fmt.Errorf("no")) }, nil))
	require.NoError(t, k.Start(ctx, consumergroup.FromBeginning(false)))
	defer k.Stop(ctx)
	b.send(t, "jobs", 2)
	pgtest.Eventually(t, 10*time.Second, "QUEUE dead letters", func() bool {
		dl, err := k.DeadLetters(ctx, 0, 10)
		require.NoError(t, err)
		return len(dl) == 2
	})
	short := b.service(t, maintenance.Config{DeadLetterRetention: time.Millisecond})
	time.Sleep(10 * time.Millisecond)
	r, err := short.RunOnce(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 4, r.Deleted["outbox_group_retries"])
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

// A cleanup pass cut short (its context ends between two batches) leaves
// no half-done work: the next pass deletes the rest, and the two together
// delete exactly what was due.
func TestCleanupCutShortIsFinishedByTheNextPass(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.topic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter,
		Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond})
	c := newCounter()
	b.group(t, "events", "g", c.handle, consumergroup.FromNow())
	b.send(t, "events", 200)
	pgtest.Eventually(t, 10*time.Second, "handled and recorded", func() bool {
		return c.distinct() == 200 && b.count(t, "outbox_published", b.db.FinishedByAll()) == 200
	})
	s := b.service(t, maintenance.Config{BatchSize: 10, BatchPause: time.Second})
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond) // ends in the pause after a batch
	r1, err := s.RunOnce(short)
	cancel()
	if err != nil { // else a batch came back short (the slowest position had not passed every row yet): the pass ended early, as good a cut
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	require.Less(t, r1.Deleted["outbox_published"], int64(200), "the pass was not cut short: the test proves nothing")
	r2, err := b.service(t, maintenance.Config{}).RunOnce(ctx) // the next pass: here another instance's
	require.NoError(t, err)
	require.EqualValues(t, 200, r1.Deleted["outbox_published"]+r2.Deleted["outbox_published"])
	require.Zero(t, b.count(t, "outbox_published", "true"))
	require.Zero(t, b.count(t, "outbox_consumer_groups", "true"), "dedupe rows go with their messages")
}

// Three services run every job at once, fast, beside producers, two live
// groups per mode and a group that keeps dying and coming back: no error
// is logged, no deadlock happens, no Counter message is completed more
// often than it is required, and the live groups receive every message
// once. The services add and drop small partitions all along (messages
// that other tests' transactions push past the last one are deleted row
// by row after a second).
func TestThreeServicesAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var recs []*counter
	for _, mode := range modes {
		topic := "events-" + strings.ToLower(string(mode))
		b.topic(t, outbox.TopicConfig{Name: topic, Semantics: outbox.PubSub, Tracking: mode,
			Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond, ZombieTTL: 300 * time.Millisecond})
		for _, g := range []string{"a", "b"} {
			c := newCounter()
			recs = append(recs, c)
			b.group(t, topic, g, c.handle, consumergroup.FromNow())
		}
	}
	var services []*maintenance.Service
	var all []*logs
	for range 3 {
		l := &logs{}
		all = append(all, l)
		s, err := maintenance.New(b.db.Pool, maintenance.Config{Client: b.client, Logger: l.logger(),
			DeadGroupInterval: 30 * time.Millisecond, CleanupInterval: 30 * time.Millisecond,
			SubscriptionCleanupInterval: 50 * time.Millisecond, BatchSize: 25, BatchPause: time.Millisecond,
			PartitionInterval: 30 * time.Millisecond, PartitionSize: 1000, RowCleanupDelay: time.Second})
		require.NoError(t, err)
		require.NoError(t, s.Start(ctx))
		t.Cleanup(func() { _ = s.Stop(context.Background()) })
		services = append(services, s)
	}
	// A group that dies and comes back, over and over, on each topic.
	stopChurn := make(chan struct{})
	churned := make(chan struct{})
	go func() {
		defer close(churned)
		for i := 0; ; i++ {
			for _, mode := range modes {
				topic := "events-" + strings.ToLower(string(mode))
				g, err := consumergroup.New(b.db.Pool, consumergroup.Config{Client: b.client, Topic: topic, Group: "flaky",
					PollInterval: 10 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond, HeartbeatTimeout: 200 * time.Millisecond})
				if err != nil {
					t.Error(err)
					return
				}
				_ = g.AddConsumer("m", newCounter().handle, nil)
				if err := g.Start(ctx, consumergroup.FromNow()); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(100 * time.Millisecond)
				_ = g.StopAndCancel(ctx)
			}
			select {
			case <-stopChurn:
				return
			case <-time.After(300 * time.Millisecond):
			}
		}
	}()
	var sent []int64
	for range 40 {
		for _, mode := range modes {
			sent = append(sent, b.send(t, "events-"+strings.ToLower(string(mode)), 25)...)
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stopChurn)
	<-churned
	pgtest.Eventually(t, 30*time.Second, "every live group received its topic's messages", func() bool {
		for _, c := range recs {
			if c.distinct() != len(sent)/3 {
				return false
			}
		}
		return true
	})
	for _, c := range recs {
		require.Zero(t, c.dups())
	}
	require.Zero(t, b.count(t, "outbox_published", "required_count <> cardinality(required_ids)"),
		"a Counter message's count of required groups does not match its list")
	var deadlocks int64
	time.Sleep(1100 * time.Millisecond) // statistics are flushed about once a second
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT deadlocks FROM pg_catalog.pg_stat_database WHERE datname = current_database()`).Scan(&deadlocks))
	require.Zero(t, deadlocks)
	for i, l := range all {
		require.Empty(t, l.errors(), "service %d logged errors", i)
	}
	require.Empty(t, b.logs.errors())
	var first int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT max(id) FROM `+b.db.Table("outbox_partitions")).Scan(&first))
	pgtest.Eventually(t, 30*time.Second, "cleanup caught up, the partitions written during the test dropped", func() bool {
		burnXids(t, b, 500) // the last partitions written to end
		var oldest int64
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT min(id) FROM `+b.db.Table("outbox_partitions")).Scan(&oldest))
		return b.count(t, "outbox_published", "true") == 0 && oldest > first
	})
	for i, l := range all {
		require.Empty(t, l.errors(), "service %d logged errors", i)
	}
}

// Kill and resurrect (the design's pre-GA checkpoint, scaled to seconds):
// three groups while producers run; one group's only instance is killed
// (it stops heartbeating) and no instance of any group on the topic looks
// for dead groups (theirs beat every 30 s): the service alone declares it
// DEAD. The other two keep going and cleanup keeps the table small; the
// dead group's claims run out (ZombieTTL); it comes back with a bounded
// backfill while new messages reach it at once; the live groups lose
// nothing.
func TestKillAndResurrect(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			b.topic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode,
				Retention: time.Millisecond, ZeroSubscriptionRetention: time.Millisecond, ZombieTTL: 2 * time.Second})
			a, bb, c := newCounter(), newCounter(), newCounter()
			b.group(t, "events", "a", a.handle, consumergroup.FromNow())
			b.group(t, "events", "b", bb.handle, consumergroup.FromNow())
			fast := func(cfg *consumergroup.Config) {
				cfg.HeartbeatInterval, cfg.HeartbeatTimeout = 100*time.Millisecond, time.Second
			}
			gc := b.group(t, "events", "c", c.handle, consumergroup.FromNow(), fast)
			s := b.service(t, maintenance.Config{DeadGroupInterval: 200 * time.Millisecond, CleanupInterval: 200 * time.Millisecond})
			require.NoError(t, s.Start(ctx))

			var sent []int64
			var mu sync.Mutex
			stop := make(chan struct{})
			produced := make(chan struct{})
			go func() { // ~400 messages a second
				defer close(produced)
				for {
					select {
					case <-stop:
						return
					case <-time.After(50 * time.Millisecond):
					}
					ids := b.send(t, "events", 20)
					mu.Lock()
					sent = append(sent, ids...)
					mu.Unlock()
				}
			}()
			time.Sleep(time.Second)
			kill, cancel := context.WithCancel(ctx)
			cancel()
			_ = gc.StopAndCancel(kill) // killed: no more heartbeats, handlers cut short
			pgtest.Eventually(t, 10*time.Second, "c declared DEAD by the service", func() bool {
				st, err := gc.State(ctx)
				require.NoError(t, err)
				return st == consumergroup.Dead
			})
			// The live groups go on, and the table stays small once c's
			// claims ran out.
			time.Sleep(2500 * time.Millisecond)
			peak := 0
			for range 10 {
				peak = max(peak, b.count(t, "outbox_published", "true"))
				time.Sleep(100 * time.Millisecond)
			}
			require.Less(t, peak, 800, "the table grows while c is DEAD past its ZombieTTL")

			// c comes back: new messages reach it at once, beside a backfill
			// of at most 300 older ones.
			c2 := newCounter()
			back := b.group(t, "events", "c", c2.handle, consumergroup.SubscriptionOptions{Position: consumergroup.StartNow, MaxBackfill: 300}, fast)
			mu.Lock()
			before := len(sent)
			mu.Unlock()
			time.Sleep(time.Second)
			close(stop)
			<-produced
			mu.Lock()
			after := sent[before:]
			all := slices.Clone(sent)
			mu.Unlock()
			pgtest.Eventually(t, 20*time.Second, "c receives what was sent after it came back", func() bool {
				for _, id := range after {
					if !c2.has(id) {
						return false
					}
				}
				return true
			})
			if mode != outbox.Offset {
				p, err := back.BackfillProgress(ctx)
				require.NoError(t, err)
				require.LessOrEqual(t, p.Done, int64(300), "the backfill is bounded")
			}
			pgtest.Eventually(t, 20*time.Second, "the live groups lose nothing", func() bool {
				return a.distinct() == len(all) && bb.distinct() == len(all)
			})
			require.Zero(t, a.dups()+bb.dups()+c2.dups())
			pgtest.Eventually(t, 20*time.Second, "steady state: everything finished is deleted", func() bool {
				return b.count(t, "outbox_published", "true") == 0
			})
			require.Empty(t, b.logs.errors())
		})
	}
}
