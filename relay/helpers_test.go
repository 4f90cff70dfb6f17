package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/childproc"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/natstest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/natsrelay"
)

const streamName = "EVENTS"

// env is one test's database, topic, NATS server and stream.
type env struct {
	db       *pgtest.DB
	client   *outbox.Client
	producer *outbox.Producer
	topic    string
	nats     *natstest.Server
	// auth is how the test's own connections authenticate.
	auth natsrelay.NATSConfig
	nc   *nats.Conn
	js   jetstream.JetStream
}

// newEnv configures tc (PUB_SUB, Offset, ordered unless set otherwise by
// the caller) and starts a NATS server with the stream EVENTS on
// "events.>" (unless noStream).
func newEnv(t *testing.T, tc outbox.TopicConfig, stream *jetstream.StreamConfig) *env {
	t.Helper()
	return newEnvOn(t, tc, stream, natstest.Options{})
}

// newEnvOn is newEnv with a NATS server configured by opts, which the
// test's own connections authenticate to as auth says.
func newEnvOn(t *testing.T, tc outbox.TopicConfig, stream *jetstream.StreamConfig, opts natstest.Options, auth ...natsrelay.NATSConfig) *env {
	t.Helper()
	db := pgtest.NewDB(t)
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	tc.Name = "events"
	tc.Semantics = outbox.PubSub
	require.NoError(t, client.ConfigureTopic(context.Background(), tc))
	e := &env{db: db, client: client, producer: producer, topic: tc.Name, nats: natstest.Start(t, opts)}
	if len(auth) > 0 {
		e.auth = auth[0]
	}
	e.nc, e.js = e.connect(t)
	if stream != nil {
		e.ensureStream(t, *stream)
	}
	return e
}

// orderedTopic is the topic most tests relay: ordered, Offset mode.
var orderedTopic = outbox.TopicConfig{Tracking: outbox.Offset, Ordered: true, Lease: 3 * time.Second}

// eventsStream is the stream most tests publish to.
var eventsStream = &jetstream.StreamConfig{Name: streamName, Subjects: []string{"events.>"}, Storage: jetstream.FileStorage}

func (e *env) connect(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	cfg := e.auth
	cfg.URL = e.nats.URL()
	nc, err := natsrelay.Connect(cfg)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return nc, js
}

func (e *env) ensureStream(t *testing.T, cfg jetstream.StreamConfig) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := natsrelay.EnsureStream(ctx, e.js, cfg)
	require.NoError(t, err)
}

// publisher is a JetStreamPublisher on a connection of its own.
func (e *env) publisher(t *testing.T, cfg natsrelay.JetStreamConfig) *natsrelay.JetStreamPublisher {
	t.Helper()
	if cfg.Conn == nil {
		cfg.Conn, _ = e.connect(t)
	}
	p, err := natsrelay.NewJetStreamPublisher(cfg)
	require.NoError(t, err)
	return p
}

// startRelay starts a relay instance in this process, stopped when the
// test ends. cfg's Publisher defaults to a JetStreamPublisher.
func (e *env) startRelay(t *testing.T, cfg relay.Config) *relay.Relay {
	t.Helper()
	if cfg.Publisher == nil {
		cfg.Publisher = e.publisher(t, natsrelay.JetStreamConfig{AckTimeout: time.Second})
	}
	cfg.Consumer.Topic = e.topic
	cfg.Consumer.Schema = e.db.Schema
	if cfg.Subject == "" {
		cfg.Subject = "events.{message_group}"
	}
	cfg.RetryMax = 500 * time.Millisecond
	r, err := relay.New(e.db.Pool, cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background(), consumergroup.FromBeginning(false)))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return r
}

// seq is the payload of the tests' messages.
type seq struct {
	Group string `json:"group"`
	Seq   int    `json:"seq"`
}

// sendGroups sends perGroup messages to each of groups message groups
// ("g0", "g1", ...), seq 0.. within each, in batches of batch messages
// that interleave the groups, taking at least over (at a steady pace);
// progress is called after each batch with the number sent so far.
func (e *env) sendGroups(t *testing.T, groups, perGroup, batch int, over time.Duration, progress func(sent int)) {
	t.Helper()
	var msgs []outbox.Message
	sent, start, total := 0, time.Now(), groups*perGroup
	flush := func() {
		if len(msgs) == 0 {
			return
		}
		_, err := e.producer.SendBatch(context.Background(), e.db.Pool, msgs)
		require.NoError(t, err)
		sent += len(msgs)
		msgs = msgs[:0]
		if progress != nil {
			progress(sent)
		}
		if due := start.Add(over * time.Duration(sent) / time.Duration(total)); time.Until(due) > 0 {
			time.Sleep(time.Until(due))
		}
	}
	for s := 0; s < perGroup; s++ {
		for g := 0; g < groups; g++ {
			name := "g" + strconv.Itoa(g)
			p, _ := json.Marshal(seq{Group: name, Seq: s})
			msgs = append(msgs, outbox.Message{Topic: e.topic, Group: name, Payload: p})
			if len(msgs) == batch {
				flush()
			}
		}
	}
	flush()
}

// stored is a message read back from the stream.
type stored struct {
	subject string
	header  nats.Header
	seq     seq
	data    []byte
}

// readStream reads every message of the stream, in stream order.
func (e *env) readStream(t *testing.T) []stored {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := e.js.Stream(ctx, streamName)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	total := int(info.State.Msgs)
	if total == 0 {
		return nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	var out []stored
	for len(out) < total {
		batch, err := c.Fetch(min(1000, total-len(out)), jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			var p seq
			_ = json.Unmarshal(m.Data(), &p)
			out = append(out, stored{subject: m.Subject(), header: m.Headers(), seq: p, data: m.Data()})
		}
		require.NoError(t, batch.Error())
	}
	return out
}

// streamCount is how many messages the stream holds.
func (e *env) streamCount(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := e.js.Stream(ctx, streamName)
	if err != nil {
		return -1
	}
	info, err := s.Info(ctx)
	if err != nil {
		return -1
	}
	return int(info.State.Msgs)
}

// drained reports whether the relay's group has nothing left: nothing
// unread, queued, waiting, leased or dead-lettered.
func drained(t *testing.T, r *relay.Relay) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h, err := r.Group().Health(ctx, 100_000)
	if err != nil {
		return false
	}
	return h.Unread == 0 && h.Queued == 0 && h.Waiting == 0 && h.LeasedBatches == 0 && h.LeasedRetries == 0
}

// checkStream asserts that the stream holds each of groups×perGroup
// messages once, each message group's in seq order, and returns them.
func checkStream(t *testing.T, got []stored, groups, perGroup int) {
	t.Helper()
	ids := map[string]int{}
	next := map[string]int{}
	var outOfOrder []string
	for _, m := range got {
		ids[m.header.Get(relay.HeaderID)]++
		if want := next[m.subject]; m.seq.Seq != want && len(outOfOrder) < 10 {
			outOfOrder = append(outOfOrder, fmt.Sprintf("%s: seq %d where %d was next", m.subject, m.seq.Seq, want))
		}
		next[m.subject] = m.seq.Seq + 1
	}
	var dups []string
	for id, n := range ids {
		if n > 1 && len(dups) < 10 {
			dups = append(dups, fmt.Sprintf("id %s ×%d", id, n))
		}
	}
	require.Empty(t, dups, "duplicates in the stream")
	require.Empty(t, outOfOrder, "a subject out of commit order")
	require.Len(t, ids, groups*perGroup, "distinct messages in the stream")
	require.Len(t, next, groups, "subjects")
	for s, n := range next {
		require.Equal(t, perGroup, n, "messages of %s", s)
	}
}

// ---------------------------------------------------------------- child processes

const childEnv = "PGOUTBOX_RELAY_TEST_CHILD"

// childSpec is what a child process relays.
type childSpec struct {
	DSN, Schema, Topic, NATSURL, Subject string
	// Hang: the child's relay publishes its first batch, then hangs
	// before it can ack it (until it is killed).
	Hang bool
}

// childMain runs a relay instance as spec says, prints "ready" once it
// started, and runs until it is killed.
func childMain() {
	var cs childSpec
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &cs); err != nil {
		fmt.Fprintln(os.Stderr, "child spec:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	cfg, err := pgtest.PoolConfig(cs.DSN) // waits for a slot on a busy server
	if err != nil {
		fmt.Fprintln(os.Stderr, "child pool:", err)
		os.Exit(2)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child pool:", err)
		os.Exit(2)
	}
	nc, err := natsrelay.Connect(natsrelay.NATSConfig{URL: cs.NATSURL})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child nats:", err)
		os.Exit(2)
	}
	pub, err := natsrelay.NewJetStreamPublisher(natsrelay.JetStreamConfig{Conn: nc, AckTimeout: time.Second})
	if err != nil {
		os.Exit(2)
	}
	var p relay.Publisher = pub
	if cs.Hang {
		p = relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) []error {
			_ = pub.Publish(ctx, msgs)
			fmt.Fprintln(os.Stderr, "published", len(msgs))
			select {} // killed here, between the publish and the ack
		})
	}
	r, err := relay.New(pool, relay.Config{
		Consumer:  consumergroup.Config{Topic: cs.Topic, Schema: cs.Schema},
		Publisher: p, Subject: cs.Subject, RetryMax: 500 * time.Millisecond,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child relay:", err)
		os.Exit(2)
	}
	if err := r.Start(ctx, consumergroup.FromBeginning(false)); err != nil {
		fmt.Fprintln(os.Stderr, "child start:", err)
		os.Exit(2)
	}
	fmt.Println("ready")
	select {}
}

// startChild starts a relay instance in a child process, killed when the
// test ends, and waits until it started.
func (e *env) startChild(t *testing.T, subject string, hang bool) *childproc.Child {
	t.Helper()
	return childproc.Start(t, childEnv, childSpec{DSN: e.db.DSN, Schema: e.db.Schema, Topic: e.topic, NATSURL: e.nats.URL(),
		Subject: subject, Hang: hang})
}
