package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/startstop/startstoptest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// A consumer started and stopped from ten goroutines at once, over and
// over, never runs twice at once, never hangs a Stop, and still works
// afterwards: a stopped consumer starts again and handles what was sent
// meanwhile.
func TestConsumerStartStopStress(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	var handled atomic.Int64
	k, err := b.client.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "jobs", PollInterval: 10 * time.Millisecond,
		Handler: func(context.Context, *outbox.Delivery) error { handled.Add(1); return nil }})
	require.NoError(t, err)
	startstoptest.Stress(t, k, 20)

	b.sendN(t, "jobs", 5)
	time.Sleep(50 * time.Millisecond)
	require.Zero(t, handled.Load(), "a stopped consumer handled messages")
	require.NoError(t, k.Start(ctx))
	pgtest.Eventually(t, 10*time.Second, "messages handled after a restart", func() bool { return handled.Load() == 5 })
	require.NoError(t, k.Stop(ctx))
	<-k.Stopped()
}
