package outbox

import (
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

const meterName = "github.com/pgoutbox/pgoutbox/outbox"

// metrics are the OpenTelemetry instruments of the outbox package (a
// topic's consumers report those of its consumer group).
type metrics struct {
	sent metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider) *metrics {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter(meterName)
	// Instrument constructors only fail on invalid names; ours are constant.
	sent, _ := m.Int64Counter("pgoutbox.messages.sent", metric.WithDescription("Messages written by producers."))
	return &metrics{sent: sent}
}
