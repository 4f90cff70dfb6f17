package outbox_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/outbox"
)

func TestConsumerDrainsQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	b.sendN(t, "orders", 500)
	var handled atomic.Int64
	startConsumer(t, b.client, outbox.ConsumerConfig{
		Topic: "orders",
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			handled.Add(1)
			return nil
		},
	})
	eventually(t, 10*time.Second, "queue drained", func() bool { return b.count(t, "true") == 0 })
	require.EqualValues(t, 500, handled.Load())
}
