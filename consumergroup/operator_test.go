package consumergroup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// A DEAD group comes back with a backfill of what it had not completed,
// or from now without one: then nothing it owed is delivered to it, and
// nothing it owed waits for it (cleanup deletes it once the other group
// is done). Only a DEAD group can be resurrected.
func TestResurrectWithAndWithoutBackfill(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setupTopic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode,
				Retention: time.Microsecond, ZeroSubscriptionRetention: time.Microsecond})
			ctx := context.Background()
			other := newRecorder()
			og := b.startRecording(t, "other", other)
			b.subscribe(t, "with")
			b.subscribe(t, "without")
			b.send(t, 1, 2, 3) // owed by both
			b.makeDead(t, "with")
			b.makeDead(t, "without")
			b.send(t, 4, 5) // written while they were DEAD
			pgtest.Eventually(t, 10*time.Second, "the other group handling 1..5", func() bool { return other.distinct() == 5 })

			without := b.newGroup(t, "without")
			require.ErrorIs(t, og.Resurrect(ctx, false), consumergroup.ErrInvalidTransition, "an ACTIVE group")
			require.NoError(t, without.Resurrect(ctx, false))
			st, err := without.State(ctx)
			require.NoError(t, err)
			require.Equal(t, consumergroup.Active, st)
			require.ErrorIs(t, without.Resurrect(ctx, false), consumergroup.ErrInvalidTransition, "no longer DEAD")
			require.NoError(t, b.newGroup(t, "with").Resurrect(ctx, true))

			// Nothing waits for "without": cleanup deletes 1..5 (the
			// backfill of "with" still holds what it has not read).
			cleaner := b.newGroup(t, "cleaner")
			_, err = cleaner.Cleanup(ctx, 100)
			require.NoError(t, err)

			recs := map[string]*recorder{"with": newRecorder(), "without": newRecorder()}
			for name, r := range recs {
				b.startRecording(t, name, r)
			}
			b.send(t, 6)
			pgtest.Eventually(t, 10*time.Second, "both receiving 6, with its backfill of 1..5", func() bool {
				return recs["without"].has(6) && recs["with"].distinct() == 6
			})
			time.Sleep(200 * time.Millisecond) // a wrong backfill would deliver meanwhile
			require.Equal(t, 1, recs["without"].distinct(), "without a backfill, only what was written after")
			pgtest.Eventually(t, 10*time.Second, "cleanup deleting everything", func() bool {
				_, err := cleaner.Cleanup(ctx, 100)
				require.NoError(t, err)
				return b.count(t, "topic = $1", b.topic) == 0
			})
		})
	}
}

// ForceComplete gives up a paused group's old messages and dead letters:
// they no longer hold cleanup back, and the group, resumed, receives only
// what is written later.
func TestForceComplete(t *testing.T) {
	for _, mode := range modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			b := setupTopic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode, MaxAttempts: 1,
				Retention: time.Microsecond, ZeroSubscriptionRetention: time.Microsecond})
			ctx := context.Background()
			other, held := newRecorder(), newRecorder()
			b.startRecording(t, "other", other)
			g := b.newGroup(t, "held")
			require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
				if p, _ := outbox.Decode[seqPayload](d); p.Seq == 0 {
					return errors.New("no")
				}
				return held.handler(ctx, d)
			}, nil))
			start(t, g, consumergroup.FromNow())
			b.send(t, 0)
			pgtest.Eventually(t, 10*time.Second, "message 0 dead-lettered", func() bool {
				dl, err := g.DeadLetters(ctx, 0, 10)
				require.NoError(t, err)
				return len(dl) == 1
			})
			require.NoError(t, g.Pause(ctx))
			b.send(t, 1, 2, 3)
			pgtest.Eventually(t, 10*time.Second, "the other group handling 0..3", func() bool { return other.distinct() == 4 })

			_, err := g.ForceComplete(ctx, -time.Second)
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			n, err := g.ForceComplete(ctx, time.Hour)
			require.NoError(t, err)
			require.Zero(t, n, "nothing is an hour old")
			n, err = g.ForceComplete(ctx, 0)
			require.NoError(t, err)
			dl, err := g.DeadLetters(ctx, 0, 10)
			require.NoError(t, err)
			require.Empty(t, dl, "the dead letter is given up")
			_, err = g.Cleanup(ctx, 100)
			require.NoError(t, err)
			want := int64(4) // the dead letter and 1..3
			if mode == outbox.Offset {
				want = 1 // the dead letter: the position passes 1..3
			}
			require.Equal(t, want, n)
			// The position moves only past what the database's xmin lets
			// it see: a transaction open anywhere on the server (another
			// test's) can hold it back for a while, and ForceComplete then
			// moves it the rest of the way when called again. (The other
			// group's completions, too, may still be on their way.)
			pgtest.Eventually(t, 10*time.Second, "nothing waits for the paused group", func() bool {
				if b.count(t, "topic = $1", b.topic) == 0 {
					return true
				}
				_, err := g.ForceComplete(ctx, 0)
				require.NoError(t, err)
				_, err = g.Cleanup(ctx, 100)
				require.NoError(t, err)
				return false
			})

			require.NoError(t, g.Resume(ctx))
			b.send(t, 4)
			pgtest.Eventually(t, 10*time.Second, "the resumed group receiving 4", func() bool { return held.has(4) })
			require.Equal(t, 1, held.distinct(), "and nothing it gave up")
		})
	}
}

// Inconsistencies finds stored messages whose completion record does
// not add up, by kind, and none on a healthy topic.
func TestInconsistencies(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Counter)
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "bits", Semantics: outbox.PubSub, Tracking: outbox.Bitmap}))
	b.subscribe(t, "g")
	maint, err := consumergroup.NewMaintainer(b.db.Pool, b.client)
	require.NoError(t, err)
	ids := b.send(t, 1, 2, 3, 4, 5)
	found, err := maint.Inconsistencies(ctx, 100)
	require.NoError(t, err)
	require.Empty(t, found)
	_, err = maint.Inconsistencies(ctx, 0)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)

	table := b.db.Table("outbox_published")
	for _, edit := range []struct {
		sql string
		id  int64
	}{
		{`UPDATE ` + table + ` SET required_count = 2 WHERE id = $1`, ids[0]},
		{`UPDATE ` + table + ` SET required_ids = '{99999}' WHERE id = $1`, ids[2]},
		{`UPDATE ` + table + ` SET required_ids = NULL, required_count = NULL WHERE id = $1`, ids[3]},
	} {
		_, err := b.db.Pool.Exec(ctx, edit.sql, edit.id)
		require.NoError(t, err)
	}
	p, err := b.producer.Send(ctx, b.db.Pool, outbox.Message{Topic: "bits", Payload: []byte(`{}`)})
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `UPDATE `+table+` SET required_bits = 6 WHERE id = $1`, p) // bits 1 and 2: nobody's
	require.NoError(t, err)

	found, err = maint.Inconsistencies(ctx, 100)
	require.NoError(t, err)
	require.Equal(t, []consumergroup.Inconsistency{
		{Topic: "bits", Kind: consumergroup.InconsistentGroup, Messages: 1, FirstID: p},
		{Topic: "events", Kind: consumergroup.InconsistentCount, Messages: 1, FirstID: ids[0]},
		{Topic: "events", Kind: consumergroup.InconsistentGroup, Messages: 1, FirstID: ids[2]},
		{Topic: "events", Kind: consumergroup.InconsistentMode, Messages: 1, FirstID: ids[3]},
	}, found)
	found, err = maint.Inconsistencies(ctx, 1)
	require.NoError(t, err)
	require.EqualValues(t, 1, found[1].Messages, "counts stop at the limit")
}
