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
