package router

import (
	"context"

	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

type metrics struct {
	meter                                                metric.Meter
	acked, nacked, deadLettered, duplicates, rateLimited metric.Int64Counter
	refused                                              metric.Int64Counter // by pool
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
		meter:        m,
		acked:        c("pgoutbox.router.acked", "Messages delivered (or refused for good) and acked."),
		nacked:       c("pgoutbox.router.nacked", "Messages nacked for redelivery."),
		deadLettered: c("pgoutbox.router.dead_lettered", "Messages dead-lettered for a configuration error."),
		duplicates:   c("pgoutbox.router.duplicates", "Deliveries of messages already in flight."),
		rateLimited:  c("pgoutbox.router.rate_limited", "Waits for a rate-limit permit."),
		refused: c("pgoutbox.router.pool.refused",
			"Messages a pool had no room for (or their message group held its share of it), sent back to their source undelivered: back-pressure."),
	}
}

// Breaker states as the gauge pgoutbox.router.breaker.state reports them.
const (
	breakerClosed   = 0
	breakerHalfOpen = 1
	breakerOpen     = 2
)

// observe registers the gauges of a running router: per pool, the
// messages queued and being delivered; per target host, its circuit
// breaker's state (0 closed, 1 half-open, 2 open).
func (r *Router) observe() (metric.Registration, error) {
	m := r.metrics.meter
	queued, err := m.Int64ObservableGauge("pgoutbox.router.pool.queued",
		metric.WithDescription("Messages waiting in a router pool for a worker."))
	if err != nil {
		return nil, err
	}
	inFlight, err := m.Int64ObservableGauge("pgoutbox.router.pool.in_flight",
		metric.WithDescription("Messages a router pool's workers are delivering."))
	if err != nil {
		return nil, err
	}
	breaker, err := m.Int64ObservableGauge("pgoutbox.router.breaker.state",
		metric.WithDescription("A target host's circuit breaker: 0 closed, 1 half-open, 2 open."))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, p := range r.Pools() {
			attrs := metric.WithAttributes(attribute.String("pool", p.Code))
			o.ObserveInt64(queued, int64(p.Queued), attrs)
			o.ObserveInt64(inFlight, int64(p.InFlight), attrs)
		}
		for host, state := range r.mediator.breakerStates() {
			v := int64(breakerClosed)
			switch state {
			case gobreaker.StateHalfOpen:
				v = breakerHalfOpen
			case gobreaker.StateOpen:
				v = breakerOpen
			}
			o.ObserveInt64(breaker, v, metric.WithAttributes(attribute.String("host", host)))
		}
		return nil
	}, queued, inFlight, breaker)
}
