package maintenance

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// metrics are the service's instruments (OpenTelemetry; no-op by default):
//
//	pgoutbox.maintenance.deleted          rows deleted, by job and table
//	pgoutbox.maintenance.duration         seconds a job's pass took, by job
//	pgoutbox.maintenance.dead_groups      groups declared DEAD
//	pgoutbox.maintenance.dropped_unread   messages the retention cap deleted before a group finished them, by topic and group
//	pgoutbox.maintenance.partitions       partitions of outbox_published created and dropped, by action
type metrics struct {
	deleted       metric.Int64Counter
	passTime      metric.Float64Histogram
	deadGroups    metric.Int64Counter
	droppedUnread metric.Int64Counter
	partitions    metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider) *metrics {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/pgoutbox/pgoutbox/maintenance")
	deleted, _ := m.Int64Counter("pgoutbox.maintenance.deleted", metric.WithDescription("Rows deleted by maintenance, by job and table."))
	passTime, _ := m.Float64Histogram("pgoutbox.maintenance.duration", metric.WithUnit("s"),
		metric.WithDescription("How long a maintenance job's pass took."))
	dead, _ := m.Int64Counter("pgoutbox.maintenance.dead_groups", metric.WithDescription("Consumer groups declared DEAD."))
	dropped, _ := m.Int64Counter("pgoutbox.maintenance.dropped_unread",
		metric.WithDescription("Messages deleted by the retention cap before a group finished them, by topic and group."))
	partitions, _ := m.Int64Counter("pgoutbox.maintenance.partitions",
		metric.WithDescription("Partitions of outbox_published created and dropped, by action (created, dropped)."))
	return &metrics{deleted: deleted, passTime: passTime, deadGroups: dead, droppedUnread: dropped, partitions: partitions}
}

func (m *metrics) attrs(job, table string) metric.AddOption {
	return metric.WithAttributes(attribute.String("job", job), attribute.String("table", table))
}

func (m *metrics) actionAttrs(action string) metric.AddOption {
	return metric.WithAttributes(attribute.String("action", action))
}

func (m *metrics) groupAttrs(topic, group string) metric.AddOption {
	return metric.WithAttributes(attribute.String("topic", topic), attribute.String("group", group))
}

func (m *metrics) duration(ctx context.Context, job string, d time.Duration) {
	m.passTime.Record(ctx, d.Seconds(), metric.WithAttributes(attribute.String("job", job)))
}
