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
// COMMIT) from 8 goroutines, as the W1 workload of ../shared/bench does:
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

// BenchmarkClaimOrdered measures one Client.Claim of up to 100 group heads
// on an ordered topic of 1,000 message groups with 20 messages each
// (ns/op per claim; the leases are undone between claims, untimed):
//
//   - priority-0: every message at priority 0;
//   - urgent-groups: 100 more groups of 20 messages at priority 5, which
//     every claim takes first;
//   - prioritized-backlog: one more group whose head is at priority 0
//     with 5,000 messages at priority 5 behind it, which every claim reads
//     (as far as it looks ahead) and passes over.
//
// Run it as:
//
//	go test -run '^$' -bench ClaimOrdered -benchtime 100x ./outbox
func BenchmarkClaimOrdered(b *testing.B) {
	for _, variant := range []struct {
		name  string
		extra func(topic string) []outbox.Message
	}{
		{"priority-0", func(string) []outbox.Message { return nil }},
		{"urgent-groups", func(topic string) []outbox.Message {
			var msgs []outbox.Message
			for seq := range 20 {
				for g := range 100 {
					msgs = append(msgs, outbox.Message{Topic: topic, Group: fmt.Sprintf("u%03d", g), Priority: 5,
						Payload: fmt.Appendf(nil, `{"seq":%d}`, seq)})
				}
			}
			return msgs
		}},
		{"prioritized-backlog", func(topic string) []outbox.Message {
			msgs := []outbox.Message{{Topic: topic, Group: "z", Payload: []byte(`{"seq":0}`)}}
			for seq := range 5000 {
				msgs = append(msgs, outbox.Message{Topic: topic, Group: "z", Priority: 5,
					Payload: fmt.Appendf(nil, `{"seq":%d}`, seq+1)})
			}
			return msgs
		}},
	} {
		b.Run(variant.name, func(b *testing.B) {
			db, client, producer := benchSetup(b)
			ctx := context.Background()
			if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "o", Ordered: true}); err != nil {
				b.Fatal(err)
			}
			var msgs []outbox.Message
			for seq := range 20 {
				for g := range 1000 {
					msgs = append(msgs, outbox.Message{Topic: "o", Group: fmt.Sprintf("g%04d", g),
						Payload: fmt.Appendf(nil, `{"seq":%d}`, seq)})
				}
			}
			msgs = append(msgs, variant.extra("o")...)
			for start := 0; start < len(msgs); start += 1000 {
				if _, err := producer.SendBatch(ctx, db.Pool, msgs[start:min(start+1000, len(msgs))]); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := db.Pool.Exec(ctx, `ANALYZE `+db.Table("outbox")); err != nil {
				b.Fatal(err)
			}
			undo := `UPDATE ` + db.Table("outbox") + ` SET lease_owner = NULL, attempts = 0,
				available_at = created_at WHERE lease_owner IS NOT NULL`
			b.ResetTimer()
			for range b.N {
				ds, err := client.Claim(ctx, "o", "bench", 100)
				if err != nil || len(ds) != 100 {
					b.Fatalf("claimed %d: %v", len(ds), err)
				}
				b.StopTimer()
				if _, err := db.Pool.Exec(ctx, undo); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
