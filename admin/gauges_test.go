package admin_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/queuetest"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/testmetrics"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// The gauges, read through an OpenTelemetry SDK reader, report the backlog
// and the lag the test created: a QUEUE topic's ready and leased messages
// and dead letter, and a stopped group's unread messages and their age.
func TestGauges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, admin.Options{},
		outbox.TopicConfig{Name: "orders", Semantics: outbox.Queue, Ordered: true},
		outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Offset})
	// A dead letter, a message leased (an ordered topic's consumer leases
	// each message on its own), and four waiting behind it.
	queuetest.DeadLetter(t, e.db.Pool, e.client, "bad", outbox.Message{Topic: "orders", Group: "a", Payload: json.RawMessage(`{}`)})
	queuetest.Hold(t, e.db.Pool, e.client, outbox.Message{Topic: "orders", Group: "b", Payload: json.RawMessage(`{}`)})
	for range 4 {
		_, err := e.producer.Send(ctx, e.db.Pool, outbox.Message{Topic: "orders", Group: "b", Payload: json.RawMessage(`{}`)})
		require.NoError(t, err)
	}
	g := e.startGroup(t, "events", "billing", &recorder{seen: map[int64]int{}})
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, g.Stop(stopCtx))
	e.send(t, "events", 25, 0)

	reader := sdkmetric.NewManualReader()
	reg, err := e.admin.RegisterGauges(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	require.NoError(t, err)
	points := testmetrics.Points(t, reader)
	value := func(name string, kv ...string) float64 {
		t.Helper()
		p, ok := testmetrics.Point(points, name, kv...)
		require.True(t, ok, "no %s %v in %v", name, kv, points)
		return p.Value
	}
	require.EqualValues(t, 4, value("pgoutbox.queue.ready", "topic", "orders"))
	require.EqualValues(t, 1, value("pgoutbox.queue.leased", "topic", "orders"))
	require.Zero(t, value("pgoutbox.queue.scheduled", "topic", "orders"))
	require.EqualValues(t, 1, value("pgoutbox.queue.dead_letters", "topic", "orders"))
	require.GreaterOrEqual(t, value("pgoutbox.queue.oldest_ready_age", "topic", "orders"), 0.0)
	require.EqualValues(t, 25, value("pgoutbox.group.unread", "topic", "events", "group", "billing"))
	require.Positive(t, value("pgoutbox.group.lag", "topic", "events", "group", "billing"))
	require.EqualValues(t, 1, value("pgoutbox.group.active", "topic", "events", "group", "billing", "state", "ACTIVE"))
	require.Zero(t, value("pgoutbox.group.dead_letters", "topic", "events", "group", "billing"))
	require.Zero(t, value("pgoutbox.group.queued", "topic", "events", "group", "billing"))

	// What the log keeps: the 25 messages of events (held back by billing)
	// and orders' 6, the partitions, and a topic nobody reads.
	require.EqualValues(t, 25, value("pgoutbox.topic.stored", "topic", "events"))
	require.EqualValues(t, 1, value("pgoutbox.topic.groups", "topic", "events"))
	require.Positive(t, value("pgoutbox.topic.oldest_age", "topic", "events"))
	require.EqualValues(t, 6, value("pgoutbox.topic.stored", "topic", "orders"))
	require.Positive(t, value("pgoutbox.storage.partitions"))
	require.NoError(t, e.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "unread", Semantics: outbox.PubSub, Tracking: outbox.Offset}))
	e.send(t, "unread", 3, 0)
	points = testmetrics.Points(t, reader)
	require.EqualValues(t, 3, value("pgoutbox.topic.stored", "topic", "unread"))
	require.Zero(t, value("pgoutbox.topic.groups", "topic", "unread"), "a PUB_SUB topic nobody reads")

	require.NoError(t, reg.Unregister())
	require.Empty(t, testmetrics.Points(t, reader), "nothing reported once unregistered")
}
