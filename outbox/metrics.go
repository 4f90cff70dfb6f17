package outbox

import (
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

const meterName = "github.com/pgoutbox/pgoutbox/outbox"

// metrics are the OpenTelemetry instruments of the outbox package.
type metrics struct {
	sent         metric.Int64Counter
	delivered    metric.Int64Counter
	acked        metric.Int64Counter
	retried      metric.Int64Counter
	deadLettered metric.Int64Counter
	handlerTime  metric.Float64Histogram
}

func newMetrics(mp metric.MeterProvider) *metrics {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter(meterName)
	// Instrument constructors only fail on invalid names; ours are constant.
	sent, _ := m.Int64Counter("pgoutbox.messages.sent", metric.WithDescription("Messages written by producers."))
	delivered, _ := m.Int64Counter("pgoutbox.messages.delivered", metric.WithDescription("Messages handed to handlers."))
	acked, _ := m.Int64Counter("pgoutbox.messages.acked", metric.WithDescription("Messages completed."))
	retried, _ := m.Int64Counter("pgoutbox.messages.retried", metric.WithDescription("Messages scheduled for another attempt."))
	dead, _ := m.Int64Counter("pgoutbox.messages.dead_lettered", metric.WithDescription("Messages dead-lettered."))
	ht, _ := m.Float64Histogram("pgoutbox.handler.duration", metric.WithUnit("s"), metric.WithDescription("Handler run time."))
	return &metrics{sent: sent, delivered: delivered, acked: acked, retried: retried, deadLettered: dead, handlerTime: ht}
}
