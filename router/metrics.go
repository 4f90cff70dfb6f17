package router

import (
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

type metrics struct {
	acked, nacked, deadLettered, duplicates, rateLimited metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider) *metrics {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/pgoutbox/pgoutbox/router")
	c := func(name, desc string) metric.Int64Counter {
		ctr, _ := m.Int64Counter(name, metric.WithDescription(desc)) // fails only on invalid names
		return ctr
	}
	return &metrics{
		acked:        c("pgoutbox.router.acked", "Messages delivered (or refused for good) and acked."),
		nacked:       c("pgoutbox.router.nacked", "Messages nacked for redelivery."),
		deadLettered: c("pgoutbox.router.dead_lettered", "Messages dead-lettered for a configuration error."),
		duplicates:   c("pgoutbox.router.duplicates", "Deliveries of messages already in flight."),
		rateLimited:  c("pgoutbox.router.rate_limited", "Waits for a rate-limit permit."),
	}
}
