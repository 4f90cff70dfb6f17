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
//     else 0, with the state as an attribute), per group;
//   - pgoutbox.storage.partitions, the log's partitions, and per topic
//     pgoutbox.topic.stored (messages kept), .oldest_age (seconds) and
//     .groups (groups holding its messages back: 0 on a PUB_SUB topic
//     means nobody reads what it keeps), see Storage.
//
// A collection costs one statement per QUEUE topic, three per group, and
// one per topic and one for the partitions.
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
	storage := map[string]metric.Int64ObservableGauge{}
	for _, g := range []struct{ name, desc string }{
		{"pgoutbox.storage.partitions", "Partitions of the message log: a count that keeps growing means something keeps old messages."},
		{"pgoutbox.topic.stored", "Messages a topic keeps in the log (counted up to the admin's count limit)."},
		{"pgoutbox.topic.groups", "Groups holding a topic's messages back (ACTIVE or PAUSED); 0 on a PUB_SUB topic: nobody reads what it keeps."},
	} {
		inst, err := m.Int64ObservableGauge(g.name, metric.WithDescription(g.desc))
		if err != nil {
			return nil, err
		}
		storage[g.name], all = inst, append(all, inst)
	}
	oldest, err := m.Float64ObservableGauge("pgoutbox.topic.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest message a topic keeps in the log."))
	if err != nil {
		return nil, err
	}
	all = append(all, oldest)
	return m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if s, err := a.Storage(ctx); err != nil {
			a.client.Logger().Warn("pgoutbox: reading the storage gauges failed", slog.Any("error", err))
		} else {
			o.ObserveInt64(storage["pgoutbox.storage.partitions"], int64(s.Partitions))
			for _, t := range s.Topics {
				attrs := metric.WithAttributes(attribute.String("topic", t.Topic))
				o.ObserveInt64(storage["pgoutbox.topic.stored"], t.Stored, attrs)
				o.ObserveInt64(storage["pgoutbox.topic.groups"], int64(t.Groups), attrs)
				o.ObserveFloat64(oldest, t.Oldest.Seconds(), attrs)
			}
		}
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
