package pgoutbox_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outboxtest"
)

type OrderPlaced struct {
	ID int `json:"id"`
}

// One client: a QUEUE consumer and a consumer group created from it,
// started and stopped together.
func ExampleClient() {
	ctx := context.Background()
	// A pool on DATABASE_URL (default: the postgres database of a local
	// server), and a fresh schema in it.
	pool, schema, cleanup, err := outboxtest.Open(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer cleanup()
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
		log.Fatal(err)
	}
	client, err := pgoutbox.NewClient(ctx, pool, pgoutbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "emails"}); err != nil {
		log.Fatal(err)
	}
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders.placed", Semantics: outbox.PubSub}); err != nil {
		log.Fatal(err)
	}

	emailed := make(chan int, 1)
	_, err = client.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "emails", Handler: func(ctx context.Context, d *outbox.Delivery) error {
		o, err := outbox.Decode[OrderPlaced](d)
		emailed <- o.ID
		return err
	}})
	if err != nil {
		log.Fatal(err)
	}
	billed := make(chan int, 1)
	billing, err := client.NewGroup(consumergroup.Config{Topic: "orders.placed", Group: "billing"}, consumergroup.FromNow())
	if err != nil {
		log.Fatal(err)
	}
	err = billing.AddConsumer("billing-1", func(ctx context.Context, d *outbox.Delivery) error {
		o, err := outbox.Decode[OrderPlaced](d)
		billed <- o.ID
		return err
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, topic := range []string{"orders.placed", "emails"} {
			msg, err := outbox.NewMessage(topic, OrderPlaced{ID: 42})
			if err != nil {
				return err
			}
			if _, err := client.Send(ctx, tx, msg); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("billed order", <-billed)
	fmt.Println("emailed about order", <-emailed)

	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// billed order 42
	// emailed about order 42
}
