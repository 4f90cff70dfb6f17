package relay

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/pgoutbox/pgoutbox/consumergroup"
)

const meterName = "github.com/pgoutbox/pgoutbox/relay"

// lagCountLimit caps the count of unrelayed messages a lag reading makes.
const lagCountLimit = 100_000

// Reasons a publish failed, the "reason" attribute of pgoutbox.relay.failures.
const (
	reasonTransient     = "transient"
	reasonMisconfigured = "misconfigured"
	reasonRejected      = "rejected"
)

// metrics are a relay's instruments:
//
//   - pgoutbox.relay.published: messages the broker confirmed;
//   - pgoutbox.relay.latency (s): from a message's write to the broker's
//     confirmation (by the relay's clock against the database's);
//   - pgoutbox.relay.failures: failed publishes, by reason (transient,
//     misconfigured, rejected);
//   - pgoutbox.relay.lag (s) and pgoutbox.relay.unrelayed: the age of the
//     oldest message not yet relayed and how many there are (up to
//     100,000), read from the database when collected.
type metrics struct {
	publishedC metric.Int64Counter
	latency    metric.Float64Histogram
	failures   metric.Int64Counter
	attrs      metric.MeasurementOption
	failAttrs  map[string]metric.MeasurementOption

	// The lag gauges, observed while the relay runs (nil without a
	// MeterProvider).
	meter     metric.Meter
	lag       metric.Float64ObservableGauge
	unrelayed metric.Int64ObservableGauge

	mu  sync.Mutex
	reg metric.Registration
}

func newMetrics(mp metric.MeterProvider, topic, group string) (*metrics, error) {
	observe := mp != nil
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter(meterName)
	base := []attribute.KeyValue{attribute.String("topic", topic), attribute.String("group", group)}
	ms := &metrics{attrs: metric.WithAttributes(base...), failAttrs: map[string]metric.MeasurementOption{}}
	for _, reason := range []string{reasonTransient, reasonMisconfigured, reasonRejected} {
		ms.failAttrs[reason] = metric.WithAttributes(append(base[:2:2], attribute.String("reason", reason))...)
	}
	var err error
	if ms.publishedC, err = m.Int64Counter("pgoutbox.relay.published",
		metric.WithDescription("Messages the broker confirmed stored.")); err != nil {
		return nil, err
	}
	if ms.latency, err = m.Float64Histogram("pgoutbox.relay.latency", metric.WithUnit("s"),
		metric.WithDescription("Time from a message's write to the broker's confirmation.")); err != nil {
		return nil, err
	}
	if ms.failures, err = m.Int64Counter("pgoutbox.relay.failures",
		metric.WithDescription("Publishes that failed, by reason: transient (retried), misconfigured (retried), rejected (dead-lettered).")); err != nil {
		return nil, err
	}
	if !observe {
		return ms, nil
	}
	ms.meter = m
	if ms.lag, err = m.Float64ObservableGauge("pgoutbox.relay.lag", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest message the relay has not yet published.")); err != nil {
		return nil, err
	}
	if ms.unrelayed, err = m.Int64ObservableGauge("pgoutbox.relay.unrelayed",
		metric.WithDescription("Messages the relay has not yet published (counted up to 100,000).")); err != nil {
		return nil, err
	}
	return ms, nil
}

// observe registers the lag gauges' callback, which reads g's health,
// until unregister.
func (m *metrics) observe(g *consumergroup.Group) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.meter == nil || m.reg != nil {
		return nil
	}
	var err error
	m.reg, err = m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		h, err := g.Health(ctx, lagCountLimit)
		if err != nil {
			return err
		}
		o.ObserveFloat64(m.lag, h.Lag.Seconds(), m.attrs)
		o.ObserveInt64(m.unrelayed, h.Unread+h.Queued+h.Scheduled+h.Waiting+h.LeasedRetries, m.attrs)
		return nil
	}, m.lag, m.unrelayed)
	return err
}

// published records the messages the broker confirmed at now.
func (m *metrics) published(ctx context.Context, now time.Time, msgs []Message) {
	if len(msgs) == 0 {
		return
	}
	m.publishedC.Add(ctx, int64(len(msgs)), m.attrs)
	for _, msg := range msgs {
		m.latency.Record(ctx, now.Sub(msg.CreatedAt).Seconds(), m.attrs)
	}
}

// failed counts n failed publishes for reason.
func (m *metrics) failed(ctx context.Context, reason string, n int) {
	if n > 0 {
		m.failures.Add(ctx, int64(n), m.failAttrs[reason])
	}
}

// unregister removes the lag gauges' callback.
func (m *metrics) unregister() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.reg != nil {
		_ = m.reg.Unregister()
		m.reg = nil
	}
}
