package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// W5, held xmin (../shared/bench README "W5 held xmin"): W4's load (one
// consumer or group instance with -workers handlers, a producer paced at
// -rate, one message a transaction) for -duration. In its middle third a
// connection of its own holds a REPEATABLE READ transaction with an xid
// and a snapshot open, so nothing deleted or updated after it began can be
// reclaimed. Latency percentiles per phase (A before, B during, C after, by
// the producer's commit time), and the dead tuples of every pgoutbox table
// at the end of A and of B, per table, with their sizes.
//
// Without -mode it runs on a QUEUE topic; with -mode on a PUB_SUB topic
// with one group of that tracking mode.

// w5Result is W5's line: the peers' fields plus a per-table breakdown.
type w5Result struct {
	result
	AP50Ms         float64              `json:"a_p50_ms"`
	AP99Ms         float64              `json:"a_p99_ms"`
	BP50Ms         float64              `json:"b_p50_ms"`
	BP99Ms         float64              `json:"b_p99_ms"`
	CP50Ms         float64              `json:"c_p50_ms"`
	CP99Ms         float64              `json:"c_p99_ms"`
	BOverAP99      float64              `json:"b_over_a_p99"`
	DeadTuplesAEnd int64                `json:"dead_tuples_a_end"`
	DeadTuplesEnd  int64                `json:"dead_tuples_end"`
	AN             int                  `json:"a_n"`
	BN             int                  `json:"b_n"`
	CN             int                  `json:"c_n"`
	TablesAEnd     map[string]tableStat `json:"tables_a_end"`
	TablesBEnd     map[string]tableStat `json:"tables_b_end"`
	TablesCEnd     map[string]tableStat `json:"tables_c_end"`
}

// tableStat is one table's dead tuples, live tuples and size (with its
// indexes and TOAST) in kB, and, where the pgstattuple extension can be
// created, the share of its heap that is not live tuples (dead tuples and
// free space, by pgstattuple_approx), in percent.
type tableStat struct {
	Dead     int64    `json:"dead"`
	Live     int64    `json:"live"`
	KB       int64    `json:"kb"`
	BloatPct *float64 `json:"bloat_pct,omitempty"`
}

func (b *bench) w5(ctx context.Context) error {
	const topic = "w5"
	c := b.c
	tr := newTracker(c.n)
	stop, err := b.startTopicConsumer(ctx, topic, tr)
	if err != nil {
		return err
	}
	defer stop()
	time.Sleep(500 * time.Millisecond)

	start := time.Now()
	type held struct {
		from, until time.Time
		a, bEnd     map[string]tableStat
		err         error
	}
	hc := make(chan held, 1)
	hctx, cancelHold := context.WithCancel(ctx)
	defer cancelHold()
	go func() {
		var h held
		h.from, h.until, h.a, h.bEnd, h.err = b.holdXmin(hctx, start, c.duration)
		hc <- h
	}()
	if err := b.paced(ctx, topic, tr, 0, c.n, c.rate); err != nil {
		return err
	}
	h := <-hc
	if h.err != nil {
		return fmt.Errorf("held transaction: %w", h.err)
	}
	if err := b.waitDrained(ctx, topic, tr); err != nil {
		return err
	}
	if err := tr.check("W5"); err != nil {
		return err
	}
	cEnd, err := b.tableStats(ctx)
	if err != nil {
		return err
	}
	p50, p99 := tr.latencies()
	a50, a99, an := tr.latenciesBetween(time.Time{}, h.from)
	b50, b99, bn := tr.latenciesBetween(h.from, h.until)
	c50, c99, cn := tr.latenciesBetween(h.until, time.Time{})
	s := tr.lastStart().Sub(tr.firstCommit()).Seconds()
	r := w5Result{
		result: result{System: c.system, Workload: c.workload, N: c.n, Seconds: round(s, 4),
			MsgsPerSec: round(float64(c.n)/s, 1), P50Ms: round(p50, 3), P99Ms: round(p99, 3)},
		AP50Ms: round(a50, 3), AP99Ms: round(a99, 3), BP50Ms: round(b50, 3), BP99Ms: round(b99, 3),
		CP50Ms: round(c50, 3), CP99Ms: round(c99, 3),
		DeadTuplesAEnd: sumDead(h.a), DeadTuplesEnd: sumDead(h.bEnd),
		AN: an, BN: bn, CN: cn,
		TablesAEnd: h.a, TablesBEnd: h.bEnd, TablesCEnd: cEnd,
	}
	if a99 > 0 {
		r.BOverAP99 = round(b99/a99, 2)
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	return nil
}

// startTopicConsumer starts what consumes topic: a member of a QUEUE
// topic's group, or (with
// -mode) one instance of group g0, subscribed from now.
func (b *bench) startTopicConsumer(ctx context.Context, topic string, tr *tracker) (stop func(), err error) {
	if b.c.mode == "" {
		if err := b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: topic}); err != nil {
			return nil, err
		}
		k, err := b.startConsumer(ctx, topic, tr)
		if err != nil {
			return nil, err
		}
		return func() { k.Stop(context.Background()) }, nil
	}
	mode := outbox.TrackingMode(strings.ToUpper(b.c.mode))
	if err := b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: topic, Semantics: outbox.PubSub, Tracking: mode}); err != nil {
		return nil, err
	}
	g, err := consumergroup.New(b.pool, consumergroup.Config{Client: b.client, Topic: topic, Group: "g0", Schema: schema,
		Concurrency: b.c.workers, HeartbeatPool: b.pool, MeterProvider: b.fetches})
	if err != nil {
		return nil, err
	}
	if err := g.AddConsumer("c", tr.handler, nil); err != nil {
		return nil, err
	}
	if err := g.Start(ctx, consumergroup.FromNow()); err != nil {
		return nil, err
	}
	return func() { g.Stop(context.Background()) }, nil
}

// holdXmin holds the horizon for the middle third of d from start, on a
// connection of its own, and reads the tables' stats at the end of A and
// of B. It returns when B began (the held transaction had its snapshot)
// and ended (its COMMIT returned).
func (b *bench) holdXmin(ctx context.Context, start time.Time, d time.Duration) (from, until time.Time, a, bEnd map[string]tableStat, err error) {
	conn, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig)
	if err != nil {
		return
	}
	defer conn.Close(context.Background())
	if err = sleepUntil(ctx, start.Add(d/3)); err != nil {
		return
	}
	if a, err = b.tableStats(ctx); err != nil {
		return
	}
	if b.c.noHold {
		from = time.Now()
		if err = sleepUntil(ctx, start.Add(2*d/3)); err != nil {
			return
		}
		bEnd, err = b.tableStats(ctx)
		until = time.Now()
		return
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return
	}
	defer tx.Rollback(context.Background())
	var xid string
	var rels int
	if err = tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
		return
	}
	if err = tx.QueryRow(ctx, `SELECT count(*) FROM pg_class`).Scan(&rels); err != nil {
		return
	}
	from = time.Now()
	logf("W5: phase B from %.2fs: holding xid %s", from.Sub(start).Seconds(), xid)
	if err = sleepUntil(ctx, start.Add(2*d/3)); err != nil {
		return
	}
	if bEnd, err = b.tableStats(ctx); err != nil {
		return
	}
	if err = tx.Commit(ctx); err != nil {
		return
	}
	until = time.Now()
	logf("W5: phase C from %.2fs; dead tuples %d at end of A, %d at end of B", until.Sub(start).Seconds(), sumDead(a), sumDead(bEnd))
	return
}

// tableStats reads every pgoutbox table's dead and live tuples and size,
// after dropping this connection's statistics snapshot (other backends
// publish their counts at most once a second).
func (b *bench) tableStats(ctx context.Context) (map[string]tableStat, error) {
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return nil, err
	}
	_, extErr := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pgstattuple`)
	bloat := `NULL::float8`
	if extErr == nil {
		bloat = `(SELECT round((100 - a.approx_tuple_percent)::numeric, 1)::float8 FROM pgstattuple_approx(relid) AS a)`
	}
	rows, err := conn.Query(ctx, `
		SELECT relname, n_dead_tup, n_live_tup, pg_total_relation_size(relid) / 1024,
		       CASE WHEN pg_relation_size(relid) > 0 THEN `+bloat+` END
		FROM pg_stat_user_tables WHERE schemaname = $1 AND relname LIKE 'outbox%'`, schema)
	if err != nil {
		return nil, err
	}
	stats := map[string]tableStat{}
	var name string
	var s tableStat
	_, err = pgx.ForEachRow(rows, []any{&name, &s.Dead, &s.Live, &s.KB, &s.BloatPct}, func() error {
		stats[name] = s
		return nil
	})
	return stats, err
}

func sumDead(m map[string]tableStat) int64 {
	var n int64
	for _, s := range m {
		n += s.Dead
	}
	return n
}

func sleepUntil(ctx context.Context, t time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(t)):
		return nil
	}
}

var errW5N = errors.New("-n is set by -rate and -duration for W5 and SKEW")
