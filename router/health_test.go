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

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/router"
)

// stuckSource polls once, then hangs without polling again.
type stuckSource struct{ runs atomic.Int32 }

func (s *stuckSource) Name() string { return "stuck" }
func (s *stuckSource) LastPoll() time.Time {
	if s.runs.Load() == 0 {
		return time.Time{}
	}
	return time.Now().Add(-time.Hour) // polled long ago
}
func (s *stuckSource) Run(ctx context.Context, _ func(context.Context, []*router.Message)) error {
	s.runs.Add(1)
	<-ctx.Done()
	return nil
}

// A source that stopped polling is restarted, with a warning.
func TestStalledSourceIsRestarted(t *testing.T) {
	t.Parallel()
	src := &stuckSource{}
	rt := newRouter(t, router.Config{AllowedHosts: []string{"x"}, HealthInterval: 20 * time.Millisecond, StallTimeout: 50 * time.Millisecond})
	rt.AddSource(src)
	pgtest.Eventually(t, 5*time.Second, "restarted", func() bool { return src.runs.Load() >= 2 })
	require.True(t, hasWarning(rt, router.WarnConsumerRestart, router.SeverityWarn))
}

func TestStartTwiceAndStopIdempotent(t *testing.T) {
	t.Parallel()
	rt, err := router.New(router.Config{AllowedHosts: []string{"x"}})
	require.NoError(t, err)
	require.NoError(t, rt.Stop(context.Background()), "stop before start")
	require.NoError(t, rt.Start(context.Background()))
	require.ErrorIs(t, rt.Start(context.Background()), router.ErrStarted)
	require.NoError(t, rt.Stop(context.Background()))
	require.NoError(t, rt.Stop(context.Background()))
}

// blockingSettler's Nack waits for release, so drained messages stay in
// the in-flight map while they are being settled.
type blockingSettler struct {
	recSettler
	release <-chan struct{}
}

func (b blockingSettler) Nack(ctx context.Context, r router.Retry) error {
	<-b.release
	return b.recSettler.Nack(ctx, r)
}

// The in-flight map growing past what the pools can hold raises
// PIPELINE_MAP_LEAK: here 60 messages of a removed pool are stuck in a slow
// nack while the only remaining pool holds 50.
func TestLeakDetection(t *testing.T) {
	t.Parallel()
	hold := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release); close(hold) }) })
	_, host := endpoint(t, func(w http.ResponseWriter, r *http.Request) { <-hold; _, _ = w.Write([]byte(`{"ack":true}`)) })
	src := &staticConfig{pools: []router.PoolConfig{{Code: "P", Concurrency: 3}}}
	rt := newRouter(t, router.Config{AllowedHosts: []string{host}, ConfigSource: src, Pools: []router.PoolConfig{},
		SyncInterval: time.Hour, LeakCheckInterval: 10 * time.Millisecond})
	rec := newRecorder()
	var batch []*router.Message
	for i := range 60 {
		m := rec.msg(fmt.Sprint(i), fmt.Sprintf("%d/1", i), "http://"+host+"/", fmt.Sprint(i))
		m.Settle = blockingSettler{recSettler: recSettler{r: rec, id: m.DeliveryID}, release: release}
		batch = append(batch, m)
	}
	rt.Route(context.Background(), batch)
	pgtest.Eventually(t, 5*time.Second, "3 in flight", func() bool { return rt.Pools()[0].InFlight == 3 })
	require.False(t, hasWarning(rt, router.WarnPipelineMapLeak, router.SeverityWarn))
	src.set([]router.PoolConfig{{Code: "Q", Concurrency: 1}})
	go func() { _ = rt.Sync(context.Background()) }() // drains P: its nacks block
	pgtest.Eventually(t, 5*time.Second, "leak warning", func() bool { return hasWarning(rt, router.WarnPipelineMapLeak, router.SeverityWarn) })
	once.Do(func() { close(release); close(hold) })
	pgtest.Eventually(t, 10*time.Second, "everything settled", func() bool { return rt.InFlight() == 0 })
}
