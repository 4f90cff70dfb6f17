package consumergroup

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testlog"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// The lease keeper warns about a batch taken over only when it really
// was: a batch the completer has just finished (its row deleted, not yet
// out of the held list) is no takeover. It warned for those, several times
// an hour in a quiet deployment.
func TestLeaseKeeperWarnsOnlyForRealTakeovers(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
	require.NoError(t, err)
	require.NoError(t, client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Offset}))
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema, AllowUnconfiguredTopics: true})
	require.NoError(t, err)
	logs := &testlog.Buffer{}
	g, err := New(db.Pool, Config{Client: client, Topic: "events", Group: "g", PollInterval: 20 * time.Millisecond, BatchSize: 5,
		Logger: logs.Logger()})
	require.NoError(t, err)
	var finished sync.WaitGroup
	// Between a batch's completion and its leaving the held list, the
	// keeper runs: the batch row is gone.
	g.testBatchFinished = func(int64) { g.run.eng.ExtendLeases(g.run.hbPool, g.topic.Lease); finished.Done() }
	block := make(chan struct{})
	var blocked sync.Once
	blockedNow := make(chan struct{})
	require.NoError(t, g.AddConsumer("m", func(ctx context.Context, d *outbox.Delivery) error {
		if string(d.Payload) == `"hold"` {
			blocked.Do(func() { close(blockedNow) })
			<-block
		}
		return nil
	}, nil))
	require.NoError(t, g.Start(ctx, FromNow()))
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = g.Stop(stopCtx)
	}()

	finished.Add(4)
	for range 4 { // four batches, each completed in its own step
		msgs := make([]outbox.Message, 5)
		for i := range msgs {
			msgs[i] = outbox.Message{Topic: "events", Payload: json.RawMessage(`{}`)}
		}
		_, err := producer.SendBatch(ctx, db.Pool, msgs)
		require.NoError(t, err)
		time.Sleep(30 * time.Millisecond)
	}
	finished.Wait()
	require.NotContains(t, logs.String(), "taken over", "finished batches reported as taken over")

	// A real takeover still warns: the batch row goes while its handler runs.
	finished.Add(1)
	_, err = producer.Send(ctx, db.Pool, outbox.Message{Topic: "events", Payload: json.RawMessage(`"hold"`)})
	require.NoError(t, err)
	<-blockedNow
	_, err = db.Pool.Exec(ctx, `DELETE FROM `+db.Table("outbox_group_batches"))
	require.NoError(t, err)
	g.run.eng.ExtendLeases(g.run.hbPool, g.topic.Lease)
	require.Equal(t, 1, strings.Count(logs.String(), "taken over"), logs.String())
	close(block)
	finished.Wait()
}
