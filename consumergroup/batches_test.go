package consumergroup_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// An instance with a batch handler holds BatchSize × ConcurrentBatches
// messages at most, in concurrent calls; by default BatchSize +
// Concurrency.
func TestConcurrentBatches(t *testing.T) {
	for _, concurrent := range []int{0, 3} {
		t.Run("ConcurrentBatches="+string(rune('0'+concurrent)), func(t *testing.T) {
			b := setup(t, outbox.Offset)
			var running, most, held, mostHeld atomic.Int32
			var mu sync.Mutex
			handled := map[int64]int{}
			g := b.newGroup(t, "g", func(c *consumergroup.Config) { c.BatchSize, c.Concurrency, c.ConcurrentBatches = 10, 1, concurrent })
			require.NoError(t, g.SetBatchHandler(func(ctx context.Context, ds []*outbox.Delivery) []error {
				raise := func(v *atomic.Int32, n int32) {
					for m := v.Load(); n > m && !v.CompareAndSwap(m, n); m = v.Load() {
					}
				}
				raise(&most, running.Add(1))
				raise(&mostHeld, held.Add(int32(len(ds))))
				time.Sleep(50 * time.Millisecond) // long enough for the next batches to be handed out meanwhile
				held.Add(-int32(len(ds)))
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
			if concurrent == 0 {
				require.LessOrEqual(t, mostHeld.Load(), int32(10+1), "most messages held: BatchSize + Concurrency")
				return
			}
			require.Greater(t, most.Load(), int32(1), "most calls at once")
			require.LessOrEqual(t, mostHeld.Load(), int32(10*concurrent), "most messages held")
			require.Greater(t, mostHeld.Load(), int32(10+1), "more held than without ConcurrentBatches")
		})
	}
}
