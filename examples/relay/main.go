// Command relay forwards an ordered topic to NATS JetStream and reads the
// messages back from the stream, as another team's service would.
//
//	go run ./examples/relay
//
// It connects to DATABASE_URL (or the postgres database of a local
// server) and works in the schema "relayexample" there, and to NATS_URL
// (or a local NATS server with JetStream), where it creates the stream
// RELAY_EXAMPLE and deletes it at the end.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/relay/natsrelay"
)

// OrderEvent is the payload of our messages.
type OrderEvent struct {
	Order string `json:"order"`
	State string `json:"state"`
}

const stream = "RELAY_EXAMPLE"

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	url, from := os.Getenv("DATABASE_URL"), "DATABASE_URL"
	if url == "" {
		url, from = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "the local server; set DATABASE_URL to use another"
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	cc := pool.Config().ConnConfig
	fmt.Fprintf(os.Stderr, "database %q at %s:%d (%s)\n", cc.Database, cc.Host, cc.Port, from)
	const schema = "relayexample"
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema, Logger: logger}); err != nil {
		return err
	}
	client, err := pgoutbox.NewClient(ctx, pool, pgoutbox.Config{Schema: schema, Logger: logger})
	if err != nil {
		return err
	}
	// Ordered: each customer's events reach the stream in commit order.
	err = client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders", Semantics: outbox.PubSub, Tracking: outbox.Offset, Ordered: true})
	if err != nil {
		return err
	}

	nc, err := natsrelay.Connect(natsrelay.NATSConfig{URL: cmp.Or(os.Getenv("NATS_URL"), nats.DefaultURL), Logger: logger})
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = natsrelay.EnsureStream(ctx, js, jetstream.StreamConfig{Name: stream, Subjects: []string{"example.orders.>"}})
	if err != nil {
		return fmt.Errorf("stream (is NATS running with JetStream at %s? set NATS_URL): %w", nc.Opts.Url, err)
	}
	defer js.DeleteStream(context.Background(), stream)

	pub, err := natsrelay.NewJetStreamPublisher(natsrelay.JetStreamConfig{Conn: nc, Stream: stream})
	if err != nil {
		return err
	}
	r, err := relay.New(pool, relay.Config{
		Consumer:  consumergroup.Config{Topic: "orders", Group: "nats", Client: client.Outbox()},
		Publisher: pub,
		Subject:   "example.{topic}.{message_group}",
	})
	if err != nil {
		return err
	}
	if err := r.Start(ctx, consumergroup.FromNow()); err != nil {
		return err
	}
	defer r.Stop(context.Background())

	events := []struct{ customer, order, state string }{
		{"alice", "A-1", "placed"}, {"bob", "B-1", "placed"}, {"alice", "A-1", "paid"},
		{"bob", "B-1", "cancelled"}, {"alice", "A-1", "shipped"},
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, e := range events {
			msg, err := outbox.NewMessage("orders", OrderEvent{Order: e.order, State: e.state})
			if err != nil {
				return err
			}
			msg.Group = e.customer
			if _, err := client.Send(ctx, tx, msg); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Printf("sent %d events to the topic orders\n", len(events))

	s, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	for range events {
		m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			return fmt.Errorf("reading the stream: %w", err)
		}
		meta, _ := m.Metadata()
		fmt.Printf("stream seq %d  %-26s %s  (outbox id %s)\n", meta.Sequence.Stream, m.Subject(), m.Data(), m.Headers().Get(relay.HeaderID))
	}
	return nil
}
