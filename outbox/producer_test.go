package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/clocktest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testlog"
	"github.com/pgoutbox/pgoutbox/outbox"
)

func TestSendWritesRow(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	var id int64
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		id, err = b.producer.Send(ctx, tx, outbox.Message{
			Topic: "orders", Payload: json.RawMessage(`{"a":1}`), Headers: map[string]string{"k": "v"},
			Group: "customer-7", Priority: 5,
		})
		return err
	}))
	var (
		topic, corr, group  string
		headers             map[string]string
		prio                int
		pending, xidMatches bool
	)
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT topic, correlation_id, message_group, lease_owner IS NULL, headers,
		priority, xid::text::bigint > 0 FROM `+b.db.Table("outbox_published")+` WHERE id = $1`, id).
		Scan(&topic, &corr, &group, &pending, &headers, &prio, &xidMatches))
	require.Equal(t, "orders", topic)
	require.Len(t, corr, 36, "a correlation id is generated")
	require.Equal(t, "customer-7", group)
	require.True(t, pending)
	require.Equal(t, map[string]string{"k": "v"}, headers)
	require.Equal(t, 5, prio)
	require.True(t, xidMatches)
}

func TestSendRecordsWritingTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	id, err := b.producer.Send(ctx, tx, seqMessage("t", 1))
	require.NoError(t, err)
	var same bool
	require.NoError(t, tx.QueryRow(ctx, `SELECT xid = pg_current_xact_id() FROM `+b.db.Table("outbox_published")+` WHERE id = $1`, id).Scan(&same))
	require.True(t, same)
}

// A batch may mix QUEUE, PUB_SUB and unconfigured topics: each message goes
// to its semantics' table, ids ascend in input order, and a repeated
// idempotency key returns the first message's id.
func TestSendBatchReturnsIDsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "q"}))
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter}))
	topics := []string{"unconfigured", "events", "q", "events", "q", "events"}
	msgs := make([]outbox.Message, len(topics))
	for i, topic := range topics {
		msgs[i] = seqMessage(topic, i)
	}
	msgs[1].IdempotencyKey = "k1"
	msgs[4].IdempotencyKey = "k1"
	dup := msgs[1]
	dup.Payload = json.RawMessage(`{"seq": 99}`)
	msgs = append(msgs, dup) // same key and topic as message 1
	ids, err := b.producer.SendBatch(ctx, b.db.Pool, msgs)
	require.NoError(t, err)
	require.Len(t, ids, len(msgs))
	require.Equal(t, ids[1], ids[6], "repeated idempotency key")
	require.True(t, slices.IsSorted(ids[:6]), "ids ascend in input order: %v", ids)
	for i, id := range ids[:6] {
		var got seqPayload
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT payload FROM `+b.db.Table("outbox_published")+` WHERE id = $1`, id).Scan(&got), "message %d", i)
		require.Equal(t, i, got.Seq)
	}
	require.Equal(t, 6, b.count(t, "true"), "every message on the log")
	var published int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+b.db.Table("outbox_published")+` WHERE required_count = 0`).Scan(&published))
	require.Equal(t, 3, published)
}

func TestRollbackNeverDeliveredNorNotified(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()

	listen := b.listen(t)

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = b.producer.Send(ctx, tx, seqMessage("orders", 1))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	waitCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = listen.WaitForNotification(waitCtx)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a rolled-back send must notify nobody")
	require.Zero(t, b.count(t, "true"))

	// A consumer finds nothing either; then a committed send reaches it.
	handled := make(chan int64, 10)
	startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "orders", PollInterval: 20 * time.Millisecond,
		Handler: func(ctx context.Context, d *outbox.Delivery) error { handled <- d.ID; return nil }})
	// Control: the same listener does see a committed send (the test can fail).
	var id int64
	require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		id, err = b.producer.Send(ctx, tx, seqMessage("orders", 2))
		return err
	}))
	waitCtx, cancel = context.WithTimeout(ctx, 5*time.Second)
	n, err := listen.WaitForNotification(waitCtx)
	cancel()
	require.NoError(t, err)
	require.Equal(t, "orders", n.Payload)
	select {
	case got := <-handled:
		require.Equal(t, id, got, "only the committed message is delivered")
	case <-time.After(10 * time.Second):
		t.Fatal("committed message not delivered")
	}
	select {
	case got := <-handled:
		t.Fatalf("unexpected delivery %d", got)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	msg := seqMessage("payments", 1)
	msg.IdempotencyKey = "charge-42"
	first, err := b.producer.Send(ctx, b.db.Pool, msg)
	require.NoError(t, err)
	second, err := b.producer.Send(ctx, b.db.Pool, msg)
	require.NoError(t, err)
	require.Equal(t, first, second)

	// Same key inside one batch, and on another topic.
	other := msg
	other.Topic = "refunds"
	ids, err := b.producer.SendBatch(ctx, b.db.Pool, []outbox.Message{msg, other, other})
	require.NoError(t, err)
	require.Equal(t, first, ids[0])
	require.NotEqual(t, first, ids[1])
	require.Equal(t, ids[1], ids[2])
	require.Equal(t, 2, b.count(t, "true"))

	// Concurrent sends of one key in two transactions: one row, one id.
	tx1, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx1.Rollback(ctx)
	msg.IdempotencyKey = "charge-43"
	id1, err := b.producer.Send(ctx, tx1, msg)
	require.NoError(t, err)
	done := make(chan int64)
	go func() {
		id2, err := b.producer.Send(ctx, b.db.Pool, msg) // blocks until tx1 ends
		if err != nil {
			id2 = -1
		}
		done <- id2
	}()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, tx1.Commit(ctx))
	require.Equal(t, id1, <-done)
	require.Equal(t, 3, b.count(t, "true"), "the second send wrote nothing")
}

// An idempotency key outlives its message for the topic's window: a retried
// send after the message was consumed writes nothing; after the window it
// writes a new message. Expired keys are deleted, live ones kept.
func TestIdempotencyWindow(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	b := setup(t, outbox.Config{Clock: clock})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "payments", IdempotencyWindow: time.Hour}))
	msg := seqMessage("payments", 1)
	msg.IdempotencyKey = "charge-1"
	first, err := b.producer.Send(ctx, b.db.Pool, msg)
	require.NoError(t, err)
	// Consumed, and cleanup deleted it.
	handled := make(chan int64, 1)
	k := startConsumer(t, b.client, outbox.ConsumerConfig{Topic: "payments", PollInterval: 20 * time.Millisecond,
		Handler: func(_ context.Context, d *outbox.Delivery) error { handled <- d.ID; return nil }})
	require.Equal(t, first, <-handled)
	require.NoError(t, k.Stop(ctx))
	_, err = b.db.Pool.Exec(ctx, `DELETE FROM `+b.db.Table("outbox_published")+` WHERE id = $1`, first)
	require.NoError(t, err)
	require.Equal(t, 0, b.count(t, "true"), "consumed")

	clock.Advance(59 * time.Minute)
	again, err := b.producer.Send(ctx, b.db.Pool, msg)
	require.NoError(t, err)
	require.Equal(t, first, again, "within the window the key still names the first message")
	require.Equal(t, 0, b.count(t, "true"), "and nothing is written")
	unconfigured := msg
	unconfigured.Topic = "unconfigured"
	other, err := b.producer.Send(ctx, b.db.Pool, unconfigured)
	require.NoError(t, err)
	require.NotEqual(t, first, other, "keys are per topic")

	clock.Advance(2 * time.Minute) // 61 minutes after the first send
	n, err := b.client.ExpireIdempotencyKeys(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "only the expired key goes; the unconfigured topic's window is a day")
	next, err := b.producer.Send(ctx, b.db.Pool, msg)
	require.NoError(t, err)
	require.Greater(t, next, first, "after the window the key is recorded anew")
	again, err = b.producer.Send(ctx, b.db.Pool, msg)
	require.NoError(t, err)
	require.Equal(t, next, again)

	// A key that expired but was not deleted yet is taken over, too.
	clock.Advance(2 * time.Hour)
	last, err := b.producer.Send(ctx, b.db.Pool, msg)
	require.NoError(t, err)
	require.Greater(t, last, next)
	require.Equal(t, 3, b.count(t, "topic = 'payments' OR topic = 'unconfigured'"))
	require.ErrorIs(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "payments", IdempotencyWindow: -time.Second}),
		outbox.ErrInvalidConfig)
}

func TestSendBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	good := seqMessage("orders", 1)
	with := func(f func(m *outbox.Message)) outbox.Message {
		m := good
		f(&m)
		return m
	}
	bigHeaders := map[string]string{"h": strings.Repeat("x", outbox.MaxHeaderBytes)}
	cases := []struct {
		name string
		msg  outbox.Message
		want error
	}{
		{"empty topic", with(func(m *outbox.Message) { m.Topic = "" }), outbox.ErrInvalidTopic},
		{"long topic", with(func(m *outbox.Message) { m.Topic = strings.Repeat("t", 256) }), outbox.ErrInvalidTopic},
		{"topic with space", with(func(m *outbox.Message) { m.Topic = "a b" }), outbox.ErrInvalidTopic},
		{"topic with quote", with(func(m *outbox.Message) { m.Topic = `a"; DROP TABLE x; --` }), outbox.ErrInvalidTopic},
		{"invalid JSON", with(func(m *outbox.Message) { m.Payload = []byte(`{"a":`) }), outbox.ErrInvalidPayload},
		{"empty payload", with(func(m *outbox.Message) { m.Payload = nil }), outbox.ErrInvalidPayload},
		{"oversized headers", with(func(m *outbox.Message) { m.Headers = bigHeaders }), outbox.ErrHeadersTooLarge},
		{"empty header name", with(func(m *outbox.Message) { m.Headers = map[string]string{"": "v"} }), outbox.ErrInvalidMessage},
		{"priority out of range", with(func(m *outbox.Message) { m.Priority = 1 << 20 }), outbox.ErrInvalidMessage},
		{"negative delay", with(func(m *outbox.Message) { m.Delay = -time.Second }), outbox.ErrInvalidMessage},
		{"delay and not-before", with(func(m *outbox.Message) { m.Delay = time.Second; m.NotBefore = time.Now() }), outbox.ErrInvalidMessage},
		{"long idempotency key", with(func(m *outbox.Message) { m.IdempotencyKey = strings.Repeat("k", 256) }), outbox.ErrInvalidMessage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.producer.Send(ctx, b.db.Pool, tc.msg)
			require.ErrorIs(t, err, tc.want)
			// A bad message in a batch rejects the whole batch.
			_, err = b.producer.SendBatch(ctx, b.db.Pool, []outbox.Message{good, tc.msg})
			require.ErrorIs(t, err, tc.want)
		})
	}
	var nilTx pgx.Tx
	_, err := b.producer.Send(ctx, nilTx, good)
	require.ErrorIs(t, err, outbox.ErrNilExecutor)
	var nilPool *pgxpool.Pool
	_, err = b.producer.Send(ctx, nilPool, good)
	require.ErrorIs(t, err, outbox.ErrNilExecutor)
	require.Zero(t, b.count(t, "true"), "no row written by any bad send")

	_, err = outbox.NewProducer(outbox.ProducerConfig{Schema: `x"; DROP`})
	require.ErrorIs(t, err, outbox.ErrInvalidSchema)
	_, err = outbox.NewMessage("t", func() {})
	require.ErrorIs(t, err, outbox.ErrInvalidPayload)
}

func TestConfigureTopicBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	cases := []outbox.TopicConfig{
		{Name: "t", Semantics: "FANOUT"},
		{Name: "t", Semantics: outbox.PubSub, Tracking: "MAGIC"},
		{Name: "t", Semantics: outbox.Queue, Tracking: outbox.Bitmap},
		{Name: "t", MaxAttempts: -1},
		{Name: "t", Lease: time.Millisecond},
		{Name: "t", BackoffInitial: time.Minute, BackoffMax: time.Second},
		{Name: "t", Retention: -time.Hour},
		{Name: "t", Semantics: outbox.PubSub, Retention: 48 * time.Hour, MaxRetention: 24 * time.Hour},
		{Name: "t", ZombieTTL: -time.Hour},
	}
	for _, c := range cases {
		require.ErrorIs(t, b.client.ConfigureTopic(ctx, c), outbox.ErrInvalidConfig, "%+v", c)
	}
	require.ErrorIs(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: ""}), outbox.ErrInvalidTopic)
	var n int
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+b.db.Table("outbox_topics")).Scan(&n))
	require.Zero(t, n)

	require.ErrorIs(t, outbox.ConsumerConfig{Topic: "t"}.WithDefaults().Validate(), outbox.ErrInvalidConfig, "nil handler")
	require.ErrorIs(t, outbox.ConsumerConfig{Topic: "t", Concurrency: -1, Handler: func(context.Context, *outbox.Delivery) error { return nil }}.WithDefaults().Validate(),
		outbox.ErrInvalidConfig)
}

func TestTopicDefaultsAndConfiguration(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	got, err := b.client.Topic(ctx, "never.configured")
	require.NoError(t, err)
	require.False(t, got.Configured)
	require.Equal(t, outbox.Queue, got.Semantics)
	require.Equal(t, outbox.DefaultMaxAttempts, got.MaxAttempts)
	require.Equal(t, outbox.DefaultLease, got.Lease)

	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Bitmap, MaxAttempts: 3, Lease: 5 * time.Second}))
	got, err = b.client.Topic(ctx, "events")
	require.NoError(t, err)
	require.Equal(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Bitmap,
		Retention: outbox.DefaultPubSubRetention, MaxAttempts: 3, BackoffInitial: outbox.DefaultBackoffInitial,
		BackoffMax: outbox.DefaultBackoffMax, Lease: 5 * time.Second,
		ZeroSubscriptionRetention: outbox.DefaultZeroSubscriptionRetention, IdempotencyWindow: outbox.DefaultIdempotencyWindow,
		MaxRetention: outbox.DefaultMaxRetention, ZombieTTL: outbox.DefaultZombieTTL, Configured: true}, got)

	// A QUEUE consumer of a PUB_SUB topic is refused when it is created.
	client, err := pgoutbox.NewClient(ctx, b.db.Pool, pgoutbox.Config{Schema: b.db.Schema, NoMaintenance: true})
	require.NoError(t, err)
	_, err = client.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "events", Handler: func(context.Context, *outbox.Delivery) error { return nil }})
	require.ErrorIs(t, err, outbox.ErrWrongSemantics)
	_, err = b.client.QueueTopic(ctx, "events")
	require.ErrorIs(t, err, outbox.ErrWrongSemantics)
	if errors.Is(nil, outbox.ErrNotFound) {
		t.Fatal("unreachable")
	}
}

// A configured QUEUE topic's messages are written without reading the topic
// row; the rows must be the same as those the general statement writes, and
// a topic's semantics can then never change under a producer.
func TestSendLearnsTopicSemantics(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "queued"}))
	sendAfter := func(topic string, delay time.Duration) int64 {
		t.Helper()
		var id int64
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			var err error
			id, err = b.producer.Send(ctx, tx, outbox.Message{
				Topic: topic, Payload: json.RawMessage(`{"a":1}`), Headers: map[string]string{"k": "v"},
				Group: "g", Priority: 3, Delay: delay, CorrelationID: "c",
			})
			return err
		}))
		return id
	}
	type row struct {
		Status, Group, Corr, Payload, Headers string
		Priority                              int
		Delay                                 time.Duration
		RequiredGroups                        bool
	}
	read := func(id int64) row {
		t.Helper()
		var r row
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT status, message_group, correlation_id, payload::text, headers::text, priority,
			available_at - created_at, required_bits IS NOT NULL AND done_bits IS NOT NULL
			FROM `+b.db.Table("outbox_published")+` WHERE id = $1`, id).
			Scan(&r.Status, &r.Group, &r.Corr, &r.Payload, &r.Headers, &r.Priority, &r.Delay, &r.RequiredGroups))
		return r
	}
	want := row{Status: "PUBLISHED", Group: "g", Corr: "c", Payload: `{"a": 1}`, Headers: `{"k": "v"}`, Priority: 3,
		Delay: 90 * time.Second}
	send := func(topic string) int64 {
		t.Helper()
		return sendAfter(topic, want.Delay)
	}
	for _, topic := range []string{"queued", "queued", "unconfigured", "unconfigured"} {
		require.Equal(t, want, read(send(topic)), topic)
		now := want
		now.Delay = 0
		require.Equal(t, now, read(sendAfter(topic, 0)), topic)
	}
	got, err := b.client.Topic(ctx, "unconfigured")
	require.NoError(t, err)
	require.True(t, got.Configured, "configured by its first send")

	// Semantics never change once configured; the tracking mode may while
	// no group is subscribed.
	require.ErrorIs(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "queued", Semantics: outbox.PubSub}), outbox.ErrInvalidConfig)
	require.ErrorIs(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "unconfigured", Semantics: outbox.PubSub}), outbox.ErrInvalidConfig)
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "queued", MaxAttempts: 3}))
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Bitmap}))
	require.ErrorIs(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events"}), outbox.ErrInvalidConfig)
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter}))

	// The producer sees "later" without configuration (its send, and the
	// configuration it made, rolled back); then it is configured as
	// PUB_SUB: the next message must be a PUB_SUB message at once.
	rolledBack := errors.New("rolled back")
	require.ErrorIs(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		if _, err := b.producer.Send(ctx, tx, outbox.Message{Topic: "later", Payload: json.RawMessage(`{}`)}); err != nil {
			return err
		}
		return rolledBack
	}), rolledBack)
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "later", Semantics: outbox.PubSub, Tracking: outbox.Bitmap}))
	for range 2 { // the first send learns the semantics, the second relies on them
		got := read(send("later"))
		require.Equal(t, "PUBLISHED", got.Status)
		require.True(t, got.RequiredGroups, "required groups are fixed at insert")
	}
	require.False(t, read(send("queued")).RequiredGroups)

	// A PUB_SUB topic's statement still reads the topic row on every send:
	// writes are refused while nobody subscribes, if the topic says so.
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "later", Semantics: outbox.PubSub,
		Tracking: outbox.Bitmap, BlockWritesOnZeroSubscriptions: true}))
	_, err = b.producer.Send(ctx, b.db.Pool, outbox.Message{Topic: "later", Payload: json.RawMessage(`{}`)})
	require.ErrorIs(t, err, outbox.ErrNoSubscriptions)
}

// With an injected clock, a configured QUEUE topic's message becomes
// available at the clock's time plus its delay, as any other topic's.
func TestSendQueuedUsesInjectedClock(t *testing.T) {
	t.Parallel()
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	b := setup(t, outbox.Config{Clock: clocktest.New(at)})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "queued"}))
	for _, topic := range []string{"queued", "queued", "unconfigured"} {
		for _, delay := range []time.Duration{0, time.Minute} {
			id, err := b.producer.Send(ctx, b.db.Pool, outbox.Message{Topic: topic, Payload: json.RawMessage(`{}`), Delay: delay})
			require.NoError(t, err)
			var availableAt time.Time
			require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT available_at FROM `+b.db.Table("outbox_published")+` WHERE id = $1`, id).Scan(&availableAt))
			require.True(t, at.Add(delay).Equal(availableAt), "%s delay %v: available at %v", topic, delay, availableAt)
		}
	}
}

// A producer notifies each topic at most once per NotifyInterval, however
// many sends and batches it makes, and not at all with a negative interval.
func TestNotifyInterval(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	listen := b.listen(t)
	received := func() []string {
		t.Helper()
		got := drainNotifications(t, listen)
		slices.Sort(got)
		return got
	}

	hourly, err := outbox.NewProducer(outbox.ProducerConfig{Schema: b.db.Schema, AllowUnconfiguredTopics: true, NotifyInterval: time.Hour})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for i := range 8 { // concurrent first sends: one of them notifies
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := hourly.Send(ctx, b.db.Pool, seqMessage("a", i))
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	_, err = hourly.SendBatch(ctx, b.db.Pool, []outbox.Message{seqMessage("a", 8), seqMessage("b", 9), seqMessage("b", 10), seqMessage("c", 11)})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c"}, received(), "each topic once")

	silent, err := outbox.NewProducer(outbox.ProducerConfig{Schema: b.db.Schema, AllowUnconfiguredTopics: true, NotifyInterval: -1})
	require.NoError(t, err)
	_, err = silent.Send(ctx, b.db.Pool, seqMessage("d", 12))
	require.NoError(t, err)
	_, err = silent.SendBatch(ctx, b.db.Pool, []outbox.Message{seqMessage("e", 13)})
	require.NoError(t, err)
	require.Empty(t, received())

	often, err := outbox.NewProducer(outbox.ProducerConfig{Schema: b.db.Schema, AllowUnconfiguredTopics: true, NotifyInterval: time.Nanosecond})
	require.NoError(t, err)
	for i := range 3 {
		_, err = often.Send(ctx, b.db.Pool, seqMessage("f", 14+i))
		require.NoError(t, err)
	}
	require.Equal(t, []string{"f", "f", "f"}, received(), "a send after the interval notifies again")
}

// While sends to a topic come closer than NotifyInterval, busy consumers
// need no wake-up: the producer notifies once per BusyNotifyInterval, and
// again at the first send after a pause (injected clock; no sleeping).
func TestBusyNotifyInterval(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	listen := b.listen(t)
	clock := clocktest.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	p, err := outbox.NewProducer(outbox.ProducerConfig{Schema: b.db.Schema, AllowUnconfiguredTopics: true, Clock: clock,
		NotifyInterval: time.Millisecond, BusyNotifyInterval: 10 * time.Millisecond})
	require.NoError(t, err)
	notified := 0
	count := func() int {
		t.Helper()
		notified += len(drainNotifications(t, listen))
		return notified
	}
	send := func() {
		t.Helper()
		_, err := p.Send(ctx, b.db.Pool, seqMessage("busy", 0))
		require.NoError(t, err)
	}

	send() // the first send notifies
	require.Equal(t, 1, count())
	for range 19 { // 0.5 ms apart: busy until 10 ms after the first notification
		clock.Advance(500 * time.Microsecond)
		send()
	}
	require.Equal(t, 1, count(), "sends 0.5 ms apart within 10 ms")
	clock.Advance(500 * time.Microsecond)
	send() // 10 ms after the first notification
	require.Equal(t, 2, count(), "once per BusyNotifyInterval while busy")
	clock.Advance(500 * time.Microsecond)
	send()
	require.Equal(t, 2, count())
	clock.Advance(time.Millisecond)
	send() // after a pause of NotifyInterval
	require.Equal(t, 3, count(), "the first send after a pause")
}

// A change of tracking mode waits for the topic's sends in flight: their
// messages keep the old mode's record, and every later one carries the
// new mode's. (Had it decided on what its statement saw before it waited,
// the message in flight would carry a record the topic no longer expects.)
func TestTrackingModeChangeWaitsForASendInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter}))

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	inFlight, err := b.producer.Send(ctx, tx, seqMessage("events", 1))
	require.NoError(t, err)

	changed := make(chan error, 1)
	go func() {
		changed <- b.client.ChangeTrackingMode(ctx, "events", outbox.Bitmap)
	}()
	select {
	case err := <-changed:
		t.Fatalf("ConfigureTopic returned while a send was in flight: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(ctx))
	select {
	case err := <-changed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("ConfigureTopic still waits after the send committed")
	}
	later, err := b.producer.Send(ctx, b.db.Pool, seqMessage("events", 2))
	require.NoError(t, err)

	topic, err := b.client.Topic(ctx, "events")
	require.NoError(t, err)
	require.Equal(t, outbox.Bitmap, topic.Tracking)
	require.True(t, topic.ModeChanging)
	var counterRecord, below bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT o.required_count IS NOT NULL AND o.required_bits IS NULL, o.xid < t.mode_changed_below
		FROM `+b.db.Table("outbox_published")+` AS o JOIN `+b.db.Table("outbox_topics")+` AS t ON t.topic = o.topic WHERE o.id = $1`,
		inFlight).Scan(&counterRecord, &below))
	require.True(t, counterRecord, "the message in flight keeps the Counter record")
	require.True(t, below, "and sorts below the change")
	require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT required_bits IS NOT NULL AND required_count IS NULL FROM `+
		b.db.Table("outbox_published")+` WHERE id = $1`, later).Scan(&counterRecord))
	require.True(t, counterRecord, "a later message carries the Bitmap record")
}

// ConfigureTopic sets the tracking mode of a topic not in use, and keeps
// that of a topic in use (two releases of a service configuring it
// differently must not change it back and forth): the other settings
// apply, and a warning says so. ChangeTrackingMode refuses bad input.
func TestConfigureTopicKeepsTheModeOfATopicInUse(t *testing.T) {
	t.Parallel()
	var logs testlog.Buffer
	b := setup(t, outbox.Config{Logger: logs.Logger()})
	ctx := context.Background()
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter}))
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Bitmap}))
	topic, err := b.client.Topic(ctx, "events")
	require.NoError(t, err)
	require.Equal(t, outbox.Bitmap, topic.Tracking, "not in use: it changes")
	require.Empty(t, logs.Lines("level=WARN"))

	_, err = b.producer.Send(ctx, b.db.Pool, seqMessage("events", 1))
	require.NoError(t, err)
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Offset, MaxAttempts: 7}))
	topic, err = b.client.Topic(ctx, "events")
	require.NoError(t, err)
	require.Equal(t, outbox.Bitmap, topic.Tracking, "in use: it keeps its mode")
	require.Equal(t, 7, topic.MaxAttempts, "and takes the other settings")
	require.False(t, topic.ModeChanging)
	require.Len(t, logs.Lines("level=WARN"), 1)
	require.Contains(t, logs.Lines("level=WARN")[0], "configured=OFFSET")

	require.ErrorIs(t, b.client.ChangeTrackingMode(ctx, "events", "SIDEWAYS"), outbox.ErrInvalidConfig)
	require.ErrorIs(t, b.client.ChangeTrackingMode(ctx, "nope", outbox.Offset), outbox.ErrNotFound)
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "jobs", Semantics: outbox.Queue}))
	require.ErrorIs(t, b.client.ChangeTrackingMode(ctx, "jobs", outbox.Offset), outbox.ErrWrongSemantics)
	require.NoError(t, b.client.ChangeTrackingMode(ctx, "events", outbox.Bitmap), "already: nothing to do")
	topic, err = b.client.Topic(ctx, "events")
	require.NoError(t, err)
	require.False(t, topic.ModeChanging)
}

// A topic that received messages before its first configuration holds
// them as QUEUE messages: configuring it PubSub is refused (no consumer
// group would ever read them) and they stay claimable.
func TestPubSubRefusedForATopicWithQueuedMessages(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	_, err := b.producer.Send(ctx, b.db.Pool, seqMessage("early", 1))
	require.NoError(t, err)
	err = b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "early", Semantics: outbox.PubSub, Tracking: outbox.Bitmap})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig, "its first send configured it as a QUEUE topic")
	tc, err := b.client.Topic(ctx, "early")
	require.NoError(t, err)
	require.Equal(t, outbox.Queue, tc.Semantics)
	require.Equal(t, 1, b.count(t, "topic = 'early'"), "the message is still there")

	// A PubSub topic configured before its first send is reconfigured freely.
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "late", Semantics: outbox.PubSub, Tracking: outbox.Bitmap}))
	_, err = b.producer.Send(ctx, b.db.Pool, seqMessage("late", 1))
	require.NoError(t, err)
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "late", Semantics: outbox.PubSub, Tracking: outbox.Bitmap, MaxAttempts: 3}))
}

// A payload above the producer's MaxPayloadBytes (1 MiB by default) is
// refused before any statement runs: the caller's transaction is still
// usable and commits the rest. (Any size used to be sent: 64 MiB took
// 13 s, 300 MB failed with a raw PostgreSQL error that aborted the
// transaction.)
func TestSendRefusesOversizedPayloads(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	huge := outbox.Message{Topic: "orders", Payload: json.RawMessage(`"` + strings.Repeat("x", outbox.DefaultMaxPayloadBytes) + `"`)}
	err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
		_, err := b.producer.Send(ctx, tx, huge)
		require.ErrorIs(t, err, outbox.ErrInvalidPayload)
		require.Contains(t, err.Error(), "MaxPayloadBytes")
		_, err = b.producer.SendBatch(ctx, tx, []outbox.Message{seqMessage("orders", 1), huge})
		require.ErrorIs(t, err, outbox.ErrInvalidPayload)
		_, err = b.producer.Send(ctx, tx, seqMessage("orders", 2)) // the transaction goes on
		return err
	})
	require.NoError(t, err)
	require.Equal(t, 1, b.count(t, "true"))

	small, err := outbox.NewProducer(outbox.ProducerConfig{Schema: b.db.Schema, AllowUnconfiguredTopics: true, MaxPayloadBytes: 20})
	require.NoError(t, err)
	_, err = small.Send(ctx, b.db.Pool, outbox.Message{Topic: "orders", Payload: json.RawMessage(`"exactly twenty b"  `)})
	require.NoError(t, err, "a payload of MaxPayloadBytes is accepted")
	_, err = small.Send(ctx, b.db.Pool, outbox.Message{Topic: "orders", Payload: json.RawMessage(`"exactly twenty b"   `)})
	require.ErrorIs(t, err, outbox.ErrInvalidPayload)

	for _, bad := range []int{-1, outbox.MaxStorablePayloadBytes + 1} {
		_, err = outbox.NewProducer(outbox.ProducerConfig{MaxPayloadBytes: bad})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, "%d", bad)
	}
}

// A send to a topic that was never configured (a misspelt name) fails with
// ErrUnknownTopic, writes nothing and leaves the caller's transaction
// usable; a topic configured a moment later is accepted at once. With
// AllowUnconfiguredTopics the topic is a QUEUE topic with the defaults.
func TestSendToATopicNeverConfigured(t *testing.T) {
	t.Parallel()
	b := setup(t, outbox.Config{})
	ctx := context.Background()
	strict, err := outbox.NewProducer(outbox.ProducerConfig{Schema: b.db.Schema})
	require.NoError(t, err)
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "emails"}))
	msg := func(topic string) outbox.Message { return outbox.Message{Topic: topic, Payload: []byte(`{}`)} }

	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = strict.Send(ctx, tx, msg("emials"))
	require.ErrorIs(t, err, outbox.ErrUnknownTopic)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	require.ErrorContains(t, err, `"emials"`)
	_, err = strict.SendBatch(ctx, tx, []outbox.Message{msg("emails"), msg("emials")})
	require.ErrorIs(t, err, outbox.ErrUnknownTopic, "one unknown topic refuses the whole batch")
	_, err = strict.Send(ctx, tx, outbox.Message{Topic: "emials", Payload: []byte(`{}`), IdempotencyKey: "k"})
	require.ErrorIs(t, err, outbox.ErrUnknownTopic)
	id, err := strict.Send(ctx, tx, msg("emails")) // the transaction is still usable
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, b.count(t, "true"))
	require.Equal(t, 1, b.count(t, "id = $1", id))

	// Configured after a refusal: accepted at once (the refusal is not cached).
	require.NoError(t, b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "emials"}))
	_, err = strict.Send(ctx, b.db.Pool, msg("emials"))
	require.NoError(t, err)

	// The opt-in: a topic never configured is a QUEUE topic with the defaults.
	_, err = b.producer.Send(ctx, b.db.Pool, msg("adhoc"))
	require.NoError(t, err)
	_, err = b.producer.SendBatch(ctx, b.db.Pool, []outbox.Message{msg("adhoc"), msg("adhoc2")})
	require.NoError(t, err)
	require.Equal(t, 3, b.count(t, "topic LIKE 'adhoc%'"))
}
