package router_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
	eventually(t, 5*time.Second, "restarted", func() bool { return src.runs.Load() >= 2 })
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
