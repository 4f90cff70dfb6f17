// Package queuetest puts QUEUE messages in the states the operator tools'
// tests (admin, adminui, the pgoutbox command) show: dead-lettered, or
// held by a consumer.
package queuetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// DeadLetter sends msgs (all of one QUEUE topic) and has a consumer of the
// topic dead-letter each of them (and whatever else the topic holds) with
// reason; it returns their ids once they all are, the consumer stopped.
func DeadLetter(t testing.TB, pool *pgxpool.Pool, client *outbox.Client, reason string, msgs ...outbox.Message) []int64 {
	t.Helper()
	ctx := context.Background()
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: client.Schema()})
	require.NoError(t, err)
	ids, err := producer.SendBatch(ctx, pool, msgs)
	require.NoError(t, err)
	g := start(t, pool, client, msgs[0].Topic, func(context.Context, *outbox.Delivery) error {
		return outbox.Permanent(errors.New(reason))
	})
	defer stop(g)
	pgtest.Eventually(t, 20*time.Second, "the messages dead-lettered", func() bool {
		dead, err := g.DeadLetters(ctx, 0, 1000)
		require.NoError(t, err)
		got := map[int64]bool{}
		for _, d := range dead {
			got[d.ID] = true
		}
		for _, id := range ids {
			if !got[id] {
				return false
			}
		}
		return true
	})
	return ids
}

// Hold sends msg and has a consumer of its topic hold it (its handler
// waits) until the test ends; it returns once the handler has it.
func Hold(t testing.TB, pool *pgxpool.Pool, client *outbox.Client, msg outbox.Message) int64 {
	t.Helper()
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: client.Schema()})
	require.NoError(t, err)
	held := make(chan int64, 1)
	release := make(chan struct{})
	var once sync.Once
	g := start(t, pool, client, msg.Topic, func(ctx context.Context, d *outbox.Delivery) error {
		once.Do(func() { held <- d.ID })
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	t.Cleanup(func() { close(release); stop(g) })
	id, err := producer.Send(context.Background(), pool, msg)
	require.NoError(t, err)
	select {
	case got := <-held:
		require.Equal(t, id, got)
	case <-time.After(20 * time.Second):
		t.Fatal("queuetest: the message was not delivered")
	}
	return id
}

// start starts a consumer of QUEUE topic (a member of its group).
func start(t testing.TB, pool *pgxpool.Pool, client *outbox.Client, topic string, h outbox.Handler) *consumergroup.Group {
	t.Helper()
	g, err := consumergroup.New(pool, consumergroup.Config{Topic: topic, Group: sqlq.QueueGroup, Client: client,
		PollInterval: 20 * time.Millisecond, Concurrency: 1, BatchSize: 1})
	require.NoError(t, err)
	require.NoError(t, g.AddConsumer("queuetest", h, nil))
	require.NoError(t, g.Start(context.Background(), consumergroup.FromBeginning(false)))
	return g
}

func stop(g *consumergroup.Group) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = g.Stop(ctx)
}
