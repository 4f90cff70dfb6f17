package router

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
)

type nopSettler struct{ wg *sync.WaitGroup }

func (s nopSettler) Ack(context.Context) error                { s.wg.Done(); return nil }
func (s nopSettler) Nack(context.Context, Retry) error        { s.wg.Done(); return nil }
func (s nopSettler) DeadLetter(context.Context, string) error { s.wg.Done(); return nil }

type poolsSource struct {
	mu    sync.Mutex
	pools []PoolConfig
}

func (s *poolsSource) Pools(context.Context) ([]PoolConfig, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pools, nil
}

func startInternal(t *testing.T, cfg Config) *Router {
	t.Helper()
	r, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	return r
}

// Holds on message groups that failed, and pools that left the
// configuration, are forgotten once they no longer matter: the router's
// memory does not grow with every group that ever failed or every pool
// that ever existed.
func TestHoldsAndDrainedPoolsArePruned(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	clock := clocktest.New(time.Now())
	src := &poolsSource{pools: []PoolConfig{{Code: "P", Concurrency: 10}}}
	r := startInternal(t, Config{AllowedHosts: []string{u.Host}, Clock: clock, MaxAttempts: 1, ConfigSource: src, SyncInterval: time.Hour,
		CleanupInterval: 10 * time.Millisecond, Breaker: BreakerConfig{MinRequests: 1000}})
	var wg sync.WaitGroup
	var batch []*Message
	for i := range 200 {
		wg.Add(1)
		batch = append(batch, &Message{ID: fmt.Sprint(i), DeliveryID: fmt.Sprint(i), Pool: "P", Target: srv.URL, Group: fmt.Sprint(i),
			Topic: "t", Settle: nopSettler{&wg}})
	}
	r.Route(context.Background(), batch)
	wg.Wait()
	held := func() int {
		r.holds.mu.Lock()
		defer r.holds.mu.Unlock()
		return len(r.holds.m)
	}
	require.Equal(t, 200, held(), "each failed group is held back until its retry")

	for i := range 50 {
		src.mu.Lock()
		src.pools = []PoolConfig{{Code: fmt.Sprint("Q", i), Concurrency: 1}}
		src.mu.Unlock()
		require.NoError(t, r.Sync(context.Background()))
	}
	clock.Advance(time.Hour) // every hold lapsed
	pgtest.Eventually(t, 5*time.Second, "lapsed holds and drained pools forgotten", func() bool {
		r.mu.Lock()
		drained := len(r.drained)
		r.mu.Unlock()
		return held() == 0 && drained == 0
	})
}

// Messages whose source keeps their message group's order (an ordered
// topic read by QueueSource or GroupSource) are never held back in
// memory: the database orders them across routers, and a hold would only
// delay them.
func TestMessagesOfOrderedSourcesAreNeverHeld(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) }))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	r := startInternal(t, Config{AllowedHosts: []string{u.Host}, MaxAttempts: 1, Pools: []PoolConfig{{Code: "P", Concurrency: 10}},
		Breaker: BreakerConfig{MinRequests: 1000}})
	var wg sync.WaitGroup
	var batch []*Message
	for i := range 100 {
		wg.Add(1)
		batch = append(batch, &Message{ID: fmt.Sprint(i), DeliveryID: fmt.Sprint(i), Pool: "P", Target: srv.URL, Group: fmt.Sprint(i % 10),
			Topic: "t", Settle: nopSettler{&wg}, ordered: true})
	}
	r.Route(context.Background(), batch)
	wg.Wait()
	r.holds.mu.Lock()
	defer r.holds.mu.Unlock()
	require.Empty(t, r.holds.m, "failed messages of an ordered source held their groups back in memory")
}

// A message group leaves nothing behind once its messages are done, and a
// pool runs no more goroutines than its concurrency, however many groups
// passed through it.
func TestFinishedGroupsLeaveNothingBehind(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(`{"ack":true}`)) }))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	r := startInternal(t, Config{AllowedHosts: []string{u.Host}, Pools: []PoolConfig{{Code: "P", Concurrency: 8}}})
	var wg sync.WaitGroup
	for i := 0; i < 2000; i += 100 {
		var batch []*Message
		for j := i; j < i+100; j++ {
			wg.Add(1)
			batch = append(batch, &Message{ID: fmt.Sprint(j), DeliveryID: fmt.Sprint(j), Pool: "P", Target: srv.URL,
				Group: fmt.Sprint(j), Topic: "t", Settle: nopSettler{&wg}})
		}
		r.Route(context.Background(), batch)
	}
	wg.Wait()
	r.mu.Lock()
	p := r.pools["P"]
	r.mu.Unlock()
	pgtest.Eventually(t, 5*time.Second, "every group forgotten", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.groups) == 0 && len(p.ready) == 0 && p.inFlight == 0 && p.queued == 0
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	require.LessOrEqual(t, p.live, 8, "no more workers than the pool's concurrency")
	require.Empty(t, p.remaining)
	require.Empty(t, p.failed)
}
