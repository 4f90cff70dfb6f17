package router_test

import (
	"context"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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

// Three routers in one process share pool P's limits (concurrency 2, 120
// a minute): together they never run more than 2 calls at once, nor start
// more than 2 in a second plus the bucket's depth; without sharing, each
// would run its own 2.
func TestSharedLimitsInOneProcess(t *testing.T) {
	t.Parallel()
	b := setupPG(t)
	watch := &limitWatch{delay: 300 * time.Millisecond}
	_, host := endpoint(t, watch.ServeHTTP)
	b.sendMany(t, "http://"+host+"/hook", 60)
	for i := range 3 {
		b.startRouter(t, host, router.Config{Pools: []router.PoolConfig{{Code: "P", Concurrency: 2}},
			Shared: &router.SharedLimits{Client: b.client, Name: "hooks-router", Instance: string(rune('a' + i))}})
	}
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
	b := setupPG(t)
	watch := &limitWatch{delay: 10 * time.Millisecond}
	_, host := endpoint(t, watch.ServeHTTP)
	b.sendMany(t, "http://"+host+"/hook", 50)
	for i := range 3 {
		b.startRouter(t, host, router.Config{Pools: []router.PoolConfig{{Code: "P", Concurrency: 4, RateLimitPerMinute: 120}},
			Shared: &router.SharedLimits{Client: b.client, Name: "hooks-router", Instance: string(rune('a' + i))}})
	}
	pgtest.Eventually(t, 60*time.Second, "every message delivered", func() bool { return b.pending(t) == 0 })
	most := watch.most(10 * time.Second)
	t.Logf("most calls in 10 s: %d", most)
	require.LessOrEqual(t, most, 20+2)
	require.GreaterOrEqual(t, most, 15, "the rate is used")
}
