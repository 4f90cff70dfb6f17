package outboxtest_test

import (
	"context"
	"fmt"
	"log"

	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outboxtest"
)

// Check what a transaction sent before it commits.
func ExampleSent() {
	ctx := context.Background()
	// A pool on DATABASE_URL (default: the postgres database of a local
	// server), and a fresh schema in it, dropped by cleanup.
	pool, schema, cleanup, err := outboxtest.Open(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup()
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	client, err := outbox.NewClient(pool, outbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders.placed"}); err != nil {
		log.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	msg, _ := outbox.NewMessage("orders.placed", map[string]int{"id": 7})
	if _, err := producer.Send(ctx, tx, msg); err != nil {
		log.Fatal(err)
	}
	sent, err := outboxtest.Sent(ctx, tx, schema, "orders.placed")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(sent), string(sent[0].Payload))
	// Output: 1 {"id": 7}
}
