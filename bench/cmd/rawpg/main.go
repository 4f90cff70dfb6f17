// Command rawpg is the baseline the benchmark reads pgoutbox against:
// messaging written by hand on pgx alone, with the textbook SQL, on one
// table. It runs W1 to W5 (bench/README.md) and prints one JSON line.
//
//	cd bench && go run ./cmd/rawpg -workload W2
//
// A QUEUE consumer (W2, W4, W5) is -workers goroutines, each claiming up
// to 100 rows with UPDATE … FOR UPDATE SKIP LOCKED under a 30 s lease,
// handling them, and deleting them; one LISTEN connection wakes them all,
// with a 1 s poll behind it. Fan-out (W3) is a cursor row per group, held
// FOR UPDATE while a batch is handled. That cursor is not commit-safe: a
// transaction holding a lower id can commit after a reader moved past a
// higher one, and that message is skipped for good. W3 preloads
// everything before reading, so it cannot happen there, but the figure is
// an upper bound for a scheme that is not correct in general.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/bench/internal/harness"
)

const (
	schema  = "bench_rawpg"
	channel = "bench_rawpg"
	claimed = 100 // rows a claim or a fan-out read takes at most
)

const createSQL = `
CREATE SCHEMA bench_rawpg;
CREATE TABLE bench_rawpg.outbox (
    id          bigserial PRIMARY KEY,
    topic       text NOT NULL,
    payload     jsonb NOT NULL,
    status      smallint NOT NULL DEFAULT 0, -- 0 ready, 1 leased
    lease_until timestamptz,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_topic_id ON bench_rawpg.outbox (topic, id);
CREATE TABLE bench_rawpg.group_cursor (
    topic      text NOT NULL,
    group_name text NOT NULL,
    last_id    bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (topic, group_name)
);`

const (
	insertSQL = `INSERT INTO bench_rawpg.outbox (topic, payload) VALUES ($1, $2)`
	claimSQL  = `
UPDATE bench_rawpg.outbox SET status = 1, lease_until = now() + interval '30 seconds'
WHERE id IN (SELECT id FROM bench_rawpg.outbox
             WHERE topic = $1 AND (status = 0 OR lease_until < now())
             ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED)
RETURNING id, payload`
	deleteSQL = `DELETE FROM bench_rawpg.outbox WHERE id = ANY($1)`
)

type program struct {
	harness.Run
	notify bool
	pool   *pgxpool.Pool
}

func main() {
	p := &program{Run: harness.Run{System: "rawpg"}}
	p.Register(flag.CommandLine)
	flag.BoolVar(&p.notify, "notify", false, "W1: NOTIFY in every sending transaction, as W4 and W5 do")
	flag.Parse()
	if err := p.Check(harness.DefaultN, "W5"); err != nil {
		p.Fail(err)
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
	if err := harness.ResetSchema(ctx, p.pool, schema, func(ctx context.Context) error {
		_, err := p.pool.Exec(ctx, createSQL)
		return err
	}); err != nil {
		return err
	}
	switch p.Workload {
	case "W1":
		return p.w1(ctx)
	case "W2":
		return p.w2(ctx)
	case "W3":
		return p.w3(ctx)
	default:
		return p.w4(ctx)
	}
}

// send writes message seq to topic in a transaction of its own, with a
// NOTIFY when notify is set.
func (p *program) send(ctx context.Context, topic string, seq int, notify bool) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, insertSQL, topic, harness.Payload(seq)); err != nil {
			return err
		}
		if notify {
			_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, channel, topic)
			return err
		}
		return nil
	})
}

func (p *program) w1(ctx context.Context) error {
	start := time.Now()
	err := harness.Concurrently(ctx, p.N, p.Workers, func(ctx context.Context, seq int) error {
		return p.send(ctx, "w1", seq, p.notify)
	})
	elapsed := time.Since(start)
	if err != nil {
		return err
	}
	var rows, distinct int
	if err := p.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (payload->>'seq')::int) FROM bench_rawpg.outbox`).Scan(&rows, &distinct); err != nil {
		return err
	}
	if rows != p.N || distinct != p.N {
		return fmt.Errorf("expected %d messages, the table has %d rows, %d distinct", p.N, rows, distinct)
	}
	p.Emit(elapsed, p.N, 0, 0)
	return nil
}

// preload writes n messages to topic, 1,000 a statement.
func (p *program) preload(ctx context.Context, topic string) error {
	for lo := 0; lo < p.N; lo += 1000 {
		payloads := make([]string, 0, 1000)
		for seq := lo; seq < min(p.N, lo+1000); seq++ {
			payloads = append(payloads, string(harness.Payload(seq)))
		}
		if _, err := p.pool.Exec(ctx, `INSERT INTO bench_rawpg.outbox (topic, payload) SELECT $1, unnest($2::jsonb[])`, topic, payloads); err != nil {
			return fmt.Errorf("preload: %w", err)
		}
	}
	_, err := p.pool.Exec(ctx, `VACUUM ANALYZE bench_rawpg.outbox`)
	return err
}

func (p *program) w2(ctx context.Context) error {
	const topic = "w2"
	if err := p.preload(ctx, topic); err != nil {
		return err
	}
	tr := harness.NewTracker(p.N)
	start := time.Now()
	stop, err := p.consume(ctx, topic, tr)
	if err != nil {
		return err
	}
	err = p.waitDrained(ctx, topic, tr)
	elapsed := time.Since(start)
	if stopErr := stop(); err == nil {
		err = stopErr
	}
	if err != nil {
		return err
	}
	if err := tr.Check("rawpg W2"); err != nil {
		return err
	}
	p.Emit(elapsed, p.N, 0, 0)
	return nil
}

// w4 is W4, and W5 with the horizon held in its middle third.
func (p *program) w4(ctx context.Context) error {
	topic := "w4"
	tr := harness.NewTracker(p.N)
	stop, err := p.consume(ctx, topic, tr)
	if err != nil {
		return err
	}
	defer stop()
	time.Sleep(500 * time.Millisecond)
	send := func(ctx context.Context, seq int) error { return p.send(ctx, topic, seq, true) }
	held, err := p.Pace(ctx, tr, p.pool.Config().ConnConfig, harness.TableStats(p.pool, schema, "%"), send)
	if err != nil {
		return err
	}
	if err := p.waitDrained(ctx, topic, tr); err != nil {
		return err
	}
	if err := tr.Check("rawpg " + p.Workload); err != nil {
		return err
	}
	p.EmitPaced(tr, held, nil)
	return nil
}

// waitDrained waits until every message was handled and deleted.
func (p *program) waitDrained(ctx context.Context, topic string, tr *harness.Tracker) error {
	if err := tr.WaitHandled(ctx); err != nil {
		return err
	}
	for {
		var left bool
		if err := p.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM bench_rawpg.outbox WHERE topic = $1)`, topic).Scan(&left); err != nil {
			return err
		}
		if !left {
			return nil
		}
		if err := harness.SleepUntil(ctx, time.Now().Add(time.Millisecond)); err != nil {
			return err
		}
	}
}

// consume starts the QUEUE consumer of topic; stop stops it and waits.
func (p *program) consume(ctx context.Context, topic string, tr *harness.Tracker) (stop func() error, err error) {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+channel); err != nil {
		conn.Release()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	wakes := make([]chan struct{}, p.Workers)
	for i := range wakes {
		wakes[i] = make(chan struct{}, 1)
	}
	var wg sync.WaitGroup
	errs := make(chan error, p.Workers)
	wg.Add(1)
	go func() { // every notification wakes every worker
		defer wg.Done()
		defer conn.Release()
		for {
			if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
				if ctx.Err() == nil {
					errs <- fmt.Errorf("listen: %w", err)
				}
				conn.Conn().Close(context.Background()) // a connection left mid-wait is not reusable
				return
			}
			for _, w := range wakes {
				select {
				case w <- struct{}{}:
				default:
				}
			}
		}
	}()
	for _, wake := range wakes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.work(ctx, topic, tr, wake); err != nil && ctx.Err() == nil {
				errs <- err
			}
		}()
	}
	return func() error {
		cancel()
		wg.Wait()
		close(errs)
		return <-errs
	}, nil
}

// work claims, handles and deletes batches until ctx ends, waiting for a
// wake-up or a second when a claim finds nothing.
func (p *program) work(ctx context.Context, topic string, tr *harness.Tracker, wake <-chan struct{}) error {
	ids := make([]int64, 0, claimed)
	for ctx.Err() == nil {
		rows, err := p.pool.Query(ctx, claimSQL, topic)
		if err != nil {
			return err
		}
		ids = ids[:0]
		var id int64
		var payload []byte
		_, err = pgx.ForEachRow(rows, []any{&id, &payload}, func() error {
			ids = append(ids, id)
			return tr.HandledPayload(payload)
		})
		if err != nil {
			return err
		}
		if len(ids) == 0 {
			select {
			case <-ctx.Done():
			case <-wake:
			case <-time.After(time.Second):
			}
			continue
		}
		if _, err := p.pool.Exec(ctx, deleteSQL, ids); err != nil {
			return err
		}
	}
	return nil
}

// w3: n preloaded messages; each of -groups groups reads them all through
// its cursor, timed to the last group's last cursor update committed.
func (p *program) w3(ctx context.Context) error {
	const topic = "w3"
	if err := p.preload(ctx, topic); err != nil {
		return err
	}
	trs := make([]*harness.Tracker, p.Groups)
	for i := range trs {
		trs[i] = harness.NewTracker(p.N)
		if _, err := p.pool.Exec(ctx, `INSERT INTO bench_rawpg.group_cursor (topic, group_name) VALUES ($1, $2)`, topic, "g"+strconv.Itoa(i)); err != nil {
			return err
		}
	}
	start := time.Now()
	errs := make(chan error, p.Groups)
	for i, tr := range trs {
		go func() { errs <- p.follow(ctx, topic, "g"+strconv.Itoa(i), tr) }()
	}
	var err error
	for range trs {
		err = errors.Join(err, <-errs)
	}
	elapsed := time.Since(start)
	if err != nil {
		return err
	}
	for i, tr := range trs {
		if err := tr.Check(fmt.Sprintf("rawpg W3 group g%d", i)); err != nil {
			return err
		}
	}
	p.Emit(elapsed, p.N*p.Groups, 0, 0)
	return nil
}

// follow reads topic through group's cursor until a read finds nothing:
// in each transaction it locks the cursor, reads the next rows, handles
// them and moves the cursor.
func (p *program) follow(ctx context.Context, topic, group string, tr *harness.Tracker) error {
	for {
		n := 0
		err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
			var last int64
			if err := tx.QueryRow(ctx, `SELECT last_id FROM bench_rawpg.group_cursor WHERE topic = $1 AND group_name = $2 FOR UPDATE`, topic, group).Scan(&last); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `SELECT id, payload FROM bench_rawpg.outbox WHERE topic = $1 AND id > $2 ORDER BY id LIMIT 100`, topic, last)
			if err != nil {
				return err
			}
			var id int64
			var payload []byte
			if _, err := pgx.ForEachRow(rows, []any{&id, &payload}, func() error {
				n++
				last = id
				return tr.HandledPayload(payload)
			}); err != nil {
				return err
			}
			if n == 0 {
				return nil
			}
			_, err = tx.Exec(ctx, `UPDATE bench_rawpg.group_cursor SET last_id = $3 WHERE topic = $1 AND group_name = $2`, topic, group, last)
			return err
		})
		if err != nil || n == 0 {
			return err
		}
	}
}
