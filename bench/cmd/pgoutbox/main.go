// Command pgoutbox measures pgoutbox on the benchmark's workloads (see
// bench/README.md), with the peer programs' flags and output: exactly one
// JSON line on stdout, diagnostics on stderr, exit 1 on failure (including
// any message never handled).
//
//	cd bench && go run ./cmd/pgoutbox -workload W2
//
// It owns schema bench_pgoutbox of the target database and recreates it on
// every run.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox"
	"github.com/pgoutbox/pgoutbox/bench/internal/harness"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
)

const schema = "bench_pgoutbox"

var defaultN = map[string]int{"W1": 20000, "W2": 50000, "W3": 20000, "W4": 2000, "CLEANUP": 20000, "DROP": 100_000, "BACKFILL": 100_000, "BACKFILL_OLTP": 1_000_000, "W5": 0, "SKEW": 0, "ADMIN": 1_000_000, "RELAY": 50_000}

type config struct {
	harness.Run
	mode                    string
	cpuProfile, latencyFile string
	memProfile              string
	pollInterval            time.Duration
	batch                   int
	notifyInterval          time.Duration
	busyNotifyInterval      time.Duration
	backfillRate            float64
	targetLatency           time.Duration
	maxSlowdown             float64
	oltpScale, oltpClients  int
	oltpTPS                 int
	oltpDuration            time.Duration
	oltpAfter               time.Duration
	fillfactor              int
	noHold, ordered         bool
	msgGroups               int
	natsURL                 string
	latencySeconds          int
}

func main() {
	c := parseFlags()
	ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
	defer cancel()
	if c.cpuProfile != "" {
		f, err := os.Create(c.cpuProfile)
		if err != nil {
			c.Fail(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			c.Fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(ctx, c); err != nil {
		c.Fail(err)
	}
	if c.memProfile != "" {
		if err := writeHeapProfile(c.memProfile); err != nil {
			c.Fail(err)
		}
	}
}

// writeHeapProfile writes the allocations of the whole run (go tool pprof
// -sample_index=alloc_space) to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func parseFlags() *config {
	c := &config{Run: harness.Run{System: "pgoutbox"}}
	c.Register(flag.CommandLine)
	flag.Lookup("workload").Usage = "W1 produce | W2 queue drain | W3 fan-out drain | W4 latency | RELAY to NATS JetStream (see relay.go) | W5 held xmin (see w5.go) | SKEW hot and cold topic (see skew.go) | CLEANUP | BACKFILL (see maintenance.go) | DROP (see drop.go) | ADMIN (see admin.go) | BACKFILL_OLTP (see oltp.go)"
	flag.Lookup("duration").Usage = "W5: how long the producer runs (n = rate × duration); SKEW: each phase's length"
	flag.IntVar(&c.batch, "batch", 0, "W2, W4: the consumer's BatchSize (0 = library default)")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file")
	flag.StringVar(&c.memProfile, "memprofile", "", "write the run's allocations (a heap profile) to this file")
	flag.StringVar(&c.latencyFile, "latencies", "", "W4: write each message's commit time and pickup latency (ms, tab-separated) to this file")
	flag.DurationVar(&c.pollInterval, "poll-interval", 0, "W2, W4: the consumer's PollInterval (0 = library default)")
	flag.StringVar(&c.mode, "mode", "", "PUB_SUB tracking mode for W3: bitmap, counter or offset")
	flag.DurationVar(&c.notifyInterval, "notify-interval", 0, "producer NotifyInterval (0 = library default, negative = no NOTIFY)")
	flag.DurationVar(&c.busyNotifyInterval, "busy-notify-interval", 0, "producer BusyNotifyInterval (0 = library default)")
	flag.Float64Var(&c.backfillRate, "backfill-rate", 1e9, "BACKFILL: BackfillRate, rows a second (default: no cap)")
	flag.DurationVar(&c.targetLatency, "target-latency", time.Hour, "BACKFILL: BackfillTargetLatency (default: never pauses)")
	flag.Float64Var(&c.maxSlowdown, "max-slowdown", -1, "BACKFILL: BackfillMaxSlowdown (default: none)")
	flag.IntVar(&c.oltpScale, "oltp-scale", 10, "BACKFILL_OLTP: pgbench scale factor")
	flag.IntVar(&c.oltpClients, "oltp-clients", 4, "BACKFILL_OLTP: pgbench clients")
	flag.IntVar(&c.oltpTPS, "oltp-tps", 200, "BACKFILL_OLTP: pgbench transactions a second (-R)")
	flag.DurationVar(&c.oltpDuration, "oltp-seconds", 20*time.Second, "BACKFILL_OLTP: length of the baseline measurement")
	flag.DurationVar(&c.oltpAfter, "oltp-after", 60*time.Second, "BACKFILL_OLTP: how long after the backfill pgbench is still measured (the write-back of what it wrote)")
	flag.IntVar(&c.msgGroups, "msg-groups", 0, "W2, W3: spread the messages over this many message groups (0 = none)")
	flag.BoolVar(&c.ordered, "ordered", false, "W2, W3: the topic is ordered (TopicConfig.Ordered): each message group's messages one at a time")
	flag.BoolVar(&c.noHold, "no-hold", false, "W5: hold no transaction (a steady run; the table stats still come at each third's end)")
	flag.IntVar(&c.fillfactor, "fillfactor", 0, "experiment: set outbox_published's fillfactor after the migrations (0 = as migrated)")
	flag.StringVar(&c.natsURL, "nats", "nats://127.0.0.1:4222", "RELAY: the NATS server (with JetStream)")
	flag.IntVar(&c.latencySeconds, "latency-seconds", 10, "RELAY: how long messages are sent at -rate for the latency measurement")
	flag.Parse()
	if c.mode != "" {
		c.System = "pgoutbox-" + c.mode
	}
	if c.ordered {
		c.System = "pgoutbox-ordered"
	}
	if err := c.Check(defaultN, "W5", "SKEW"); err != nil {
		c.Fail(err)
	}
	return c
}

func run(ctx context.Context, c *config) error {
	if (c.Workload == "RELAY" || c.Workload == "W3") && c.mode == "" {
		c.mode = "offset" // a PUB_SUB topic's default mode
	}
	if (c.Workload == "CLEANUP" || c.Workload == "DROP" || c.Workload == "BACKFILL" || c.Workload == "BACKFILL_OLTP" || c.Workload == "ADMIN") && c.mode == "" {
		c.Unsupported(c.Workload + " needs -mode bitmap, counter or offset")
	}
	pool, err := harness.OpenPool(ctx, c.DSN, c.Workers)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := harness.ResetSchema(ctx, pool, schema, func(ctx context.Context) error {
		return migrations.Up(ctx, pool, migrations.Config{Schema: schema})
	}); err != nil {
		return err
	}
	if c.fillfactor > 0 {
		if _, err := pool.Exec(ctx, fmt.Sprintf("ALTER TABLE %s.outbox_published SET (fillfactor = %d)", schema, c.fillfactor)); err != nil {
			return err
		}
	}
	fetches := &fetchRecorder{}
	app, err := pgoutbox.NewClient(ctx, pool, pgoutbox.Config{Schema: schema, MeterProvider: fetches, NoMaintenance: true,
		Producer: outbox.ProducerConfig{NotifyInterval: c.notifyInterval, BusyNotifyInterval: c.busyNotifyInterval}})
	if err != nil {
		return err
	}
	client, producer := app.Outbox(), app.Producer()
	if c.Workload != "DROP" { // which sizes its own
		// Partitions ahead of the writers, as a service's maintenance adds
		// them at Start (the first one after the migrations is small).
		m, err := maintenance.New(pool, maintenance.Config{Client: client})
		if err != nil {
			return err
		}
		if _, err := m.RunOnce(ctx); err != nil {
			return err
		}
	}
	b := &bench{c: c, pool: pool, app: app, client: client, producer: producer, fetches: fetches}
	if c.mode == "" && c.Workload != "W5" && c.Workload != "SKEW" { // QUEUE workloads: configure the topic, as a service would at boot
		if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: strings.ToLower(c.Workload), Ordered: c.ordered}); err != nil {
			return err
		}
	}
	switch c.Workload {
	case "W1":
		return b.w1(ctx)
	case "W2":
		return b.w2(ctx)
	case "W3":
		return b.w3(ctx)
	case "RELAY":
		return b.relay(ctx)
	case "DROP":
		return b.drop(ctx)
	case "ADMIN":
		return b.admin(ctx)
	case "CLEANUP":
		return b.cleanup(ctx)
	case "BACKFILL":
		return b.backfill(ctx)
	case "BACKFILL_OLTP":
		return b.backfillOLTP(ctx)
	case "W5":
		return b.w5(ctx)
	case "SKEW":
		return b.skew(ctx)
	default:
		return b.w4(ctx)
	}
}

type bench struct {
	c        *config
	fetches  *fetchRecorder // the consumer's looks (W2, W4, W5)
	pool     *pgxpool.Pool
	app      *pgoutbox.Client
	client   *outbox.Client
	producer *outbox.Producer
}

// subscribeIdle subscribes -groups groups g0, g1, … to topic from now and
// stops them: the topic's messages need them, and nobody consumes.
func (b *bench) subscribeIdle(ctx context.Context, topic string) error {
	for i := range b.c.Groups {
		g, err := consumergroup.New(b.pool, consumergroup.Config{Client: b.client, Topic: topic, Group: fmt.Sprintf("g%d", i), Schema: schema, HeartbeatPool: b.pool})
		if err != nil {
			return err
		}
		if err := g.AddConsumer("c", func(context.Context, *outbox.Delivery) error { return nil }, nil); err != nil {
			return err
		}
		if err := g.Start(ctx, consumergroup.FromNow()); err != nil {
			return err
		}
		if err := g.Stop(ctx); err != nil {
			return err
		}
	}
	return nil
}

// w1: n messages, each in its own transaction, from `workers` goroutines.
func (b *bench) w1(ctx context.Context) error {
	if b.c.mode != "" { // W1 on a PUB_SUB topic with `groups` subscribed groups
		if err := b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: "w1", Semantics: outbox.PubSub,
			Tracking: outbox.TrackingMode(strings.ToUpper(b.c.mode))}); err != nil {
			return err
		}
		if err := b.subscribeIdle(ctx, "w1"); err != nil { // nobody consumes during W1
			return err
		}
	}
	start := time.Now()
	err := harness.Concurrently(ctx, b.c.N, b.c.Workers, func(ctx context.Context, seq int) error {
		return b.sendOne(ctx, "w1", seq)
	})
	elapsed := time.Since(start)
	if err != nil {
		return err
	}
	var rows, distinct int
	if err := b.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (payload->>'seq')::int) FROM `+schema+`.outbox_published`).Scan(&rows, &distinct); err != nil {
		return err
	}
	if rows != b.c.N || distinct != b.c.N {
		return fmt.Errorf("expected %d messages, table has %d rows / %d distinct", b.c.N, rows, distinct)
	}
	b.c.Emit(elapsed, b.c.N, 0, 0)
	return nil
}

func (b *bench) sendOne(ctx context.Context, topic string, seq int) error {
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.producer.Send(ctx, tx, outbox.Message{Topic: topic, Payload: harness.Payload(seq)})
		return err
	})
}

// w2: n preloaded messages drained by one consumer with `workers` handlers,
// timed to the last completion being committed.
func (b *bench) w2(ctx context.Context) error {
	const topic = "w2"
	if err := b.preload(ctx, topic); err != nil {
		return err
	}
	tr := harness.NewTracker(b.c.N)
	start := time.Now()
	k, err := b.startConsumer(ctx, topic, tr)
	if err != nil {
		return err
	}
	err = b.waitDrained(ctx, topic, tr)
	elapsed := time.Since(start)
	stopErr := k.Stop(context.Background())
	if err != nil {
		return err
	}
	if stopErr != nil {
		return stopErr
	}
	if err := tr.Check("W2"); err != nil {
		return err
	}
	if n, f50, _, f99 := b.fetches.percentiles(); n > 0 {
		harness.Logf("W2: %d looks, p50 %.3f ms, p99 %.3f ms", n, f50, f99)
	}
	b.c.Emit(elapsed, b.c.N, 0, 0)
	return nil
}

// w3: n messages preloaded on one PUB_SUB topic, then `groups` groups
// (subscribed before the preload, one instance each) drain it concurrently,
// timed to the last group's last batch completion being committed.
func (b *bench) w3(ctx context.Context) error {
	const topic = "w3"
	mode := outbox.TrackingMode(strings.ToUpper(b.c.mode))
	if err := b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: topic, Semantics: outbox.PubSub, Tracking: mode, Ordered: b.c.ordered}); err != nil {
		return err
	}
	elapsed, fetches, err := b.drainGroups(ctx, topic, b.c.Groups)
	if err != nil {
		return err
	}
	res := b.c.Result(elapsed, b.c.N*b.c.Groups, 0, 0)
	res.Groups = b.c.Groups
	var p50, p95, p99 float64
	res.Fetches, p50, p95, p99 = fetches.percentiles()
	res.FetchP50Ms, res.FetchP95Ms, res.FetchP99Ms = harness.Round(p50, 3), harness.Round(p95, 3), harness.Round(p99, 3)
	harness.Print(res)
	return nil
}

// startAll starts groups, up to 8 at once: one after another, starting
// 1,000 groups took longer than their drain.
func startAll(ctx context.Context, groups []*consumergroup.Group) error {
	sem := make(chan struct{}, 8)
	errs := make(chan error, len(groups))
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs <- g.Start(ctx, consumergroup.FromNow())
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// drainGroups subscribes nGroups groups g0, g1, … to topic (configured),
// preloads -n messages, then starts the groups with handlers that only
// record, and returns how long they took to handle and complete them all.
func (b *bench) drainGroups(ctx context.Context, topic string, nGroups int) (time.Duration, *fetchRecorder, error) {
	fetches := &fetchRecorder{}
	newGroup := func(i int, tr *harness.Tracker) (*consumergroup.Group, error) {
		g, err := consumergroup.New(b.pool, consumergroup.Config{Client: b.client, Topic: topic, Group: fmt.Sprintf("g%d", i), Schema: schema,
			Concurrency: b.c.Workers, BatchSize: 1000, HeartbeatPool: b.pool, MeterProvider: fetches})
		if err != nil {
			return nil, err
		}
		return g, g.AddConsumer("c", handler(tr), nil)
	}
	// Subscribe every group first, so the preloaded messages require them.
	for i := range nGroups {
		g, err := newGroup(i, harness.NewTracker(b.c.N))
		if err != nil {
			return 0, nil, err
		}
		if err := g.Start(ctx, consumergroup.FromNow()); err != nil {
			return 0, nil, err
		}
		if err := g.Stop(ctx); err != nil {
			return 0, nil, err
		}
	}
	if err := b.preload(ctx, topic); err != nil {
		return 0, nil, err
	}
	trs := make([]*harness.Tracker, nGroups)
	groups := make([]*consumergroup.Group, nGroups)
	for i := range groups {
		trs[i] = harness.NewTracker(b.c.N)
		g, err := newGroup(i, trs[i])
		if err != nil {
			return 0, nil, err
		}
		groups[i] = g
	}
	start := time.Now()
	if err := startAll(ctx, groups); err != nil {
		return 0, nil, err
	}
	harness.Logf("W3: %d groups started in %v", len(groups), time.Since(start).Round(time.Millisecond))
	for i, tr := range trs {
		for tr.Distinct() < b.c.N {
			select {
			case <-ctx.Done():
				return 0, nil, fmt.Errorf("group %d: %d of %d handled: %w", i, tr.Distinct(), b.c.N, ctx.Err())
			case <-time.After(time.Millisecond):
			}
		}
	}
	for { // every batch's completion committed
		var open int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.outbox_group_batches`).Scan(&open); err != nil {
			return 0, nil, err
		}
		if open == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	for _, g := range groups {
		if err := g.Stop(context.Background()); err != nil {
			return 0, nil, err
		}
	}
	for i, tr := range trs {
		if err := tr.Check(fmt.Sprintf("%s group g%d", topic, i)); err != nil {
			return 0, nil, err
		}
	}
	return elapsed, fetches, nil
}

// w4: messages produced at a fixed rate while the consumer runs; latency
// from the producer's commit returning to the handler starting. With
// -mode, the topic is PUB_SUB and one group reads it (see
// startTopicConsumer).
func (b *bench) w4(ctx context.Context) error {
	const topic = "w4"
	tr := harness.NewTracker(b.c.N)
	stop, err := b.startTopicConsumer(ctx, topic, tr)
	if err != nil {
		return err
	}
	defer stop()
	time.Sleep(500 * time.Millisecond)
	if err := b.paced(ctx, topic, tr, 0, b.c.N, b.c.Rate); err != nil {
		return err
	}
	if err := b.waitDrained(ctx, topic, tr); err != nil {
		return err
	}
	if err := tr.Check("W4"); err != nil {
		return err
	}
	p50, p99 := tr.Latencies()
	if n, f50, _, f99 := b.fetches.percentiles(); n > 0 {
		harness.Logf("W4: %d looks, p50 %.3f ms, p99 %.3f ms", n, f50, f99)
	}
	if b.c.latencyFile != "" {
		if err := tr.WriteLatencies(b.c.latencyFile); err != nil {
			return err
		}
	}
	b.c.Emit(tr.LastStart().Sub(tr.FirstCommit()), b.c.N, p50, p99)
	return nil
}

// paced sends messages from, from+1, … (n of them) to topic, one a
// transaction, at rate a second (see harness.Paced).
func (b *bench) paced(ctx context.Context, topic string, tr *harness.Tracker, from, n, rate int) error {
	return harness.Paced(ctx, tr, from, n, rate, func(ctx context.Context, seq int) error { return b.sendOne(ctx, topic, seq) })
}

// stopper is a running consumer.
type stopper interface{ Stop(context.Context) error }

func (b *bench) startConsumer(ctx context.Context, topic string, tr *harness.Tracker) (stopper, error) {
	k, err := b.app.NewConsumer(ctx, outbox.ConsumerConfig{Topic: topic, Handler: handler(tr),
		Concurrency: b.c.Workers, BatchSize: b.c.batch, PollInterval: b.c.pollInterval})
	if err != nil {
		return nil, err
	}
	return k, k.Start(ctx)
}

// waitDrained waits until every message was handled and its completion
// committed: none of the topic's groups' batches is open.
func (b *bench) waitDrained(ctx context.Context, topic string, tr *harness.Tracker) error {
	if err := tr.WaitHandled(ctx); err != nil {
		return fmt.Errorf("waiting for handlers: %w", err)
	}
	const left = `SELECT EXISTS (SELECT 1 FROM ` + schema + `.outbox_group_batches AS b
		        JOIN ` + schema + `.outbox_topic_subscriptions AS s ON s.id = b.subscription_id WHERE s.topic = $1)`
	for {
		var more bool
		if err := b.pool.QueryRow(ctx, left, topic).Scan(&more); err != nil {
			return fmt.Errorf("waiting for completions: %w", err)
		}
		if !more {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
}

func (b *bench) preload(ctx context.Context, topic string) error {
	for start := 0; start < b.c.N; start += 1000 {
		msgs := make([]outbox.Message, 0, 1000)
		for i := start; i < min(b.c.N, start+1000); i++ {
			m := outbox.Message{Topic: topic, Payload: harness.Payload(i)}
			if b.c.msgGroups > 0 {
				m.Group = "g" + strconv.Itoa(i%b.c.msgGroups)
			}
			msgs = append(msgs, m)
		}
		if _, err := b.producer.SendBatch(ctx, b.pool, msgs); err != nil {
			return fmt.Errorf("preload: %w", err)
		}
	}
	_, err := b.pool.Exec(ctx, `VACUUM ANALYZE `+schema+`.outbox_published`)
	return err
}

// handler is the workloads' handler: it records the message's seq.
func handler(tr *harness.Tracker) outbox.Handler {
	return func(_ context.Context, d *outbox.Delivery) error {
		if err := tr.HandledPayload(d.Payload); err != nil {
			return outbox.Permanent(err)
		}
		return nil
	}
}
