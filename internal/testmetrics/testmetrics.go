// Package testmetrics reads what a test's components reported to an
// OpenTelemetry reader.
package testmetrics

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Gauge is a gauge's first data point: its value and attributes.
type Gauge struct {
	Value float64
	Attrs attribute.Set
}

// Attr is the data point's string attribute key ("" if it has none).
func (g Gauge) Attr(key attribute.Key) string {
	v, _ := g.Attrs.Value(key)
	return v.AsString()
}

// Gauges collects r and returns every gauge's first data point, by name.
func Gauges(t testing.TB, r sdkmetric.Reader) map[string]Gauge {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collecting metrics: %v", err)
	}
	gauges := map[string]Gauge{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				gauges[m.Name] = Gauge{Value: float64(d.DataPoints[0].Value), Attrs: d.DataPoints[0].Attributes}
			case metricdata.Gauge[float64]:
				gauges[m.Name] = Gauge{Value: d.DataPoints[0].Value, Attrs: d.DataPoints[0].Attributes}
			}
		}
	}
	return gauges
}
