package router_test

import (
	"context"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/childproc"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// limitWatch is a receiver that takes delay a call and records when each
// call started and how many ran at once.
type limitWatch struct {
	delay  time.Duration
	mu     sync.Mutex
	starts []time.Time
	active int
	peak   int
}

func (l *limitWatch) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.mu.Lock()
	l.starts = append(l.starts, time.Now())
	l.active++
	l.peak = max(l.peak, l.active)
	delay := l.delay
	l.mu.Unlock()
	select {
	case <-time.After(delay):
	case <-r.Context().Done():
	}
	l.mu.Lock()
	l.active--
	l.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

func (l *limitWatch) setDelay(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.delay = d
}

// most is the most calls that started within any window of length d.
func (l *limitWatch) most(d time.Duration) int {
	l.mu.Lock()
	starts := append([]time.Time(nil), l.starts...)
	l.mu.Unlock()
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	best, lo := 0, 0
	for hi := range starts {
		for starts[hi].Sub(starts[lo]) >= d {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// since counts the calls that started after t.
func (l *limitWatch) since(t time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.starts {
		if s.After(t) {
			n++
		}
	}
	return n
}

func (l *limitWatch) stats() (calls, peak int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.starts), l.peak
}

// sendMany writes n messages for target, each in a message group of its
// own, through pool P.
func (b *pgBundle) sendMany(t *testing.T, target string, n int) {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "hooks", Payload: []byte(`{}`),
			Headers: map[string]string{router.HeaderPool: "P", router.HeaderTarget: target}}
	}
	_, err := b.producer.SendBatch(context.Background(), b.db.Pool, msgs)
	require.NoError(t, err)
}

// sharedRouters sends n messages to a receiver that takes delay a call,
// and starts three routers a, b and c that share pool's limits.
func sharedRouters(t *testing.T, delay time.Duration, n int, pool router.PoolConfig) (*pgBundle, *limitWatch) {
	t.Helper()
	b := setupPG(t)
	watch := &limitWatch{delay: delay}
	_, host := endpoint(t, watch.ServeHTTP)
	b.sendMany(t, "http://"+host+"/hook", n)
	for _, name := range []string{"a", "b", "c"} {
		b.startRouter(t, host, router.Config{Pools: []router.PoolConfig{pool},
			Shared: &router.SharedLimits{Client: b.client, Name: "hooks-router", Instance: name}})
	}
	return b, watch
}

// Three routers in one process share pool P's limits (concurrency 2, 120
// a minute): together they never run more than 2 calls at once, nor start
// more than 2 in a second plus the bucket's depth; without sharing, each
// would run its own 2.
func TestSharedLimitsInOneProcess(t *testing.T) {
	t.Parallel()
	b, watch := sharedRouters(t, 300*time.Millisecond, 60, router.PoolConfig{Code: "P", Concurrency: 2})
	adm, err := admin.New(b.client, admin.Options{})
	require.NoError(t, err)
	pgtest.Eventually(t, 30*time.Second, "the permits shown to operators", func() bool {
		routers, err := adm.Routers(context.Background())
		require.NoError(t, err)
		if len(routers) != 1 || len(routers[0].Permits) == 0 {
			return false
		}
		sum := 0
		for _, p := range routers[0].Permits {
			require.Equal(t, "P", p.Pool)
			require.Contains(t, []string{"a", "b", "c"}, p.Instance)
			sum += p.Permits
		}
		require.LessOrEqual(t, sum, 2)
		return sum > 0
	})
	pgtest.Eventually(t, 60*time.Second, "every message delivered", func() bool { return b.pending(t) == 0 })
	calls, peak := watch.stats()
	require.GreaterOrEqual(t, calls, 60)
	require.LessOrEqual(t, peak, 2, "calls at once, all routers together")
	require.Equal(t, 2, peak, "the limit is used")
}

// The same routers with a rate limit of 120 a minute: any 10 s sees at
// most 20 calls start, plus the bucket's depth (2).
func TestSharedRateLimitInOneProcess(t *testing.T) {
	t.Parallel()
	b, watch := sharedRouters(t, 10*time.Millisecond, 50, router.PoolConfig{Code: "P", Concurrency: 4, RateLimitPerMinute: 120})
	pgtest.Eventually(t, 60*time.Second, "every message delivered", func() bool { return b.pending(t) == 0 })
	most := watch.most(10 * time.Second)
	t.Logf("most calls in 10 s: %d", most)
	require.LessOrEqual(t, most, 20+2)
	require.GreaterOrEqual(t, most, 15, "the rate is used")
}

// Three router processes share pool P (concurrency 4, 600 a minute),
// measured by the receiver: for 20 s calls are quick and the rate binds;
// then one process is killed, calls take a second and the concurrency
// binds. No 10 s see more than 100 calls start plus the bucket's depth
// (10), never more than 4 run at once, and the killed process's permits
// come back once their lease (10 s) ends: the survivors run 4 at once
// again.
func TestSharedLimitsAcrossProcesses(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	watch := &limitWatch{delay: 50 * time.Millisecond}
	_, host := endpoint(t, watch.ServeHTTP)
	b.sendMany(t, "http://"+host+"/hook", 600)
	var children []*childproc.Child
	for _, name := range []string{"a", "b", "c"} {
		children = append(children, startChild(t, childSpec{DSN: b.db.DSN, Schema: b.db.Schema, Host: host, Instance: name,
			Queue: true, Concurrency: 4, BatchSize: 20, Shared: "hooks-router", RatePerMinute: 600}))
	}
	time.Sleep(20 * time.Second)
	watch.setDelay(time.Second)
	children[0].Kill()
	killed := time.Now()
	time.Sleep(25 * time.Second)

	calls, peak := watch.stats()
	most := watch.most(10 * time.Second)
	late := watch.since(killed.Add(13 * time.Second))
	t.Logf("%d calls; at most %d in any 10 s; at most %d at once; %d in the last 12 s (4 at once of 1 s: 48, 3 at once: 36)",
		calls, most, peak, late)
	require.LessOrEqual(t, most, 100+10, "calls started within 10 s, every router together")
	require.LessOrEqual(t, peak, 4, "calls at once, every router together")
	require.GreaterOrEqual(t, most, 80, "the rate is used")
	require.GreaterOrEqual(t, late, 40, "the killed process's permits came back to the others")
}
