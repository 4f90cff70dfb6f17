package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/bench/internal/harness"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// DROP -mode M: -n finished messages of one topic (-groups subscribed
// groups, every one done with them) in one partition, removed once by the
// maintenance service dropping the partition, and once (another -n in
// another partition) by its row-by-row cleanup followed by the VACUUM
// that the deleted rows need: time and WAL bytes of each. A CHECKPOINT
// precedes each, so both pay for full-page images alike.

// dropResult is DROP's JSON line.
type dropResult struct {
	System         string  `json:"system"`
	Workload       string  `json:"workload"`
	Mode           string  `json:"mode"`
	N              int     `json:"n"`
	DropMs         float64 `json:"drop_ms"`
	DropWALBytes   int64   `json:"drop_wal_bytes"`
	DeleteMs       float64 `json:"delete_ms"`
	DeleteWALBytes int64   `json:"delete_wal_bytes"`
	VacuumMs       float64 `json:"vacuum_ms"`
	VacuumWALBytes int64   `json:"vacuum_wal_bytes"`
	TimeRatio      float64 `json:"time_ratio"` // (delete + vacuum) / drop
	WALRatio       float64 `json:"wal_ratio"`
}

func (b *bench) drop(ctx context.Context) error {
	const topic = "drop"
	mode := outbox.TrackingMode(strings.ToUpper(b.c.mode))
	if err := b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: topic, Semantics: outbox.PubSub, Tracking: mode,
		Retention: time.Microsecond, ZeroSubscriptionRetention: time.Microsecond}); err != nil {
		return err
	}
	if err := b.subscribeIdle(ctx, topic); err != nil {
		return err
	}
	const size = 1000 // transaction ids per partition: the fill takes n/10,000 of them
	res := dropResult{System: b.c.System, Workload: b.c.Workload, Mode: b.c.mode, N: b.c.N}

	// Dropped whole.
	s, err := maintenance.New(b.pool, maintenance.Config{Client: b.client, PartitionSize: size, RowCleanupDelay: time.Hour})
	if err != nil {
		return err
	}
	table, hi, err := b.fillPartition(ctx, s, topic, mode)
	if err != nil {
		return err
	}
	if err := b.burnTo(ctx, hi); err != nil { // no transaction can write into it any more
		return err
	}
	var r maintenance.Report
	res.DropMs, res.DropWALBytes, err = b.measureWAL(ctx, func() error {
		r, err = s.RunOnce(ctx)
		return err
	})
	if err != nil {
		return err
	}
	if !containsString(r.PartitionsDropped, table) {
		return fmt.Errorf("drop: %s was not dropped (%+v)", table, r)
	}

	// Deleted row by row (the partition is not full yet: the job leaves it).
	s, err = maintenance.New(b.pool, maintenance.Config{Client: b.client, PartitionSize: size,
		RowCleanupDelay: time.Nanosecond, BatchPause: time.Nanosecond})
	if err != nil {
		return err
	}
	if table, _, err = b.fillPartition(ctx, s, topic, mode); err != nil {
		return err
	}
	res.DeleteMs, res.DeleteWALBytes, err = b.measureWAL(ctx, func() error {
		r, err = s.RunOnce(ctx)
		return err
	})
	if err != nil {
		return err
	}
	if got := r.Deleted["outbox_published"]; got != int64(b.c.N) {
		return fmt.Errorf("drop: cleanup deleted %d of %d messages", got, b.c.N)
	}
	res.VacuumMs, res.VacuumWALBytes, err = b.measureWAL(ctx, func() error {
		_, err := b.pool.Exec(ctx, `VACUUM `+schema+`.`+table)
		return err
	})
	if err != nil {
		return err
	}
	res.TimeRatio = harness.Round((res.DeleteMs+res.VacuumMs)/res.DropMs, 1)
	res.WALRatio = harness.Round(float64(res.DeleteWALBytes+res.VacuumWALBytes)/float64(max(res.DropWALBytes, 1)), 1)
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	return nil
}

// fillPartition runs s's partition job, moves the transaction ids to the
// start of a fresh partition, stores -n messages there (10,000 a
// transaction) that every group finished, and returns its table and upper
// bound.
func (b *bench) fillPartition(ctx context.Context, s *maintenance.Service, topic string, mode outbox.TrackingMode) (string, uint64, error) {
	var id int64
	var lo, hi, last uint64
	for attempt := 0; ; attempt++ {
		if _, err := s.RunOnce(ctx); err != nil {
			return "", 0, err
		}
		err := b.pool.QueryRow(ctx, `SELECT p.id, p.lo::text::numeric, p.hi::text::numeric
FROM `+schema+`.outbox_partitions AS p WHERE p.lo >= pg_snapshot_xmax(pg_current_snapshot()) ORDER BY p.lo LIMIT 1`).Scan(&id, &lo, &hi)
		if err == nil {
			break
		}
		if !errors.Is(err, pgx.ErrNoRows) || attempt == 3 {
			return "", 0, fmt.Errorf("drop: no partition ahead: %w", err)
		}
		// The first partition after the migrations is larger: go past it.
		if err := b.pool.QueryRow(ctx, `SELECT max(hi)::text::numeric FROM `+schema+`.outbox_partitions`).Scan(&last); err != nil {
			return "", 0, err
		}
		if err := b.burnTo(ctx, last); err != nil {
			return "", 0, err
		}
	}
	if err := b.burnTo(ctx, lo); err != nil {
		return "", 0, err
	}
	if err := b.storeRows(ctx, topic); err != nil {
		return "", 0, err
	}
	var finish string
	switch mode {
	case outbox.Bitmap:
		finish = `UPDATE ` + schema + `.outbox_published SET done_bits = required_bits`
	case outbox.Counter:
		finish = `UPDATE ` + schema + `.outbox_published SET required_count = 0, required_ids = '{}'`
	}
	if finish != "" {
		if _, err := b.pool.Exec(ctx, finish); err != nil {
			return "", 0, err
		}
	}
	if _, err := b.pool.Exec(ctx, `UPDATE `+schema+`.outbox_subscription_offsets SET position = pg_current_snapshot(),
    pair_cur = NULL, resume_xid = NULL, resume_id = NULL`); err != nil {
		return "", 0, err
	}
	table := "outbox_published_p" + strconv.FormatInt(id, 10)
	_, err := b.pool.Exec(ctx, `VACUUM ANALYZE `+schema+`.`+table)
	return table, hi, err
}

// burnTo commits transactions that each take an id until the next id is
// at least xid.
func (b *bench) burnTo(ctx context.Context, xid uint64) error {
	_, err := b.pool.Exec(ctx, `DO $$ BEGIN
    WHILE pg_snapshot_xmax(pg_current_snapshot())::text::numeric < `+strconv.FormatUint(xid, 10)+` LOOP
        PERFORM pg_current_xact_id(); COMMIT;
    END LOOP;
END $$`)
	return err
}

// measureWAL runs f after a CHECKPOINT and returns how long it took (ms)
// and how many WAL bytes were written meanwhile.
func (b *bench) measureWAL(ctx context.Context, f func() error) (float64, int64, error) {
	if _, err := b.pool.Exec(ctx, `CHECKPOINT`); err != nil {
		return 0, 0, err
	}
	var before string
	if err := b.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&before); err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if err := f(); err != nil {
		return 0, 0, err
	}
	elapsed := time.Since(start)
	var wal int64
	if err := b.pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, before).Scan(&wal); err != nil {
		return 0, 0, err
	}
	return harness.Round(float64(elapsed.Microseconds())/1000, 2), wal, nil
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
