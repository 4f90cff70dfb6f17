package main

import (
	"context"
	"slices"
	"sync"

	"github.com/pgoutbox/pgoutbox/bench/internal/harness"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// fetchRecorder is a MeterProvider that keeps every value recorded on
// the groups' pgoutbox.group.fetch.duration histogram (and drops the
// rest): W3 reports the fetch latency from it.
type fetchRecorder struct {
	noop.MeterProvider
	mu      sync.Mutex
	seconds []float64
}

func (r *fetchRecorder) Meter(string, ...metric.MeterOption) metric.Meter { return fetchMeter{r: r} }

// percentiles returns how many fetches there were and their p50, p95
// and p99 in milliseconds.
func (r *fetchRecorder) percentiles() (n int, p50, p95, p99 float64) {
	r.mu.Lock()
	ms := make([]float64, len(r.seconds))
	for i, s := range r.seconds {
		ms[i] = s * 1000
	}
	r.mu.Unlock()
	slices.Sort(ms)
	return len(ms), harness.Percentile(ms, 50), harness.Percentile(ms, 95), harness.Percentile(ms, 99)
}

type fetchMeter struct {
	noop.Meter
	r *fetchRecorder
}

func (m fetchMeter) Float64Histogram(name string, _ ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	if name != "pgoutbox.group.fetch.duration" {
		return noop.Float64Histogram{}, nil
	}
	return fetchHistogram{r: m.r}, nil
}

type fetchHistogram struct {
	noop.Float64Histogram
	r *fetchRecorder
}

func (h fetchHistogram) Record(_ context.Context, v float64, _ ...metric.RecordOption) {
	h.r.mu.Lock()
	h.r.seconds = append(h.r.seconds, v)
	h.r.mu.Unlock()
}
