package consumergroup_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Health counts, in every mode, what a stopped group has not read, what
// waits for a retry and its dead letters, stops counting at its limit, and
// says ErrNotFound for a group that does not exist.
func TestHealth(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, mode)
			g := b.newGroup(t, "billing")
			handled := newRecorder()
			require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
				var p seqPayload
				require.NoError(t, json.Unmarshal(d.Payload, &p))
				switch {
				case p.Seq < 5:
					return outbox.Permanent(errors.New("bad message"))
				case p.Seq < 10:
					return outbox.RetryAfter(time.Hour, errors.New("downstream down"))
				}
				return handled.handler(ctx, d)
			}, nil))
			start(t, g, consumergroup.FromNow())
			b.sendRange(t, 0, 20)
			pgtest.Eventually(t, 30*time.Second, "the first 20 settled", func() bool {
				h, err := g.Health(ctx, 0)
				require.NoError(t, err)
				return handled.distinct() == 10 && h.Waiting == 5 && h.DeadLetters == 5 && h.LeasedBatches == 0
			})
			stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			require.NoError(t, g.Stop(stopCtx))
			b.sendRange(t, 20, 50)

			admin := b.newGroup(t, "billing") // a Group value never started reads it too
			h, err := admin.Health(ctx, 0)
			require.NoError(t, err)
			require.Equal(t, consumergroup.Active, h.State)
			require.EqualValues(t, 30, h.Unread, "the messages sent while it was stopped")
			require.EqualValues(t, 5, h.Waiting)
			require.EqualValues(t, 5, h.DeadLetters)
			require.Zero(t, h.LeasedBatches+h.LeasedRetries)
			require.Positive(t, h.Lag)
			require.False(t, h.NearTimeout(), "a heartbeat %v ago, timeout %v", h.SinceHeartbeat, h.HeartbeatTimeout)
			require.Equal(t, time.Minute, h.HeartbeatTimeout)

			h, err = admin.Health(ctx, 12)
			require.NoError(t, err)
			require.EqualValues(t, 12, h.Unread, "counting stops at the limit")

			_, err = b.newGroup(t, "nobody").Health(ctx, 0)
			require.ErrorIs(t, err, outbox.ErrNotFound)
		})
	}
}

// Health counts as unread, in every mode, the messages of a batch a
// member is handling and has not finished, even once the read that took
// them is over (the group's position is past them then).
func TestHealthCountsTheMessagesBeingHandled(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t, mode)
			g := b.newGroup(t, "billing")
			release := make(chan struct{})
			started := make(chan struct{}, 100)
			require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
				started <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}, nil))
			start(t, g, consumergroup.FromNow())
			t.Cleanup(func() { close(release) }) // before the group stops
			b.sendRange(t, 0, 5)
			<-started
			h, err := g.Health(ctx, 0)
			require.NoError(t, err)
			require.EqualValues(t, 1, h.LeasedBatches)
			require.EqualValues(t, 5, h.Unread, "the batch's messages, none finished")
			require.Positive(t, h.Lag)
		})
	}
}
