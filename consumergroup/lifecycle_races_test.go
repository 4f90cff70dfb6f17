package consumergroup_test

// Interleavings found by an adversarial review of the lifecycle; each test
// failed before its fix.

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/completion"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// makeDead makes group's heartbeat look stale and runs dead-group detection
// (which also forgets the group), as any instance on the topic would.
func (b *bundle) makeDead(t *testing.T, group string) {
	t.Helper()
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `UPDATE `+b.db.Table("outbox_topic_subscriptions")+`
SET last_heartbeat_at = now() - interval '1 hour' WHERE group_name = $1`, group)
	require.NoError(t, err)
	admin := b.newGroup(t, "review-admin")
	probe := b.newGroup(t, group)
	pgtest.Eventually(t, 10*time.Second, group+" DEAD", func() bool { // a fetch in progress holds it back
		admin.DetectDeadGroups(ctx)
		st, err := probe.State(ctx)
		require.NoError(t, err)
		return st == consumergroup.Dead
	})
}

func (b *bundle) subID(t *testing.T, group string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), `SELECT id FROM `+b.db.Table("outbox_topic_subscriptions")+
		` WHERE topic = $1 AND group_name = $2`, b.topic, group).Scan(&id))
	return id
}

// waitLockWaiter waits until some backend waits for a heavyweight lock.
func (b *bundle) waitLockWaiter(t *testing.T) {
	t.Helper()
	pgtest.Eventually(t, 10*time.Second, "a backend waits for a lock", func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
		return n > 0
	})
}

// A group that comes back from DEAD receives, through its backfill, the
// messages written while it was DEAD and still stored, while cleanup
// deletes, under it, one that another group finished (the backfill used
// to stop at such a row and leave the rest behind for good).
func TestBackfillGoesOnWhenARowIsDeletedUnderIt(t *testing.T) {
	for _, mode := range []outbox.TrackingMode{outbox.Bitmap, outbox.Counter} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setup(t, mode)
			ctx := context.Background()
			require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub,
				Tracking: mode, Retention: time.Microsecond, ZeroSubscriptionRetention: time.Microsecond}))

			g1 := b.newGroup(t, "g")
			require.NoError(t, g1.AddConsumer("m", newRecorder().handler, nil))
			require.NoError(t, g1.Start(ctx, consumergroup.FromNow()))
			require.NoError(t, g1.Stop(ctx))

			hr := newRecorder()
			h := b.newGroup(t, "h")
			require.NoError(t, h.AddConsumer("m", hr.handler, nil))
			require.NoError(t, h.Start(ctx, consumergroup.FromNow()))

			b.makeDead(t, "g")

			// Written while g is DEAD: seq 1 is finished by h (cleanup may
			// delete it), seqs 2..20 are not (h stopped), so they stay.
			b.send(t, 1)
			pgtest.Eventually(t, 10*time.Second, "h handled seq 1", func() bool { return hr.has(1) })
			require.NoError(t, h.Stop(ctx))
			for s := 2; s <= 20; s++ {
				b.send(t, s)
			}

			// Cleanup deletes seq 1, in a transaction that commits while g's
			// backfill works on (g's completion of seq 1, if it read it
			// first, waits for that row).
			tx, err := b.db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx)
			tracker, err := completion.New(mode, sqlq.ForPubSub(b.db.Schema))
			require.NoError(t, err)
			n, err := tracker.Cleanup(ctx, tx, b.topic, completion.Retention{Completed: time.Microsecond, ZeroSubscription: time.Microsecond}, 100)
			require.NoError(t, err)
			require.EqualValues(t, 1, n, "only seq 1 is finished")

			gr := newRecorder()
			g2 := b.newGroup(t, "g")
			require.NoError(t, g2.AddConsumer("m", gr.handler, nil))
			start(t, g2, consumergroup.SubscriptionOptions{Position: consumergroup.StartNow, BackfillBatchSize: 5}) // resurrects g
			time.Sleep(200 * time.Millisecond)
			require.NoError(t, tx.Commit(ctx))

			pgtest.Eventually(t, 10*time.Second, "the 19 stored messages written while g was DEAD", func() bool {
				for s := 2; s <= 20; s++ {
					if !gr.has(s) {
						return false
					}
				}
				return true
			})
			require.Zero(t, gr.dups(), gr.duplicates())
			pgtest.Eventually(t, 10*time.Second, "the backfill's end recorded (its next read finds nothing more)", func() bool {
				p, err := g2.BackfillProgress(ctx)
				require.NoError(t, err)
				return p.Outcome == consumergroup.BackfillDone && !p.Running
			})
		})
	}
}

// Was a bug: cleanup does not wait for a pending backfill. Rows that were
// unfinished when a group subscribed with Backfill (so "cleanup keeps them
// until it acks") but that the backfill has not reached yet are deleted as
// soon as the other groups finish them.
func TestCleanupWaitsForAPendingBackfill(t *testing.T) {
	for _, pause := range []bool{true, false} {
		name := "paused"
		if !pause {
			name = "racing"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, outbox.Bitmap)
			ctx := context.Background()
			require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub,
				Tracking: outbox.Bitmap, Retention: time.Microsecond, ZeroSubscriptionRetention: time.Microsecond}))
			// h is subscribed and lagging: 300 unfinished messages.
			h1 := b.newGroup(t, "h")
			require.NoError(t, h1.AddConsumer("m", newRecorder().handler, nil))
			require.NoError(t, h1.Start(ctx, consumergroup.FromNow()))
			require.NoError(t, h1.Stop(ctx))
			b.sendRange(t, 0, 300)

			gr := newRecorder()
			g := b.newGroup(t, "g")
			require.NoError(t, g.AddConsumer("m", gr.handler, nil))
			start(t, g, consumergroup.SubscriptionOptions{Position: consumergroup.StartBeginning, Backfill: true, BackfillBatchSize: 1})
			if pause {
				require.NoError(t, g.Pause(ctx)) // a paused group stays subscribed
			}

			hr := newRecorder()
			h := b.newGroup(t, "h")
			require.NoError(t, h.AddConsumer("m", hr.handler, nil))
			start(t, h, consumergroup.FromNow())
			pgtest.Eventually(t, 10*time.Second, "h catches up", func() bool { return hr.distinct() == 300 })
			admin := b.newGroup(t, "review-admin")
			for {
				n, err := admin.Cleanup(ctx, 1000)
				require.NoError(t, err)
				if n == 0 {
					break
				}
			}
			if pause {
				require.NoError(t, g.Resume(ctx))
			}
			// Deleted rows never come: waiting longer cannot make this pass.
			pgtest.Eventually(t, 30*time.Second, "g receives the 300 messages that were unfinished when it subscribed",
				func() bool { return gr.distinct() == 300 })
		})
	}
}

// Was a bug: a batch completed after the group was forgotten (DEAD)
// and before its resurrection's backfill ran sets no done bit (the group is
// not required then); the backfill then raises the group on those rows
// again. The group's position is past them and they are in no batch and no
// retry: they stay required and never done, so cleanup never deletes them.
func TestCompletionWhileForgottenIsRemembered(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Bitmap)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub,
		Tracking: outbox.Bitmap, Retention: time.Microsecond, ZeroSubscriptionRetention: time.Microsecond,
		ZombieTTL: time.Microsecond})) // forgotten as soon as it is DEAD
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	r := newRecorder()
	g := b.newGroup(t, "g", func(c *consumergroup.Config) {
		c.PollInterval = 5 * time.Second // the fetcher sleeps while the group is DEAD
		c.HeartbeatInterval = 30 * time.Second
		c.HeartbeatTimeout = time.Minute
	})
	require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
		once.Do(func() { close(entered); <-release })
		return r.handler(ctx, d)
	}, nil))
	start(t, g, consumergroup.FromNow())
	ids := b.send(t, 0)
	<-entered // batch of seq 0 open, its handler running
	b.makeDead(t, "g")
	require.Equal(t, 0, b.count(t, "id = $1 AND required_bits & $2 <> 0", ids[0], g.Subscription().Mask()), "forgotten")
	time.Sleep(500 * time.Millisecond) // the fetcher saw DEAD and sleeps a poll interval

	admin := b.newGroup(t, "g")
	require.NoError(t, admin.Resume(ctx)) // resurrection: backfill pending from the open batch's prev

	// The batch completes before the backfill step runs (here: while the
	// test holds the group's position, as a fetch in progress would).
	tx, err := b.db.Pool.BeginTx(ctx, pgx.TxOptions{})
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+b.db.Table("outbox_subscription_offsets")+` WHERE subscription_id = $1 FOR UPDATE`, g.Subscription().ID)
	require.NoError(t, err)
	close(release)
	pgtest.Eventually(t, 5*time.Second, "batch completed", func() bool {
		return b.countIn(t, "outbox_group_batches", "true") == 0
	})
	require.NoError(t, tx.Commit(ctx))

	time.Sleep(time.Second) // backfill and fetches run
	_, err = admin.Cleanup(ctx, 1000)
	require.NoError(t, err)
	retries := b.countIn(t, "outbox_group_retries", "true")
	t.Logf("deliveries of seq 0: %d, retries: %d", r.count[ids[0]], retries)
	require.Zero(t, b.count(t, "required_bits & $1 <> 0 AND NOT "+b.db.FinishedBy(g.Subscription().ID), g.Subscription().Mask()),
		"a handled message must not stay required by the group with nothing left to deliver it (never cleaned up)")
}

// Was a bug: forgetting runs inside the heartbeat goroutine. While an instance
// forgets a big DEAD group (10,000 rows a pass, every pass waiting for the
// other instances' passes), it sends no heartbeat; past HeartbeatTimeout,
// its own healthy, running group is declared DEAD by any other instance
// (and forgotten: cleanup may then delete what it had not finished).
func TestForgettingDoesNotDelayHeartbeats(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Bitmap)
	ctx := context.Background()
	x := b.newGroup(t, "x")
	require.NoError(t, x.AddConsumer("m", newRecorder().handler, nil))
	require.NoError(t, x.Start(ctx, consumergroup.FromNow()))
	require.NoError(t, x.Stop(ctx))
	// x owes 300,000 messages (written in bulk for speed; same columns as a send).
	_, err := b.db.Pool.Exec(ctx, `INSERT INTO `+b.db.Table("outbox_published")+`
(topic, payload, correlation_id, status, required_bits, done_bits)
SELECT $1, '{}'::jsonb, 'c', 'PUBLISHED', $2, 0 FROM generate_series(1, 300000)`, b.topic, x.Subscription().Mask())
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `UPDATE `+b.db.Table("outbox_topic_subscriptions")+`
SET last_heartbeat_at = now() - interval '1 hour' WHERE group_name = 'x'`)
	require.NoError(t, err)

	// g is healthy: it runs and beats every 50ms, with a 1s timeout.
	g := b.newGroup(t, "g", func(c *consumergroup.Config) {
		c.HeartbeatInterval = 50 * time.Millisecond
		c.HeartbeatTimeout = time.Second
	})
	require.NoError(t, g.AddConsumer("m", newRecorder().handler, nil))
	start(t, g, consumergroup.FromNow())

	// Another instance on the topic runs dead-group detection now and then.
	other := b.newGroup(t, "review-admin")
	probe := b.newGroup(t, "g")
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		st, err := probe.State(ctx)
		require.NoError(t, err)
		require.NotEqual(t, consumergroup.Dead, st, "a running, healthy group was declared DEAD")
		go other.DetectDeadGroups(ctx)
		time.Sleep(100 * time.Millisecond)
		var pending bool
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT forget_pending FROM `+b.db.Table("outbox_topic_subscriptions")+` WHERE group_name = 'x'`).Scan(&pending))
		if !pending {
			return
		}
	}
}

// A group of an Offset topic records nothing per message, so its return
// from DEAD must read exactly what it had not read. It dies with a
// backfill half read and a snapshot pair of its stream half read (its
// handlers hang on most messages, so both stall), and comes back: it
// receives every message once, the rest of both and what was written
// while it was DEAD.
func TestOffsetGroupDeadMidBackfillAndMidPair(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Offset)
	ctx := context.Background()
	b.startRecording(t, "other", newRecorder())
	r := newRecorder()
	run := func(hang func(seq int) bool) *consumergroup.Group {
		g := b.newGroup(t, "twice", func(c *consumergroup.Config) { c.BatchSize, c.Concurrency = 2, 4 })
		require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
			p, err := outbox.Decode[seqPayload](d)
			require.NoError(t, err)
			if hang(p.Seq) {
				<-ctx.Done() // never handled: given back, or retried
				return ctx.Err()
			}
			return r.handler(ctx, d)
		}, nil))
		opts := consumergroup.FromNow()
		opts.BackfillBatchSize = 2
		require.NoError(t, g.Start(ctx, opts))
		return g
	}
	require.NoError(t, run(func(int) bool { return false }).Stop(ctx))
	b.sendRange(t, 0, 20) // it owes them
	b.makeDead(t, "twice")
	b.sendRange(t, 20, 30) // written while it was DEAD

	// Back with a backfill of 0..29; then 30..39, one snapshot pair of
	// its stream. Its reads take turns, the stream's first.
	require.NoError(t, b.newGroup(t, "twice").Resurrect(ctx, true))
	b.sendRange(t, 30, 40)
	g := run(func(seq int) bool { return seq >= 32 || (seq >= 4 && seq < 30) })
	pgtest.Eventually(t, 10*time.Second, "the first rows of the backfill and of the stream", func() bool {
		return r.has(0) && r.has(1) && r.has(30) && r.has(31)
	})
	time.Sleep(300 * time.Millisecond) // the instance holds what it can and reads no further
	stop, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_ = g.Stop(stop)
	cancel()
	require.Less(t, r.distinct(), 10, "both stalled half-way")
	b.makeDead(t, "twice")
	b.sendRange(t, 40, 45)

	g = run(func(int) bool { return false })
	pgtest.Eventually(t, 20*time.Second, "every message", func() bool { return r.distinct() == 45 })
	time.Sleep(200 * time.Millisecond) // a duplicate would come meanwhile
	require.NoError(t, g.Stop(ctx))
	require.Zero(t, r.dups(), "duplicates:\n%s", r.duplicates())
}
