package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Every statement of sending, claiming and settling works in each of pgx's
// query exec modes (PgBouncer's transaction pooling needs exec,
// simple_protocol or cache_describe).
func TestEveryQueryExecMode(t *testing.T) {
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db := pgtest.NewDB(t)
			pool := pgtest.NewPool(t, db.DSN+"&default_query_exec_mode="+mode)
			ctx := context.Background()
			client, err := outbox.NewClient(pool, outbox.Config{Schema: db.Schema})
			require.NoError(t, err)
			producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true})
			require.NoError(t, err)
			require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "q", MaxAttempts: 2}))
			require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "p", Semantics: outbox.PubSub, Tracking: outbox.Counter}))
			topic, err := client.Topic(ctx, "p")
			require.NoError(t, err)
			require.Equal(t, outbox.Counter, topic.Tracking)

			full := outbox.Message{Topic: "q", Payload: []byte(`{"a":"\u00e9"}`), Headers: map[string]string{"h": "v"},
				Group: "g", CorrelationID: "c", Priority: 3, IdempotencyKey: "k"}
			id, err := producer.Send(ctx, pool, full)
			require.NoError(t, err)
			again, err := producer.Send(ctx, pool, full)
			require.NoError(t, err)
			require.Equal(t, id, again, "idempotency key")
			_, err = producer.Send(ctx, pool, outbox.Message{Topic: "q", Payload: []byte(`[1]`), Delay: time.Millisecond})
			require.NoError(t, err)
			_, err = producer.Send(ctx, pool, outbox.Message{Topic: "unconfigured", Payload: []byte(`{}`)})
			require.NoError(t, err)
			_, err = producer.Send(ctx, pool, outbox.Message{Topic: "p", Payload: []byte(`{"b":1}`), Headers: map[string]string{"x": "y"}})
			require.NoError(t, err)
			ids, err := producer.SendBatch(ctx, pool, []outbox.Message{full, {Topic: "q", Payload: []byte(`2`)},
				{Topic: "p", Payload: []byte(`3`)}, {Topic: "q", Payload: []byte(`4`), NotBefore: time.Now()}})
			require.NoError(t, err)
			require.Len(t, ids, 4)

			time.Sleep(5 * time.Millisecond)
			ds, err := client.Claim(ctx, "q", "me", 10)
			require.NoError(t, err)
			require.Len(t, ds, 4)
			require.Equal(t, map[string]string{"h": "v"}, ds[0].Headers)
			require.JSONEq(t, `{"a":"é"}`, string(ds[0].Payload))
			require.NoError(t, client.Ack(ctx, ds[0]))
			lost, err := client.ExtendLeases(ctx, ds[1:], time.Minute)
			require.NoError(t, err)
			require.Empty(t, lost)
			require.NoError(t, client.ExtendLease(ctx, ds[1], time.Minute))
			require.NoError(t, client.Retry(ctx, ds[1], 0, "again"))
			require.NoError(t, client.DeadLetter(ctx, ds[2], "no"))
			require.NoError(t, client.PostponeUntil(ctx, ds[3], time.Now()))
			dead, err := client.DeadLetters(ctx, "q", 0, 10)
			require.NoError(t, err)
			require.Len(t, dead, 1)
			n, err := client.ReplayDeadLetters(ctx, "q", dead[0].ID)
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			_, err = client.ExpireIdempotencyKeys(ctx)
			require.NoError(t, err)

			handled := make(chan int64, 10)
			k, err := client.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "q", PollInterval: 10 * time.Millisecond,
				Handler: func(_ context.Context, d *outbox.Delivery) error { handled <- d.ID; return nil }})
			require.NoError(t, err)
			require.NoError(t, k.Start(ctx))
			for range 3 {
				select {
				case <-handled:
				case <-time.After(10 * time.Second):
					t.Fatal("consumer did not handle the remaining messages")
				}
			}
			require.NoError(t, k.Stop(ctx))
		})
	}
}
