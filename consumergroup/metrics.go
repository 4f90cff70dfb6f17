package consumergroup

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/pgoutbox/pgoutbox/internal/blockedgauges"
	"github.com/pgoutbox/pgoutbox/outbox"
)

const meterName = "github.com/pgoutbox/pgoutbox/consumergroup"

// metrics are the group's OpenTelemetry instruments, bound to its topic
// and group attributes.
type metrics struct {
	delivered, acked, retried  boundCounter
	backfilled, backfillPauses boundCounter
	handlerTime, fetchTime     boundHistogram
	takenOver                  reasonCounter
}

// reasonCounter is a counter with the topic and group attributes and a
// reason.
type reasonCounter struct {
	c            metric.Int64Counter
	topic, group string
}

func (b reasonCounter) Add(ctx context.Context, n int64, reason string) {
	b.c.Add(ctx, n, metric.WithAttributes(attribute.String("topic", b.topic), attribute.String("group", b.group), attribute.String("reason", reason)))
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
	m := mp.Meter(meterName)
	attrs := metric.WithAttributes(attribute.String("topic", topic), attribute.String("group", group))
	counter := func(name, desc string) boundCounter {
		c, _ := m.Int64Counter(name, metric.WithDescription(desc)) // fails only on invalid names
		return boundCounter{c: c, attrs: attrs}
	}
	h, _ := m.Float64Histogram("pgoutbox.group.handler.duration", metric.WithUnit("s"), metric.WithDescription("Group handler run time."))
	f, _ := m.Float64Histogram("pgoutbox.group.fetch.duration", metric.WithUnit("s"),
		metric.WithDescription("How long an instance's full look for work took: the transaction that takes the next batch."))
	takenOver, _ := m.Int64Counter("pgoutbox.group.taken_over", metric.WithDescription(
		"Messages an instance took over from another, by reason: lease_expired (the lease ran out) or owner_gone (the instance's database session ended)."))
	return &metrics{
		delivered:  counter("pgoutbox.group.delivered", "Messages handed to group handlers."),
		acked:      counter("pgoutbox.group.acked", "Messages completed by the group."),
		retried:    counter("pgoutbox.group.retried", "Messages parked for retry or dead-lettered."),
		backfilled: counter("pgoutbox.group.backfilled", "Messages handed out by a backfill (catch-up reads)."),
		backfillPauses: counter("pgoutbox.group.backfill.pauses",
			"Times a backfill paused because its reads were slower than BackfillTargetLatency."),
		handlerTime: boundHistogram{h: h, attrs: attrs},
		fetchTime:   boundHistogram{h: f, attrs: attrs},
		takenOver:   reasonCounter{c: takenOver, topic: topic, group: group},
	}
}

// observeBlockedGroups registers, for a running instance of a group of an
// ordered topic, the gauges pgoutbox.ordered.blocked_groups and
// pgoutbox.ordered.oldest_blocked_age with the topic and group as
// attributes, read from the database (an index of failed retries) when
// the meter provider collects them. The run unregisters them when it ends.
func (g *Group) observeBlockedGroups() metric.Registration {
	mp := g.cfg.MeterProvider
	if mp == nil {
		return nil
	}
	now := time.Now
	if g.cfg.Clock != nil {
		now = g.cfg.Clock.Now
	}
	attrs := metric.WithAttributes(attribute.String("topic", g.cfg.Topic), attribute.String("group", g.cfg.Group))
	reg, err := blockedgauges.Register(mp.Meter(meterName), now, func(ctx context.Context) []blockedgauges.Reading {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		topic, err := g.client.Topic(ctx, g.cfg.Topic)
		if err != nil || !topic.Ordered {
			return nil
		}
		var n int64
		var since *time.Time
		err = g.pool.QueryRow(ctx, g.q.BlockedGroupsSummary, pgx.StrictNamedArgs{
			"topic": g.cfg.Topic, "group_name": g.cfg.Group,
			"dead_letter_blocks": topic.OrderedDeadLetters == outbox.BlockGroup,
		}).Scan(&n, &since)
		if err != nil {
			g.logger.Warn("pgoutbox: reading blocked message groups failed", slog.Any("error", err))
			return nil
		}
		r := blockedgauges.Reading{Groups: n, Attrs: attrs}
		if since != nil {
			r.Since = *since
		}
		return []blockedgauges.Reading{r}
	})
	if err != nil {
		g.logger.Warn("pgoutbox: blocked-group gauges not registered", slog.Any("error", err))
		return nil
	}
	return reg
}
