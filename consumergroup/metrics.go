package consumergroup

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// metrics are the group's OpenTelemetry instruments, bound to its topic
// and group attributes.
type metrics struct {
	delivered, acked, retried  boundCounter
	backfilled, backfillPauses boundCounter
	handlerTime, fetchTime     boundHistogram
}

type boundCounter struct {
	c     metric.Int64Counter
	attrs metric.MeasurementOption
}

func (b boundCounter) Add(ctx context.Context, n int64) { b.c.Add(ctx, n, b.attrs) }

type boundHistogram struct {
	h     metric.Float64Histogram
	attrs metric.MeasurementOption
}

func (b boundHistogram) Record(ctx context.Context, v float64) { b.h.Record(ctx, v, b.attrs) }

func newMetrics(mp metric.MeterProvider, topic, group string) *metrics {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/pgoutbox/pgoutbox/consumergroup")
	attrs := metric.WithAttributes(attribute.String("topic", topic), attribute.String("group", group))
	counter := func(name, desc string) boundCounter {
		c, _ := m.Int64Counter(name, metric.WithDescription(desc)) // fails only on invalid names
		return boundCounter{c: c, attrs: attrs}
	}
	h, _ := m.Float64Histogram("pgoutbox.group.handler.duration", metric.WithUnit("s"), metric.WithDescription("Group handler run time."))
	f, _ := m.Float64Histogram("pgoutbox.group.fetch.duration", metric.WithUnit("s"),
		metric.WithDescription("How long an instance's full look for work took: the transaction that takes the next batch."))
	return &metrics{
		delivered:  counter("pgoutbox.group.delivered", "Messages handed to group handlers."),
		acked:      counter("pgoutbox.group.acked", "Messages completed by the group."),
		retried:    counter("pgoutbox.group.retried", "Messages parked for retry or dead-lettered."),
		backfilled: counter("pgoutbox.group.backfilled", "Messages handed out by a backfill (catch-up reads)."),
		backfillPauses: counter("pgoutbox.group.backfill.pauses",
			"Times a backfill paused because its reads were slower than BackfillTargetLatency."),
		handlerTime: boundHistogram{h: h, attrs: attrs},
		fetchTime:   boundHistogram{h: f, attrs: attrs},
	}
}
