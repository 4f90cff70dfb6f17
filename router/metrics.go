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
	acked, nacked, deadLettered, duplicates, rateLimited metric.Int64Counter // the first three by pool, host and result
	refused                                              metric.Int64Counter // by pool
	defaultPool                                          metric.Int64Counter // by the pool asked for
	delivery                                             metric.Float64Histogram
}

// The result attribute of the settlement counters and the delivery
// histogram: a delivery's Result, or why a message was not delivered.
const (
	resultBreakerOpen  = "BREAKER_OPEN"  // the host's circuit was open: not called
	resultNotDelivered = "NOT_DELIVERED" // sent back before any call: held back, pool full or draining
	resultDuplicate    = "DUPLICATE"     // the same message already in flight
	resultNotAllowed   = "NOT_ALLOWED"   // the target is not allowed (a dead letter)
	resultMapperPanic  = "MAPPER_PANIC"
)

// resultOf is the result attribute of a delivery's outcome.
func resultOf(o Outcome) string {
	if o.notTried {
		return resultBreakerOpen
	}
	return o.Result.String()
}

// settleAttrs are the attributes of a settlement of m: its pool (the one
// it was routed to, else the one it asked for), its target's host, and
// result.
func settleAttrs(m *Message, result string) metric.MeasurementOption {
	pool := m.poolCode
	if pool == "" {
		pool = m.Pool
	}
	host := targetSubject(m.Target)
	if m.target != nil {
		host = m.target.Host
	}
	return metric.WithAttributes(attribute.String("pool", pool), attribute.String("host", host), attribute.String("result", result))
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
		acked:        c("pgoutbox.router.acked", "Messages delivered (or refused for good) and acked, by pool, host and result."),
		nacked:       c("pgoutbox.router.nacked", "Messages nacked for redelivery, by pool, host and result."),
		deadLettered: c("pgoutbox.router.dead_lettered", "Messages dead-lettered for a configuration error, by pool, host and result."),
		defaultPool:  c("pgoutbox.router.default_pool", "Messages routed to DEFAULT-POOL because the pool they asked for does not exist, by that pool (requested)."),
		delivery:     histogram(m),
		duplicates:   c("pgoutbox.router.duplicates", "Deliveries of messages already in flight."),
		rateLimited:  c("pgoutbox.router.rate_limited", "Waits for a rate-limit permit."),
		refused: c("pgoutbox.router.pool.refused",
			"Messages a pool had no room for (or their message group held its share of it), sent back to their source undelivered: back-pressure."),
	}
}

func histogram(m metric.Meter) metric.Float64Histogram {
	h, _ := m.Float64Histogram("pgoutbox.router.delivery.duration", metric.WithUnit("s"),
		metric.WithDescription("How long a delivery's HTTP call took (or its refusal by an open circuit), by pool, host and result."),
		metric.WithExplicitBucketBoundaries(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
	return h
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
	groups, err := m.Int64ObservableGauge("pgoutbox.router.pool.active_groups",
		metric.WithDescription("Message groups with messages queued or being delivered in a router pool."))
	if err != nil {
		return nil, err
	}
	return m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, p := range r.Pools() {
			attrs := metric.WithAttributes(attribute.String("pool", p.Code))
			o.ObserveInt64(queued, int64(p.Queued), attrs)
			o.ObserveInt64(inFlight, int64(p.InFlight), attrs)
			o.ObserveInt64(groups, int64(p.ActiveGroups), attrs)
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
	}, queued, inFlight, breaker, groups)
}
