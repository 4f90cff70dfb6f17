package relay_test

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outboxtest"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/natsrelay"
)

// A relay forwards the ordered topic "orders" to a JetStream stream, one
// subject per customer, in the order each customer's transactions
// committed. It connects to NATS_URL, or to a local server.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, schema, cleanup, err := outboxtest.Open(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup()
	client, err := outbox.NewClient(pool, outbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	err = client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders", Semantics: outbox.PubSub, Tracking: outbox.Offset, Ordered: true})
	if err != nil {
		log.Fatal(err)
	}

	nc, err := natsrelay.Connect(natsrelay.NATSConfig{URL: cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL)})
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	// The stream, with the relay's duplicate window. (Named after the
	// schema so that examples running at once do not share it.)
	stream, prefix := strings.ToUpper(schema), schema
	if _, err := natsrelay.EnsureStream(ctx, js, jetstream.StreamConfig{Name: stream, Subjects: []string{prefix + ".>"}}); err != nil {
		log.Fatal(err)
	}
	defer js.DeleteStream(context.Background(), stream)

	pub, err := natsrelay.NewJetStreamPublisher(natsrelay.JetStreamConfig{Conn: nc, Stream: stream})
	if err != nil {
		log.Fatal(err)
	}
	r, err := relay.New(pool, relay.Config{
		Consumer:  consumergroup.Config{Topic: "orders", Schema: schema},
		Publisher: pub,
		Subject:   prefix + ".{topic}.{message_group}",
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Start(ctx, consumergroup.FromNow()); err != nil {
		log.Fatal(err)
	}
	defer r.Stop(context.Background())

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, step := range []string{"placed", "paid", "shipped"} {
			msg, err := outbox.NewMessage("orders", map[string]string{"order": "A-1", "state": step})
			if err != nil {
				return err
			}
			msg.Group = "customer-7"
			if _, err := producer.Send(ctx, tx, msg); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	// Read the stream as any NATS consumer would.
	s, err := js.Stream(ctx, stream)
	if err != nil {
		log.Fatal(err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(strings.TrimPrefix(m.Subject(), prefix+"."), string(m.Data()))
	}
	// Output:
	// orders.customer-7 {"order": "A-1", "state": "placed"}
	// orders.customer-7 {"order": "A-1", "state": "paid"}
	// orders.customer-7 {"order": "A-1", "state": "shipped"}
}
