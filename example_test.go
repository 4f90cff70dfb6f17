package pgoutbox_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
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

// A handler whose effect is a write to the same database acks its message
// in the transaction that writes it: the effect and the ack commit
// together, so a redelivery (after a crash, or a lease that ran out)
// finds the message acked and the effect there once.
func ExampleConsumer_AckTx() {
	ctx := context.Background()
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
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "invoices"}); err != nil {
		log.Fatal(err)
	}
	invoices := pgx.Identifier{schema, "invoices"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE `+invoices+` (order_id int PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}

	done := make(chan int, 1)
	var consumer *pgoutbox.Consumer
	consumer, err = client.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "invoices", Handler: func(ctx context.Context, d *outbox.Delivery) error {
		o, err := outbox.Decode[OrderPlaced](d)
		if err != nil {
			return outbox.Permanent(err)
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO `+invoices+` (order_id) VALUES ($1)`, o.ID); err != nil {
				return err
			}
			return consumer.AckTx(ctx, tx, d) // last, just before the commit
		})
		if err == nil {
			done <- o.ID
		}
		return err
	}})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		msg, err := outbox.NewMessage("invoices", OrderPlaced{ID: 7})
		if err != nil {
			return err
		}
		_, err = client.Send(ctx, tx, msg)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("invoiced order", <-done)

	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// invoiced order 7
}

// Health probes: /healthz while the client is live, /readyz while it is
// ready, each answering 503 with the reasons otherwise.
func ExampleClient_HealthHandler() {
	ctx := context.Background()
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
	mux := http.NewServeMux()
	mux.Handle("/healthz", client.HealthHandler())
	mux.Handle("/readyz", client.HealthHandler())

	probe := func(path string) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		fmt.Println(path, rec.Code)
	}
	probe("/readyz") // not started yet
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
	probe("/healthz")
	probe("/readyz")
	h := client.Health(ctx)
	fmt.Println("live:", h.Live, "ready:", h.Ready, "database reachable:", h.Database.Reachable)
	if err := client.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// /readyz 503
	// /healthz 200
	// /readyz 200
	// live: true ready: true database reachable: true
}
