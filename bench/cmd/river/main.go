// Command river runs the benchmark's workloads (bench/README.md) on River
// (github.com/riverqueue/river) with its documented defaults: one queue
// with MaxWorkers = -workers, jobs sent with InsertTx in the caller's
// transaction, and completion read from River's JobCompleted events,
// which it emits once its completer has stored the job's state. It
// prints one JSON line.
//
//	cd bench && go run ./cmd/river -workload W2 -n 1000
//	cd bench && go run ./cmd/river -workload W4 -fetch-cooldown 1ms
//
// W3 is not supported: River has no consumer groups, every job is worked
// once. Its producer fetches at most once per FetchCooldown (100 ms by
// default) and at most as many jobs as it has free workers, so at its
// defaults 8 workers drain at most 80 jobs a second; -fetch-cooldown 1ms
// (River's minimum) is the tuned variant.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/pgoutbox/pgoutbox/bench/internal/harness"
)

const schema = "bench_river"

// benchArgs is a job's arguments: the benchmark's payload.
type benchArgs struct {
	Seq  int    `json:"seq"`
	Body string `json:"body"`
}

func (benchArgs) Kind() string { return "bench" }

// recorder is the worker: it records the job's seq.
type recorder struct {
	river.WorkerDefaults[benchArgs]
	tr *harness.Tracker
}

func (w *recorder) Work(_ context.Context, job *river.Job[benchArgs]) error {
	w.tr.Handled(job.Args.Seq)
	return nil
}

type program struct {
	harness.Run
	fetchCooldown time.Duration
	pool          *pgxpool.Pool
	client        *river.Client[pgx.Tx]
	tr            *harness.Tracker
}

func main() {
	p := &program{Run: harness.Run{System: "river"}}
	p.Register(flag.CommandLine)
	flag.DurationVar(&p.fetchCooldown, "fetch-cooldown", 0, "River's FetchCooldown (0 = River's default, 100ms)")
	flag.Parse()
	if err := p.Check(harness.DefaultN, "W5"); err != nil {
		p.Fail(err)
	}
	if p.fetchCooldown > 0 {
		p.System = "river-fc" + p.fetchCooldown.String()
	}
	if p.Workload == "W3" {
		p.Unsupported("River has no consumer groups: a job is worked once")
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.Timeout)
	defer cancel()
	if err := p.run(ctx); err != nil {
		p.Fail(err)
	}
}

func (p *program) run(ctx context.Context) (err error) {
	if p.pool, err = harness.OpenPool(ctx, p.DSN, p.Workers); err != nil {
		return err
	}
	defer p.pool.Close()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	driver := riverpgxv5.New(p.pool)
	if err := harness.ResetSchema(ctx, p.pool, schema, func(ctx context.Context) error {
		if _, err := p.pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			return err
		}
		migrator, err := rivermigrate.New(driver, &rivermigrate.Config{Schema: schema, Logger: logger})
		if err != nil {
			return err
		}
		_, err = migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
		return err
	}); err != nil {
		return err
	}
	p.tr = harness.NewTracker(p.N)
	workers := river.NewWorkers()
	river.AddWorker(workers, &recorder{tr: p.tr})
	p.client, err = river.NewClient(driver, &river.Config{
		Schema:        schema,
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: p.Workers}},
		Workers:       workers,
		FetchCooldown: p.fetchCooldown,
		Logger:        logger,
	})
	if err != nil {
		return err
	}
	switch p.Workload {
	case "W1":
		return p.w1(ctx)
	case "W2":
		return p.w2(ctx)
	default:
		return p.w4(ctx)
	}
}

// send inserts job seq in a transaction of its own.
func (p *program) send(ctx context.Context, seq int) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		_, err := p.client.InsertTx(ctx, tx, benchArgs{Seq: seq, Body: harness.Body}, nil)
		return err
	})
}

func (p *program) w1(ctx context.Context) error {
	start := time.Now()
	err := harness.Concurrently(ctx, p.N, p.Workers, p.send)
	elapsed := time.Since(start)
	if err != nil {
		return err
	}
	var rows, distinct int
	if err := p.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (args->>'seq')::int) FROM `+schema+`.river_job`).Scan(&rows, &distinct); err != nil {
		return err
	}
	if rows != p.N || distinct != p.N {
		return fmt.Errorf("expected %d jobs, river_job has %d rows, %d distinct", p.N, rows, distinct)
	}
	p.Emit(elapsed, p.N, 0, 0)
	return nil
}

// completions counts the JobCompleted events from now on.
func (p *program) completions() (done func() int, unsubscribe func()) {
	events, cancel := p.client.SubscribeConfig(&river.SubscribeConfig{
		Kinds:    []river.EventKind{river.EventKindJobCompleted},
		ChanSize: p.N + 1000, // River drops the events that overflow it
	})
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range events {
			n.Add(1)
		}
	}()
	return func() int { return int(n.Load()) }, func() { cancel(); wg.Wait() }
}

// waitCompleted waits until every job's completion was stored.
func (p *program) waitCompleted(ctx context.Context, done func() int) error {
	for done() < p.N {
		if err := harness.SleepUntil(ctx, time.Now().Add(time.Millisecond)); err != nil {
			return fmt.Errorf("%d of %d jobs completed: %w", done(), p.N, err)
		}
	}
	var completed int
	if err := p.pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.river_job WHERE state = 'completed'`).Scan(&completed); err != nil {
		return err
	}
	if completed != p.N {
		return fmt.Errorf("expected %d completed jobs, river_job has %d", p.N, completed)
	}
	return nil
}

func (p *program) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.client.Stop(ctx); err != nil {
		harness.Logf("river: Stop: %v", err)
	}
}

func (p *program) w2(ctx context.Context) error {
	for lo := 0; lo < p.N; lo += 5000 {
		params := make([]river.InsertManyParams, 0, 5000)
		for seq := lo; seq < min(p.N, lo+5000); seq++ {
			params = append(params, river.InsertManyParams{Args: benchArgs{Seq: seq, Body: harness.Body}})
		}
		if _, err := p.client.InsertManyFast(ctx, params); err != nil {
			return fmt.Errorf("preload: %w", err)
		}
	}
	done, unsubscribe := p.completions()
	defer unsubscribe()
	start := time.Now()
	if err := p.client.Start(ctx); err != nil {
		return err
	}
	err := p.waitCompleted(ctx, done)
	elapsed := time.Since(start)
	p.stop()
	if err != nil {
		return err
	}
	if err := p.tr.Check("river W2"); err != nil {
		return err
	}
	p.Emit(elapsed, p.N, 0, 0)
	return nil
}

// w4 is W4, and W5 with the horizon held in its middle third.
func (p *program) w4(ctx context.Context) error {
	done, unsubscribe := p.completions()
	defer unsubscribe()
	if err := p.client.Start(ctx); err != nil {
		return err
	}
	defer p.stop()
	time.Sleep(500 * time.Millisecond)
	held, err := p.Pace(ctx, p.tr, p.pool.Config().ConnConfig, harness.TableStats(p.pool, schema, "river_job"), p.send)
	if err != nil {
		return err
	}
	if err := p.waitCompleted(ctx, done); err != nil {
		return err
	}
	if err := p.tr.Check("river " + p.Workload); err != nil {
		return err
	}
	p.EmitPaced(p.tr, held, nil)
	return nil
}
