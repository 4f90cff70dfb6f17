package admin_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/pgoutbox/pgoutbox"
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
	client, err := pgoutbox.NewClient(ctx, pool, pgoutbox.Config{Schema: schema, NoMaintenance: true})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "emails", Semantics: outbox.Queue}); err != nil {
		log.Fatal(err)
	}
	send := func(n int) {
		for range n {
			if _, err := client.Send(ctx, pool, outbox.Message{Topic: "emails", Payload: []byte(`{}`)}); err != nil {
				log.Fatal(err)
			}
		}
	}
	adm, err := admin.New(client.Outbox(), admin.Options{}) // or client.Admin()
	if err != nil {
		log.Fatal(err)
	}

	// A consumer that cannot deliver the first email dead-letters it.
	send(1)
	consumer, err := client.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "emails", PollInterval: 10 * time.Millisecond,
		Handler: func(context.Context, *outbox.Delivery) error {
			return outbox.Permanent(errors.New("mailbox unavailable"))
		}})
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Start(ctx); err != nil {
		log.Fatal(err)
	}
	for {
		if t, err := adm.Topic(ctx, "emails"); err != nil {
			log.Fatal(err)
		} else if t.DeadLetters == 1 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := consumer.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	send(2)

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
