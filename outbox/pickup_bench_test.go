package outbox_test

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// BenchmarkIdlePickup measures how long an idle QUEUE consumer takes to
// start handling a message after the producer's commit returned, one
// message at a time with the consumer idle in between (W4's question):
//
//   - direct: pool and LISTEN connection straight to PostgreSQL;
//   - pgbouncer-direct-listen: pool through PgBouncer in transaction mode,
//     LISTEN connection direct (Config.ListenDSN);
//   - pgbouncer-poll-only: pool through PgBouncer, no LISTEN (PollOnly):
//     pickup waits for the poll.
//
// All use the cache_describe exec mode, which works through PgBouncer.
//
//	go test -run '^$' -bench IdlePickup -benchtime 300x ./outbox
func BenchmarkIdlePickup(b *testing.B) {
	for _, setup := range []struct {
		name     string
		bouncer  bool
		listen   bool
		pollOnly bool
	}{
		{"direct", false, false, false},
		{"pgbouncer-direct-listen", true, true, false},
		{"pgbouncer-poll-only", true, false, true},
	} {
		b.Run(setup.name, func(b *testing.B) {
			db := pgtest.NewDB(b)
			dsn := db.DSN
			if setup.bouncer {
				dsn = pgtest.PgBouncer(b, db)
			}
			pool := pgtest.NewPool(b, dsn+"&default_query_exec_mode=cache_describe")
			cfg := outbox.Config{Schema: db.Schema, PollOnly: setup.pollOnly, ListenProbeInterval: -1,
				Logger: slog.New(slog.DiscardHandler)}
			if setup.listen {
				cfg.ListenDSN = db.DSN
			}
			benchPickup(b, pool, db.Schema, cfg)
		})
	}
}

func benchPickup(b *testing.B, pool *pgxpool.Pool, schema string, cfg outbox.Config) {
	ctx := context.Background()
	client, err := outbox.NewClient(pool, cfg)
	if err != nil {
		b.Fatal(err)
	}
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: schema, AllowUnconfiguredTopics: true})
	if err != nil {
		b.Fatal(err)
	}
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "pickup"}); err != nil {
		b.Fatal(err)
	}
	started := make(chan time.Time, 1)
	consumer, err := client.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "pickup", PollInterval: 100 * time.Millisecond,
		Handler: func(context.Context, *outbox.Delivery) error { started <- time.Now(); return nil }})
	if err != nil {
		b.Fatal(err)
	}
	if err := consumer.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer consumer.Stop(ctx)
	time.Sleep(200 * time.Millisecond) // LISTEN established
	lat := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range b.N {
		tx, err := pool.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := producer.Send(ctx, tx, outbox.Message{Topic: "pickup", Payload: []byte(`{}`)}); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		committed := time.Now()
		lat[i] = max((<-started).Sub(committed), 0)
		time.Sleep(10 * time.Millisecond) // the consumer goes idle
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
