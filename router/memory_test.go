package router_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/router"
)

// tally is a Settler that only counts, for tests that route many messages.
type tally struct{ acked, nacked, dead *atomic.Int64 }

func newTally() tally { return tally{new(atomic.Int64), new(atomic.Int64), new(atomic.Int64)} }

func (t tally) Ack(context.Context) error                { t.acked.Add(1); return nil }
func (t tally) Nack(context.Context, router.Retry) error { t.nacked.Add(1); return nil }
func (t tally) DeadLetter(context.Context, string) error { t.dead.Add(1); return nil }
func (t tally) settled() int64                           { return t.acked.Load() + t.nacked.Load() + t.dead.Load() }

// 10,000 messages naming an unknown pool, then 10,000 naming hosts off
// the allow-list, each a different one (ten times the cap): the warnings
// stay bounded. The first kind is one ROUTING warning (their messages are
// nacked: DEFAULT-POOL cannot take batches of 1,000, which is
// back-pressure, not a warning), the second at most MaxWarnings.
func TestWarningsAreBounded(t *testing.T) {
	t.Parallel()
	rt := newRouter(t, router.Config{AllowedHosts: []string{"allowed.invalid"}})
	const messages = 10 * router.DefaultMaxWarnings
	settle := newTally()
	route := func(target func(i int) string, pool string) {
		for start := 0; start < messages; start += 1000 {
			batch := make([]*router.Message, 0, 1000)
			for i := start; i < start+1000; i++ {
				batch = append(batch, &router.Message{ID: fmt.Sprint(pool, i), DeliveryID: fmt.Sprint(pool, i), Pool: pool,
					Target: target(i), Group: fmt.Sprint(i), Settle: settle})
			}
			rt.Route(context.Background(), batch)
		}
	}
	route(func(int) string { return "http://allowed.invalid/" }, "NO-SUCH-POOL")
	require.EqualValues(t, messages, settle.nacked.Load())
	require.Equal(t, 1, len(rt.Warnings()), "one ROUTING warning")
	require.True(t, hasWarning(rt, router.WarnRouting, router.SeverityWarn))
	for _, w := range rt.Warnings() {
		if w.Code == router.WarnRouting {
			require.Equal(t, "NO-SUCH-POOL", w.Subject)
			require.Equal(t, messages, w.Count)
		}
	}

	route(func(i int) string { return fmt.Sprintf("http://h%d.invalid/", i) }, "P")
	require.EqualValues(t, messages, settle.dead.Load())
	require.Equal(t, router.DefaultMaxWarnings, len(rt.Warnings()), "one per host, up to the cap")
}

// One hot message group cannot take a pool's whole capacity: it holds at
// most GroupShare of it (the rest of its batch is sent back), and other
// groups' batches still get in.
func TestHotGroupLeavesRoomForOthers(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var once sync.Once
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) { <-release; _, _ = w.Write([]byte(`{"ack":true}`)) })
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, Pools: []router.PoolConfig{{Code: "P", Concurrency: 1}}})
	rec := newRecorder()
	target := "http://" + host + "/"
	rt.Route(context.Background(), []*router.Message{rec.msg("z", "z/1", target, "z")})
	pgtest.Eventually(t, 5*time.Second, "the pool's one permit taken", func() bool { return rt.Pools()[0].InFlight == 1 })
	var hot []*router.Message
	for i := range 50 { // capacity max(1×20, 50) = 50
		hot = append(hot, rec.msg(fmt.Sprint("hot", i), fmt.Sprint("hot", i, "/1"), target, "hot"))
	}
	rt.Route(context.Background(), hot)
	others := []*router.Message{rec.msg("x", "x/1", target, "x"), rec.msg("y", "y/1", target, "y")}
	rt.Route(context.Background(), others)
	once.Do(func() { close(release) })
	require.Equal(t, "ack", rec.outcome(t, "x/1").kind)
	require.Equal(t, "ack", rec.outcome(t, "y/1").kind)
	accepted, sentBack := 0, 0
	for i := range 50 {
		switch got := rec.outcome(t, fmt.Sprint("hot", i, "/1")); {
		case got.kind == "ack":
			accepted++
		case got.kind == "nack" && !got.attempted:
			sentBack++
		}
	}
	require.Equal(t, 25, accepted, "the hot group's share: half the capacity")
	require.Equal(t, 25, sentBack, "the rest is sent back undelivered")
}
