package consumergroup_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// An instance whose heartbeats cannot reach the database (its heartbeat
// pool's connections cut) while its main pool works:
//   - a short outage is bridged: beats are retried within a fifth of the
//     timeout, and the group is never declared DEAD;
//   - past HeartbeatTimeout without a beat, the instance stops fetching
//     (to everyone else the group is DEAD; it kept fetching and handling
//     before), and fetches again once a beat goes through (bringing the
//     group back).
func TestInstanceWithoutHeartbeatsStopsFetching(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Offset)
	ctx := context.Background()
	proxy := pgtest.NewProxy(t)
	hb := pgtest.NewPool(t, proxy.DSN(t, b.db)+"&pool_max_conns=2")
	r := newRecorder()
	g := b.newGroup(t, "g", func(c *consumergroup.Config) {
		c.HeartbeatPool = hb
		c.HeartbeatInterval, c.HeartbeatTimeout = 300*time.Millisecond, 1500*time.Millisecond
	})
	require.NoError(t, g.AddConsumer("m", r.handler, nil))
	start(t, g, consumergroup.FromNow())
	admin := b.newGroup(t, "g")
	state := func() consumergroup.State {
		admin.DetectDeadGroups(ctx)
		st, err := admin.State(ctx)
		require.NoError(t, err)
		return st
	}

	// A short outage.
	proxy.Down()
	deadline := time.Now().Add(700 * time.Millisecond)
	for time.Now().Before(deadline) {
		require.Equal(t, consumergroup.Active, state())
		time.Sleep(50 * time.Millisecond)
	}
	proxy.Up()
	for range 20 {
		require.Equal(t, consumergroup.Active, state(), "a short outage made the group DEAD")
		time.Sleep(50 * time.Millisecond)
	}

	// A long one: past its timeout the instance stops fetching, before
	// anybody declared the group DEAD (it fetched on until then).
	proxy.Down()
	time.Sleep(1500*time.Millisecond + 300*time.Millisecond)
	ids := b.send(t, 1, 2, 3)
	time.Sleep(500 * time.Millisecond)
	require.Zero(t, r.distinct(), "an instance without heartbeats kept fetching")
	require.Equal(t, consumergroup.Dead, state(), "to the others it is DEAD")

	proxy.Up()
	pgtest.Eventually(t, 10*time.Second, "delivered once heartbeats go through", func() bool { return r.distinct() == len(ids) })
	require.Equal(t, consumergroup.Active, state())
	require.Zero(t, r.dups(), r.duplicates())
}

// The instances on a client's pool share one heartbeat pool of at most 4
// connections, which closes when the last of them stops: twelve groups
// beating every 20 ms open no more than the main pool's connections, the
// client's LISTEN connection and those 4.
func TestInstancesShareTheClientsHeartbeatPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, outbox.Offset)
	client, err := outbox.NewClient(b.db.Pool, outbox.Config{Schema: b.db.Schema})
	require.NoError(t, err)
	backends := func() int {
		var n int
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend'`).Scan(&n))
		return n
	}
	var groups []*consumergroup.Group
	for i := range 12 {
		g := b.newGroup(t, fmt.Sprintf("g%d", i), func(c *consumergroup.Config) {
			c.Client, c.Schema, c.HeartbeatInterval = client, "", 20*time.Millisecond
		})
		require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return nil }, nil))
		start(t, g, consumergroup.FromNow())
		groups = append(groups, g)
	}
	b.sendRange(t, 0, 200)
	for range 10 {
		time.Sleep(50 * time.Millisecond)
		main := int(b.db.Pool.Stat().TotalConns())
		require.LessOrEqual(t, backends(), main+2+4, "the main pool's %d, LISTEN, the session proving the client alive and at most 4 for heartbeats", main)
	}
	for _, g := range groups {
		require.NoError(t, g.Stop(ctx))
	}
	pgtest.Eventually(t, 10*time.Second, "the heartbeat pool closed with the last instance", func() bool {
		return backends() <= int(b.db.Pool.Stat().TotalConns())+1
	})
}
