// Package blockedtest builds, for the tests of the operator tools (admin,
// adminui, the pgoutbox command), a database whose ordered topics have
// blocked message groups.
package blockedtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// The failures the fixture's message groups meet.
const (
	QueueDeadError = "no such customer" // cust-99's head on orders
	GroupDeadError = "account closed"   // cust-99's head for billing
	RetryError     = "downstream down"  // cust-5's head, both
)

// Fixture is a database with an ordered QUEUE topic "orders" and an
// ordered PUB_SUB topic "events" (Counter mode) read by a running group
// "billing", each sent three messages in message group cust-99, two in
// cust-5 and one in cust-1: cust-99's head is dead-lettered (the topics
// block message groups on dead letters), cust-5's failed and waits for a
// retry in an hour, cust-1's is done. So each has two blocked message
// groups, with two and one messages behind their heads, and billing has
// one message waiting for a retry and three queued.
type Fixture struct {
	DB     *pgtest.DB
	Client *outbox.Client
	Group  *consumergroup.Group // billing, running until the test ends
	// DeadHead and RetryHead are the heads of cust-99 and cust-5 on
	// orders.
	DeadHead, RetryHead int64
}

// New builds the fixture, with the topics extra configured too, and
// returns once billing has settled every message it can.
func New(t *testing.T, extra ...outbox.TopicConfig) *Fixture {
	t.Helper()
	ctx := context.Background()
	db := pgtest.NewDB(t)
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	topics := append([]outbox.TopicConfig{
		{Name: "orders", Semantics: outbox.Queue, Ordered: true},
		{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Counter, Ordered: true},
	}, extra...)
	for _, tc := range topics {
		require.NoError(t, client.ConfigureTopic(ctx, tc))
	}
	f := &Fixture{DB: db, Client: client}
	f.send(t, "orders")
	orders := f.start(t, "orders", sqlq.QueueGroup) // the QUEUE topic's consumers
	f.DeadHead, f.RetryHead = f.message(t, "orders", "cust-99", 0), f.message(t, "orders", "cust-5", 0)
	f.Group = f.start(t, "events", "billing")
	f.send(t, "events")
	for _, g := range []*consumergroup.Group{orders, f.Group} {
		pgtest.Eventually(t, 30*time.Second, "blocked on cust-99 and cust-5, done with cust-1", func() bool {
			h, err := g.Health(ctx, 0)
			require.NoError(t, err)
			blocked, err := g.BlockedGroups(ctx, 0)
			require.NoError(t, err)
			return len(blocked) == 2 && h.Unread == 0 && h.LeasedBatches+h.LeasedRetries == 0
		})
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, orders.Stop(stopCtx)) // the topic's consumers are gone: an operator's action is not followed by a delivery
	return f
}

// start starts an instance of group on topic, running until the test
// ends, whose member dead-letters cust-99's messages, retries cust-5's in
// an hour and handles cust-1's.
func (f *Fixture) start(t *testing.T, topic, group string) *consumergroup.Group {
	t.Helper()
	g, err := consumergroup.New(f.DB.Pool, consumergroup.Config{Topic: topic, Group: group, Client: f.Client,
		PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("m", func(_ context.Context, d *outbox.Delivery) error {
		switch {
		case d.Group == "cust-99" && topic == "orders":
			return outbox.Permanent(errors.New(QueueDeadError))
		case d.Group == "cust-99":
			return outbox.Permanent(errors.New(GroupDeadError))
		case d.Group == "cust-5":
			return outbox.RetryAfter(time.Hour, errors.New(RetryError))
		}
		return nil
	}, nil))
	require.NoError(t, g.Start(context.Background(), consumergroup.FromNow()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Stop(ctx)
	})
	return g
}

// send sends the fixture's messages to topic.
func (f *Fixture) send(t *testing.T, topic string) {
	t.Helper()
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: f.DB.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	var msgs []outbox.Message
	for i, group := range []string{"cust-99", "cust-99", "cust-99", "cust-5", "cust-5", "cust-1"} {
		msgs = append(msgs, outbox.Message{Topic: topic, Group: group, Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
	}
	_, err = producer.SendBatch(context.Background(), f.DB.Pool, msgs)
	require.NoError(t, err)
}

// EventsMessage returns the id of message n (from 0, in id order) of
// message group mg on events.
func (f *Fixture) EventsMessage(t *testing.T, mg string, n int) int64 {
	t.Helper()
	return f.message(t, "events", mg, n)
}

// message returns the id of message n (from 0, in id order) of message
// group mg on topic.
func (f *Fixture) message(t *testing.T, topic, mg string, n int) int64 {
	t.Helper()
	var id int64
	require.NoError(t, f.DB.Pool.QueryRow(context.Background(), `SELECT id FROM `+f.DB.Table("outbox_published")+
		` WHERE topic = $1 AND message_group = $2 ORDER BY id OFFSET $3 LIMIT 1`, topic, mg, n).Scan(&id))
	return id
}
