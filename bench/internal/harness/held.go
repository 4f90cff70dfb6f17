package harness

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// W5, held xmin: W4's load for Run.Duration; in its middle third a
// connection of its own holds a REPEATABLE READ transaction with an xid
// and a snapshot, so nothing deleted or updated after it began can be
// reclaimed. Messages are put in phases A (before), B (during) and C
// (after) by when their producer's commit returned.

// TableStat is one table's dead and live tuples and its size with its
// indexes and TOAST, in kB, and, where the pgstattuple extension can be
// created, the share of its heap that is not live tuples (dead tuples
// and free space, by pgstattuple_approx), in percent.
type TableStat struct {
	Dead     int64    `json:"dead"`
	Live     int64    `json:"live"`
	KB       int64    `json:"kb"`
	BloatPct *float64 `json:"bloat_pct,omitempty"`
}

// Tables reads the statistics of a system's tables.
type Tables func(context.Context) (map[string]TableStat, error)

// TableStats returns a Tables that reads the tables of schema whose name
// is LIKE pattern, on a connection of pool, after dropping that
// connection's statistics snapshot (other backends publish their counts
// at most once a second).
func TableStats(pool *pgxpool.Pool, schema, pattern string) Tables {
	return func(ctx context.Context) (map[string]TableStat, error) {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		defer conn.Release()
		if _, err := conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
			return nil, err
		}
		bloat := `NULL::float8`
		if ext, err := pgstattuple(ctx, conn.Conn()); err == nil {
			bloat = `(SELECT round((100 - a.approx_tuple_percent)::numeric, 1)::float8 FROM ` + ext + `.pgstattuple_approx(relid) AS a)`
		}
		rows, err := conn.Query(ctx, `
			SELECT relname, n_dead_tup, n_live_tup, pg_total_relation_size(relid) / 1024,
			       CASE WHEN pg_relation_size(relid) > 0 THEN `+bloat+` END
			FROM pg_stat_user_tables WHERE schemaname = $1 AND relname LIKE $2`, schema, pattern)
		if err != nil {
			return nil, err
		}
		stats := map[string]TableStat{}
		var name string
		var s TableStat
		_, err = pgx.ForEachRow(rows, []any{&name, &s.Dead, &s.Live, &s.KB, &s.BloatPct}, func() error {
			stats[name] = s
			return nil
		})
		return stats, err
	}
}

// pgstattuple creates the pgstattuple extension if it can, and returns
// the schema it is in, quoted (a program's search_path need not hold it).
func pgstattuple(ctx context.Context, conn *pgx.Conn) (string, error) {
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pgstattuple`); err != nil {
		return "", err
	}
	var schema string
	err := conn.QueryRow(ctx, `SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pgstattuple'`).Scan(&schema)
	return schema, err
}

// SumDead adds up the dead tuples of every table.
func SumDead(m map[string]TableStat) int64 {
	var n int64
	for _, s := range m {
		n += s.Dead
	}
	return n
}

// Held is what HoldXmin saw: when phase B began (the held transaction
// had its snapshot) and ended (its COMMIT returned), and the tables at
// the end of A and of B.
type Held struct {
	From, Until time.Time
	AEnd, BEnd  map[string]TableStat
}

// HoldXmin holds the horizon for the middle third of d from start, on a
// connection of its own made with cfg, and reads tables at the end of A
// and of B. With noHold it holds nothing (a steady run, for contrast).
func HoldXmin(ctx context.Context, cfg *pgx.ConnConfig, start time.Time, d time.Duration, noHold bool, tables Tables) (h Held, err error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return h, err
	}
	defer conn.Close(context.Background())
	if err := SleepUntil(ctx, start.Add(d/3)); err != nil {
		return h, err
	}
	if h.AEnd, err = tables(ctx); err != nil {
		return h, err
	}
	if noHold {
		h.From = time.Now()
		if err := SleepUntil(ctx, start.Add(2*d/3)); err != nil {
			return h, err
		}
		h.BEnd, err = tables(ctx)
		h.Until = time.Now()
		return h, err
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return h, err
	}
	defer tx.Rollback(context.Background())
	var xid string
	var rels int
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
		return h, err
	}
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_class`).Scan(&rels); err != nil {
		return h, err
	}
	h.From = time.Now()
	Logf("W5: phase B from %.2fs: holding xid %s", h.From.Sub(start).Seconds(), xid)
	if err := SleepUntil(ctx, start.Add(2*d/3)); err != nil {
		return h, err
	}
	if h.BEnd, err = tables(ctx); err != nil {
		return h, err
	}
	if err := tx.Commit(ctx); err != nil {
		return h, err
	}
	h.Until = time.Now()
	Logf("W5: phase C from %.2fs; dead tuples %d at end of A, %d at end of B", h.Until.Sub(start).Seconds(), SumDead(h.AEnd), SumDead(h.BEnd))
	return h, nil
}

// W5Result is W5's line: the common fields, latencies per phase, and the
// dead tuples at the end of A and of B, in all and per table.
type W5Result struct {
	Result
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
	TablesAEnd     map[string]TableStat `json:"tables_a_end"`
	TablesBEnd     map[string]TableStat `json:"tables_b_end"`
	TablesCEnd     map[string]TableStat `json:"tables_c_end,omitempty"`
}

// W5Result returns the W5 line of a run whose handlers tr recorded, held
// as h, with the tables cEnd at its end (may be nil).
func (r *Run) W5Result(tr *Tracker, h Held, cEnd map[string]TableStat) W5Result {
	p50, p99 := tr.Latencies()
	a50, a99, an := tr.LatenciesBetween(time.Time{}, h.From)
	b50, b99, bn := tr.LatenciesBetween(h.From, h.Until)
	c50, c99, cn := tr.LatenciesBetween(h.Until, time.Time{})
	w := W5Result{
		Result: r.Result(tr.LastStart().Sub(tr.FirstCommit()), r.N, p50, p99),
		AP50Ms: Round(a50, 3), AP99Ms: Round(a99, 3), BP50Ms: Round(b50, 3), BP99Ms: Round(b99, 3),
		CP50Ms: Round(c50, 3), CP99Ms: Round(c99, 3),
		DeadTuplesAEnd: SumDead(h.AEnd), DeadTuplesEnd: SumDead(h.BEnd),
		AN: an, BN: bn, CN: cn,
		TablesAEnd: h.AEnd, TablesBEnd: h.BEnd, TablesCEnd: cEnd,
	}
	if a99 > 0 {
		w.BOverAP99 = Round(b99/a99, 2)
	}
	return w
}

// Pace sends the run's N messages at its Rate, one a call of send, and
// records each commit in tr (W4). For W5 it holds the horizon in the
// middle third of Duration meanwhile, on a connection made with cfg, and
// returns what the hold saw; for W4 the Held is empty.
func (r *Run) Pace(ctx context.Context, tr *Tracker, cfg *pgx.ConnConfig, tables Tables, send func(context.Context, int) error) (Held, error) {
	if r.Workload != "W5" {
		return Held{}, Paced(ctx, tr, 0, r.N, r.Rate, send)
	}
	type hold struct {
		h   Held
		err error
	}
	done := make(chan hold, 1)
	start := time.Now()
	go func() {
		h, err := HoldXmin(ctx, cfg, start, r.Duration, false, tables)
		done <- hold{h, err}
	}()
	err := Paced(ctx, tr, 0, r.N, r.Rate, send)
	h := <-done
	if h.err != nil {
		return h.h, fmt.Errorf("held transaction: %w", h.err)
	}
	return h.h, err
}

// EmitPaced prints the line of a paced run: W5's with its phases (h,
// and the tables at the end, cEnd, if read), else W4's latencies.
func (r *Run) EmitPaced(tr *Tracker, h Held, cEnd map[string]TableStat) {
	if r.Workload == "W5" {
		Print(r.W5Result(tr, h, cEnd))
		return
	}
	p50, p99 := tr.Latencies()
	r.Emit(tr.LastStart().Sub(tr.FirstCommit()), r.N, p50, p99)
}
