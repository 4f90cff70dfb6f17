package maintenance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testlog"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/outbox"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// logs collects log records as text.
type logs struct{ testlog.Buffer }

func (l *logs) logger() *slog.Logger { return l.Logger() }

// errors lists the ERROR records.
func (l *logs) errors() []string { return l.Lines("level=ERROR") }

type bundle struct {
	db       *pgtest.DB
	client   *outbox.Client
	producer *outbox.Producer
	logs     *logs
}

// setup returns a bundle on a fresh database; tune adjusts the client's
// configuration (a clock, say).
func setup(t *testing.T, tune ...func(*outbox.Config)) *bundle {
	t.Helper()
	db := pgtest.NewDB(t)
	l := &logs{}
	cfg := outbox.Config{Schema: db.Schema, Logger: l.logger()}
	for _, f := range tune {
		f(&cfg)
	}
	client, err := outbox.NewClient(db.Pool, cfg)
	require.NoError(t, err)
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	return &bundle{db: db, client: client, producer: producer, logs: l}
}

// service returns a maintenance service on b's schema (not started).
// Unless cfg says otherwise, finished messages are deleted row by row at
// once (RowCleanupDelay): the tests of partition drops set it.
func (b *bundle) service(t *testing.T, cfg maintenance.Config) *maintenance.Service {
	t.Helper()
	cfg.Client = b.client
	if cfg.RowCleanupDelay == 0 {
		cfg.RowCleanupDelay = time.Nanosecond
	}
	s, err := maintenance.New(b.db.Pool, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	return s
}

func (b *bundle) topic(t *testing.T, cfg outbox.TopicConfig) {
	t.Helper()
	require.NoError(t, b.client.ConfigureTopic(context.Background(), cfg))
}

func (b *bundle) send(t *testing.T, topic string, n int) []int64 {
	t.Helper()
	return b.sendTo(t, []string{topic}, n)
}

// sendTo sends n messages to each of topics, all in one transaction.
func (b *bundle) sendTo(t *testing.T, topics []string, n int) []int64 {
	t.Helper()
	var msgs []outbox.Message
	for _, topic := range topics {
		for i := range n {
			p, _ := json.Marshal(map[string]int{"seq": i})
			msgs = append(msgs, outbox.Message{Topic: topic, Payload: p})
		}
	}
	ids, err := b.producer.SendBatch(context.Background(), b.db.Pool, msgs)
	require.NoError(t, err)
	return ids
}

func (b *bundle) count(t *testing.T, table, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.db.Table(table)+" WHERE "+where, args...).Scan(&n))
	return n
}

func (b *bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err)
}

// counter is a handler that counts deliveries per message id.
type counter struct {
	mu   sync.Mutex
	seen map[int64]int
	fail atomic.Bool // fail every delivery
}

func newCounter() *counter { return &counter{seen: map[int64]int{}} }

func (c *counter) handle(_ context.Context, d *outbox.Delivery) error {
	if c.fail.Load() {
		return outbox.Permanent(fmt.Errorf("refused"))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[d.ID]++
	return nil
}

func (c *counter) distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

func (c *counter) dups() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, k := range c.seen {
		n += k - 1
	}
	return n
}

func (c *counter) has(id int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[id] > 0
}

// group starts an instance of group on topic, stopped when the test ends.
func (b *bundle) group(t *testing.T, topic, group string, h outbox.Handler, opts consumergroup.SubscriptionOptions, tune ...func(*consumergroup.Config)) *consumergroup.Group {
	t.Helper()
	cfg := consumergroup.Config{Client: b.client, Topic: topic, Group: group, PollInterval: 20 * time.Millisecond,
		HeartbeatInterval: 30 * time.Second, HeartbeatTimeout: time.Hour}
	for _, f := range tune {
		f(&cfg)
	}
	g, err := consumergroup.New(b.db.Pool, cfg)
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", h, nil))
	require.NoError(t, g.Start(context.Background(), opts))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Stop(ctx)
	})
	return g
}

// burnXids commits n transactions that each take a transaction id.
func burnXids(t *testing.T, b *bundle, n int) {
	t.Helper()
	b.exec(t, fmt.Sprintf(`DO $$ BEGIN FOR i IN 1..%d LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP; END $$`, n))
}
