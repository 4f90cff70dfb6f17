// Package blockedgauges registers the two gauges of an ordered topic's
// blocked message groups, for a consumer group instance (a QUEUE topic's
// consumers are the members of its group): pgoutbox.ordered.blocked_groups (how
// many message groups a failed or dead-lettered message holds back) and
// pgoutbox.ordered.oldest_blocked_age (for how long the longest blocked
// one has been).
package blockedgauges

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// Reading is what one topic (or one group of it) reports.
type Reading struct {
	Groups int64     // blocked message groups
	Since  time.Time // when the longest blocked one was first held back; zero when none is
	Attrs  metric.MeasurementOption
}

// Register registers the gauges on meter: at each collection, read says
// what to report (it logs its own errors and leaves out what it could not
// read), and now is the clock ages are measured by.
func Register(meter metric.Meter, now func() time.Time, read func(ctx context.Context) []Reading) (metric.Registration, error) {
	groups, err := meter.Int64ObservableGauge("pgoutbox.ordered.blocked_groups",
		metric.WithDescription("Message groups of an ordered topic held back by a failed or dead-lettered message."))
	if err != nil {
		return nil, err
	}
	age, err := meter.Float64ObservableGauge("pgoutbox.ordered.oldest_blocked_age", metric.WithUnit("s"),
		metric.WithDescription("How long the longest blocked message group of an ordered topic has been held back."))
	if err != nil {
		return nil, err
	}
	return meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		for _, r := range read(ctx) {
			o.ObserveInt64(groups, r.Groups, r.Attrs)
			var seconds float64
			if !r.Since.IsZero() {
				seconds = max(0, now().Sub(r.Since).Seconds())
			}
			o.ObserveFloat64(age, seconds, r.Attrs)
		}
		return nil
	}, groups, age)
}
