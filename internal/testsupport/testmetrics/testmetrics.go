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
	gauges := map[string]Gauge{}
	for name, points := range Points(t, r) {
		gauges[name] = points[0]
	}
	return gauges
}

// Points collects r and returns every data point of every gauge, by name;
// also of every int64 counter (its sum) and every float64 histogram (its
// count of recordings).
func Points(t testing.TB, r sdkmetric.Reader) map[string][]Gauge {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collecting metrics: %v", err)
	}
	points := map[string][]Gauge{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					points[m.Name] = append(points[m.Name], Gauge{Value: float64(p.Value), Attrs: p.Attributes})
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					points[m.Name] = append(points[m.Name], Gauge{Value: p.Value, Attrs: p.Attributes})
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					points[m.Name] = append(points[m.Name], Gauge{Value: float64(p.Value), Attrs: p.Attributes})
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					points[m.Name] = append(points[m.Name], Gauge{Value: float64(p.Count), Attrs: p.Attributes})
				}
			}
		}
	}
	return points
}

// Point returns the data point of name whose attributes include every
// key-value pair of kv (alternating keys and values), and whether there is
// one.
func Point(points map[string][]Gauge, name string, kv ...string) (Gauge, bool) {
next:
	for _, g := range points[name] {
		for i := 0; i+1 < len(kv); i += 2 {
			if g.Attr(attribute.Key(kv[i])) != kv[i+1] {
				continue next
			}
		}
		return g, true
	}
	return Gauge{}, false
}
