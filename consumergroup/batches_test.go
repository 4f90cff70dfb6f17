package consumergroup_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// A batch handler gets as many batches at once as ConcurrentBatches says,
// and no more; by default, with BatchSize + Concurrency messages held, a
// full batch at a time.
func TestConcurrentBatches(t *testing.T) {
	for _, concurrent := range []int{0, 3} {
		t.Run("ConcurrentBatches="+string(rune('0'+concurrent)), func(t *testing.T) {
			b := setup(t, outbox.Offset)
			var running, most atomic.Int32
			var mu sync.Mutex
			handled := map[int64]int{}
			g := b.newGroup(t, "g", func(c *consumergroup.Config) { c.BatchSize, c.Concurrency, c.ConcurrentBatches = 10, 1, concurrent })
			require.NoError(t, g.SetBatchHandler(func(ctx context.Context, ds []*outbox.Delivery) []error {
				n := running.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(50 * time.Millisecond) // long enough for the next batches to be handed out meanwhile
				running.Add(-1)
				mu.Lock()
				for _, d := range ds {
					handled[d.ID]++
				}
				mu.Unlock()
				return make([]error, len(ds))
			}))
			start(t, g, consumergroup.FromNow())
			b.sendRange(t, 0, 200)
			pgtest.Eventually(t, 30*time.Second, "every message handled", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(handled) == 200
			})
			want := int32(max(1, concurrent))
			require.Equal(t, want, most.Load(), "most calls at once")
		})
	}
}
