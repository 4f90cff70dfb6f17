// Command quickstart migrates pgoutbox's tables, configures a topic, sends
// messages inside a transaction, consumes them and exits.
//
//	go run ./examples/quickstart
//
// It connects to DATABASE_URL when set, else to a local server on
// 127.0.0.1:5432 (user postgres), else it starts a throw-away cluster from
// the local PostgreSQL binaries.
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

	"github.com/pgoutbox/pgoutbox/internal/pgfind"
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

	const schema = "quickstart"
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
		return err
	}
	fmt.Printf("migrated schema %q to version %d\n", schema, migrations.Latest())

	client, err := outbox.NewClient(pool, outbox.Config{Schema: schema, Logger: logger})
	if err != nil {
		return err
	}
	err = client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "greetings", MaxAttempts: 5, Lease: 10 * time.Second})
	if err != nil {
		return err
	}
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: schema, Logger: logger})
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
			id, err := producer.Send(ctx, tx, msg)
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
	consumer, err := client.NewConsumer(outbox.ConsumerConfig{
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
	if err := consumer.Start(ctx); err != nil {
		return err
	}
	select {
	case <-done:
	case <-ctx.Done():
		return errors.New("timed out waiting for messages")
	}
	stopCtx, cancelStop := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelStop()
	if err := consumer.Stop(stopCtx); err != nil {
		return err
	}
	fmt.Printf("done: %d messages sent and handled\n", handled.Load())
	return nil
}
