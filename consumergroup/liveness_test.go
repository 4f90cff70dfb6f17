package consumergroup_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testlog"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// An instance is recorded as alive, with its client's lock, only while
// the lock is held by a LISTEN session of its own; stopping forgets it.
// Through a transaction pooler (no session of its own) nothing is
// recorded, a log line says so, and the instance's work comes back with
// its lease only.
func TestInstanceRecordedAliveOnlyWithASessionOfItsOwn(t *testing.T) {
	b := setup(t, outbox.Offset)
	recorded := func() (n, held int) {
		require.NoError(t, b.db.Pool.QueryRow(context.Background(), `
SELECT count(*), count(*) FILTER (WHERE EXISTS (
    SELECT 1 FROM pg_locks AS l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.classid = 1885826914::oid AND l.objid = i.lock_key::oid))
FROM `+b.db.Table("outbox_live_instances")+` AS i`).Scan(&n, &held))
		return n, held
	}

	g := b.newGroup(t, "direct", func(c *consumergroup.Config) { c.InstanceID = "direct-1" })
	require.NoError(t, g.AddConsumer("m", newRecorder().handler, nil))
	require.NoError(t, g.Start(context.Background(), consumergroup.FromNow()))
	pgtest.Eventually(t, 10*time.Second, "the instance recorded alive", func() bool { n, held := recorded(); return n == 1 && held == 1 })
	require.NoError(t, g.Stop(context.Background()))
	n, _ := recorded()
	require.Zero(t, n, "a stopped instance is forgotten")

	var logs testlog.Buffer
	pooled := pgtest.NewPool(t, pgtest.PgBouncer(t, b.db)+"&default_query_exec_mode=simple_protocol")
	client, err := outbox.NewClient(pooled, outbox.Config{Schema: b.db.Schema, Logger: logs.Logger()})
	require.NoError(t, err)
	p := b.newGroupOn(t, pooled, "pooled", func(c *consumergroup.Config) { c.InstanceID = "pooled-1"; c.Client = client })
	require.NoError(t, p.AddConsumer("m", newRecorder().handler, nil))
	start(t, p, consumergroup.FromNow())
	pgtest.Eventually(t, 30*time.Second, "a log line saying the instance's work comes back with its lease only", func() bool {
		return len(logs.Lines("no session of its own", "lease ends")) > 0
	})
	n, _ = recorded()
	require.Zero(t, n, "an instance whose LISTEN connection has no session of its own is not recorded alive")
}

// An instance whose session proving it alive is ended by the server
// (pg_terminate_backend, an idle timeout, a proxy) while its process
// lives makes a new one at once, and keeps every lease: a survivor
// running beside it takes none of its messages.
func TestASessionEndedUnderALiveInstanceIsMadeAgain(t *testing.T) {
	b := setupTopic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Offset, Lease: 10 * time.Minute})
	ctx := context.Background()
	holderClient, err := outbox.NewClient(pgtest.NewPool(t, b.db.DSN), outbox.Config{Schema: b.db.Schema})
	require.NoError(t, err)
	b.holdTen(t, holderClient)
	r := newRecorder()
	b.startRecording(t, "g", r)

	sessionPid := func() (pid int) {
		err := b.db.Pool.QueryRow(ctx, `
SELECT l.pid FROM pg_locks AS l JOIN `+b.db.Table("outbox_live_instances")+` AS i ON l.objid = i.lock_key::oid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid = 1885826914::oid AND i.member = 'holder'`).Scan(&pid)
		if err != nil {
			return 0
		}
		return pid
	}
	pgtest.Eventually(t, 10*time.Second, "the holder recorded alive", func() bool { return sessionPid() != 0 })
	for range 3 {
		old := sessionPid()
		var ended bool
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT pg_terminate_backend($1, 5000)`, old).Scan(&ended))
		require.True(t, ended)
		pgtest.Eventually(t, 10*time.Second, "a new session holding the holder's lock", func() bool { p := sessionPid(); return p != 0 && p != old })
	}
	time.Sleep(2 * time.Second) // longer than any client waits before it takes back the leases of an instance whose lock is free
	require.Zero(t, r.distinct(), "a survivor took messages from a live instance whose session was ended")
}

// The first instance of a client leases nothing before the client's
// session records it alive: killed in between, its work would come back
// only with its lease. With the session's connection slowed by a second,
// the handler's first call finds the instance recorded.
func TestAnInstanceLeasesNothingBeforeItIsRecordedAlive(t *testing.T) {
	b := setupTopic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Offset})
	slow := pgtest.NewProxy(t)
	slow.SlowDown(time.Second)
	client, err := outbox.NewClient(b.db.Pool, outbox.Config{Schema: b.db.Schema, ListenDSN: slow.DSN(t, b.db)})
	require.NoError(t, err)
	recordedAtFirstCall := make(chan bool, 1)
	g := b.newGroup(t, "g", func(c *consumergroup.Config) { c.Client = client; c.InstanceID = "first" })
	require.NoError(t, g.AddConsumer("m", func(ctx context.Context, _ *outbox.Delivery) error {
		var recorded bool
		err := b.db.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+b.db.Table("outbox_live_instances")+
			` WHERE member = 'first')`).Scan(&recorded)
		select {
		case recordedAtFirstCall <- err == nil && recorded:
		default:
		}
		return err
	}, nil))
	start(t, g, consumergroup.FromNow())
	b.send(t, 1, 2, 3)
	select {
	case recorded := <-recordedAtFirstCall:
		require.True(t, recorded, "the instance was recorded alive when its handler was first called")
	case <-time.After(30 * time.Second):
		t.Fatal("no handler call")
	}
}

// A client whose statements are slow (a server under load, far away)
// still takes back the leases of an instance whose session ended: every
// look for such instances takes longer than the reaper's tick, and that
// must not count as a pause in its watch (a look that started late
// restarts the grace an instance's lock must stay free for). The holder's
// session is cut by its proxy and cannot be made again; a survivor whose
// every answer comes 700 ms late handles its messages long before their
// 10-minute lease ends.
func TestSlowStatementsDoNotKeepAGoneInstancesLeases(t *testing.T) {
	t.Parallel() // mostly waiting on answers that come late
	b := setupTopic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Offset, Lease: 10 * time.Minute})
	ctx := context.Background()
	path := pgtest.NewProxy(t)
	holderClient, err := outbox.NewClient(b.db.Pool, outbox.Config{Schema: b.db.Schema, ListenDSN: path.DSN(t, b.db)})
	require.NoError(t, err)
	b.holdTen(t, holderClient)
	pgtest.Eventually(t, 10*time.Second, "the holder recorded alive", func() bool {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+b.db.Table("outbox_live_instances")+` WHERE member = 'holder'`).Scan(&n))
		return n == 1
	})

	far := pgtest.NewProxy(t)
	far.Latency(700 * time.Millisecond)
	slowPool := pgtest.NewPool(t, far.DSN(t, b.db))
	survivorClient, err := outbox.NewClient(slowPool, outbox.Config{Schema: b.db.Schema, ListenDSN: b.db.DSN})
	require.NoError(t, err)
	r := newRecorder()
	survivor := b.newGroupOn(t, slowPool, "g", func(c *consumergroup.Config) {
		c.InstanceID, c.Client, c.Concurrency, c.BatchSize = "survivor", survivorClient, 10, 10
	})
	require.NoError(t, survivor.AddConsumer("m", r.handler, nil))
	start(t, survivor, consumergroup.FromNow())
	survivorClient.WaitRecorded(ctx)

	path.Down() // the holder's session ends, and no new one can be made
	pgtest.Eventually(t, time.Minute, "the survivor handling the holder's messages", func() bool { return r.distinct() == 10 })
}

// holdTen starts instance "holder" of group g on client, whose handlers
// start every message and return only when cancelled, sends 10 messages
// and waits until the holder handles them all. The instance is stopped,
// and the group cancelled, when the test ends.
func (b *bundle) holdTen(t *testing.T, client *outbox.Client) {
	t.Helper()
	ctx := context.Background()
	var started atomic.Int64
	holder := b.newGroupOn(t, client.Pool(), "g", func(c *consumergroup.Config) {
		c.InstanceID, c.Client, c.Concurrency, c.BatchSize = "holder", client, 10, 10
	})
	require.NoError(t, holder.AddConsumer("m", func(ctx context.Context, _ *outbox.Delivery) error {
		started.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}, nil))
	require.NoError(t, holder.Start(ctx, consumergroup.FromNow()))
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = holder.StopAndCancel(stopCtx)
	})
	b.sendRange(t, 0, 10)
	pgtest.Eventually(t, 30*time.Second, "the holder handling every message", func() bool { return started.Load() == 10 })
}
