package router_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/router"
)

// Router overhead against calling the same no-op endpoint directly with the
// same concurrency. Compare:
//
//	go test -run '^$' -bench 'Deliver' -benchtime 20000x ./router
const benchConcurrency = 32
const benchGroups = 1000

func noopServer(b *testing.B) (*httptest.Server, string) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte(`{"ack":true}`))
	}))
	b.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return srv, u.Host
}

func reportLatency(b *testing.B, lat []time.Duration, elapsed time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "deliveries/s")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
}

// BenchmarkDeliverDirect: benchConcurrency goroutines POSTing directly.
func BenchmarkDeliverDirect(b *testing.B) {
	srv, _ := noopServer(b)
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 256
	client := &http.Client{Transport: transport}
	lat := make([]time.Duration, b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range benchConcurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < b.N; i = int(next.Add(1) - 1) {
				t0 := time.Now()
				resp, err := client.Post(srv.URL+"/hook", "application/json", bytes.NewReader([]byte(`{"n":1}`)))
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	reportLatency(b, lat, time.Since(start))
}

// countingSettler records when a message was settled.
type countingSettler struct {
	i    int
	done *benchDone
}

type benchDone struct {
	lat   []time.Duration
	sent  []time.Time
	left  atomic.Int64
	all   chan struct{}
	acked atomic.Int64
}

func (c countingSettler) finish() {
	c.done.lat[c.i] = time.Since(c.done.sent[c.i])
	if c.done.left.Add(-1) == 0 {
		close(c.done.all)
	}
}
func (c countingSettler) Ack(context.Context) error { c.done.acked.Add(1); c.finish(); return nil }
func (c countingSettler) Nack(context.Context, router.Retry) error {
	c.finish()
	return nil
}
func (c countingSettler) DeadLetter(context.Context, string) error { c.finish(); return nil }

// BenchmarkDeliverRouter: the same deliveries through the router, 1,000
// groups, pool concurrency benchConcurrency. Latency is from routing to
// settlement. With window=32 at most 32 messages are in the router at once
// (as in the direct benchmark), so latency compares like for like; with
// window=640 (the pool's capacity) the pool never runs dry: throughput.
func BenchmarkDeliverRouter(b *testing.B) {
	for _, window := range []int{benchConcurrency, benchConcurrency * 20} {
		b.Run(fmt.Sprintf("window=%d", window), func(b *testing.B) { benchRouter(b, window) })
	}
}

func benchRouter(b *testing.B, window int) {
	_, host := noopServer(b)
	rt, err := router.New(router.Config{AllowedHosts: []string{host}, Pools: []router.PoolConfig{{Code: "P", Concurrency: benchConcurrency}}})
	if err != nil {
		b.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer rt.Stop(context.Background())
	d := &benchDone{lat: make([]time.Duration, b.N), sent: make([]time.Time, b.N), all: make(chan struct{})}
	d.left.Store(int64(b.N))
	target := "http://" + host + "/hook"
	b.ResetTimer()
	start := time.Now()
	batch := min(100, window)
	for i := 0; i < b.N; i += batch {
		var msgs []*router.Message
		for j := i; j < min(b.N, i+batch); j++ {
			d.sent[j] = time.Now()
			msgs = append(msgs, &router.Message{ID: fmt.Sprint(j), DeliveryID: fmt.Sprint(j), Pool: "P", Target: target,
				Group: fmt.Sprint(j % benchGroups), Payload: []byte(`{"n":1}`), Settle: countingSettler{i: j, done: d}})
		}
		for int64(i+len(msgs))-(int64(b.N)-d.left.Load()) > int64(window) { // back-pressure, as a source's MaxInFlight
			time.Sleep(50 * time.Microsecond)
		}
		rt.Route(context.Background(), msgs)
	}
	<-d.all
	elapsed := time.Since(start)
	if d.acked.Load() != int64(b.N) {
		b.Fatalf("%d of %d acked", d.acked.Load(), b.N)
	}
	reportLatency(b, d.lat, elapsed)
}

// BenchmarkIdleGroupMemory: heap and goroutine cost of a message group
// whose goroutine is idle (waiting for more messages before its idle exit).
func BenchmarkIdleGroupMemory(b *testing.B) {
	_, host := noopServer(b)
	rt, err := router.New(router.Config{AllowedHosts: []string{host}, Pools: []router.PoolConfig{{Code: "P", Concurrency: 64}}})
	if err != nil {
		b.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer rt.Stop(context.Background())
	const groups = 1000
	d := &benchDone{lat: make([]time.Duration, groups), sent: make([]time.Time, groups), all: make(chan struct{})}
	d.left.Store(groups)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < groups; i += 50 {
		var msgs []*router.Message
		for j := i; j < i+50; j++ {
			d.sent[j] = time.Now()
			msgs = append(msgs, &router.Message{ID: fmt.Sprint(j), DeliveryID: fmt.Sprint(j), Pool: "P", Target: "http://" + host + "/",
				Group: fmt.Sprint(j), Payload: []byte(`{}`), Settle: countingSettler{i: j, done: d}})
		}
		rt.Route(context.Background(), msgs)
	}
	<-d.all
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if got := rt.Pools()[0].ActiveGroups; got != groups {
		b.Fatalf("%d idle groups alive, want %d", got, groups)
	}
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/groups, "heap-B/idle-group")
	b.ReportMetric(float64(after.StackInuse-before.StackInuse)/groups, "stack-B/idle-group")
}
