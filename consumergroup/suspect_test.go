package consumergroup_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// peakHandler counts the calls in progress and their peak; block makes
// each call wait for its context (an instance that will crash).
type peakHandler struct {
	mu        sync.Mutex
	now, peak int
	done      map[int64]bool
	block     bool
}

func (h *peakHandler) handle(ctx context.Context, d *outbox.Delivery) error {
	h.mu.Lock()
	h.now++
	h.peak = max(h.peak, h.now)
	h.mu.Unlock()
	if h.block {
		<-ctx.Done()
	} else {
		time.Sleep(20 * time.Millisecond)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.now--
	if ctx.Err() != nil {
		return ctx.Err()
	}
	h.done[d.ID] = true
	return nil
}

func (h *peakHandler) state() (peak, done int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peak, len(h.done)
}

// The messages of an instance that crashed are retried at the group's
// usual pace, many at once; messages that were in flight in two crashes
// in a row are suspected of causing them and retried one at a time, apart
// from each other (so one that crashes every process runs out of attempts
// without taking the others along).
func TestCrashedInstancesMessagesRetriedAtPaceUntilTheSecondCrash(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	b := setupTopic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Bitmap,
		Lease: 30 * time.Second, MaxAttempts: 5})
	ctx := context.Background()
	withClock := func(c *consumergroup.Config) { c.Clock = clock; c.BatchSize = 10; c.Concurrency = 10 }

	// crash runs an instance whose handler blocks until the instance dies,
	// waits until its calls began, kills it (its pool closes: nothing
	// reaches the database any more), lets the leases run out, and
	// returns how many calls it had running at once.
	crash := func(name string) int {
		pool := pgtest.NewPool(t, b.db.DSN)
		g := b.newGroupOn(t, pool, "g", withClock, func(c *consumergroup.Config) { c.InstanceID = name })
		h := &peakHandler{done: map[int64]bool{}, block: true}
		require.NoError(t, g.AddConsumer("m", h.handle, nil))
		require.NoError(t, g.Start(ctx, consumergroup.FromNow()))
		pgtest.Eventually(t, 10*time.Second, name+" handling", func() bool { peak, _ := h.state(); return peak > 0 })
		time.Sleep(500 * time.Millisecond) // what one look claims has begun
		pool.Close()
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		_ = g.Stop(stopCtx)
		cancel()
		clock.Advance(31 * time.Second)
		peak, _ := h.state()
		return peak
	}

	first := b.newGroup(t, "g", withClock) // subscribes the group
	require.NoError(t, first.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return nil }, nil))
	require.NoError(t, first.Start(ctx, consumergroup.FromNow()))
	require.NoError(t, first.Stop(ctx))
	b.sendRange(t, 0, 10)

	require.Equal(t, 10, crash("doomed-1"), "the first instance holds the batch")
	// The second instance takes the batch over: its messages are retried
	// together, not one at a time.
	require.Equal(t, 10, crash("doomed-2"), "retried at the usual pace after one crash")
	// Now each was in flight in two crashes: tried one at a time.
	h := &peakHandler{done: map[int64]bool{}}
	survivor := b.newGroup(t, "g", withClock)
	require.NoError(t, survivor.AddConsumer("m", h.handle, nil))
	start(t, survivor, consumergroup.FromNow())
	pgtest.Eventually(t, 20*time.Second, "every message delivered", func() bool { _, done := h.state(); return done == 10 })
	peak, _ := h.state()
	require.Equal(t, 1, peak, "suspects are tried one at a time")
}
