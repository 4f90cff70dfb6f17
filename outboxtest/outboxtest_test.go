package outboxtest_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outboxtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

type OrderPlaced struct {
	ID int `json:"id"`
}

// fakeTB records a failure instead of failing the test (Fatal ends the
// calling goroutine, as testing.T's does).
type fakeTB struct {
	testing.TB
	mu     sync.Mutex
	failed string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.failed = format
	f.mu.Unlock()
	runtime.Goexit()
}
func (f *fakeTB) Fatal(args ...any) { f.Fatalf("%v", args...) }

// fails reports whether check fails on a fake TB.
func fails(check func(tb testing.TB)) bool {
	f := &fakeTB{}
	done := make(chan struct{})
	go func() { defer close(done); check(f) }()
	<-done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed != ""
}

func TestRequireSent(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmptyDB(t)
	schema := outboxtest.Schema(t, db.Pool)
	ctx := context.Background()
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	outboxtest.RequireNotSent(t, tx, schema, "orders.placed")
	for id := 1; id <= 2; id++ {
		msg, err := outbox.NewMessage("orders.placed", OrderPlaced{ID: id})
		require.NoError(t, err)
		_, err = producer.Send(ctx, tx, msg)
		require.NoError(t, err)
	}
	// Read through the sending transaction, before it commits.
	placed := outboxtest.RequireSentN[OrderPlaced](t, tx, schema, "orders.placed", 2)
	require.Equal(t, []OrderPlaced{{ID: 1}, {ID: 2}}, placed)
	outboxtest.RequireNotSent(t, db.Pool, schema, "orders.placed") // not committed yet
	require.True(t, fails(func(tb testing.TB) { outboxtest.RequireSent[OrderPlaced](tb, tx, schema, "orders.placed") }), "two sent, not one")
	require.True(t, fails(func(tb testing.TB) { outboxtest.RequireNotSent(tb, tx, schema, "orders.placed") }))
	require.True(t, fails(func(tb testing.TB) { outboxtest.RequireSentN[[]string](tb, tx, schema, "orders.placed", 2) }), "does not decode")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, OrderPlaced{ID: 2}, outboxtest.RequireSentN[OrderPlaced](t, db.Pool, schema, "orders.placed", 2)[1])

	// The schema is a fresh one with pgoutbox's tables, dropped at the end.
	var n int
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema}.Sanitize()+
		`.outbox_topics WHERE topic <> 'orders.placed'`).Scan(&n)) // the sends configured theirs
	require.Zero(t, n)
}

// Schema logs nothing by default (the migrations printed a line per step
// through slog.Default for every test); WithLogger takes them.
func TestSchemaIsQuietUnlessGivenALogger(t *testing.T) { // not parallel: it swaps slog.Default
	db := pgtest.NewEmptyDB(t)
	var global, mine bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&global, nil)))
	defer slog.SetDefault(old)
	outboxtest.Schema(t, db.Pool)
	require.Empty(t, global.String(), "Schema logged through slog.Default")
	outboxtest.Schema(t, db.Pool, outboxtest.WithLogger(slog.New(slog.NewTextHandler(&mine, nil))))
	require.Contains(t, mine.String(), "component=pgoutbox.migrations")
	require.Empty(t, global.String())
}

// A QUEUE topic's dead letter is among its sent messages, marked, before
// and after cleanup deleted its message row (it is then read from the
// dead letter's copy); a message its consumers handled is not, once
// cleanup deleted it.
func TestSentShowsAQueueTopicsDeadLetters(t *testing.T) {
	t.Parallel()
	db := pgtest.NewEmptyDB(t)
	schema := outboxtest.Schema(t, db.Pool)
	ctx := context.Background()
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "jobs"}))
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: schema})
	require.NoError(t, err)
	ids, err := producer.SendBatch(ctx, db.Pool, []outbox.Message{
		{Topic: "jobs", Payload: []byte(`{"id":1}`)}, {Topic: "jobs", Payload: []byte(`{"id":2}`)}})
	require.NoError(t, err)
	g, err := consumergroup.New(db.Pool, consumergroup.Config{Topic: "jobs", Group: sqlq.QueueGroup, Client: client,
		PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", func(_ context.Context, d *outbox.Delivery) error {
		if d.ID == ids[0] {
			return outbox.Permanent(errors.New("no"))
		}
		return nil
	}, nil))
	require.NoError(t, g.Start(ctx, consumergroup.FromBeginning(false)))
	pgtest.Eventually(t, 20*time.Second, "one dead letter, one handled", func() bool {
		h, err := g.Health(ctx, 0)
		require.NoError(t, err)
		return h.DeadLetters == 1 && h.Unread+h.LeasedBatches+h.LeasedRetries == 0
	})
	require.NoError(t, g.Stop(ctx))
	sent, err := outboxtest.Sent(ctx, db.Pool, schema, "jobs")
	require.NoError(t, err)
	require.Len(t, sent, 2)
	require.True(t, sent[0].DeadLettered)
	require.False(t, sent[1].DeadLettered)

	m, err := maintenance.New(db.Pool, maintenance.Config{Client: client, RowCleanupDelay: time.Nanosecond})
	require.NoError(t, err)
	pgtest.Eventually(t, 20*time.Second, "cleanup deleting both message rows", func() bool {
		_, err := m.RunOnce(ctx)
		require.NoError(t, err)
		var n int
		require.NoError(t, db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{schema}.Sanitize()+`.outbox_published`).Scan(&n))
		return n == 0
	})
	sent, err = outboxtest.Sent(ctx, db.Pool, schema, "jobs")
	require.NoError(t, err)
	require.Len(t, sent, 1)
	require.Equal(t, ids[0], sent[0].ID)
	require.True(t, sent[0].DeadLettered)
	require.JSONEq(t, `{"id":1}`, string(sent[0].Payload))
}
