package outbox_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
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
	app, err := pgoutbox.NewClient(ctx, pool, pgoutbox.Config{Schema: schema, NoMaintenance: true})
	if err != nil {
		log.Fatal(err)
	}
	consumer, err := app.NewConsumer(ctx, outbox.ConsumerConfig{
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

// An ordered topic hands out each message group's messages one at a
// time, in the order they were sent: a consumer gets the next message of
// a group only once the previous one is acked, while groups go on side by
// side.
func ExampleTopicConfig_ordered() {
	ctx := context.Background()
	pool, schema, cleanup := exampleDB()
	defer cleanup()
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
		log.Fatal(err)
	}
	app, err := pgoutbox.NewClient(ctx, pool, pgoutbox.Config{Schema: schema, NoMaintenance: true})
	if err != nil {
		log.Fatal(err)
	}
	if err := app.ConfigureTopic(ctx, outbox.TopicConfig{Name: "ledger.entries", Ordered: true}); err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i, account := range []string{"alice", "bob", "alice", "bob"} {
			msg, err := outbox.NewMessage("ledger.entries", map[string]int{"entry": i + 1})
			if err != nil {
				return err
			}
			msg.Group = account
			if _, err := app.Send(ctx, tx, msg); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Add(4)
	seen := map[string][]int{}
	consumer, err := app.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "ledger.entries", Concurrency: 4,
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			defer wg.Done()
			e, err := outbox.Decode[map[string]int](d)
			if err != nil {
				return outbox.Permanent(err)
			}
			mu.Lock()
			seen[d.Group] = append(seen[d.Group], e["entry"])
			mu.Unlock()
			return nil
		}})
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Start(ctx); err != nil {
		log.Fatal(err)
	}
	wg.Wait()
	if err := consumer.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("alice:", seen["alice"])
	fmt.Println("bob:", seen["bob"])
	// Output:
	// alice: [1 3]
	// bob: [2 4]
}
