package outbox_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

type testBundle struct {
	db       *pgtest.DB
	client   *outbox.Client
	producer *outbox.Producer
}

func setup(t *testing.T, cfg outbox.Config) *testBundle {
	t.Helper()
	db := pgtest.NewDB(t)
	cfg.Schema = db.Schema
	client, err := outbox.NewClient(db.Pool, cfg)
	require.NoError(t, err)
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true, Clock: cfg.Clock})
	require.NoError(t, err)
	return &testBundle{db: db, client: client, producer: producer}
}

type seqPayload struct {
	Seq int `json:"seq"`
}

func seqMessage(topic string, seq int) outbox.Message {
	b, _ := json.Marshal(seqPayload{Seq: seq})
	return outbox.Message{Topic: topic, Payload: b}
}

// sendN writes n messages, one transaction per chunk of 1000.
func (b *testBundle) sendN(t *testing.T, topic string, n int) {
	t.Helper()
	ctx := context.Background()
	for start := 0; start < n; start += 1000 {
		end := min(n, start+1000)
		msgs := make([]outbox.Message, 0, end-start)
		for i := start; i < end; i++ {
			msgs = append(msgs, seqMessage(topic, i))
		}
		require.NoError(t, pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
			_, err := b.producer.SendBatch(ctx, tx, msgs)
			return err
		}))
	}
}

// count counts the stored messages that match where.
func (b *testBundle) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	return b.countIn(t, "outbox_published", where, args...)
}

func (b *testBundle) countIn(t *testing.T, table, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+b.db.Table(table)+" WHERE "+where, args...).Scan(&n))
	return n
}

func startConsumer(t *testing.T, c *outbox.Client, cfg outbox.ConsumerConfig) *pgoutbox.Consumer {
	t.Helper()
	ctx := context.Background()
	client, err := pgoutbox.NewClient(ctx, c.Pool(), pgoutbox.Config{Schema: c.Schema(), NoMaintenance: true})
	require.NoError(t, err)
	k, err := client.NewConsumer(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, k.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = k.Stop(ctx)
	})
	return k
}

// listen returns a connection listening on the producer's notify channel.
func (b *testBundle) listen(t *testing.T) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgtest.ConnConfig(b.db.DSN)
	require.NoError(t, err)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(ctx) })
	_, err = conn.Exec(ctx, "LISTEN "+ident.Quote(outbox.NotifyChannel(b.db.Schema)))
	require.NoError(t, err)
	return conn
}

// drainNotifications returns the payloads of the notifications conn
// receives until none arrives for 200 ms.
func drainNotifications(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	var got []string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		n, err := conn.WaitForNotification(ctx)
		cancel()
		if err != nil {
			require.ErrorIs(t, err, context.DeadlineExceeded)
			return got
		}
		got = append(got, n.Payload)
	}
}
