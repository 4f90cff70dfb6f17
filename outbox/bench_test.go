package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// benchSetup returns a fresh schema with a client and a producer for it.
func benchSetup(b *testing.B) (*pgtest.DB, *outbox.Client, *outbox.Producer) {
	db := pgtest.NewDB(b)
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	return db, client, producer
}

// BenchmarkSend measures one message per transaction (BEGIN, write,
// COMMIT) from 8 goroutines, as the W1 workload of bench/ does:
//
//   - bare-insert: the peer harness's raw-pgx baseline, a two-column INSERT
//     into a six-column table with two indexes, in the same database;
//   - queue: Producer.Send to a configured QUEUE topic;
//   - pubsub: Producer.Send to a configured PUB_SUB topic (Bitmap, one
//     group subscribed).
//
// msgs/s is the throughput; ns/op and allocs/op are per message (-benchmem).
//
//	go test -run '^$' -bench Send -benchmem -benchtime 20000x -count 5 ./outbox
func BenchmarkSend(b *testing.B) {
	db, client, producer := benchSetup(b)
	ctx := context.Background()
	bare := db.Table("bare")
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE `+bare+` (id bigserial PRIMARY KEY, topic text NOT NULL,
		payload jsonb NOT NULL, status smallint NOT NULL DEFAULT 0, lease_until timestamptz,
		created_at timestamptz NOT NULL DEFAULT now());
		CREATE INDEX ON `+bare+` (topic, id)`); err != nil {
		b.Fatal(err)
	}
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "queue"}); err != nil {
		b.Fatal(err)
	}
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "pubsub", Semantics: outbox.PubSub, Tracking: outbox.Bitmap}); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE `+db.Table("outbox_topics")+` SET subscribed_bits = 1 WHERE topic = 'pubsub'`); err != nil {
		b.Fatal(err)
	}
	payload := func(seq int) []byte {
		return fmt.Appendf(nil, `{"seq":%d,"body":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}`, seq)
	}
	send := map[string]func(tx pgx.Tx, seq int) error{
		"bare-insert": func(tx pgx.Tx, seq int) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+bare+` (topic, payload) VALUES ($1, $2)`, "bare", payload(seq))
			return err
		},
		"queue": func(tx pgx.Tx, seq int) error {
			_, err := producer.Send(ctx, tx, outbox.Message{Topic: "queue", Payload: payload(seq)})
			return err
		},
		"pubsub": func(tx pgx.Tx, seq int) error {
			_, err := producer.Send(ctx, tx, outbox.Message{Topic: "pubsub", Payload: payload(seq)})
			return err
		},
	}
	for _, name := range []string{"bare-insert", "queue", "pubsub"} {
		b.Run(name, func(b *testing.B) {
			b.SetParallelism(4) // 8 goroutines on 2 cores, as W1
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				seq := 0
				for pb.Next() {
					seq++
					if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error { return send[name](tx, seq) }); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
