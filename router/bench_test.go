package router_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/testsupport/pgtest"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/router"
)

// Router overhead against calling the same endpoint directly with the same
// concurrency, for a no-op receiver and one that takes 2 ms a call (a
// realistic webhook). Compare:
//
//	go test -run '^$' -bench 'Deliver' -benchtime 20000x ./router
//
// BenchmarkDeliverRouterShared runs the router with its pool's limits
// shared through the database (Config.Shared).
//
// The receiver runs in a process of its own. Besides deliveries/s and
// latency, each benchmark reports its process's CPU time per delivery
// (cpu-µs/op): the direct calls' is what an HTTP client costs, the
// router's is everything it does per message.
const benchConcurrency = 32
const benchGroups = 1000

// receiverDelays are the receivers the benchmarks run against.
var receiverDelays = []time.Duration{0, 2 * time.Millisecond}

func noopServer(b *testing.B) (*httptest.Server, string) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte(`{"ack":true}`))
	}))
	b.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return srv, u.Host
}

// cpuTime is the user and system CPU time the process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportLatency(b *testing.B, lat []time.Duration, elapsed, cpu time.Duration) {
	slices.Sort(lat)
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "deliveries/s")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(cpu.Microseconds())/float64(len(lat)), "cpu-µs/op")
}

// BenchmarkDeliverDirect: benchConcurrency goroutines POSTing directly.
func BenchmarkDeliverDirect(b *testing.B) {
	for _, delay := range receiverDelays {
		b.Run(fmt.Sprintf("receiver=%v", delay), func(b *testing.B) { benchDirect(b, delay) })
	}
}

func benchDirect(b *testing.B, delay time.Duration) {
	host := startReceiver(b, delay)
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 256
	client := &http.Client{Transport: transport}
	defer transport.CloseIdleConnections()
	lat := make([]time.Duration, b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start, cpu := time.Now(), cpuTime(b)
	for range benchConcurrency {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < b.N; i = int(next.Add(1) - 1) {
				t0 := time.Now()
				resp, err := client.Post("http://"+host+"/hook", "application/json", bytes.NewReader([]byte(`{"n":1}`)))
				if err != nil {
					b.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	reportLatency(b, lat, time.Since(start), cpuTime(b)-cpu)
}

// countingSettler records when a message was settled and frees its place
// in the window.
type countingSettler struct {
	i    int
	done *benchDone
}

type benchDone struct {
	lat    []time.Duration
	sent   []time.Time
	window chan struct{} // one token per message in the router
	left   atomic.Int64
	all    chan struct{}
	acked  atomic.Int64
}

func (c countingSettler) finish() {
	c.done.lat[c.i] = time.Since(c.done.sent[c.i])
	<-c.done.window
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
// settlement. The feeder acts as a source with MaxInFlight = window: it
// routes as many messages as there is room for, as soon as there is. With
// window=32 at most 32 messages are in the router at once (as in the
// direct benchmark), so latency compares like for like; with window=640
// (the pool's capacity) the pool never runs dry: throughput.
func BenchmarkDeliverRouter(b *testing.B) {
	for _, delay := range receiverDelays {
		for _, window := range []int{benchConcurrency, benchConcurrency * 20} {
			b.Run(fmt.Sprintf("receiver=%v/window=%d", delay, window), func(b *testing.B) { benchRouter(b, delay, window) })
		}
	}
}

// BenchmarkDeliverRouterShared is BenchmarkDeliverRouter's 2 ms receiver
// with the pool's limits shared through the database (Config.Shared):
// the permits a router holds, renewed every 500 ms, and no round trip
// per delivery.
func BenchmarkDeliverRouterShared(b *testing.B) {
	db := pgtest.NewDB(b)
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	shared := &router.SharedLimits{Client: client, Name: "bench"}
	for _, window := range []int{benchConcurrency, benchConcurrency * 20} {
		b.Run(fmt.Sprintf("receiver=%v/window=%d", 2*time.Millisecond, window), func(b *testing.B) {
			benchRouterWith(b, 2*time.Millisecond, window, shared)
		})
	}
}

func benchRouter(b *testing.B, delay time.Duration, window int) {
	benchRouterWith(b, delay, window, nil)
}

func benchRouterWith(b *testing.B, delay time.Duration, window int, shared *router.SharedLimits) {
	host := startReceiver(b, delay)
	rt, err := router.New(router.Config{AllowedHosts: []string{host}, Pools: []router.PoolConfig{{Code: "P", Concurrency: benchConcurrency}},
		Shared: shared})
	if err != nil {
		b.Fatal(err)
	}
	if err := rt.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	defer rt.Stop(context.Background())
	d := &benchDone{lat: make([]time.Duration, b.N), sent: make([]time.Time, b.N),
		window: make(chan struct{}, window), all: make(chan struct{})}
	d.left.Store(int64(b.N))
	target := "http://" + host + "/hook"
	const claim = 100 // a source's batch size
	b.ResetTimer()
	start, cpu := time.Now(), cpuTime(b)
	for i := 0; i < b.N; {
		// Wait for room for one message, then take all the room there is.
		d.window <- struct{}{}
		n := 1
	room:
		for n < min(claim, b.N-i) {
			select {
			case d.window <- struct{}{}:
				n++
			default:
				break room
			}
		}
		msgs := make([]*router.Message, 0, n)
		for j := i; j < i+n; j++ {
			d.sent[j] = time.Now()
			msgs = append(msgs, &router.Message{ID: strconv.Itoa(j), DeliveryID: strconv.Itoa(j), Pool: "P", Target: target,
				Group: strconv.Itoa(j % benchGroups), Payload: []byte(`{"n":1}`), Settle: countingSettler{i: j, done: d}})
		}
		rt.Route(context.Background(), msgs)
		i += n
	}
	<-d.all
	elapsed, used := time.Since(start), cpuTime(b)-cpu
	if d.acked.Load() != int64(b.N) {
		b.Fatalf("%d of %d acked", d.acked.Load(), b.N)
	}
	reportLatency(b, d.lat, elapsed, used)
}

// BenchmarkDeliverFromQueue: the router end to end, reading a QUEUE topic
// (not ordered) through a QueueSource, which reads it by message group:
// b.N messages of benchGroups message groups, queued before the timer
// starts, delivered to an in-process no-op receiver with pool concurrency
// benchConcurrency. It measures what the database side of a source costs
// per message (the queue row each message gets, its claims and acks):
//
//	go test -run '^$' -bench DeliverFromQueue -benchtime 20000x ./router
func BenchmarkDeliverFromQueue(b *testing.B) {
	db := pgtest.NewDB(b)
	ctx := context.Background()
	client, err := outbox.NewClient(db.Pool, outbox.Config{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "hooks", Semantics: outbox.Queue}); err != nil {
		b.Fatal(err)
	}
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: db.Schema})
	if err != nil {
		b.Fatal(err)
	}
	var got atomic.Int64
	all := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte(`{"ack":true}`))
		if got.Add(1) == int64(b.N) {
			close(all)
		}
	}))
	b.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	headers := map[string]string{router.HeaderPool: "P", router.HeaderTarget: srv.URL + "/hook"}
	for i := 0; i < b.N; i += 1000 {
		msgs := make([]outbox.Message, 0, 1000)
		for j := i; j < min(i+1000, b.N); j++ {
			msgs = append(msgs, outbox.Message{Topic: "hooks", Payload: []byte(`{"n":1}`), Group: strconv.Itoa(j % benchGroups), Headers: headers})
		}
		if _, err := producer.SendBatch(ctx, db.Pool, msgs); err != nil {
			b.Fatal(err)
		}
	}
	rt, err := router.New(router.Config{AllowedHosts: []string{u.Host}, Pools: []router.PoolConfig{{Code: "P", Concurrency: benchConcurrency}}})
	if err != nil {
		b.Fatal(err)
	}
	src, err := router.NewQueueSource(router.QueueSourceConfig{Client: client, Topic: "hooks", BatchSize: 100})
	if err != nil {
		b.Fatal(err)
	}
	rt.AddSource(src)
	b.ResetTimer()
	start := time.Now()
	if err := rt.Start(ctx); err != nil {
		b.Fatal(err)
	}
	<-all
	elapsed := time.Since(start)
	b.StopTimer()
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_ = rt.Stop(stopCtx)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "deliveries/s")
}
