// Package tracing starts pgoutbox's spans, following the OpenTelemetry
// messaging semantic conventions, and carries their context from a send
// to its handlers and router deliveries in the message's headers, as W3C
// trace context (traceparent, tracestate):
//
//   - "send {topic}" (producer): Send and SendBatch; its context goes into
//     the headers of the messages written;
//   - "receive {topic}" (consumer): a claim of a batch;
//   - "process {topic}" (consumer): a handler's call, a child of the
//     context the message carries, so a trace runs from the send through
//     the handler (and what the handler does with its context);
//   - "deliver {topic}" (client): the router's HTTP call, which carries
//     its context on to the receiver.
//
// With no TracerProvider nothing is recorded, and a send still carries a
// context the caller's ctx already had.
package tracing

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// System is the messaging.system attribute of every span.
const System = "pgoutbox"

// Attribute keys of the messaging semantic conventions.
const (
	keySystem        = attribute.Key("messaging.system")
	keyDestination   = attribute.Key("messaging.destination.name")
	keyOperationType = attribute.Key("messaging.operation.type")
	keyOperationName = attribute.Key("messaging.operation.name")
	keyMessageID     = attribute.Key("messaging.message.id")
	keyBatchCount    = attribute.Key("messaging.batch.message_count")
	keyConsumerGroup = attribute.Key("messaging.consumer.group.name")
	keyAttempt       = attribute.Key("pgoutbox.attempt")
	keyHTTPStatus    = attribute.Key("http.response.status_code")
)

// Tracer starts pgoutbox's spans on a TracerProvider.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TraceContext
}

// New returns a tracer on tp (nil: record nothing).
func New(tp trace.TracerProvider) *Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return &Tracer{tracer: tp.Tracer("github.com/pgoutbox/pgoutbox")}
}

// start starts the span "{op} {topic}" with the messaging attributes
// every span has, attrs, and opts.
func (t *Tracer) start(ctx context.Context, op, opType, topic string, kind trace.SpanKind, attrs []attribute.KeyValue,
	opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !t.recording() {
		// Nothing records: keep ctx (and its span context, which a
		// send still carries) without the cost of a span.
		return ctx, noop.Span{}
	}
	attrs = append(attrs, keySystem.String(System), keyDestination.String(topic), keyOperationType.String(opType),
		keyOperationName.String(op))
	opts = append(opts, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
	return t.tracer.Start(ctx, op+" "+topic, opts...)
}

// recording reports whether the provider records spans.
func (t *Tracer) recording() bool {
	_, isNoop := t.tracer.(noop.Tracer)
	return !isNoop
}

// Send starts the span of a send of n messages to topic.
func (t *Tracer) Send(ctx context.Context, topic string, n int) (context.Context, trace.Span) {
	var attrs []attribute.KeyValue
	if n > 1 {
		attrs = append(attrs, keyBatchCount.Int(n))
	}
	return t.start(ctx, "send", "send", topic, trace.SpanKindProducer, attrs)
}

// Inject returns headers with ctx's trace context added, or headers itself
// when ctx has none (headers is not modified).
func (t *Tracer) Inject(ctx context.Context, headers map[string]string) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return headers
	}
	out := make(map[string]string, len(headers)+2)
	for k, v := range headers {
		out[k] = v
	}
	t.prop.Inject(ctx, propagation.MapCarrier(out))
	return out
}

// Sent records the ids a send wrote.
func Sent(span trace.Span, ids ...int64) {
	if span.IsRecording() && len(ids) == 1 {
		span.SetAttributes(keyMessageID.String(strconv.FormatInt(ids[0], 10)))
	}
}

// Received records the span of a claim of n messages of topic (group ""
// for a QUEUE topic) that began at start and ended now. Claims that find
// nothing make no span (an idle consumer looks every few milliseconds).
func (t *Tracer) Received(ctx context.Context, topic, group string, n int, start time.Time) {
	if !t.recording() || n == 0 {
		return
	}
	attrs := []attribute.KeyValue{keyBatchCount.Int(n)}
	if group != "" {
		attrs = append(attrs, keyConsumerGroup.String(group))
	}
	_, span := t.start(ctx, "receive", "receive", topic, trace.SpanKindConsumer, attrs, trace.WithTimestamp(start))
	span.End()
}

// Process starts the span of a handler's call for message id of topic
// (group "" for a QUEUE topic), a child of the context headers carry.
func (t *Tracer) Process(ctx context.Context, topic, group string, id int64, attempt int, headers map[string]string) (context.Context, trace.Span) {
	if !t.recording() {
		return ctx, noop.Span{}
	}
	ctx = t.prop.Extract(ctx, propagation.MapCarrier(headers))
	attrs := []attribute.KeyValue{keyMessageID.String(strconv.FormatInt(id, 10)), keyAttempt.Int(attempt)}
	if group != "" {
		attrs = append(attrs, keyConsumerGroup.String(group))
	}
	return t.start(ctx, "process", "process", topic, trace.SpanKindConsumer, attrs)
}

// ProcessBatch starts the span of a batch handler's call for messages of
// topic and group, linked to the trace context each message carries.
func (t *Tracer) ProcessBatch(ctx context.Context, topic, group string, headers []map[string]string) (context.Context, trace.Span) {
	if !t.recording() {
		return ctx, noop.Span{}
	}
	var links []trace.Link
	for _, h := range headers {
		if sc := trace.SpanContextFromContext(t.prop.Extract(context.Background(), propagation.MapCarrier(h))); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	attrs := []attribute.KeyValue{keyBatchCount.Int(len(headers)), keyConsumerGroup.String(group)}
	return t.start(ctx, "process", "process", topic, trace.SpanKindConsumer, attrs, trace.WithLinks(links...))
}

// Deliver starts the span of the router's HTTP call for message id of
// topic, a child of the context carrier holds, and puts its context in
// the request's headers.
func (t *Tracer) Deliver(ctx context.Context, topic, id string, carrier map[string]string, req http.Header) (context.Context, trace.Span) {
	if !t.recording() {
		if carrier["traceparent"] != "" {
			// Nothing records here: the receiver still joins the
			// message's trace.
			t.prop.Inject(t.prop.Extract(ctx, propagation.MapCarrier(carrier)), propagation.HeaderCarrier(req))
		}
		return ctx, noop.Span{}
	}
	ctx = t.prop.Extract(ctx, propagation.MapCarrier(carrier))
	ctx, span := t.start(ctx, "deliver", "send", topic, trace.SpanKindClient, []attribute.KeyValue{keyMessageID.String(id)})
	t.prop.Inject(ctx, propagation.HeaderCarrier(req))
	return ctx, span
}

// HTTPStatus records the response's status code.
func HTTPStatus(span trace.Span, code int) {
	if span.IsRecording() {
		span.SetAttributes(keyHTTPStatus.Int(code))
	}
}

// End ends span, recording err as its error status.
func End(span trace.Span, err error) {
	if !span.IsRecording() {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
