package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/bench/internal/harness"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/natsrelay"
)

// relay (workload RELAY) measures the relay to NATS JetStream (-nats),
// in one run, on -n messages of W3's payload over -msg-groups message
// groups (200 when 0), on a topic in -mode (Offset by default), -ordered
// or not:
//
//  1. raw: nats.go publishing the messages asynchronously to a stream,
//     with Nats-Msg-Id, as fast as it can (the ceiling);
//  2. drain: one consumer group draining the preloaded messages with a
//     handler that does nothing (W3 with -groups 1);
//  3. relay: a relay instance forwarding the preloaded messages to a
//     stream, until every one is confirmed and acked;
//  4. latency: messages sent one a transaction at -rate for
//     -latency-seconds while the relay runs: from the producer's commit
//     returning to JetStream's confirmation reaching the relay.
func (b *bench) relay(ctx context.Context) error {
	groups := b.c.msgGroups
	if groups == 0 {
		groups = 200
	}
	b.c.msgGroups = groups
	nc, err := nats.Connect(b.c.natsURL)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	freshStream := func(name, subjects string) error {
		_ = js.DeleteStream(ctx, name)
		_, err := natsrelay.EnsureStream(ctx, js, jetstream.StreamConfig{Name: name, Subjects: []string{subjects}, Storage: jetstream.FileStorage})
		return err
	}
	defer func() {
		for _, s := range []string{"BENCH_RAW", "BENCH_RELAY"} {
			_ = js.DeleteStream(context.Background(), s)
		}
	}()

	// 1. raw nats.go
	if err := freshStream("BENCH_RAW", "benchraw.>"); err != nil {
		return err
	}
	rawJS, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(natsrelay.DefaultMaxPending))
	if err != nil {
		return err
	}
	start := time.Now()
	for i := range b.c.N {
		m := nats.NewMsg("benchraw.g" + strconv.Itoa(i%groups))
		m.Data = harness.Payload(i)
		if _, err := rawJS.PublishMsgAsync(m, jetstream.WithMsgID("raw:"+strconv.Itoa(i))); err != nil {
			return fmt.Errorf("raw publish: %w", err)
		}
	}
	select {
	case <-rawJS.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	}
	raw := time.Since(start)
	harness.Logf("RELAY: raw nats.go async publish: %.0f msgs/s", float64(b.c.N)/raw.Seconds())

	// 2. one group draining the same messages
	mode := outbox.TrackingMode(strings.ToUpper(b.c.mode))
	if err := b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "drain", Semantics: outbox.PubSub, Tracking: mode, Ordered: b.c.ordered}); err != nil {
		return err
	}
	drain, _, err := b.drainGroups(ctx, "drain", 1)
	if err != nil {
		return err
	}
	harness.Logf("RELAY: one group's drain: %.0f msgs/s", float64(b.c.N)/drain.Seconds())

	// 3. the relay
	if err := b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "relay", Semantics: outbox.PubSub, Tracking: mode, Ordered: b.c.ordered}); err != nil {
		return err
	}
	if err := freshStream("BENCH_RELAY", "bench.>"); err != nil {
		return err
	}
	pub, err := natsrelay.NewJetStreamPublisher(natsrelay.JetStreamConfig{Conn: nc, Stream: "BENCH_RELAY"})
	if err != nil {
		return err
	}
	tr := harness.NewTracker(b.c.N)
	var recordIn atomic.Pointer[harness.Tracker] // where confirmations are recorded: tr, then lat
	recordIn.Store(tr)
	newRelay := func() (*relay.Relay, error) {
		return relay.New(b.pool, relay.Config{
			Consumer: consumergroup.Config{Client: b.client, Topic: "relay", Schema: schema, Concurrency: b.c.Workers,
				BatchSize: 1000, HeartbeatPool: b.pool},
			Publisher:      confirmed(pub, &recordIn),
			Subject:        "bench.{message_group}",
			AllowUnordered: !b.c.ordered,
		})
	}
	r, err := newRelay()
	if err != nil {
		return err
	}
	if err := r.Start(ctx, consumergroup.FromNow()); err != nil { // subscribed: the preloaded messages need it
		return err
	}
	if err := r.Stop(ctx); err != nil {
		return err
	}
	if err := b.preload(ctx, "relay"); err != nil {
		return err
	}
	if r, err = newRelay(); err != nil {
		return err
	}
	start = time.Now()
	if err := r.Start(ctx, consumergroup.FromNow()); err != nil {
		return err
	}
	if err := waitRelayed(ctx, r, tr, b.c.N); err != nil {
		return err
	}
	relayed := time.Since(start)
	if err := tr.Check("RELAY"); err != nil {
		return err
	}
	if st := pub.Stats(); st.Stored-st.Duplicates != int64(b.c.N) {
		return fmt.Errorf("relay: %d stored, %d of them duplicates, for %d messages", st.Stored, st.Duplicates, b.c.N)
	}
	harness.Logf("RELAY: relay: %.0f msgs/s", float64(b.c.N)/relayed.Seconds())

	// 4. latency, the relay running
	n := b.c.Rate * b.c.latencySeconds
	lat := harness.NewTracker(n)
	recordIn.Store(lat)
	if err := b.paced(ctx, "relay", lat, 0, n, b.c.Rate); err != nil {
		return err
	}
	if err := waitRelayed(ctx, r, lat, n); err != nil {
		return err
	}
	if err := r.Stop(ctx); err != nil {
		return err
	}
	p50, p99 := lat.Latencies()

	out, _ := json.Marshal(map[string]any{
		"system": b.c.System, "workload": "RELAY", "n": b.c.N, "mode": b.c.mode, "ordered": b.c.ordered,
		"msg_groups": groups, "raw_msgs_per_sec": harness.Round(float64(b.c.N)/raw.Seconds(), 1),
		"drain_msgs_per_sec": harness.Round(float64(b.c.N)/drain.Seconds(), 1), "relay_msgs_per_sec": harness.Round(float64(b.c.N)/relayed.Seconds(), 1),
		"relay_vs_drain": harness.Round(drain.Seconds()/relayed.Seconds(), 3), "relay_vs_raw": harness.Round(raw.Seconds()/relayed.Seconds(), 3),
		"latency_rate": b.c.Rate, "latency_n": n, "latency_p50_ms": harness.Round(p50, 3), "latency_p99_ms": harness.Round(p99, 3),
	})
	fmt.Println(string(out))
	return nil
}

// confirmed wraps pub to record in the tracker tr points to each message
// JetStream confirmed (by the seq in its payload), as a handler records
// what it handled.
func confirmed(pub relay.Publisher, tr *atomic.Pointer[harness.Tracker]) relay.Publisher {
	return relay.PublisherFunc(func(ctx context.Context, msgs []relay.Message) []error {
		errs := pub.Publish(ctx, msgs)
		for i, err := range errs {
			if err != nil {
				continue
			}
			var m struct {
				Seq int `json:"seq"`
			}
			if json.Unmarshal(msgs[i].Payload, &m) == nil {
				tr.Load().Handled(m.Seq)
			}
		}
		return errs
	})
}

// waitRelayed waits until n messages were confirmed and the relay's group
// has nothing left to complete.
func waitRelayed(ctx context.Context, r *relay.Relay, tr *harness.Tracker, n int) error {
	for tr.Distinct() < n {
		select {
		case <-ctx.Done():
			return fmt.Errorf("relay: %d of %d confirmed: %w", tr.Distinct(), n, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	for {
		h, err := r.Group().Health(ctx, 1)
		if err != nil {
			return err
		}
		if h.Unread == 0 && h.Queued == 0 && h.Scheduled == 0 && h.Waiting == 0 && h.LeasedBatches == 0 && h.LeasedRetries == 0 {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
}
