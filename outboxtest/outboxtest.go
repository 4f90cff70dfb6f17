// Package outboxtest helps an application's own tests check what it sends
// with pgoutbox, against a real PostgreSQL (the application's test
// database): a fresh, migrated schema per test, and assertions that a
// message was sent, sent N times, or not sent, decoded into the
// application's own type.
//
//	func TestPlaceOrder(t *testing.T) {
//		pool := testPool(t) // the application's test database
//		schema := outboxtest.Schema(t, pool)
//		client, err := pgoutbox.NewClient(ctx, pool, pgoutbox.Config{Schema: schema})
//		...
//		tx, _ := pool.Begin(ctx)
//		placeOrder(ctx, tx, client, order) // sends "orders.placed"
//		placed := outboxtest.RequireSent[OrderPlaced](t, tx, schema, "orders.placed")
//		require.Equal(t, order.ID, placed.ID)
//	}
//
// The assertions read through any Querier: the transaction the code under
// test sent in (before it commits), or a pool.
package outboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/migrations"
)

// DefaultDatabaseURL is the database Connect uses when DATABASE_URL is not
// set: the postgres database of a local server, user postgres.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Connect opens a pool on DATABASE_URL, or DefaultDatabaseURL when it is
// not set, for examples and tools.
func Connect(ctx context.Context) (*pgxpool.Pool, error) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = DefaultDatabaseURL
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("outboxtest: connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("outboxtest: connect (set DATABASE_URL to a PostgreSQL you may create schemas in): %w", err)
	}
	return pool, nil
}

// Option tunes Schema and CreateSchema.
type Option func(*options)

type options struct{ logger *slog.Logger }

// WithLogger sends the migrations' log lines (one per step) to logger.
// Without it they are discarded.
func WithLogger(logger *slog.Logger) Option { return func(o *options) { o.logger = logger } }

// CreateSchema creates a schema with a random name in pool's database and
// migrates pgoutbox's tables into it, quietly unless WithLogger says
// otherwise. drop removes the schema and everything in it.
func CreateSchema(ctx context.Context, pool *pgxpool.Pool, opts ...Option) (schema string, drop func(context.Context) error, err error) {
	o := options{logger: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt(&o)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema = "pgoutbox_test_" + hex.EncodeToString(b[:])
	drop = func(ctx context.Context) error {
		_, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		return err
	}
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema, Logger: o.logger}); err != nil {
		_ = drop(context.WithoutCancel(ctx))
		return "", nil, fmt.Errorf("outboxtest: migrate schema %s: %w", schema, err)
	}
	return schema, drop, nil
}

// Schema creates a migrated schema for one test (see CreateSchema) and
// drops it when the test ends. Tests can run in parallel, each in a schema
// of its own. It logs nothing unless given WithLogger.
func Schema(tb testing.TB, pool *pgxpool.Pool, opts ...Option) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema, drop, err := CreateSchema(ctx, pool, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := drop(context.Background()); err != nil {
			tb.Errorf("outboxtest: drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// Querier reads rows: a pgx.Tx, a *pgxpool.Pool or a *pgx.Conn.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Message is a message as it is stored.
type Message struct {
	ID            int64
	Topic         string
	Payload       json.RawMessage
	Headers       map[string]string
	CorrelationID string
	Group         string
	Priority      int
	// DeadLettered reports a QUEUE message its consumers dead-lettered.
	DeadLettered bool
}

// Sent returns the messages of topic stored in schema, in id order: QUEUE
// messages not consumed yet (and dead letters), PUB_SUB messages not
// cleaned up yet. Read through the transaction that sent them, it sees them
// before they commit.
func Sent(ctx context.Context, db Querier, schema, topic string) ([]Message, error) {
	s := pgx.Identifier{schema}.Sanitize()
	cols := `id, topic, payload, coalesce(headers, '{}'), coalesce(correlation_id, ''), coalesce(message_group, ''), priority`
	// A QUEUE topic's dead letters are its group's, each with a copy of
	// its message once its row may go.
	queueDead := `SELECT r.message_id, r.payload, r.headers, r.correlation_id, r.message_group, r.priority
FROM ` + s + `.outbox_group_retries AS r
JOIN ` + s + `.outbox_topic_subscriptions AS g ON g.id = r.subscription_id
WHERE g.topic = $1 AND g.group_name = '` + sqlq.QueueGroup + `' AND r.status = 'DEAD_LETTER'`
	rows, err := db.Query(ctx, `
SELECT `+cols+`, id IN (SELECT message_id FROM (`+queueDead+`) AS d) FROM `+s+`.outbox_published WHERE topic = $1
UNION ALL SELECT d.message_id, $1, d.payload, coalesce(d.headers, '{}'), coalesce(d.correlation_id, ''),
                 coalesce(d.message_group, ''), coalesce(d.priority, 0), true
          FROM (`+queueDead+`) AS d
          WHERE d.payload IS NOT NULL AND NOT EXISTS (SELECT 1 FROM `+s+`.outbox_published AS o WHERE o.id = d.message_id)
ORDER BY 1`, topic)
	if err != nil {
		return nil, fmt.Errorf("outboxtest: read messages of %q: %w", topic, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Message, error) {
		var m Message
		var prio int16
		err := r.Scan(&m.ID, &m.Topic, &m.Payload, &m.Headers, &m.CorrelationID, &m.Group, &prio, &m.DeadLettered)
		m.Priority = int(prio)
		return m, err
	})
}

// RequireSent fails the test unless exactly one message of topic is
// stored in schema, and returns its payload decoded into a T.
func RequireSent[T any](tb testing.TB, db Querier, schema, topic string) T {
	tb.Helper()
	return RequireSentN[T](tb, db, schema, topic, 1)[0]
}

// RequireSentN fails the test unless exactly n messages of topic are
// stored in schema, and returns their payloads, in send order, decoded.
func RequireSentN[T any](tb testing.TB, db Querier, schema, topic string, n int) []T {
	tb.Helper()
	msgs, err := Sent(context.Background(), db, schema, topic)
	if err != nil {
		tb.Fatal(err)
	}
	if len(msgs) != n {
		tb.Fatalf("outboxtest: want %d messages of topic %q, found %d", n, topic, len(msgs))
	}
	out := make([]T, len(msgs))
	for i, m := range msgs {
		if err := json.Unmarshal(m.Payload, &out[i]); err != nil {
			tb.Fatalf("outboxtest: message %d of topic %q does not decode into %T: %v", m.ID, topic, out[i], err)
		}
	}
	return out
}

// RequireNotSent fails the test if any message of topic is stored in schema.
func RequireNotSent(tb testing.TB, db Querier, schema, topic string) {
	tb.Helper()
	msgs, err := Sent(context.Background(), db, schema, topic)
	if err != nil {
		tb.Fatal(err)
	}
	if len(msgs) > 0 {
		tb.Fatalf("outboxtest: want no message of topic %q, found %d (first: %s)", topic, len(msgs), msgs[0].Payload)
	}
}

// Open is Connect and CreateSchema in one, for runnable examples: a pool
// and a fresh migrated schema; cleanup drops the schema and closes the pool.
func Open(ctx context.Context) (pool *pgxpool.Pool, schema string, cleanup func(), err error) {
	if pool, err = Connect(ctx); err != nil {
		return nil, "", nil, err
	}
	schema, drop, err := CreateSchema(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, "", nil, err
	}
	return pool, schema, func() { _ = drop(context.Background()); pool.Close() }, nil
}
