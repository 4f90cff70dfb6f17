package relay_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/natsrelay"
)

// The relay publishes each message once, with its headers, the relay's
// own and Nats-Msg-Id, each message group's in commit order.
func TestRelayPublishesInOrderWithHeaders(t *testing.T) {
	e := newEnv(t, orderedTopic, eventsStream)
	r := e.startRelay(t, relay.Config{})
	p, _ := json.Marshal(seq{Group: "g0", Seq: 0})
	_, err := e.producer.Send(context.Background(), e.db.Pool, outbox.Message{Topic: e.topic, Group: "g0", Payload: p,
		CorrelationID: "c-1", Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "Tenant": "acme",
			// JetStream's own headers would tell the stream what to do
			// with the message (here: refuse it forever): not forwarded.
			"Nats-Expected-Last-Sequence": "999", "nats-rollup": "all"}})
	require.NoError(t, err)
	e.sendGroups(t, 10, 50, 37, 0, nil)
	// seq 0 of g0 went twice: the first message above and the first of
	// sendGroups; count it as its own group for the order check.
	pgtest.Eventually(t, 30*time.Second, "all relayed", func() bool { return drained(t, r) })
	got := e.readStream(t)
	require.Len(t, got, 501)
	first := got[0]
	require.Equal(t, "events.g0", first.subject)
	require.Equal(t, "acme", first.header.Get("Tenant"))
	require.Empty(t, first.header.Values("Nats-Expected-Last-Sequence"))
	require.Empty(t, first.header.Values("nats-rollup"))
	require.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", first.header.Get("traceparent"))
	require.Equal(t, "c-1", first.header.Get(relay.HeaderCorrelationID))
	require.Equal(t, "events", first.header.Get(relay.HeaderTopic))
	require.Equal(t, "g0", first.header.Get(relay.HeaderMessageGroup))
	require.Equal(t, "events:"+first.header.Get(relay.HeaderID), first.header.Get(jetstream.MsgIDHeader))
	_, err = time.Parse(time.RFC3339Nano, first.header.Get(relay.HeaderCreatedAt))
	require.NoError(t, err)
	checkStream(t, got[1:], 10, 50)
}

// Must show: 20,000 messages over 200 message groups, relayed by two
// instances while the NATS server is killed and restarted twice and one
// instance is killed: every message in the stream once, each message
// group in commit order, nothing left unrelayed.
func TestRelayThroughServerAndRelayKills(t *testing.T) {
	total := 20_000
	if v, err := strconv.Atoi(os.Getenv("PGOUTBOX_RELAY_MESSAGES")); err == nil && v > 0 {
		total = v
	}
	const groups = 200
	perGroup := total / groups
	e := newEnv(t, orderedTopic, eventsStream)
	counting := &countingPublisher{Publisher: e.publisher(t, natsrelay.JetStreamConfig{AckTimeout: time.Second})}
	r := e.startRelay(t, relay.Config{Publisher: counting})
	victim := e.startChild(t, "events.{message_group}", false)

	var faults sync.WaitGroup
	var step atomic.Int32
	e.sendGroups(t, groups, perGroup, 50, 12*time.Second, func(sent int) {
		switch {
		case step.Load() == 0 && sent >= total/4:
			step.Store(1)
			t.Logf("killing the NATS server at %d sent", sent)
			e.nats.Kill()
			faults.Add(1)
			go func() { defer faults.Done(); time.Sleep(1500 * time.Millisecond); e.nats.Restart() }()
		case step.Load() == 1 && sent >= total/2:
			step.Store(2)
			t.Logf("killing a relay instance at %d sent", sent)
			victim.Kill()
		case step.Load() == 2 && sent >= 3*total/4:
			faults.Wait()
			step.Store(3)
			t.Logf("killing the NATS server again at %d sent", sent)
			e.nats.Kill()
			faults.Add(1)
			go func() { defer faults.Done(); time.Sleep(1500 * time.Millisecond); e.nats.Restart() }()
		}
	})
	faults.Wait()
	require.EqualValues(t, 3, step.Load(), "every fault was injected")
	pgtest.Eventually(t, 3*time.Minute, "every message relayed", func() bool { return drained(t, r) })
	got := e.readStream(t)
	checkStream(t, got, groups, perGroup)
	require.Len(t, got, total, "messages in the stream")
	dead, err := r.Group().DeadLetters(context.Background(), 0, 10)
	require.NoError(t, err)
	require.Empty(t, dead)
	require.Positive(t, counting.failed.Load(), "publishes failed while the server was down (the kills landed in flight)")
	t.Logf("%d messages; %d publishes failed and were retried", total, counting.failed.Load())
}

// countingPublisher counts failed publishes.
type countingPublisher struct {
	relay.Publisher
	failed atomic.Int64
}

func (c *countingPublisher) Publish(ctx context.Context, msgs []relay.Message) []error {
	errs := c.Publisher.Publish(ctx, msgs)
	for _, err := range errs {
		if err != nil {
			c.failed.Add(1)
		}
	}
	return errs
}

// A connection cut while a relay publishes loses what was on the wire
// while later publishes wait in the client's reconnect buffer and are
// stored after it reconnects: publishing a message group's next message
// before the previous one was confirmed would store them out of order.
func TestRelayOrderThroughConnectionCuts(t *testing.T) {
	const groups, perGroup = 50, 200
	e := newEnv(t, orderedTopic, eventsStream)
	proxy := pgtest.NewProxyTo(t, strings.TrimPrefix(e.nats.URL(), "nats://"))
	nc, err := natsrelay.Connect(natsrelay.NATSConfig{URL: "nats://" + proxy.Addr(), Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	counting := &countingPublisher{Publisher: e.publisher(t, natsrelay.JetStreamConfig{Conn: nc, AckTimeout: time.Second})}
	r := e.startRelay(t, relay.Config{Publisher: counting})

	stop := make(chan struct{})
	cuts := make(chan int)
	go func() {
		n := 0
		defer func() { cuts <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			proxy.Down()
			time.Sleep(20 * time.Millisecond)
			proxy.Up()
			n++
		}
	}()
	e.sendGroups(t, groups, perGroup, 100, 6*time.Second, nil)
	close(stop)
	n := <-cuts
	pgtest.Eventually(t, 2*time.Minute, "every message relayed", func() bool { return drained(t, r) })
	got := e.readStream(t)
	checkStream(t, got, groups, perGroup)
	require.Len(t, got, groups*perGroup)
	require.Positive(t, counting.failed.Load(), "publishes failed on the cuts")
	t.Logf("%d connection cuts; %d publishes failed and were retried", n, counting.failed.Load())
}

// A relay killed after JetStream stored a batch and before its ack: the
// batch's lease runs out, another instance publishes it again, and
// JetStream drops every message of it as a duplicate (Nats-Msg-Id within
// the window).
func TestRelayKilledBetweenPublishAndAck(t *testing.T) {
	e := newEnv(t, orderedTopic, eventsStream)
	hanging := e.startChild(t, "events.{message_group}", true)
	e.sendGroups(t, 5, 20, 100, 0, nil)
	pgtest.Eventually(t, 30*time.Second, "the hanging relay published", func() bool { return e.streamCount(t) > 0 })
	hanging.Kill()
	<-hanging.Exited()
	time.Sleep(200 * time.Millisecond) // what it sent before it died is stored
	published := e.streamCount(t)
	pub := e.publisher(t, natsrelay.JetStreamConfig{AckTimeout: time.Second})
	r := e.startRelay(t, relay.Config{Publisher: pub})
	pgtest.Eventually(t, time.Minute, "relayed by the survivor", func() bool { return drained(t, r) })
	got := e.readStream(t)
	checkStream(t, got, 5, 20)
	require.Len(t, got, 100)
	require.EqualValues(t, published, pub.Stats().Duplicates, "the hanging relay's messages, published again, dropped as duplicates")
	t.Logf("%d messages published before the kill were republished and dropped", published)
}
