package inbox_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/inbox"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type env struct {
	db       *pgtest.DB
	client   *outbox.Client
	producer *outbox.Producer
	effects  string
}

func setup(t *testing.T, cfg outbox.Config) *env {
	t.Helper()
	db := pgtest.NewDB(t)
	cfg.Schema = db.Schema
	client, err := outbox.NewClient(db.Pool, cfg)
	require.NoError(t, err)
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true, Clock: cfg.Clock})
	require.NoError(t, err)
	e := &env{db: db, client: client, producer: producer, effects: db.Table("effects")}
	_, err = db.Pool.Exec(context.Background(), `CREATE TABLE `+e.effects+` (message_id bigint NOT NULL, by text NOT NULL)`)
	require.NoError(t, err)
	return e
}

func (e *env) newInbox(t *testing.T, cfg inbox.Config) *inbox.Inbox {
	t.Helper()
	cfg.Schema = e.db.Schema
	cfg.Name = "billing"
	in, err := inbox.New(context.Background(), e.db.Pool, cfg)
	require.NoError(t, err)
	return in
}

// effect is a handler writing one effect row in the inbox's transaction.
func (e *env) effect(by string) inbox.Handler {
	return func(ctx context.Context, tx pgx.Tx, d *outbox.Delivery) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+e.effects+` VALUES ($1, $2)`, d.ID, by)
		return err
	}
}

func (e *env) send(t *testing.T, topic string, n int) []int64 {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: topic, Payload: []byte(`{}`)}
	}
	ids, err := e.producer.SendBatch(context.Background(), e.db.Pool, msgs)
	require.NoError(t, err)
	return ids
}

// effectsOf returns how many effects each message had.
func (e *env) effectsOf(t *testing.T) map[int64]int {
	t.Helper()
	rows, err := e.db.Pool.Query(context.Background(), `SELECT message_id FROM `+e.effects)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	out := map[int64]int{}
	for _, id := range ids {
		out[id]++
	}
	return out
}

// A message redelivered after its lease ran out, to a process whose
// inbox never saw it (its filter cannot help): one effect, whether the
// first delivery committed before the second arrived or was still in
// its transaction (the second then waits, and skips).
func TestRedeliveryAfterLeaseExpiryHasOneEffect(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	e := setup(t, outbox.Config{Clock: clock})
	ctx := context.Background()
	require.NoError(t, e.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "work", Lease: 30 * time.Second}))
	first, second := e.newInbox(t, inbox.Config{}), e.newInbox(t, inbox.Config{})
	ids := e.send(t, "work", 2)
	// Each message as delivered twice: first, then again after its lease ran out.
	stale := []*outbox.Delivery{{ID: ids[0], Topic: "work", Attempt: 1}, {ID: ids[1], Topic: "work", Attempt: 1}}
	fresh := []*outbox.Delivery{{ID: ids[0], Topic: "work", Attempt: 2}, {ID: ids[1], Topic: "work", Attempt: 2}}

	// Message 1: the stale delivery committed first.
	ran, err := first.Handle(ctx, stale[0], e.effect("stale"))
	require.NoError(t, err)
	require.True(t, ran)
	ran, err = second.Handle(ctx, fresh[0], e.effect("fresh"))
	require.NoError(t, err)
	require.False(t, ran, "recorded already")

	// Message 2: both in flight; the stale one's transaction is open when
	// the fresh one arrives.
	inTx, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		ran, err := first.Handle(ctx, stale[1], func(ctx context.Context, tx pgx.Tx, d *outbox.Delivery) error {
			close(inTx)
			<-release
			return e.effect("stale")(ctx, tx, d)
		})
		require.NoError(t, err)
		require.True(t, ran)
	}()
	<-inTx
	done := make(chan bool)
	go func() {
		ran, err := second.Handle(ctx, fresh[1], e.effect("fresh"))
		require.NoError(t, err)
		done <- ran
	}()
	select {
	case <-done:
		t.Fatal("the second delivery did not wait for the first one's transaction")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	require.False(t, <-done, "the second delivery skips once the first committed")
	wg.Wait()

	got := e.effectsOf(t)
	require.Equal(t, map[int64]int{stale[0].ID: 1, stale[1].ID: 1}, got)
	require.Equal(t, inbox.Stats{Duplicates: 2, Lookups: 0, FilterBytes: second.Stats().FilterBytes}, second.Stats(),
		"a key the filter never saw is not looked up: the insert catches it")
}

// A handler that rolls back leaves nothing recorded: the next delivery
// runs it again.
func TestRollbackRecordsNothing(t *testing.T) {
	t.Parallel()
	e := setup(t, outbox.Config{})
	ctx := context.Background()
	in := e.newInbox(t, inbox.Config{})
	d := &outbox.Delivery{ID: 42, Attempt: 1}
	boom := errors.New("boom")
	ran, err := in.Handle(ctx, d, func(ctx context.Context, tx pgx.Tx, d *outbox.Delivery) error {
		require.NoError(t, e.effect("first")(ctx, tx, d))
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.False(t, ran)
	ran, err = in.Handle(ctx, d, e.effect("second"))
	require.NoError(t, err)
	require.True(t, ran)
	ran, err = in.Handle(ctx, d, e.effect("third"))
	require.NoError(t, err)
	require.False(t, ran)
	require.Equal(t, map[int64]int{42: 1}, e.effectsOf(t))
	require.Equal(t, int64(1), in.Stats().Lookups, "only the key the filter saw is looked up")
}

// A message whose effect committed but that was dead-lettered anyway
// (its handler failed after the commit), then replayed: the replay is
// skipped.
func TestReplayedDeadLetterHasOneEffect(t *testing.T) {
	t.Parallel()
	e := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, e.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "work", MaxAttempts: 1}))
	in := e.newInbox(t, inbox.Config{})
	ids := e.send(t, "work", 3)
	var mu sync.Mutex
	calls := 0
	h := func(ctx context.Context, d *outbox.Delivery) error {
		ran, err := in.Handle(ctx, d, e.effect("consumer"))
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		calls++
		if ran && d.ID == ids[1] {
			return errors.New("failed after the commit") // dead-lettered: MaxAttempts 1
		}
		return nil
	}
	c, err := consumergroup.New(e.db.Pool, consumergroup.Config{Topic: "work", Group: sqlq.QueueGroup, Client: e.client,
		PollInterval: 10 * time.Millisecond}) // the topic's consumer
	require.NoError(t, err)
	require.NoError(t, c.AddConsumer("m", h, nil))
	require.NoError(t, c.Start(ctx, consumergroup.FromBeginning(false)))
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	pgtest.Eventually(t, 10*time.Second, "one dead letter", func() bool {
		dl, err := c.DeadLetters(ctx, 0, 10)
		require.NoError(t, err)
		return len(dl) == 1
	})
	n, err := c.ReplayDeadLetters(ctx, ids[1])
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	pgtest.Eventually(t, 10*time.Second, "the replay handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return calls == 4
	})
	require.Equal(t, map[int64]int{ids[0]: 1, ids[1]: 1, ids[2]: 1}, e.effectsOf(t))
	require.Equal(t, int64(1), in.Stats().Duplicates)
}

// Two consumer groups share an inbox: every message reaches both, and
// has one effect.
func TestTwoGroupsSharingAnInbox(t *testing.T) {
	t.Parallel()
	e := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, e.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders", Semantics: outbox.PubSub, Tracking: outbox.Counter}))
	const n = 300
	var mu sync.Mutex
	deliveries := 0
	for _, name := range []string{"billing-eu", "billing-us"} {
		in := e.newInbox(t, inbox.Config{})
		g, err := consumergroup.New(e.db.Pool, consumergroup.Config{Topic: "orders", Group: name, Client: e.client,
			PollInterval: 10 * time.Millisecond, Concurrency: 4})
		require.NoError(t, err)
		effect := in.Wrap(e.effect(name))
		require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
			if err := effect(ctx, d); err != nil {
				return err
			}
			mu.Lock()
			deliveries++
			mu.Unlock()
			return nil
		}, nil))
		require.NoError(t, g.Start(ctx, consumergroup.FromNow()))
		t.Cleanup(func() { _ = g.Stop(context.Background()) })
	}
	e.send(t, "orders", n)
	pgtest.Eventually(t, 30*time.Second, "both groups got every message", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return deliveries == 2*n
	})
	got := e.effectsOf(t)
	require.Len(t, got, n)
	for id, c := range got {
		require.Equal(t, 1, c, "message %d", id)
	}
}

// A new inbox loads the keys recorded last into its filter, so a
// redelivery of one costs a lookup and no transaction; keys expire
// through the maintenance service.
func TestFilterLoadsRecentKeysAndKeysExpire(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	e := setup(t, outbox.Config{Clock: clock})
	ctx := context.Background()
	before := e.newInbox(t, inbox.Config{Clock: clock, Retention: time.Hour})
	for id := range int64(5) {
		_, err := before.Handle(ctx, &outbox.Delivery{ID: id + 1}, e.effect("before"))
		require.NoError(t, err)
	}
	after := e.newInbox(t, inbox.Config{Clock: clock, Retention: time.Hour})
	ran, err := after.Handle(ctx, &outbox.Delivery{ID: 3}, e.effect("after"))
	require.NoError(t, err)
	require.False(t, ran)
	require.Equal(t, int64(1), after.Stats().Lookups)

	clock.Advance(2 * time.Hour)
	maint, err := maintenance.New(e.db.Pool, maintenance.Config{Client: e.client})
	require.NoError(t, err)
	report, err := maint.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5), report.Deleted["outbox_inbox"])
	ran, err = after.Handle(ctx, &outbox.Delivery{ID: 3}, e.effect("after"))
	require.NoError(t, err)
	require.True(t, ran, "a key past its retention is gone: the message takes effect again")
}

// Bad configuration and keys get typed errors, and nothing is recorded.
func TestInboxRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t, outbox.Config{})
	ctx := context.Background()
	_, err := inbox.New(ctx, e.db.Pool, inbox.Config{Schema: e.db.Schema})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	_, err = inbox.New(ctx, e.db.Pool, inbox.Config{Name: "x", Schema: e.db.Schema, FalsePositiveRate: 2})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	_, err = inbox.New(ctx, nil, inbox.Config{Name: "x"})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	_, err = inbox.New(ctx, e.db.Pool, inbox.Config{Name: "x", Schema: `bad"schema`})
	require.ErrorIs(t, err, outbox.ErrInvalidSchema)
	in, err := inbox.New(ctx, e.db.Pool, inbox.Config{Name: "x", Schema: e.db.Schema,
		Key: func(d *outbox.Delivery) string { return d.Headers["order"] }})
	require.NoError(t, err)
	_, err = in.Handle(ctx, &outbox.Delivery{ID: 1}, e.effect("x"))
	require.ErrorIs(t, err, inbox.ErrInvalidKey)
	for _, key := range []string{"nul\x00", "\xff\xfe"} {
		_, err = in.Handle(ctx, &outbox.Delivery{ID: 1, Headers: map[string]string{"order": key}}, e.effect("x"))
		require.ErrorIs(t, err, inbox.ErrInvalidKey)
	}
	_, err = inbox.New(ctx, e.db.Pool, inbox.Config{Name: "bad\x00name", Schema: e.db.Schema})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	require.Empty(t, e.effectsOf(t))
}
