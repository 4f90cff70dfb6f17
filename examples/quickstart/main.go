// Command quickstart migrates pgoutbox's tables, configures a topic, sends
// messages inside a transaction, consumes them and exits.
//
//	go run ./examples/quickstart
//
// It connects to DATABASE_URL, or, when that is not set, to the postgres
// database of a local server (postgres://postgres@127.0.0.1:5432/postgres),
// and works in the schema "quickstart" there (created when missing).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Greeting is the payload of our messages.
type Greeting struct {
	To   string `json:"to"`
	Text string `json:"text"`
}

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
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

	// At boot: create or upgrade the tables (idempotent, safe from many
	// instances at once), then the one client everything is created from.
	const schema = "quickstart"
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema, Logger: logger}); err != nil {
		return err
	}
	fmt.Printf("migrated schema %q to version %d\n", schema, migrations.Latest())
	client, err := pgoutbox.NewClient(ctx, pool, pgoutbox.Config{Schema: schema, Logger: logger})
	if err != nil {
		return err
	}
	err = client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "greetings", MaxAttempts: 5, Lease: 10 * time.Second})
	if err != nil {
		return err
	}

	// Three messages, written atomically with whatever else this
	// transaction does. A rollback would leave no trace of them.
	names := []string{"Ada", "Grace", "Edsger"}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, name := range names {
			msg, err := outbox.NewMessage("greetings", Greeting{To: name, Text: "hello"})
			if err != nil {
				return err
			}
			id, err := client.Send(ctx, tx, msg)
			if err != nil {
				return err
			}
			fmt.Printf("sent message %d to %s\n", id, name)
		}
		return nil
	})
	if err != nil {
		return err
	}

	var handled atomic.Int64
	done := make(chan struct{})
	_, err = client.NewConsumer(ctx, outbox.ConsumerConfig{
		Topic:       "greetings",
		Concurrency: 2,
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			g, err := outbox.Decode[Greeting](d)
			if err != nil {
				return outbox.Permanent(err)
			}
			fmt.Printf("handled message %d (attempt %d): %s, %s\n", d.ID, d.Attempt, g.Text, g.To)
			if handled.Add(1) == int64(len(names)) {
				close(done)
			}
			return nil
		},
	})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil { // starts every consumer, group and router of the client
		return err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return errors.New("timed out waiting for messages")
	}
	stopCtx, cancelStop := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelStop()
	if err := client.Stop(stopCtx); err != nil { // stops them all, waiting for running handlers
		return err
	}
	fmt.Printf("done: %d messages sent and handled\n", handled.Load())
	return nil
}
