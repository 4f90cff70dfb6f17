package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgoutbox/pgoutbox/bench/internal/harness"
	"github.com/pgoutbox/pgoutbox/consumergroup"
)

// BACKFILL_OLTP -mode M: the seed's "backfill vs OLTP" check. pgbench's
// TPC-B-like transactions run at a steady rate (-oltp-tps, -oltp-clients) on
// the same server, in the benchmark's database (its pgbench_* tables). The
// p95 of their latency is measured alone first (-oltp-seconds), then while a
// group backfills -n stored messages with the throttle -backfill-rate and
// -target-latency set, and for -oltp-after after it ended (the write-back
// of what it wrote). One line reports both p95s, their ratio and the
// backfill's rate. pgbench must be on PATH (Debian: postgresql-client).

// oltpResult is BACKFILL_OLTP's JSON line.
type oltpResult struct {
	System            string  `json:"system"`
	Workload          string  `json:"workload"`
	N                 int     `json:"n"`
	BackfillRate      float64 `json:"backfill_rate_cap"`
	TargetLatencyMS   float64 `json:"target_latency_ms"`
	MaxSlowdown       float64 `json:"max_slowdown"`
	OLTPTPS           int     `json:"oltp_tps"`
	BaselineP95MS     float64 `json:"baseline_p95_ms"`
	DuringP95MS       float64 `json:"during_p95_ms"`
	P95Ratio          float64 `json:"p95_ratio"`
	BaselineTxns      int     `json:"baseline_txns"`
	DuringTxns        int     `json:"during_txns"`
	BackfillSeconds   float64 `json:"backfill_seconds"`
	BackfillPerSecond float64 `json:"backfill_rows_per_sec"`
}

func (b *bench) backfillOLTP(ctx context.Context) error {
	const topic = "backfill"
	if _, err := exec.LookPath("pgbench"); err != nil {
		return fmt.Errorf("BACKFILL_OLTP needs pgbench on PATH: %w", err)
	}
	harness.Logf("pgbench -i (scale %d)", b.c.oltpScale)
	if out, err := exec.CommandContext(ctx, "pgbench", "-i", "-q", "-s", strconv.Itoa(b.c.oltpScale), b.c.DSN).CombinedOutput(); err != nil {
		return fmt.Errorf("pgbench -i: %w: %s", err, out)
	}
	if err := b.storeOld(ctx, topic); err != nil {
		return err
	}
	// Old messages have been on disk for a while in production: the
	// baseline must not pay for writing back the ones just stored.
	if _, err := b.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return err
	}
	syscall.Sync() // and the kernel's write-back of it (the server is on this machine)

	harness.Logf("baseline: %d s of pgbench at %d tps", int(b.c.oltpDuration.Seconds()), b.c.oltpTPS)
	from := time.Now()
	for end := from.Add(b.c.oltpDuration); time.Now().Before(end); {
		if err := b.pgbench(ctx, 5*time.Second); err != nil {
			return err
		}
	}
	baseline, err := b.pgbenchLatencies(from, time.Now())
	if err != nil {
		return err
	}

	harness.Logf("backfill of %d rows beside pgbench", b.c.N)
	done := make(chan error, 1)
	var elapsed time.Duration
	start := time.Now()
	go func() {
		var err error
		elapsed, err = b.runBackfill(ctx, topic, consumergroup.SubscriptionOptions{
			BackfillRate: b.c.backfillRate, BackfillTargetLatency: b.c.targetLatency, BackfillMaxSlowdown: b.c.maxSlowdown})
		done <- err
	}()
	var backfillErr error
	for running := true; running; {
		if err := b.pgbench(ctx, 5*time.Second); err != nil {
			return err
		}
		select {
		case backfillErr = <-done:
			running = false
		default:
		}
	}
	if backfillErr != nil {
		return backfillErr
	}
	// What the backfill wrote reaches the disk later (the kernel writes
	// dirty pages back after ~30 s): that is its cost too.
	for end := start.Add(elapsed + b.c.oltpAfter); time.Now().Before(end); {
		if err := b.pgbench(ctx, 5*time.Second); err != nil {
			return err
		}
	}
	during, err := b.pgbenchLatencies(start, start.Add(elapsed+b.c.oltpAfter))
	if err != nil {
		return err
	}
	if len(baseline) == 0 || len(during) == 0 {
		return fmt.Errorf("pgbench logged %d baseline and %d concurrent transactions", len(baseline), len(during))
	}
	bp, dp := p95(baseline), p95(during)
	out, _ := json.Marshal(oltpResult{System: b.c.System, Workload: b.c.Workload, N: b.c.N,
		BackfillRate: b.c.backfillRate, TargetLatencyMS: ms(b.c.targetLatency), MaxSlowdown: b.c.maxSlowdown, OLTPTPS: b.c.oltpTPS,
		BaselineP95MS: harness.Round(bp, 2), DuringP95MS: harness.Round(dp, 2), P95Ratio: harness.Round(dp/bp, 2),
		BaselineTxns: len(baseline), DuringTxns: len(during),
		BackfillSeconds: harness.Round(elapsed.Seconds(), 2), BackfillPerSecond: harness.Round(float64(b.c.N)/elapsed.Seconds(), 1)})
	fmt.Println(string(out))
	return nil
}

// pgbench runs pgbench's TPC-B-like script for d at the configured rate,
// logging every transaction under the benchmark's log directory. It
// vacuums pgbench's two hot tables first, as autovacuum would: on a server
// with autovacuum off their dead rows would slow pgbench down over time,
// the backfill or not.
func (b *bench) pgbench(ctx context.Context, d time.Duration) error {
	if _, err := b.pool.Exec(ctx, "VACUUM pgbench_branches, pgbench_tellers"); err != nil {
		return err
	}
	if err := os.MkdirAll(b.oltpLogDir(), 0o755); err != nil {
		return err
	}
	prefix := filepath.Join(b.oltpLogDir(), "pgbench_log")
	cmd := exec.CommandContext(ctx, "pgbench", "-n", "-c", strconv.Itoa(b.c.oltpClients), "-j", "1",
		"-R", strconv.Itoa(b.c.oltpTPS), "-T", strconv.Itoa(int(d.Seconds())), "-l", "--log-prefix", prefix, b.c.DSN)
	cmd.Dir = b.oltpLogDir()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgbench: %w: %s", err, out)
	}
	return nil
}

func (b *bench) oltpLogDir() string {
	return filepath.Join(os.TempDir(), fmt.Sprintf("pgoutbox-bench-oltp-%d", os.Getpid()))
}

// pgbenchLatencies reads every pgbench log of this run and returns the
// latencies (ms) of the transactions that ended within [from, to].
// A log line is "client txn latency_us script epoch_s epoch_us [lag_us]".
func (b *bench) pgbenchLatencies(from, to time.Time) ([]float64, error) {
	files, err := filepath.Glob(filepath.Join(b.oltpLogDir(), "pgbench_log.*"))
	if err != nil {
		return nil, err
	}
	var lat []float64
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 6 {
				continue
			}
			us, err1 := strconv.ParseFloat(fields[2], 64)
			sec, err2 := strconv.ParseInt(fields[4], 10, 64)
			usec, err3 := strconv.ParseInt(fields[5], 10, 64)
			if err1 != nil || err2 != nil || err3 != nil {
				continue // "skipped" transactions and the like
			}
			at := time.Unix(sec, usec*1000)
			if !at.Before(from) && !at.After(to) {
				lat = append(lat, us/1000)
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return lat, nil
}

func p95(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)*95)/100]
}

func ms(d time.Duration) float64 { return harness.Round(float64(d)/float64(time.Millisecond), 3) }
