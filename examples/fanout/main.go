// Command fanout shows PUB_SUB fan-out: three consumer groups subscribe to
// one topic and each receives every message.
//
//	go run ./examples/fanout
//
// It connects to DATABASE_URL, or, when that is not set, to the postgres
// database of a local server (postgres://postgres@127.0.0.1:5432/postgres),
// and works in a schema of its own that it drops at the end.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// OrderPlaced is the event every group receives.
type OrderPlaced struct {
	OrderID int `json:"order_id"`
}

const messages = 100

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "fanout:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
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

	// A fresh schema per run keeps the example repeatable.
	schema := fmt.Sprintf("fanout_%d", time.Now().UnixNano())
	defer pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
		return err
	}
	client, err := pgoutbox.NewClient(ctx, pool, pgoutbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	err = client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders.placed", Semantics: outbox.PubSub, Tracking: outbox.Offset})
	if err != nil {
		return err
	}

	names := []string{"billing", "shipping", "analytics"}
	counts := make([]atomic.Int64, len(names))
	for i, name := range names {
		g, err := client.NewGroup(consumergroup.Config{Topic: "orders.placed", Group: name, PollInterval: 50 * time.Millisecond},
			consumergroup.FromNow())
		if err != nil {
			return err
		}
		err = g.AddConsumer(name+"-1", func(ctx context.Context, d *outbox.Delivery) error {
			if _, err := outbox.Decode[OrderPlaced](d); err != nil {
				return outbox.Permanent(err)
			}
			counts[i].Add(1)
			return nil
		}, nil)
		if err != nil {
			return err
		}
	}
	if err := client.Start(ctx); err != nil { // subscribes the groups: they receive what is sent from now on
		return err
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for id := 1; id <= messages; id++ {
			msg, err := outbox.NewMessage("orders.placed", OrderPlaced{OrderID: id})
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
		return err
	}
	fmt.Printf("sent %d messages to orders.placed\n", messages)

	for i := range names {
		for counts[i].Load() < messages {
			select {
			case <-ctx.Done():
				return errors.New("timed out waiting for the groups")
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	if err := client.Stop(ctx); err != nil {
		return err
	}
	for i, name := range names {
		fmt.Printf("group %-9s handled %d messages\n", name, counts[i].Load())
	}
	return nil
}
