package outbox_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/outboxtest"
)

// exampleDB opens a pool on DATABASE_URL (default: the postgres database
// of a local server) and creates a fresh schema in it.
func exampleDB() (*pgxpool.Pool, string, func()) {
	pool, schema, cleanup, err := outboxtest.Open(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	return pool, schema, cleanup
}

type OrderPaid struct {
	OrderID int `json:"order_id"`
}

// Send a message in a transaction and handle it with a QUEUE consumer.
func Example() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB()
	defer cleanup()

	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
		log.Fatal(err)
	}
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	client, err := outbox.NewClient(pool, outbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	// A topic is configured before anything is sent to it (a send to a
	// topic never configured fails with ErrUnknownTopic).
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders.paid"}); err != nil {
		log.Fatal(err)
	}

	// The message is written in the same transaction as the business change.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for id := 1; id <= 3; id++ {
			msg, err := outbox.NewMessage("orders.paid", OrderPaid{OrderID: id})
			if err != nil {
				return err
			}
			if _, err := producer.Send(ctx, tx, msg); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	var wg sync.WaitGroup
	wg.Add(3)
	var mu sync.Mutex
	total := 0
	consumer, err := client.NewConsumer(ctx, outbox.ConsumerConfig{
		Topic: "orders.paid",
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			defer wg.Done()
			paid, err := outbox.Decode[OrderPaid](d)
			if err != nil {
				return outbox.Permanent(err)
			}
			mu.Lock()
			total += paid.OrderID
			mu.Unlock()
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Start(ctx); err != nil {
		log.Fatal(err)
	}
	wg.Wait()
	stopCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := consumer.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("sum of handled order ids:", total)
	// Output: sum of handled order ids: 6
}

// Dead letters are kept, listed and replayed.
func ExampleClient_ReplayDeadLetters() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB()
	defer cleanup()
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
		log.Fatal(err)
	}
	client, _ := outbox.NewClient(pool, outbox.Config{Schema: schema})
	producer, _ := outbox.NewProducer(outbox.ProducerConfig{Schema: schema})
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "emails", MaxAttempts: 1}); err != nil {
		log.Fatal(err)
	}
	msg, _ := outbox.NewMessage("emails", map[string]string{"to": "ada@example.com"})
	if _, err := producer.Send(ctx, pool, msg); err != nil {
		log.Fatal(err)
	}

	failed := make(chan struct{})
	consumer, _ := client.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "emails",
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			defer close(failed)
			return fmt.Errorf("smtp: connection refused")
		}})
	_ = consumer.Start(ctx)
	<-failed
	_ = consumer.Stop(ctx) // waits for the outcome to be written

	dead, err := client.DeadLetters(ctx, "emails", 0, 10)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(dead), "dead letter:", dead[0].LastError)
	n, err := client.ReplayDeadLetters(ctx, "emails", dead[0].ID)
	fmt.Println("replayed", n, err)
	// Output:
	// 1 dead letter: smtp: connection refused
	// replayed 1 <nil>
}

// An ordered topic hands out each message group's messages one at a
// time: a claim takes the oldest message of every group, and the next one
// of a group only once the previous one is acked.
func ExampleTopicConfig_ordered() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB()
	defer cleanup()
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
		log.Fatal(err)
	}
	client, err := outbox.NewClient(pool, outbox.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "ledger.entries", Ordered: true}); err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, account := range []string{"alice", "bob", "alice", "bob"} {
			msg, err := outbox.NewMessage("ledger.entries", map[string]string{"account": account})
			if err != nil {
				return err
			}
			msg.Group = account
			if _, err := producer.Send(ctx, tx, msg); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	for round := 1; round <= 3; round++ {
		ds, err := client.Claim(ctx, "ledger.entries", "worker-1", 10)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("claim %d:", round)
		for _, d := range ds {
			fmt.Printf(" %s#%d", d.Group, d.ID)
		}
		fmt.Println()
		if err := client.Ack(ctx, ds...); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// claim 1: alice#1 bob#2
	// claim 2: alice#3 bob#4
	// claim 3:
}
