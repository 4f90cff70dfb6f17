package admin_test

import (
	"context"
	"fmt"
	"log"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outboxtest"
)

// See a QUEUE topic's backlog and replay its dead letters, by name.
func Example() {
	ctx := context.Background()
	pool, schema, cleanup, err := outboxtest.Open(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup()
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
		log.Fatal(err)
	}
	client, err := outbox.NewClient(pool, outbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "emails", Semantics: outbox.Queue}); err != nil {
		log.Fatal(err)
	}
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		if _, err := producer.Send(ctx, pool, outbox.Message{Topic: "emails", Payload: []byte(`{}`)}); err != nil {
			log.Fatal(err)
		}
	}
	claimed, err := client.Claim(ctx, "emails", "example", 1)
	if err != nil {
		log.Fatal(err)
	}
	if err := client.DeadLetter(ctx, claimed[0], "mailbox unavailable"); err != nil {
		log.Fatal(err)
	}

	adm, err := admin.New(client, admin.Options{})
	if err != nil {
		log.Fatal(err)
	}
	t, err := adm.Topic(ctx, "emails")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s: %d ready, %d dead letters\n", t.Name, t.Ready, t.DeadLetters)
	n, err := adm.ReplayDeadLetters(ctx, "emails", "")
	if err != nil {
		log.Fatal(err)
	}
	t, err = adm.Topic(ctx, "emails")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("replayed %d: %d ready, %d dead letters\n", n, t.Ready, t.DeadLetters)
	// Output:
	// emails: 2 ready, 1 dead letters
	// replayed 1: 3 ready, 0 dead letters
}
