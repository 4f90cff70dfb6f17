package pgoutbox_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// A message sent in a request's span is one trace with that request, the
// send, the router's delivery and the receiver's HTTP request (the
// receiver reads the W3C traceparent), and with a QUEUE handler's span;
// each span follows the messaging conventions.
func TestOneTraceFromSendToReceiver(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDB(t)
	ctx := context.Background()
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	var mu sync.Mutex
	var received []trace.SpanContext
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
		mu.Lock()
		received = append(received, sc)
		mu.Unlock()
		_, _ = w.Write([]byte(`{"ack":true}`))
	}))
	defer srv.Close()

	c, err := pgoutbox.NewClient(ctx, db.Pool, pgoutbox.Config{Schema: db.Schema, TracerProvider: tp, NoMaintenance: true})
	require.NoError(t, err)
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "events", Semantics: outbox.PubSub, Tracking: outbox.Offset}))
	require.NoError(t, c.ConfigureTopic(ctx, outbox.TopicConfig{Name: "jobs"}))
	rt, err := c.NewRouter(router.Config{AllowedHosts: []string{strings.TrimPrefix(srv.URL, "http://")},
		Pools: []router.PoolConfig{{Code: "P", Concurrency: 2}}})
	require.NoError(t, err)
	gs, err := router.NewGroupSource(router.GroupSourceConfig{Pool: c.Pool(),
		Group: consumergroup.Config{Client: c.Outbox(), Topic: "events", Group: "webhooks", PollInterval: 20 * time.Millisecond}})
	require.NoError(t, err)
	rt.AddSource(gs)
	handled := make(chan trace.SpanContext, 1)
	_, err = c.NewConsumer(ctx, outbox.ConsumerConfig{Topic: "jobs", PollInterval: 20 * time.Millisecond,
		Handler: func(ctx context.Context, d *outbox.Delivery) error {
			handled <- trace.SpanContextFromContext(ctx)
			return nil
		}})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, c.Stop(stopCtx))
	}()

	reqCtx, request := tp.Tracer("test").Start(ctx, "POST /orders")
	send(t, c, "events", 1, map[string]string{router.HeaderPool: "P", router.HeaderTarget: srv.URL + "/hook"})
	sendIn(t, reqCtx, c, "events", map[string]string{router.HeaderPool: "P", router.HeaderTarget: srv.URL + "/hook"})
	sendIn(t, reqCtx, c, "jobs", nil)
	request.End()

	pgtest.Eventually(t, 30*time.Second, "both deliveries received", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(received) == 2
	})
	var inHandler trace.SpanContext
	select {
	case inHandler = <-handled:
	case <-time.After(30 * time.Second):
		t.Fatal("the QUEUE handler was not called")
	}
	traceID := request.SpanContext().TraceID()
	mu.Lock()
	var joined int
	for _, sc := range received {
		require.True(t, sc.IsValid(), "the receiver got no traceparent")
		if sc.TraceID() == traceID {
			joined++
		}
	}
	mu.Unlock()
	require.Equal(t, 1, joined, "the message sent in the request's span reached the receiver in its trace; the other in its own")
	require.Equal(t, traceID, inHandler.TraceID(), "the handler runs in the sender's trace")

	// The spans of the request's trace, parent by parent.
	pgtest.Eventually(t, 10*time.Second, "the spans ended", func() bool {
		return len(byName(spans.Ended(), traceID)["deliver events"]) == 1 && len(byName(spans.Ended(), traceID)["process jobs"]) == 1
	})
	got := byName(spans.Ended(), traceID)
	sendSpan, deliver, process := got["send events"][0], got["deliver events"][0], got["process jobs"][0]
	require.Equal(t, request.SpanContext().SpanID(), sendSpan.Parent().SpanID())
	require.Equal(t, trace.SpanKindProducer, sendSpan.SpanKind())
	require.Equal(t, sendSpan.SpanContext().SpanID(), deliver.Parent().SpanID(), "the delivery is a child of the send")
	require.Equal(t, trace.SpanKindClient, deliver.SpanKind())
	require.Equal(t, got["send jobs"][0].SpanContext().SpanID(), process.Parent().SpanID(), "the handler's span is a child of the send")
	require.Equal(t, trace.SpanKindConsumer, process.SpanKind())
	attrs := map[string]string{}
	for _, kv := range deliver.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	require.Equal(t, "pgoutbox", attrs["messaging.system"])
	require.Equal(t, "events", attrs["messaging.destination.name"])
	require.Equal(t, "200", attrs["http.response.status_code"])
	mu.Lock()
	for _, sc := range received {
		if sc.TraceID() == traceID {
			require.Equal(t, deliver.SpanContext().SpanID(), sc.SpanID(), "the receiver's parent is the delivery span")
		}
	}
	mu.Unlock()
	var receives int
	for _, s := range spans.Ended() {
		if s.Name() == "receive jobs" || s.Name() == "receive events" {
			receives++
		}
	}
	require.Positive(t, receives, "claims that found work have receive spans")
}

func sendIn(t *testing.T, ctx context.Context, c *pgoutbox.Client, topic string, headers map[string]string) {
	t.Helper()
	tx, err := c.Pool().Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	msg, err := outbox.NewMessage(topic, map[string]string{"order": "42"})
	require.NoError(t, err)
	msg.Headers = headers
	_, err = c.Send(ctx, tx, msg)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
}

func byName(spans []sdktrace.ReadOnlySpan, traceID trace.TraceID) map[string][]sdktrace.ReadOnlySpan {
	out := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		if s.SpanContext().TraceID() == traceID {
			out[s.Name()] = append(out[s.Name()], s)
		}
	}
	return out
}
