package consumergroup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// A topic's tracking mode changes, in every direction, while producers
// send and groups consume, with cleanup deleting finished messages as
// soon as it may: every group receives every message once. A group that
// was not running across the change finds what it had not read, written
// under the old mode, and what was written under the new one. Afterwards
// cleanup deletes every message (each was recorded as completed, by its
// own mode's record) and the change ends.
func TestTrackingModeChangesOnline(t *testing.T) {
	t.Parallel()
	for _, from := range modes {
		for _, to := range modes {
			if from == to {
				continue
			}
			t.Run(string(from)+"-to-"+string(to), func(t *testing.T) {
				modeChangeUnderLoad(t, from, to)
			})
		}
	}
}

func modeChangeUnderLoad(t *testing.T, from, to outbox.TrackingMode) {
	ctx := context.Background()
	topic := func(mode outbox.TrackingMode) outbox.TopicConfig {
		return outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode,
			Retention: time.Microsecond, ZeroSubscriptionRetention: time.Microsecond}
	}
	b := setupTopic(t, topic(from))
	recorders := map[string]*recorder{}
	startGroup := func(name string, instances ...string) []*consumergroup.Group {
		if recorders[name] == nil {
			recorders[name] = newRecorder()
		}
		var gs []*consumergroup.Group
		for _, i := range instances {
			g := b.newGroup(t, name, func(c *consumergroup.Config) { c.InstanceID = name + "-" + i; c.BatchSize = 20 })
			require.NoError(t, g.AddConsumer("m", recorders[name].handler, nil))
			start(t, g, consumergroup.FromNow())
			gs = append(gs, g)
		}
		return gs
	}
	cleaner := startGroup("g1", "a", "b")[0]
	startGroup("g2", "a")
	idle := startGroup("idle", "a")[0]
	require.NoError(t, idle.Stop(ctx)) // subscribed, reads nothing until it starts again

	cleanCtx, stopCleaning := context.WithCancel(ctx)
	var cleaning sync.WaitGroup
	cleaning.Add(1)
	go func() {
		defer cleaning.Done()
		for cleanCtx.Err() == nil {
			_, _ = cleaner.Cleanup(cleanCtx, 500)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	defer func() { stopCleaning(); cleaning.Wait() }()

	const total = 600
	changed := make(chan struct{})
	var sending sync.WaitGroup
	for w := range 4 {
		sending.Add(1)
		go func() {
			defer sending.Done()
			for seq := w; seq < total; seq += 4 * 3 {
				if seq == total/3 {
					<-changed // the change happens with these producers under way
				}
				err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
					for s := seq; s < min(seq+4*3, total); s += 4 {
						p, _ := json.Marshal(seqPayload{Seq: s})
						if _, err := b.producer.Send(ctx, tx, outbox.Message{Topic: b.topic, Payload: p}); err != nil {
							return err
						}
					}
					time.Sleep(time.Millisecond) // transactions overlap, and commit out of id order
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	pgtest.Eventually(t, 30*time.Second, "the first messages handled", func() bool { return recorders["g2"].distinct() >= total/6 })
	require.NoError(t, b.client.ChangeTrackingMode(ctx, b.topic, to))
	cfg, err := b.client.Topic(ctx, b.topic)
	require.NoError(t, err)
	require.Equal(t, to, cfg.Tracking)
	require.True(t, cfg.ModeChanging, "messages of the old mode are stored (the idle group holds them)")
	close(changed)
	sending.Wait()

	startGroup("late", "a") // registers under the new mode
	startGroup("idle", "a")
	for _, name := range []string{"g1", "g2", "idle"} {
		r := recorders[name]
		pgtest.Eventually(t, 60*time.Second, name+" receiving every message", func() bool { return r.distinct() == total })
	}
	b.send(t, total) // one more, for the late group too
	for name, r := range recorders {
		want := total + 1
		if name == "late" {
			want = 1
		}
		pgtest.Eventually(t, 30*time.Second, name+" receiving the last message", func() bool { return r.has(total) })
		require.Equal(t, want, r.distinct(), "group %s", name)
		require.Zero(t, r.dups(), "group %s: duplicates:\n%s", name, r.duplicates())
	}

	pgtest.Eventually(t, 30*time.Second, "cleanup deleting every message and ending the change", func() bool {
		cfg, err := b.client.Topic(ctx, b.topic)
		require.NoError(t, err)
		return b.count(t, "topic = $1", b.topic) == 0 && !cfg.ModeChanging
	})
	require.Zero(t, b.countIn(t, "outbox_consumer_groups", "true"), "no completion record outlives its message")
}

// A Bitmap topic with 64 groups takes no 65th; changed to Counter, it
// does, while the 64 keep their messages, and it cannot change back to
// Bitmap while it has more than 64 groups.
func TestBitmapTopicWith64GroupsMovesToCounter(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Bitmap)
	ctx := context.Background()
	var mu sync.Mutex
	got := map[string]map[int]int{}
	handler := func(group string) outbox.Handler {
		return func(ctx context.Context, d *outbox.Delivery) error {
			p, err := outbox.Decode[seqPayload](d)
			if err != nil {
				return outbox.Permanent(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if got[group] == nil {
				got[group] = map[int]int{}
			}
			got[group][p.Seq]++
			return nil
		}
	}
	// 65 groups in one process share a small pool for heartbeats (each
	// would open one of its own): the test fits any server's connection
	// limit.
	hbConfig, err := pgtest.PoolConfig(b.db.DSN)
	require.NoError(t, err)
	hbConfig.MaxConns = 2
	heartbeats, err := pgxpool.NewWithConfig(ctx, hbConfig)
	require.NoError(t, err)
	t.Cleanup(heartbeats.Close)
	group := func(i int) *consumergroup.Group {
		name := fmt.Sprintf("g%02d", i)
		g := b.newGroup(t, name, func(c *consumergroup.Config) {
			c.PollInterval, c.HeartbeatPool = 100*time.Millisecond, heartbeats
		})
		require.NoError(t, g.AddConsumer("m", handler(name), nil))
		return g
	}
	for i := range 64 {
		start(t, group(i), consumergroup.FromNow())
	}
	require.ErrorIs(t, group(64).Start(ctx, consumergroup.FromNow()), outbox.ErrTooManyGroups)
	b.send(t, 1, 2, 3)

	require.NoError(t, b.client.ChangeTrackingMode(ctx, b.topic, outbox.Counter))
	g64 := group(64)
	start(t, g64, consumergroup.FromNow())
	b.send(t, 4, 5)
	require.ErrorIs(t, b.client.ChangeTrackingMode(ctx, b.topic, outbox.Bitmap), outbox.ErrTooManyGroups)
	cfg, err := b.client.Topic(ctx, b.topic)
	require.NoError(t, err)
	require.Equal(t, outbox.Counter, cfg.Tracking, "nothing changed")

	pgtest.Eventually(t, 60*time.Second, "every group receiving its messages", func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(got["g64"]) != 2 {
			return false
		}
		for i := range 64 {
			if len(got[fmt.Sprintf("g%02d", i)]) != 5 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	for name, seqs := range got {
		for seq, n := range seqs {
			require.Equal(t, 1, n, "group %s, message %d", name, seq)
		}
	}
	mu.Unlock()
	require.NotContains(t, got["g64"], 1, "the 65th group started after the first messages")

	// Every message is completed by every group that required it.
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub, Tracking: outbox.Counter,
		Retention: time.Microsecond, ZeroSubscriptionRetention: time.Microsecond}))
	pgtest.Eventually(t, 30*time.Second, "cleanup deleting every message and ending the change", func() bool {
		_, err := g64.Cleanup(ctx, 100)
		require.NoError(t, err)
		cfg, err := b.client.Topic(ctx, b.topic)
		require.NoError(t, err)
		return b.count(t, "topic = $1", b.topic) == 0 && !cfg.ModeChanging
	})
}

// A group that dies twice while an Offset topic changes to Counter mode,
// the second time in the middle of the backfill its first return started,
// receives every message once: the messages written in Offset mode record
// nothing of their own, and the second backfill, which reads again from
// where the first began, skips those the group completed.
func TestDeadTwiceDuringAModeChangeFromOffset(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Offset)
	ctx := context.Background()
	b.startRecording(t, "other", newRecorder())
	r := newRecorder()
	// A backfill's first DefaultBackfillBatchSize rows go at once (its
	// bucket starts full); the rest at BackfillRate. So the group owes
	// more than that, and the rest takes 20 s (the load rule, which would
	// start slower still, is off): it dies while its backfill is under
	// way, however fast or slow the machine.
	const owes = consumergroup.DefaultBackfillBatchSize + 2000
	run := func() *consumergroup.Group {
		g := b.newGroup(t, "twice")
		require.NoError(t, g.AddConsumer("m", r.handler, nil))
		opts := consumergroup.FromNow()
		opts.BackfillRate, opts.BackfillMaxSlowdown = 100, -1
		require.NoError(t, g.Start(ctx, opts))
		return g
	}
	require.NoError(t, run().Stop(ctx))
	b.sendRange(t, 0, owes) // Offset messages it owes
	require.NoError(t, b.client.ChangeTrackingMode(ctx, b.topic, outbox.Counter))
	b.makeDead(t, "twice")
	b.sendRange(t, owes, owes+10) // Counter messages written while it was DEAD

	g := run() // back, with a backfill of everything before owes+10
	b.sendRange(t, owes+10, owes+20)
	pgtest.Eventually(t, time.Minute, "the stream and part of the backfill", func() bool {
		return r.has(owes+19) && r.distinct() >= 15
	})
	require.NoError(t, g.Stop(ctx))
	require.Less(t, r.distinct(), owes+20, "the backfill is still under way")
	b.makeDead(t, "twice")
	b.sendRange(t, owes+20, owes+25)
	g = run() // a new backfill: its bucket is full again
	pgtest.Eventually(t, 2*time.Minute, "every message", func() bool { return r.distinct() == owes+25 })
	require.NoError(t, g.Stop(ctx))
	require.Zero(t, r.dups(), "duplicates:\n%s", r.duplicates())
}

// While a Bitmap topic changes to Counter, a group DEAD within its
// ZombieTTL holds what it owes and nothing more: cleanup deletes the
// messages written since it died, as it would in either mode.
func TestModeChangeCleanupPassesADeadGroup(t *testing.T) {
	t.Parallel()
	b := setupTopic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Bitmap,
		Retention: time.Microsecond, ZeroSubscriptionRetention: time.Microsecond})
	ctx := context.Background()
	other := newRecorder()
	og := b.startRecording(t, "other", other)
	b.subscribe(t, "dead")
	owed := b.send(t, 1, 2, 3)
	b.makeDead(t, "dead")
	require.NoError(t, b.client.ChangeTrackingMode(ctx, b.topic, outbox.Counter))
	b.send(t, 4, 5, 6)
	pgtest.Eventually(t, 10*time.Second, "the other group handling 1..6", func() bool { return other.distinct() == 6 })
	pgtest.Eventually(t, 10*time.Second, "cleanup deleting 4..6", func() bool {
		_, err := og.Cleanup(ctx, 100)
		require.NoError(t, err)
		return b.count(t, "topic = $1", b.topic) == 3
	})
	require.Equal(t, 3, b.count(t, "topic = $1 AND id = ANY($2)", b.topic, owed), "what the DEAD group owes stays")
}
