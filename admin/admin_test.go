package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/blockedtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/queuetest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

type env struct {
	db       *pgtest.DB
	client   *outbox.Client
	producer *outbox.Producer
	admin    *admin.Admin
}

func newEnv(t *testing.T, opts admin.Options, topics ...outbox.TopicConfig) *env {
	t.Helper()
	db := pgtest.NewDB(t)
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	for _, tc := range topics {
		require.NoError(t, client.ConfigureTopic(context.Background(), tc))
	}
	a, err := admin.New(client, opts)
	require.NoError(t, err)
	return &env{db: db, client: client, producer: producer, admin: a}
}

func (e *env) send(t *testing.T, topic string, n int, delay time.Duration) {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: topic, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), Delay: delay}
	}
	_, err := e.producer.SendBatch(context.Background(), e.db.Pool, msgs)
	require.NoError(t, err)
}

// A QUEUE topic's backlog: what is deliverable, what is due later, how
// long the oldest has waited, and its dead letters, which can be listed,
// replayed and purged by name.
func TestQueueTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, admin.Options{}, outbox.TopicConfig{Name: "orders", Semantics: outbox.Queue})
	dl := queuetest.DeadLetter(t, e.db.Pool, e.client, "bad payload", outbox.Message{Topic: "orders", Payload: json.RawMessage(`{}`)})
	e.send(t, "orders", 4, 0)
	e.send(t, "orders", 2, time.Hour)

	topics, err := e.admin.Topics(ctx)
	require.NoError(t, err)
	require.Len(t, topics, 1)
	got := topics[0]
	require.Equal(t, "orders", got.Name)
	require.Equal(t, outbox.Queue, got.Semantics)
	require.EqualValues(t, 4, got.Ready)
	require.EqualValues(t, 2, got.Scheduled)
	require.EqualValues(t, 1, got.DeadLetters)
	require.GreaterOrEqual(t, got.OldestReady, time.Duration(0))

	dead, err := e.admin.DeadLetters(ctx, "orders", "", 0, 10)
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, dl[0], dead[0].ID)

	_, err = e.admin.DiscardDeadLetters(ctx, "orders", "", dead[0].ID+1000)
	require.ErrorIs(t, err, outbox.ErrNotFound, "purging an id that is no dead letter")
	n, err := e.admin.ReplayDeadLetters(ctx, "orders", "", dead[0].ID)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	got, err = e.admin.Topic(ctx, "orders")
	require.NoError(t, err)
	require.EqualValues(t, 5, got.Ready, "the replayed message is deliverable again")
	require.Zero(t, got.DeadLetters)
}

// Counts stop at Options.CountLimit.
func TestCountLimit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, admin.Options{CountLimit: 3}, outbox.TopicConfig{Name: "orders", Semantics: outbox.Queue})
	e.send(t, "orders", 10, 0)
	got, err := e.admin.Topic(context.Background(), "orders")
	require.NoError(t, err)
	require.EqualValues(t, 3, got.Ready)
}

// Unknown topics and groups, and names that cannot exist, are refused
// with a typed error, and nothing changes.
func TestUnknownNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, admin.Options{},
		outbox.TopicConfig{Name: "orders", Semantics: outbox.Queue},
		outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter})
	_, err := e.admin.Topic(ctx, "nope")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	_, err = e.admin.Groups(ctx, "nope")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	_, err = e.admin.Group(ctx, "events", "nobody")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	require.ErrorIs(t, e.admin.PauseGroup(ctx, "events", "nobody"), outbox.ErrNotFound)
	require.ErrorIs(t, e.admin.RemoveGroup(ctx, "events", "nobody"), outbox.ErrNotFound)
	_, err = e.admin.DeadLetters(ctx, "nope", "", 0, 10)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	_, err = e.admin.ReplayDeadLetters(ctx, "events", "nobody")
	require.ErrorIs(t, err, outbox.ErrNotFound)
	_, err = e.admin.Groups(ctx, "orders")
	require.ErrorIs(t, err, outbox.ErrWrongSemantics, "a QUEUE topic has no groups")
	_, err = e.admin.DeadLetters(ctx, "events", "", 0, 10)
	require.ErrorIs(t, err, outbox.ErrWrongSemantics, "a PUB_SUB topic's dead letters are its groups'")
	require.ErrorIs(t, e.admin.CancelGroup(ctx, "events", ""), consumergroup.ErrInvalidGroup)
	_, err = admin.New(nil, admin.Options{})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
}

type recorder struct {
	mu   sync.Mutex
	seen map[int64]int
}

func (r *recorder) handle(_ context.Context, d *outbox.Delivery) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen[d.ID]++
	return nil
}

func (r *recorder) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

func (e *env) startGroup(t *testing.T, topic, name string, r *recorder) *consumergroup.Group {
	t.Helper()
	return e.startGroupWith(t, topic, name, r.handle)
}

// Groups are listed with their health, paused and resumed by name, and a
// group removed while producers send: its instance stops, its name is
// free, and the other group receives every message.
func TestGroupsWhileProducersRun(t *testing.T) {
	for _, mode := range []outbox.TrackingMode{outbox.Bitmap, outbox.Counter, outbox.Offset} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, admin.Options{}, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode})
			keep, drop := &recorder{seen: map[int64]int{}}, &recorder{seen: map[int64]int{}}
			e.startGroup(t, "events", "keep", keep)
			dropped := e.startGroup(t, "events", "drop", drop)

			require.NoError(t, e.admin.PauseGroup(ctx, "events", "keep"))
			h, err := e.admin.Group(ctx, "events", "keep")
			require.NoError(t, err)
			require.Equal(t, consumergroup.Paused, h.State)
			require.NoError(t, e.admin.ResumeGroup(ctx, "events", "keep"))

			const batches, per = 40, 50
			sent := make(chan struct{})
			go func() {
				defer close(sent)
				for range batches {
					e.send(t, "events", per, 0)
				}
			}()
			pgtest.Eventually(t, 30*time.Second, "the dropped group got some", func() bool { return drop.distinct() > 0 })
			require.NoError(t, e.admin.RemoveGroup(ctx, "events", "drop"))
			<-sent

			pgtest.Eventually(t, 60*time.Second, "every message delivered to the kept group", func() bool {
				return keep.distinct() == batches*per
			})
			select {
			case <-dropped.Stopped():
			case <-time.After(30 * time.Second):
				t.Fatal("the removed group's instance did not stop")
			}
			require.True(t, errors.Is(dropped.Err(), consumergroup.ErrCancelled) || errors.Is(dropped.Err(), consumergroup.ErrSubscriptionGone),
				"the removed group's instance stopped with %v", dropped.Err())
			_, err = e.admin.Group(ctx, "events", "drop")
			require.ErrorIs(t, err, outbox.ErrNotFound, "the removed group's name is free")

			groups, err := e.admin.Groups(ctx, "events")
			require.NoError(t, err)
			require.Len(t, groups, 1)
			require.Equal(t, "keep", groups[0].Group)
			require.Equal(t, consumergroup.Active, groups[0].State)
			pgtest.Eventually(t, 30*time.Second, "the kept group's unread backlog drained", func() bool {
				h, err := e.admin.Group(ctx, "events", "keep")
				require.NoError(t, err)
				return h.Waiting == 0 && h.LeasedBatches == 0 && h.LeasedRetries == 0
			})
		})
	}
}

// Stuck names the QUEUE topic whose ready message has waited past the
// bound and the group whose unread message has, and neither below it.
func TestStuck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, admin.Options{},
		outbox.TopicConfig{Name: "orders", Semantics: outbox.Queue},
		outbox.TopicConfig{Name: "idle", Semantics: outbox.Queue},
		outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter})
	g := e.startGroup(t, "events", "billing", &recorder{seen: map[int64]int{}})
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, g.Stop(stopCtx))
	e.send(t, "orders", 3, 0)
	e.send(t, "events", 3, 0)
	_, err := e.db.Pool.Exec(ctx, `UPDATE `+e.db.Schema+`.outbox_published SET created_at = now() - interval '2 hours'`)
	require.NoError(t, err)

	s, err := e.admin.Stuck(ctx, time.Hour)
	require.NoError(t, err)
	require.Len(t, s.Topics, 1)
	require.Equal(t, "orders", s.Topics[0].Name)
	require.Len(t, s.Groups, 1)
	require.Equal(t, "billing", s.Groups[0].Group)

	s, err = e.admin.Stuck(ctx, 3*time.Hour)
	require.NoError(t, err)
	require.Empty(t, s.Topics)
	require.Empty(t, s.Groups)
}

// byGroup indexes blocked message groups by name.
func byGroup(bs []outbox.BlockedGroup) map[string]outbox.BlockedGroup {
	out := map[string]outbox.BlockedGroup{}
	for _, b := range bs {
		out[b.Group] = b
	}
	return out
}

// The message groups an ordered QUEUE topic and an ordered consumer group
// are held back on are listed by name, with their head, its attempts and
// last error, since when, and how many wait behind it; and a group's
// Waiting counts the messages that failed and wait for a retry, not its
// queue of messages read and not yet delivered (Queued).
func TestBlockedGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := blockedtest.New(t, outbox.TopicConfig{Name: "plain", Semantics: outbox.Queue})
	adm, err := admin.New(f.Client, admin.Options{})
	require.NoError(t, err)

	blocked, err := adm.BlockedGroups(ctx, "orders", "", 0)
	require.NoError(t, err)
	require.Len(t, blocked, 2)
	got := byGroup(blocked)
	require.Equal(t, f.DeadHead, got["cust-99"].HeadID)
	require.True(t, got["cust-99"].DeadLettered)
	require.Equal(t, 2, got["cust-99"].Behind)
	require.Contains(t, got["cust-99"].LastError, blockedtest.QueueDeadError)
	require.Equal(t, f.RetryHead, got["cust-5"].HeadID)
	require.False(t, got["cust-5"].DeadLettered)
	require.Equal(t, 1, got["cust-5"].Behind)
	require.Equal(t, 1, got["cust-5"].Attempts)
	require.Contains(t, got["cust-5"].LastError, blockedtest.RetryError)
	require.False(t, got["cust-5"].Since.IsZero())

	blocked, err = adm.BlockedGroups(ctx, "events", "billing", 0)
	require.NoError(t, err)
	got = byGroup(blocked)
	require.True(t, got["cust-99"].DeadLettered)
	require.Equal(t, 2, got["cust-99"].Behind)
	require.Contains(t, got["cust-99"].LastError, blockedtest.GroupDeadError)
	require.Equal(t, 1, got["cust-5"].Behind)
	h, err := adm.Group(ctx, "events", "billing")
	require.NoError(t, err)
	require.EqualValues(t, 1, h.Waiting, "only cust-5's head failed and waits for a retry")
	require.EqualValues(t, 3, h.Queued, "queued behind the two heads, never tried")
	require.EqualValues(t, 1, h.DeadLetters)

	all, err := adm.Blocked(ctx, 0)
	require.NoError(t, err)
	where := map[string]int{}
	for _, b := range all {
		where[b.Topic+"/"+b.ConsumerGroup+"/"+b.Group]++
	}
	require.Equal(t, map[string]int{"orders//cust-99": 1, "orders//cust-5": 1, "events/billing/cust-99": 1, "events/billing/cust-5": 1}, where)

	none, err := adm.BlockedGroups(ctx, "plain", "", 0)
	require.NoError(t, err)
	require.Empty(t, none, "a topic that is not ordered has none")
	_, err = adm.BlockedGroups(ctx, "events", "", 0)
	require.ErrorIs(t, err, outbox.ErrWrongSemantics, "a PUB_SUB topic's are its groups'")
	_, err = adm.BlockedGroups(ctx, "orders", "billing", 0)
	require.ErrorIs(t, err, outbox.ErrWrongSemantics, "a QUEUE topic has no groups")
	_, err = adm.BlockedGroups(ctx, "nope", "", 0)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	_, err = adm.BlockedGroups(ctx, "events", "nobody", 0)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	_, err = adm.BlockedGroups(ctx, "orders", "", -1)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
}

// A QUEUE topic's leased messages are counted apart from those due later.
func TestLeasedApartFromScheduled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Ordered: a consumer leases each message on its own (Leased counts
	// those), and the ones behind it wait in its message group.
	e := newEnv(t, admin.Options{}, outbox.TopicConfig{Name: "orders", Semantics: outbox.Queue, Ordered: true})
	e.send(t, "orders", 2, time.Hour)
	got, err := e.admin.Topic(ctx, "orders")
	require.NoError(t, err)
	require.Zero(t, got.Ready)
	require.Zero(t, got.OldestReady, "nothing is ready")
	queuetest.Hold(t, e.db.Pool, e.client, outbox.Message{Topic: "orders", Group: "g", Payload: json.RawMessage(`{}`)})
	for range 2 {
		_, err := e.producer.Send(ctx, e.db.Pool, outbox.Message{Topic: "orders", Group: "g", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	got, err = e.admin.Topic(ctx, "orders")
	require.NoError(t, err)
	require.EqualValues(t, 2, got.Ready, "%+v", got)
	require.EqualValues(t, 2, got.Scheduled, "the delayed ones, not the leased one")
	require.EqualValues(t, 1, got.Leased)
}

// Pausing a paused group, or resuming an active one, succeeds and changes
// nothing; a state change that cannot be made still fails.
func TestPauseAndResumeTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, admin.Options{}, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter})
	e.startGroup(t, "events", "billing", &recorder{seen: map[int64]int{}})
	require.NoError(t, e.admin.ResumeGroup(ctx, "events", "billing"), "already ACTIVE")
	require.NoError(t, e.admin.PauseGroup(ctx, "events", "billing"))
	require.NoError(t, e.admin.PauseGroup(ctx, "events", "billing"), "already PAUSED")
	h, err := e.admin.Group(ctx, "events", "billing")
	require.NoError(t, err)
	require.Equal(t, consumergroup.Paused, h.State)
	require.NoError(t, e.admin.CancelGroup(ctx, "events", "billing"))
	require.ErrorIs(t, e.admin.PauseGroup(ctx, "events", "billing"), consumergroup.ErrInvalidTransition)
	require.ErrorIs(t, e.admin.ResumeGroup(ctx, "events", "billing"), consumergroup.ErrInvalidTransition)
}

// Bounds an API would refuse are refused here too, with a typed error.
func TestNegativeBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, admin.Options{}, outbox.TopicConfig{Name: "orders", Semantics: outbox.Queue})
	_, err := e.admin.Stuck(ctx, -time.Hour)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	_, err = e.admin.DeadLetters(ctx, "orders", "", -5, 10)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
}

// Every stored message can be found: a topic a producer that allows
// topics without a configuration sent to (a typo) has the defaults from
// its first send, and is listed with its backlog and dead letters; its
// messages count as stuck like any topic's. A name that holds nothing is
// unknown.
func TestTopicsConfiguredByTheirFirstSend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, admin.Options{}, outbox.TopicConfig{Name: "emails"})
	e.send(t, "emials", 1, 0)
	queuetest.DeadLetter(t, e.db.Pool, e.client, "nobody reads this topic", outbox.Message{Topic: "emials", Payload: json.RawMessage(`{}`)})
	e.send(t, "emials", 2, 0)

	topics, err := e.admin.Topics(ctx)
	require.NoError(t, err)
	require.Len(t, topics, 2)
	require.Equal(t, "emails", topics[0].Name)
	typo := topics[1]
	require.Equal(t, "emials", typo.Name)
	require.True(t, typo.Configured, "configured by its first send")
	want := outbox.TopicConfig{Name: "emials"}.WithDefaults()
	want.Configured = true
	require.Equal(t, want, typo.TopicConfig, "the defaults")
	require.Equal(t, outbox.Queue, typo.Semantics)
	require.EqualValues(t, 2, typo.Ready)
	require.EqualValues(t, 2, typo.DeadLetters)

	stuck, err := e.admin.Stuck(ctx, 0)
	require.NoError(t, err)
	require.Len(t, stuck.Topics, 1)
	require.Equal(t, "emials", stuck.Topics[0].Name)

	dead, err := e.admin.DeadLetters(ctx, "emials", "", 0, 10)
	require.NoError(t, err)
	require.Len(t, dead, 2)
	_, err = e.admin.Topic(ctx, "nothing.here")
	require.ErrorIs(t, err, outbox.ErrNotFound)
}
