package admin

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// RegisterGauges registers, on mp, gauges of every topic's backlog and
// every group's lag, read at each collection with the Admin's bounded
// counts (a count at CountLimit means "at least"; nothing counts a whole
// table):
//
//   - pgoutbox.queue.ready, .scheduled, .leased, .dead_letters (messages)
//     and .oldest_ready_age (seconds), per QUEUE topic;
//   - pgoutbox.group.unread, .queued, .waiting, .leased, .dead_letters (messages),
//     .lag and .since_heartbeat (seconds), and .active (1 while ACTIVE,
//     else 0, with the state as an attribute), per group.
//
// A collection costs one statement per QUEUE topic and three per group.
// Every process with an Admin may register them (they are gauges: each
// reports the same values); one is enough. Unregister the returned
// registration to stop.
func (a *Admin) RegisterGauges(mp metric.MeterProvider) (metric.Registration, error) {
	m := mp.Meter("github.com/pgoutbox/pgoutbox/admin")
	ints := map[string]metric.Int64ObservableGauge{}
	floats := map[string]metric.Float64ObservableGauge{}
	var all []metric.Observable
	for _, g := range []struct{ name, desc string }{
		{"pgoutbox.queue.ready", "Messages of a QUEUE topic deliverable now."},
		{"pgoutbox.queue.scheduled", "Messages of a QUEUE topic due later (a delay or a retry's backoff)."},
		{"pgoutbox.queue.leased", "Messages of a QUEUE topic a consumer holds."},
		{"pgoutbox.queue.dead_letters", "Dead letters of a QUEUE topic."},
		{"pgoutbox.group.unread", "Messages a consumer group has not read yet (or not finished of its current read)."},
		{"pgoutbox.group.queued", "Messages a consumer group read and will deliver that have not failed (an ordered group's queue)."},
		{"pgoutbox.group.scheduled", "Messages a consumer group read that are not due yet (Delay, NotBefore)."},
		{"pgoutbox.group.waiting", "Messages of a consumer group that failed and wait for a retry."},
		{"pgoutbox.group.leased", "Batches and one-by-one deliveries a consumer group's instances hold."},
		{"pgoutbox.group.dead_letters", "Dead letters of a consumer group."},
		{"pgoutbox.group.active", "1 while a consumer group is ACTIVE, else 0 (its state is an attribute)."},
	} {
		inst, err := m.Int64ObservableGauge(g.name, metric.WithDescription(g.desc), metric.WithUnit("{message}"))
		if err != nil {
			return nil, err
		}
		ints[g.name], all = inst, append(all, inst)
	}
	for _, g := range []struct{ name, desc string }{
		{"pgoutbox.queue.oldest_ready_age", "How long the oldest deliverable message of a QUEUE topic has waited."},
		{"pgoutbox.group.lag", "Age of the oldest message a consumer group has not finished."},
		{"pgoutbox.group.since_heartbeat", "Time since a consumer group's last heartbeat."},
	} {
		inst, err := m.Float64ObservableGauge(g.name, metric.WithDescription(g.desc), metric.WithUnit("s"))
		if err != nil {
			return nil, err
		}
		floats[g.name], all = inst, append(all, inst)
	}
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		topics, err := a.Topics(ctx)
		if err != nil {
			a.client.Logger().Warn("pgoutbox: reading the backlog gauges failed", slog.Any("error", err))
			return nil
		}
		for _, t := range topics {
			topic := attribute.String("topic", t.Name)
			if t.Semantics == outbox.Queue {
				attrs := metric.WithAttributes(topic)
				o.ObserveInt64(ints["pgoutbox.queue.ready"], t.Ready, attrs)
				o.ObserveInt64(ints["pgoutbox.queue.scheduled"], t.Scheduled, attrs)
				o.ObserveInt64(ints["pgoutbox.queue.leased"], t.Leased, attrs)
				o.ObserveInt64(ints["pgoutbox.queue.dead_letters"], t.DeadLetters, attrs)
				o.ObserveFloat64(floats["pgoutbox.queue.oldest_ready_age"], t.OldestReady.Seconds(), attrs)
				continue
			}
			for _, name := range t.Groups {
				h, err := a.Group(ctx, t.Name, name)
				if err != nil {
					a.client.Logger().Warn("pgoutbox: reading a group's gauges failed", slog.String("topic", t.Name),
						slog.String("group", name), slog.Any("error", err))
					continue
				}
				attrs := metric.WithAttributes(topic, attribute.String("group", name))
				o.ObserveInt64(ints["pgoutbox.group.unread"], h.Unread, attrs)
				o.ObserveInt64(ints["pgoutbox.group.queued"], h.Queued, attrs)
				o.ObserveInt64(ints["pgoutbox.group.scheduled"], h.Scheduled, attrs)
				o.ObserveInt64(ints["pgoutbox.group.waiting"], h.Waiting, attrs)
				o.ObserveInt64(ints["pgoutbox.group.leased"], h.LeasedBatches+h.LeasedRetries, attrs)
				o.ObserveInt64(ints["pgoutbox.group.dead_letters"], h.DeadLetters, attrs)
				active := int64(0)
				if h.State == consumergroup.Active {
					active = 1
				}
				o.ObserveInt64(ints["pgoutbox.group.active"], active,
					metric.WithAttributes(topic, attribute.String("group", name), attribute.String("state", string(h.State))))
				o.ObserveFloat64(floats["pgoutbox.group.lag"], h.Lag.Seconds(), attrs)
				o.ObserveFloat64(floats["pgoutbox.group.since_heartbeat"], h.SinceHeartbeat.Seconds(), attrs)
			}
		}
		return nil
	}, all...)
}
