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
	heads, err := client.Claim(ctx, "orders", "operator", 10)
	require.NoError(t, err)
	require.Len(t, heads, 3, "one head per message group")
	for _, d := range heads {
		switch d.Group {
		case "cust-99":
			f.DeadHead = d.ID
			require.NoError(t, client.DeadLetter(ctx, d, QueueDeadError))
		case "cust-5":
			f.RetryHead = d.ID
			require.NoError(t, client.Retry(ctx, d, time.Hour, RetryError))
		default:
			require.NoError(t, client.Ack(ctx, d))
		}
	}

	f.Group, err = consumergroup.New(db.Pool, consumergroup.Config{Topic: "events", Group: "billing", Client: client,
		PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, f.Group.AddConsumer("m", func(_ context.Context, d *outbox.Delivery) error {
		switch d.Group {
		case "cust-99":
			return outbox.Permanent(errors.New(GroupDeadError))
		case "cust-5":
			return outbox.RetryAfter(time.Hour, errors.New(RetryError))
		}
		return nil
	}, nil))
	require.NoError(t, f.Group.Start(ctx, consumergroup.FromNow()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = f.Group.Stop(ctx)
	})
	f.send(t, "events")
	pgtest.Eventually(t, 30*time.Second, "billing blocked on cust-99 and cust-5, done with cust-1", func() bool {
		h, err := f.Group.Health(ctx, 0)
		require.NoError(t, err)
		blocked, err := f.Group.BlockedGroups(ctx, 0)
		require.NoError(t, err)
		return len(blocked) == 2 && h.Unread == 0 && h.LeasedBatches+h.LeasedRetries == 0
	})
	return f
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
	var id int64
	require.NoError(t, f.DB.Pool.QueryRow(context.Background(), `SELECT id FROM `+f.DB.Table("outbox_published")+
		` WHERE topic = 'events' AND message_group = $1 ORDER BY id OFFSET $2 LIMIT 1`, mg, n).Scan(&id))
	return id
}
