// Command bench measures pgoutbox on the workloads of ../shared/bench
// (README "Workloads"), with the peer programs' flags and output: exactly one
// JSON line on stdout, diagnostics on stderr, exit 1 on failure (including
// any message never handled).
//
//	go run ./internal/bench -workload W2
//
// It owns schema bench_pgoutbox of the target database and recreates it on
// every run.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
)

const schema = "bench_pgoutbox"

var defaultN = map[string]int{"W1": 20000, "W2": 50000, "W3": 20000, "W4": 2000, "CLEANUP": 20000, "DROP": 100_000, "BACKFILL": 100_000, "BACKFILL_OLTP": 1_000_000, "W5": 0, "SKEW": 0, "ADMIN": 1_000_000, "RELAY": 50_000}

type config struct {
	system, dsn, workload, mode string
	cpuProfile, latencyFile     string
	pollInterval                time.Duration
	n, workers, groups, rate    int
	batch                       int
	timeout, notifyInterval     time.Duration
	busyNotifyInterval          time.Duration
	backfillRate                float64
	targetLatency               time.Duration
	maxSlowdown                 float64
	oltpScale, oltpClients      int
	oltpTPS                     int
	oltpDuration                time.Duration
	oltpAfter                   time.Duration
	duration                    time.Duration
	fillfactor                  int
	noHold, ordered             bool
	msgGroups                   int
	natsURL                     string
	latencySeconds              int
}

func main() {
	c := parseFlags()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if c.cpuProfile != "" {
		f, err := os.Create(c.cpuProfile)
		if err != nil {
			fail(c, err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fail(c, err)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(ctx, c); err != nil {
		fail(c, err)
	}
}

func parseFlags() *config {
	c := &config{system: "pgoutbox"}
	flag.StringVar(&c.dsn, "dsn", "postgres://postgres@127.0.0.1:5432/bench?sslmode=disable", "PostgreSQL connection string")
	flag.StringVar(&c.workload, "workload", "W1", "W1 produce | W2 queue drain | W3 fan-out drain | W4 latency | RELAY to NATS JetStream (see relay.go) | W5 held xmin (see w5.go) | SKEW hot and cold topic (see skew.go) | CLEANUP | BACKFILL (see maintenance.go) | DROP (see drop.go) | ADMIN (see admin.go) | BACKFILL_OLTP (see oltp.go)")
	flag.IntVar(&c.n, "n", 0, "messages (0 = workload default)")
	flag.IntVar(&c.workers, "workers", 8, "producer goroutines (W1) / consumer concurrency (W2, W4)")
	flag.IntVar(&c.batch, "batch", 0, "W2, W4: the consumer's BatchSize (0 = library default)")
	flag.IntVar(&c.groups, "groups", 4, "consumer groups (W3)")
	flag.IntVar(&c.rate, "rate", 500, "produce rate in msg/s (W4, W5)")
	flag.DurationVar(&c.duration, "duration", 60*time.Second, "W5: how long the producer runs (n = rate × duration); SKEW: each phase's length")
	flag.DurationVar(&c.timeout, "timeout", 5*time.Minute, "abort after this long")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file")
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
	c.workload = strings.ToUpper(c.workload)
	if c.mode != "" {
		c.system = "pgoutbox-" + c.mode
	}
	if c.ordered {
		c.system = "pgoutbox-ordered"
	}
	if _, ok := defaultN[c.workload]; !ok {
		fail(c, fmt.Errorf("unknown workload %q (want W1..W5, CLEANUP, BACKFILL, BACKFILL_OLTP)", c.workload))
	}
	if c.workload == "W5" || c.workload == "SKEW" {
		if c.n > 0 {
			fail(c, errW5N)
		}
		c.n = int(float64(c.rate) * c.duration.Seconds())
	}
	if c.n <= 0 {
		c.n = defaultN[c.workload]
	}
	if c.workers < 1 || c.groups < 1 || c.rate < 1 {
		fail(c, errors.New("-workers, -groups and -rate must be >= 1"))
	}
	return c
}

func run(ctx context.Context, c *config) error {
	if c.workload == "RELAY" && c.mode == "" {
		c.mode = "offset"
	}
	if (c.workload == "W3" || c.workload == "CLEANUP" || c.workload == "DROP" || c.workload == "BACKFILL" || c.workload == "BACKFILL_OLTP" || c.workload == "ADMIN") && c.mode == "" {
		unsupported(c, c.workload+" needs -mode bitmap, counter or offset")
	}
	pool, err := openPool(ctx, c)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := resetSchema(ctx, pool); err != nil {
		return err
	}
	if c.fillfactor > 0 {
		if _, err := pool.Exec(ctx, fmt.Sprintf("ALTER TABLE %s.outbox_published SET (fillfactor = %d)", schema, c.fillfactor)); err != nil {
			return err
		}
	}
	client, err := outbox.NewClient(pool, outbox.Config{Schema: schema})
	if err != nil {
		return err
	}
	producer, err := outbox.NewProducer(outbox.ProducerConfig{Schema: schema, NotifyInterval: c.notifyInterval,
		BusyNotifyInterval: c.busyNotifyInterval})
	if err != nil {
		return err
	}
	if c.workload != "DROP" { // which sizes its own
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
	b := &bench{c: c, pool: pool, client: client, producer: producer, fetches: &fetchRecorder{}}
	if c.mode == "" && c.workload != "W5" && c.workload != "SKEW" { // QUEUE workloads: configure the topic, as a service would at boot
		if err := client.ConfigureTopic(ctx, outbox.TopicConfig{Name: strings.ToLower(c.workload), Ordered: c.ordered}); err != nil {
			return err
		}
	}
	switch c.workload {
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
	client   *outbox.Client
	producer *outbox.Producer
}

// subscribeIdle subscribes -groups groups g0, g1, … to topic from now and
// stops them: the topic's messages need them, and nobody consumes.
func (b *bench) subscribeIdle(ctx context.Context, topic string) error {
	for i := range b.c.groups {
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
	err := concurrently(ctx, b.c.n, b.c.workers, func(ctx context.Context, seq int) error {
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
	if rows != b.c.n || distinct != b.c.n {
		return fmt.Errorf("expected %d messages, table has %d rows / %d distinct", b.c.n, rows, distinct)
	}
	emit(b.c, elapsed, b.c.n, 0, 0)
	return nil
}

func (b *bench) sendOne(ctx context.Context, topic string, seq int) error {
	return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.producer.Send(ctx, tx, outbox.Message{Topic: topic, Payload: payload(seq)})
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
	tr := newTracker(b.c.n)
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
	if err := tr.check("W2"); err != nil {
		return err
	}
	if n, f50, _, f99 := b.fetches.percentiles(); n > 0 {
		logf("W2: %d looks, p50 %.3f ms, p99 %.3f ms", n, f50, f99)
	}
	emit(b.c, elapsed, b.c.n, 0, 0)
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
	elapsed, fetches, err := b.drainGroups(ctx, topic, b.c.groups)
	if err != nil {
		return err
	}
	s := elapsed.Seconds()
	res := result{System: b.c.system, Workload: b.c.workload, N: b.c.n, Seconds: round(s, 4),
		MsgsPerSec: round(float64(b.c.n*b.c.groups)/s, 1), Groups: b.c.groups}
	var p50, p95, p99 float64
	res.Fetches, p50, p95, p99 = fetches.percentiles()
	res.FetchP50Ms, res.FetchP95Ms, res.FetchP99Ms = round(p50, 3), round(p95, 3), round(p99, 3)
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
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
	newGroup := func(i int, tr *tracker) (*consumergroup.Group, error) {
		g, err := consumergroup.New(b.pool, consumergroup.Config{Client: b.client, Topic: topic, Group: fmt.Sprintf("g%d", i), Schema: schema,
			Concurrency: b.c.workers, BatchSize: 1000, HeartbeatPool: b.pool, MeterProvider: fetches})
		if err != nil {
			return nil, err
		}
		return g, g.AddConsumer("c", tr.handler, nil)
	}
	// Subscribe every group first, so the preloaded messages require them.
	for i := range nGroups {
		g, err := newGroup(i, newTracker(b.c.n))
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
	trs := make([]*tracker, nGroups)
	groups := make([]*consumergroup.Group, nGroups)
	for i := range groups {
		trs[i] = newTracker(b.c.n)
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
	logf("W3: %d groups started in %v", len(groups), time.Since(start).Round(time.Millisecond))
	for i, tr := range trs {
		for tr.distinct() < b.c.n {
			select {
			case <-ctx.Done():
				return 0, nil, fmt.Errorf("group %d: %d of %d handled: %w", i, tr.distinct(), b.c.n, ctx.Err())
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
		if err := tr.check(fmt.Sprintf("%s group g%d", topic, i)); err != nil {
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
	tr := newTracker(b.c.n)
	stop, err := b.startTopicConsumer(ctx, topic, tr)
	if err != nil {
		return err
	}
	defer stop()
	time.Sleep(500 * time.Millisecond)
	if err := b.paced(ctx, topic, tr, 0, b.c.n, b.c.rate); err != nil {
		return err
	}
	if err := b.waitDrained(ctx, topic, tr); err != nil {
		return err
	}
	if err := tr.check("W4"); err != nil {
		return err
	}
	p50, p99 := tr.latencies()
	if n, f50, _, f99 := b.fetches.percentiles(); n > 0 {
		logf("W4: %d looks, p50 %.3f ms, p99 %.3f ms", n, f50, f99)
	}
	if b.c.latencyFile != "" {
		if err := tr.writeLatencies(b.c.latencyFile); err != nil {
			return err
		}
	}
	emit(b.c, tr.lastStart().Sub(tr.firstCommit()), b.c.n, p50, p99)
	return nil
}

// paced sends messages from, from+1, … (n of them) to topic, one a
// transaction, on a fixed schedule of rate a second (a late send is
// followed by the next one at once), and records each commit in tr.
func (b *bench) paced(ctx context.Context, topic string, tr *tracker, from, n, rate int) error {
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		if err := b.sendOne(ctx, topic, from+i); err != nil {
			return fmt.Errorf("send %s %d: %w", topic, from+i, err)
		}
		tr.committed(from + i)
	}
	return nil
}

// stopper is a running consumer.
type stopper interface{ Stop(context.Context) error }

func (b *bench) startConsumer(ctx context.Context, topic string, tr *tracker) (stopper, error) {
	// A member of the topic's group, as pgoutbox.Consumer runs it.
	g, err := consumergroup.New(b.pool, consumergroup.Config{Topic: topic, Group: sqlq.QueueGroup, Client: b.client,
		Concurrency: b.c.workers, BatchSize: b.c.batch, PollInterval: b.c.pollInterval, MeterProvider: b.fetches})
	if err != nil {
		return nil, err
	}
	if err := g.AddConsumer("bench", tr.handler, nil); err != nil {
		return nil, err
	}
	return g, g.Start(ctx, consumergroup.FromBeginning(false))
}

// waitDrained waits until every message was handled and its completion
// committed: none of the topic's groups' batches is open.
func (b *bench) waitDrained(ctx context.Context, topic string, tr *tracker) error {
	for tr.distinct() < b.c.n {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for handlers: %d of %d handled: %w", tr.distinct(), b.c.n, ctx.Err())
		case <-time.After(time.Millisecond):
		}
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
	for start := 0; start < b.c.n; start += 1000 {
		msgs := make([]outbox.Message, 0, 1000)
		for i := start; i < min(b.c.n, start+1000); i++ {
			m := outbox.Message{Topic: topic, Payload: payload(i)}
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

const body = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func payload(seq int) []byte {
	return []byte(fmt.Sprintf(`{"seq":%d,"body":"%s"}`, seq, body))
}

// concurrently calls send(seq) for seq in [0,n) from `workers` goroutines.
func concurrently(ctx context.Context, n, workers int, send func(context.Context, int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := int(next.Add(1) - 1); seq < n; seq = int(next.Add(1) - 1) {
				if err := send(ctx, seq); err != nil {
					errs <- fmt.Errorf("send %d: %w", seq, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func openPool(ctx context.Context, c *config) (*pgxpool.Pool, error) {
	if err := ensureDatabase(ctx, c.dsn); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(c.dsn)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(c.dsn, "pool_max_conns") {
		cfg.MaxConns = int32(2*c.workers + 8)
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

func ensureDatabase(ctx context.Context, dsn string) error {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" {
		return err
	}
	admin := cfg.ConnConfig.Copy()
	admin.Database = "postgres"
	aconn, aerr := pgx.ConnectConfig(ctx, admin)
	if aerr != nil {
		return fmt.Errorf("%v; and connecting to postgres to create it: %w", err, aerr)
	}
	defer aconn.Close(ctx)
	_, err = aconn.Exec(ctx, "CREATE DATABASE "+ident.Quote(cfg.ConnConfig.Database))
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		return err
	}
	return nil
}

// resetSchema drops and re-creates the benchmark's schema, then checkpoints.
// The DROP runs on a connection of its own: a backend that once held the
// hundreds of locks a cascading DROP SCHEMA takes keeps a grown lock table,
// and scans all of it at every later commit, which would slow whichever
// pooled connection a producer got. (A service's pool never runs it; the
// migrations open connections of their own too.)
func resetSchema(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		return err
	}
	if err := migrations.Up(ctx, pool, migrations.Config{Schema: schema}); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		logf("CHECKPOINT skipped: %v", err)
	}
	return nil
}

// ---------------------------------------------------------------- output

type result struct {
	System     string  `json:"system"`
	Workload   string  `json:"workload"`
	N          int     `json:"n"`
	Seconds    float64 `json:"seconds"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	// W3: how many groups, and their fetch transactions
	// (pgoutbox.group.fetch.duration).
	Groups     int     `json:"groups,omitempty"`
	Fetches    int     `json:"fetches,omitempty"`
	FetchP50Ms float64 `json:"fetch_p50_ms,omitempty"`
	FetchP95Ms float64 `json:"fetch_p95_ms,omitempty"`
	FetchP99Ms float64 `json:"fetch_p99_ms,omitempty"`
}

func round(v float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

func emit(c *config, elapsed time.Duration, deliveries int, p50, p99 float64) {
	s := elapsed.Seconds()
	out, _ := json.Marshal(result{System: c.system, Workload: c.workload, N: c.n, Seconds: round(s, 4),
		MsgsPerSec: round(float64(deliveries)/s, 1), P50Ms: round(p50, 3), P99Ms: round(p99, 3)})
	fmt.Println(string(out))
}

func unsupported(c *config, why string) {
	out, _ := json.Marshal(map[string]any{"system": c.system, "workload": c.workload, "unsupported": true})
	fmt.Println(string(out))
	logf("%s %s unsupported: %s", c.system, c.workload, why)
	os.Exit(0)
}

func fail(c *config, err error) {
	out, _ := json.Marshal(map[string]any{"system": c.system, "workload": c.workload, "n": c.n, "error": err.Error()})
	fmt.Println(string(out))
	os.Exit(1)
}

func logf(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

// ---------------------------------------------------------------- tracker

// tracker records per message how often it was handled, when a handler
// first started on it and when its producer's commit returned (ns since base).
type tracker struct {
	base      time.Time
	counts    []atomic.Int32
	started   []atomic.Int64 // +1; 0 = never
	commits   []atomic.Int64 // +1; 0 = never
	bad       atomic.Int64
	nDistinct atomic.Int64
	last      atomic.Int64
}

func newTracker(n int) *tracker {
	return &tracker{base: time.Now(), counts: make([]atomic.Int32, n), started: make([]atomic.Int64, n), commits: make([]atomic.Int64, n)}
}

func (t *tracker) now() int64 { return int64(time.Since(t.base)) + 1 }

func (t *tracker) handled(seq int) {
	if seq < 0 || seq >= len(t.counts) {
		t.bad.Add(1)
		return
	}
	if t.counts[seq].Add(1) != 1 {
		return
	}
	now := t.now()
	t.started[seq].Store(now)
	t.nDistinct.Add(1)
	for old := t.last.Load(); now > old && !t.last.CompareAndSwap(old, now); old = t.last.Load() {
	}
}

// handler is the workloads' handler: it records the message's seq.
func (t *tracker) handler(_ context.Context, d *outbox.Delivery) error {
	var m struct {
		Seq int `json:"seq"`
	}
	if err := json.Unmarshal(d.Payload, &m); err != nil {
		return outbox.Permanent(err)
	}
	t.handled(m.Seq)
	return nil
}

func (t *tracker) committed(seq int) { t.commits[seq].Store(t.now()) }
func (t *tracker) distinct() int     { return int(t.nDistinct.Load()) }

func (t *tracker) check(workload string) error {
	missing, dups := 0, 0
	for i := range t.counts {
		switch c := int(t.counts[i].Load()); c {
		case 0:
			missing++
		default:
			dups += c - 1
		}
	}
	if dups > 0 {
		logf("pgoutbox %s: %d duplicate deliveries", workload, dups)
	}
	if missing > 0 || t.bad.Load() > 0 {
		return fmt.Errorf("%d of %d messages never handled, %d unknown sequence numbers", missing, len(t.counts), t.bad.Load())
	}
	return nil
}

func (t *tracker) latencies() (p50, p99 float64) {
	p50, p99, _ = t.latenciesBetween(time.Time{}, time.Time{})
	return p50, p99
}

// latenciesBetween is latencies over the messages whose producer commit
// returned in [from, to) (a zero time is no bound), and how many those are.
func (t *tracker) latenciesBetween(from, to time.Time) (p50, p99 float64, n int) {
	lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
	if !from.IsZero() {
		lo = int64(from.Sub(t.base)) + 1
	}
	if !to.IsZero() {
		hi = int64(to.Sub(t.base)) + 1
	}
	var v []float64
	for i := range t.counts {
		s, c := t.started[i].Load(), t.commits[i].Load()
		if s == 0 || c == 0 || c < lo || c >= hi {
			continue
		}
		v = append(v, max(0, float64(s-c)/1e6))
	}
	sort.Float64s(v)
	return percentile(v, 50), percentile(v, 99), len(v)
}

// writeLatencies writes, per message handled, the time its producer's
// commit returned (ms since the tracker began) and its pickup latency
// (ms), tab-separated, one line each, in message order.
func (t *tracker) writeLatencies(path string) error {
	var b strings.Builder
	for i := range t.counts {
		s, c := t.started[i].Load(), t.commits[i].Load()
		if s != 0 && c != 0 {
			fmt.Fprintf(&b, "%.3f\t%.3f\n", float64(c)/1e6, float64(s-c)/1e6)
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := max(0, int(math.Ceil(p/100*float64(len(sorted))))-1)
	return sorted[k]
}

func (t *tracker) firstCommit() time.Time {
	return t.base.Add(time.Duration(t.commits[0].Load() - 1))
}
func (t *tracker) lastStart() time.Time { return t.base.Add(time.Duration(t.last.Load() - 1)) }
