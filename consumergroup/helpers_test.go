package consumergroup_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

var modes = []outbox.TrackingMode{outbox.Bitmap, outbox.Counter, outbox.Offset}

// queueTopic stands, beside the tracking modes, for a QUEUE topic read by
// its one group (see setupSubject).
const queueTopic outbox.TrackingMode = "QUEUE"

// setupSubject is setup for mode, or, for queueTopic, a QUEUE topic; it
// returns the group to read it with.
func setupSubject(t *testing.T, mode outbox.TrackingMode) (*bundle, string) {
	t.Helper()
	if mode == queueTopic {
		return setupTopic(t, outbox.TopicConfig{Name: "jobs"}), sqlq.QueueGroup
	}
	return setup(t, mode), "g"
}

type bundle struct {
	db       *pgtest.DB
	client   *outbox.Client
	producer *outbox.Producer
	topic    string
}

func setup(t *testing.T, mode outbox.TrackingMode) *bundle {
	t.Helper()
	return setupTopic(t, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: mode})
}

// setupTopic is setup with the topic configured as tc.
func setupTopic(t *testing.T, tc outbox.TopicConfig) *bundle {
	t.Helper()
	db := pgtest.NewDB(t)
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	require.NoError(t, client.ConfigureTopic(context.Background(), tc))
	return &bundle{db: db, client: client, producer: producer, topic: tc.Name}
}

type seqPayload struct {
	Seq int `json:"seq"`
}

func (b *bundle) send(t *testing.T, seqs ...int) []int64 {
	t.Helper()
	msgs := make([]outbox.Message, len(seqs))
	for i, s := range seqs {
		p, _ := json.Marshal(seqPayload{Seq: s})
		msgs[i] = outbox.Message{Topic: b.topic, Payload: p}
	}
	ids, err := b.producer.SendBatch(context.Background(), b.db.Pool, msgs)
	require.NoError(t, err)
	return ids
}

func (b *bundle) sendRange(t *testing.T, from, to int) {
	t.Helper()
	for start := from; start < to; start += 1000 {
		var seqs []int
		for i := start; i < min(to, start+1000); i++ {
			seqs = append(seqs, i)
		}
		b.send(t, seqs...)
	}
}

func (b *bundle) count(t *testing.T, where string, args ...any) int {
	t.Helper()
	return b.countIn(t, "outbox_published", where, args...)
}

// countIn counts the rows of one of pgoutbox's tables that match where.
func (b *bundle) countIn(t *testing.T, table, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.db.Table(table)+" WHERE "+where, args...).Scan(&n))
	return n
}

// recorder counts deliveries per message id.
type recorder struct {
	mu    sync.Mutex
	count map[int64]int
	seqs  map[int]int
	seen  map[int64][]string // each delivery's attempt and lease end, to explain a duplicate
}

func newRecorder() *recorder {
	return &recorder{count: map[int64]int{}, seqs: map[int]int{}, seen: map[int64][]string{}}
}

func (r *recorder) handler(ctx context.Context, d *outbox.Delivery) error {
	p, err := outbox.Decode[seqPayload](d)
	if err != nil {
		return outbox.Permanent(err)
	}
	r.mu.Lock()
	r.count[d.ID]++
	r.seqs[p.Seq]++
	r.seen[d.ID] = append(r.seen[d.ID], fmt.Sprintf("attempt %d lease until %s", d.Attempt, d.LeaseUntil.Format("15:04:05.000000")))
	r.mu.Unlock()
	return nil
}

func (r *recorder) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.count)
}

func (r *recorder) dups() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.count {
		n += c - 1
	}
	return n
}

// duplicates describes the messages delivered more than once (for a
// failing assertion's message).
func (r *recorder) duplicates() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for id, c := range r.count {
		if c > 1 {
			fmt.Fprintf(&b, "message %d: %s\n", id, strings.Join(r.seen[id], "; "))
		}
	}
	return b.String()
}

func (r *recorder) has(seq int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seqs[seq] > 0
}

// hasAll reports whether every message of ids was delivered.
func (r *recorder) hasAll(ids []int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		if r.count[id] == 0 {
			return false
		}
	}
	return true
}

type groupOpt func(*consumergroup.Config)

func (b *bundle) newGroup(t *testing.T, name string, opts ...groupOpt) *consumergroup.Group {
	t.Helper()
	return b.newGroupOn(t, b.db.Pool, name, opts...)
}

func (b *bundle) newGroupOn(t *testing.T, pool *pgxpool.Pool, name string, opts ...groupOpt) *consumergroup.Group {
	t.Helper()
	cfg := consumergroup.Config{Topic: b.topic, Group: name, Schema: b.db.Schema, PollInterval: 20 * time.Millisecond,
		HeartbeatInterval: time.Second, HeartbeatTimeout: time.Minute}
	for _, o := range opts {
		o(&cfg)
	}
	g, err := consumergroup.New(pool, cfg)
	require.NoError(t, err)
	return g
}

func start(t *testing.T, g *consumergroup.Group, opts consumergroup.SubscriptionOptions) {
	t.Helper()
	require.NoError(t, g.Start(context.Background(), opts))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Stop(ctx)
	})
}

// startRecording starts an instance of group name, from now, whose
// handler records into r; it is stopped when the test ends.
func (b *bundle) startRecording(t *testing.T, name string, r *recorder) *consumergroup.Group {
	t.Helper()
	g := b.newGroup(t, name)
	require.NoError(t, g.AddConsumer("m", r.handler, nil))
	start(t, g, consumergroup.FromNow())
	return g
}

// subscribe registers group name from now and stops the instance that
// did: the group is subscribed (ACTIVE) and reads nothing.
func (b *bundle) subscribe(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	g := b.newGroup(t, name)
	require.NoError(t, g.AddConsumer("m", func(context.Context, *outbox.Delivery) error { return nil }, nil))
	require.NoError(t, g.Start(ctx, consumergroup.FromNow()))
	require.NoError(t, g.Stop(ctx))
}

// crash ends instance g as a crashed process ends: its pool is closed
// first, so nothing it does from then on reaches the database, and it is
// stopped without waiting for anything.
func crash(g *consumergroup.Group, pool *pgxpool.Pool) {
	pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_ = g.Stop(ctx)
}

// crashHoldingABatch starts an instance of group name on a pool of its
// own whose handler holds every message until its context ends, calls
// send, and crashes the instance (see crash) once it holds a batch: its
// lease is left to run out.
func (b *bundle) crashHoldingABatch(t *testing.T, name string, send func(), opts ...groupOpt) {
	t.Helper()
	pool := pgtest.NewPool(t, b.db.DSN)
	g := b.newGroupOn(t, pool, name, opts...)
	var got atomic.Int64
	require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
		got.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}, nil))
	require.NoError(t, g.Start(context.Background(), consumergroup.FromNow()))
	send()
	pgtest.Eventually(t, 10*time.Second, "the doomed instance holds a batch", func() bool { return got.Load() > 0 })
	crash(g, pool)
}
