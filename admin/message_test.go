package admin_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Which groups finished a message, in every mode: one group finished it,
// one retries it, one dead-lettered it, one has not read it (stopped),
// and one subscribed after it was written.
func TestMessageGroups(t *testing.T) {
	for _, mode := range []outbox.TrackingMode{outbox.Bitmap, outbox.Counter, outbox.Offset} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, admin.Options{}, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode},
				outbox.TopicConfig{Name: "jobs", Semantics: outbox.Queue})
			done := &recorder{seen: map[int64]int{}}
			e.startGroup(t, "events", "done", done)
			e.startGroupWith(t, "events", "retrying", func(context.Context, *outbox.Delivery) error {
				return outbox.RetryAfter(time.Hour, errors.New("downstream down"))
			})
			e.startGroupWith(t, "events", "dead", func(context.Context, *outbox.Delivery) error {
				return outbox.Permanent(errors.New("account closed"))
			})
			stopped := e.startGroup(t, "events", "stopped", &recorder{seen: map[int64]int{}})
			require.NoError(t, stopped.Stop(ctx))

			id, err := e.producer.Send(ctx, e.db.Pool, outbox.Message{Topic: "events", Payload: []byte(`{}`)})
			require.NoError(t, err)
			want := map[string]admin.MessageState{"done": admin.MessageFinished, "retrying": admin.MessageRetrying,
				"dead": admin.MessageDeadLettered, "stopped": admin.MessagePending}
			var got []admin.MessageGroup
			pgtest.Eventually(t, 30*time.Second, "every running group handled the message", func() bool {
				got, err = e.admin.MessageGroups(ctx, "events", id)
				require.NoError(t, err)
				return len(got) == 4 && states(got)["done"] == want["done"] && states(got)["retrying"] == want["retrying"] &&
					states(got)["dead"] == want["dead"]
			})
			require.Equal(t, want, states(got))
			for _, g := range got {
				require.Equal(t, consumergroup.Active, g.Status, g.ConsumerGroup)
				switch g.ConsumerGroup {
				case "retrying":
					require.Equal(t, 1, g.Attempts)
					require.Contains(t, g.LastError, "downstream down")
					require.NotNil(t, g.NextAttempt)
					require.WithinDuration(t, time.Now().Add(time.Hour), *g.NextAttempt, 10*time.Minute)
				case "dead":
					require.Contains(t, g.LastError, "account closed")
					require.Nil(t, g.NextAttempt)
				default:
					require.Zero(t, g.Attempts, g.ConsumerGroup)
				}
			}

			// A group that subscribes after the message: Bitmap and Counter
			// messages name the groups they need; in Offset mode its
			// position is past the message.
			e.startGroup(t, "events", "later", &recorder{seen: map[int64]int{}})
			got, err = e.admin.MessageGroups(ctx, "events", id)
			require.NoError(t, err)
			later := admin.MessageNotRequired
			if mode == outbox.Offset {
				later = admin.MessageFinished
			}
			require.Equal(t, later, states(got)["later"])

			_, err = e.admin.MessageGroups(ctx, "events", id+1000)
			require.ErrorIs(t, err, outbox.ErrNotFound)
			_, err = e.admin.MessageGroups(ctx, "jobs", id)
			require.ErrorIs(t, err, outbox.ErrNotFound, "not one of the QUEUE topic's messages")
			_, err = e.admin.MessageGroups(ctx, "nothing", id)
			require.ErrorIs(t, err, outbox.ErrNotFound)
		})
	}
}

// A message sent with NotBefore that a group read is PENDING in it until
// it is due, and says when that is.
func TestMessageGroupsSaysWhenAScheduledMessageIsDue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, admin.Options{}, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Offset})
	r := &recorder{seen: map[int64]int{}}
	g := e.startGroup(t, "events", "g", r)
	due := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	id, err := e.producer.Send(ctx, e.db.Pool, outbox.Message{Topic: "events", Payload: []byte(`{}`), NotBefore: due})
	require.NoError(t, err)
	var got []admin.MessageGroup
	pgtest.Eventually(t, 30*time.Second, "the group read the message", func() bool {
		var err error
		got, err = e.admin.MessageGroups(ctx, "events", id)
		require.NoError(t, err)
		return len(got) == 1 && got[0].NextAttempt != nil // parked until due
	})
	require.Len(t, got, 1)
	require.Equal(t, admin.MessagePending, got[0].State)
	require.NotNil(t, got[0].NextAttempt)
	require.True(t, due.Equal(*got[0].NextAttempt), "due %v, NextAttempt %v", due, *got[0].NextAttempt)
	require.Zero(t, got[0].Attempts)
	h, err := g.Health(ctx, 0)
	require.NoError(t, err)
	require.Zero(t, h.Queued, "a scheduled message is not queued")
	require.Less(t, h.Lag, time.Minute, "a message not due yet is no lag")
}

func states(gs []admin.MessageGroup) map[string]admin.MessageState {
	m := map[string]admin.MessageState{}
	for _, g := range gs {
		m[g.ConsumerGroup] = g.State
	}
	return m
}

// startGroupWith starts an instance of group name on topic, from now,
// with handler h; it is stopped when the test ends.
func (e *env) startGroupWith(t *testing.T, topic, name string, h func(context.Context, *outbox.Delivery) error) *consumergroup.Group {
	t.Helper()
	g, err := consumergroup.New(e.db.Pool, consumergroup.Config{Topic: topic, Group: name, Client: e.client,
		PollInterval: 20 * time.Millisecond, HeartbeatInterval: time.Second, HeartbeatTimeout: time.Minute})
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", h, nil))
	require.NoError(t, g.Start(context.Background(), consumergroup.FromNow()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Stop(ctx)
	})
	return g
}
