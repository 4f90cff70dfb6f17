package consumergroup_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// A Counter group removed after it finished a message (by its position)
// is taken out of the message's required groups: once its subscription is
// gone nothing can say it finished the message, and cleanup must still
// delete it when the other group has.
func TestRemovedCounterGroupNoLongerHoldsMessagesItFinished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, outbox.Counter)
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: b.topic, Semantics: outbox.PubSub, Tracking: outbox.Counter, Retention: time.Nanosecond}))
	b.subscribe(t, "b") // subscribed, reads nothing yet
	ra := newRecorder()
	ga := b.startRecording(t, "a", ra)
	ids := b.send(t, 1)
	aSub := b.subID(t, "a")
	pgtest.Eventually(t, 10*time.Second, "a finished it", func() bool {
		return b.count(t, "id = $1 AND "+b.db.FinishedBy(aSub), ids[0]) == 1
	})
	require.NoError(t, ga.Stop(ctx))
	maint, err := consumergroup.NewMaintainer(b.db.Pool, b.client)
	require.NoError(t, err)
	require.NoError(t, maint.RemoveGroup(ctx, b.topic, "a"))
	rb := newRecorder()
	b.startRecording(t, "b", rb)
	bSub := b.subID(t, "b")
	pgtest.Eventually(t, 10*time.Second, "b finished it", func() bool {
		return rb.hasAll(ids) && b.count(t, "id = $1 AND "+b.db.FinishedBy(bSub), ids[0]) == 1
	})
	n, err := maint.Cleanup(ctx, b.topic, 100)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "both groups handled the message; cleanup deletes it")
	require.Zero(t, b.count(t, "id = $1", ids[0]))
}
