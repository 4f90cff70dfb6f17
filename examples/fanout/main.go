// Command fanout shows PUB_SUB fan-out: three consumer groups subscribe to
// one topic and each receives every message.
//
//	go run ./examples/fanout
//
// It connects to DATABASE_URL when set, else to a local server on
// 127.0.0.1:5432 (user postgres), else it starts a throw-away cluster from
// the local PostgreSQL binaries.
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

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/pgfind"
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
	dsn, stop, err := pgfind.DatabaseURL(ctx)
	if err != nil {
		return err
	}
	defer stop()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()

	// A fresh schema per run keeps the example repeatable.
	schema := fmt.Sprintf("fanout_%d", time.Now().UnixNano())
	defer pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+schema+` CASCADE`)
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
		return err
	}
	client, err := outbox.NewClient(pool, outbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	err = client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "orders.placed", Semantics: outbox.PubSub, Tracking: outbox.Offset})
	if err != nil {
		return err
	}

	names := []string{"billing", "shipping", "analytics"}
	counts := make([]atomic.Int64, len(names))
	var groups []*consumergroup.Group
	for i, name := range names {
		g, err := consumergroup.New(pool, consumergroup.Config{Topic: "orders.placed", Group: name, Schema: schema, PollInterval: 50 * time.Millisecond})
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
		if err := g.Start(ctx, consumergroup.FromNow()); err != nil {
			return err
		}
		groups = append(groups, g)
	}

	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: schema})
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for id := 1; id <= messages; id++ {
			msg, err := outbox.NewMessage("orders.placed", OrderPlaced{OrderID: id})
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
	for _, g := range groups {
		if err := g.Stop(ctx); err != nil {
			return err
		}
	}
	for i, name := range names {
		fmt.Printf("group %-9s handled %d messages\n", name, counts[i].Load())
	}
	return nil
}
