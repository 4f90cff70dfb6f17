package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/bench/internal/harness"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// The maintenance workloads (pgoutbox only: the peers have no such jobs).
//
//	CLEANUP  -mode M: W1 on a PUB_SUB topic with -groups subscribed groups
//	         (-n messages, -workers producers, each in its own transaction),
//	         every message then finished by every group, then one
//	         maintenance pass deletes them: produce rate beside cleanup rate.
//	BACKFILL -mode M: -n messages stored with no group subscribed, then a
//	         group subscribes from the beginning with Backfill and drains
//	         them (-workers handlers): rows a second, to the backfill's
//	         recorded end. -backfill-rate and -target-latency set its
//	         throttle (default: none).

// cleanupResult is CLEANUP's JSON line.
type cleanupResult struct {
	System        string  `json:"system"`
	Workload      string  `json:"workload"`
	N             int     `json:"n"`
	Groups        int     `json:"groups"`
	ProducePerSec float64 `json:"produce_per_sec"`
	CleanupPerSec float64 `json:"cleanup_per_sec"`
	Seconds       float64 `json:"seconds"`
}

func (b *bench) cleanup(ctx context.Context) error {
	const topic = "cleanup"
	mode := outbox.TrackingMode(strings.ToUpper(b.c.mode))
	if err := b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: topic, Semantics: outbox.PubSub, Tracking: mode,
		Retention: time.Microsecond, ZeroSubscriptionRetention: time.Microsecond}); err != nil {
		return err
	}
	if err := b.subscribeIdle(ctx, topic); err != nil { // nobody consumes during the produce phase
		return err
	}
	start := time.Now()
	if err := harness.Concurrently(ctx, b.c.N, b.c.Workers, func(ctx context.Context, seq int) error {
		return b.sendOne(ctx, topic, seq)
	}); err != nil {
		return err
	}
	produced := time.Since(start)
	// Every group finishes every message, as its completions would record it.
	var finish string
	switch mode {
	case outbox.Bitmap:
		finish = `UPDATE ` + schema + `.outbox_published SET done_bits = required_bits`
	case outbox.Counter:
		finish = `WITH d AS (INSERT INTO ` + schema + `.outbox_consumer_groups (message_id, subscription_id)
    SELECT o.id, s FROM ` + schema + `.outbox_published AS o, unnest(o.required_ids) AS s)
UPDATE ` + schema + `.outbox_published SET completed_count = required_count`
	default:
		finish = `UPDATE ` + schema + `.outbox_subscription_offsets SET position = pg_current_snapshot(),
    pair_cur = NULL, resume_xid = NULL, resume_id = NULL`
	}
	if _, err := b.pool.Exec(ctx, finish); err != nil {
		return fmt.Errorf("finish: %w", err)
	}
	if mode != outbox.Offset { // and, having read them, their positions are past them
		if _, err := b.pool.Exec(ctx, `UPDATE `+schema+`.outbox_subscription_offsets SET position = pg_current_snapshot(),
    pair_cur = NULL, resume_xid = NULL, resume_id = NULL`); err != nil {
			return fmt.Errorf("finish: %w", err)
		}
	}
	if _, err := b.pool.Exec(ctx, `VACUUM ANALYZE `+schema+`.outbox_published`); err != nil {
		return err
	}
	s, err := maintenance.New(b.pool, maintenance.Config{Client: b.client, RowCleanupDelay: time.Nanosecond}) // row by row: see DROP
	if err != nil {
		return err
	}
	start = time.Now()
	r, err := s.RunOnce(ctx)
	cleaned := time.Since(start)
	if err != nil {
		return err
	}
	if got := r.Deleted["outbox_published"]; got != int64(b.c.N) {
		return fmt.Errorf("cleanup deleted %d of %d messages", got, b.c.N)
	}
	out, _ := json.Marshal(cleanupResult{System: b.c.System, Workload: b.c.Workload, N: b.c.N, Groups: b.c.Groups,
		ProducePerSec: harness.Round(float64(b.c.N)/produced.Seconds(), 1), CleanupPerSec: harness.Round(float64(b.c.N)/cleaned.Seconds(), 1),
		Seconds: harness.Round(cleaned.Seconds(), 4)})
	fmt.Println(string(out))
	return nil
}

func (b *bench) backfill(ctx context.Context) error {
	const topic = "backfill"
	if err := b.storeOld(ctx, topic); err != nil {
		return err
	}
	elapsed, err := b.runBackfill(ctx, topic, consumergroup.SubscriptionOptions{BackfillBatchSize: 1000,
		BackfillRate: b.c.backfillRate, BackfillTargetLatency: b.c.targetLatency, BackfillMaxSlowdown: b.c.maxSlowdown})
	if err != nil {
		return err
	}
	b.c.Emit(elapsed, b.c.N, 0, 0)
	return nil
}

// storeOld stores -n messages on a PUB_SUB topic nobody subscribes to, in
// chunks of 10,000 rows, a transaction each (distinct xids, as producers
// leave them), without the producer's round trips.
func (b *bench) storeOld(ctx context.Context, topic string) error {
	mode := outbox.TrackingMode(strings.ToUpper(b.c.mode))
	if err := b.client.ConfigureTopic(ctx, outbox.TopicConfig{Name: topic, Semantics: outbox.PubSub, Tracking: mode}); err != nil {
		return err
	}
	return b.storeRows(ctx, topic)
}

// storeRows is storeOld on a topic already configured.
func (b *bench) storeRows(ctx context.Context, topic string) error {
	for start := 0; start < b.c.N; start += 10_000 {
		_, err := b.pool.Exec(ctx, `INSERT INTO `+schema+`.outbox_published
    (topic, payload, correlation_id, status, required_bits, done_bits, required_ids, required_count, completed_count)
SELECT $1, jsonb_build_object('seq', i, 'body', $2::text), 'c' || i, 'PUBLISHED', 0, 0, '{}', 0, 0
FROM generate_series($3::int, $4::int - 1) AS i`, topic, harness.Body, start, min(b.c.N, start+10_000))
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
	}
	_, err := b.pool.Exec(ctx, `VACUUM ANALYZE `+schema+`.outbox_published`)
	return err
}

// runBackfill subscribes a group from the beginning with a backfill of
// every stored message (opts sets its throttle), and waits until each was
// handled once and the backfill says DONE.
func (b *bench) runBackfill(ctx context.Context, topic string, opts consumergroup.SubscriptionOptions) (time.Duration, error) {
	tr := harness.NewTracker(b.c.N)
	g, err := consumergroup.New(b.pool, consumergroup.Config{Client: b.client, Topic: topic, Group: "late", Schema: schema,
		Concurrency: b.c.Workers, BatchSize: 1000, HeartbeatPool: b.pool})
	if err != nil {
		return 0, err
	}
	if err := g.AddConsumer("c", handler(tr), nil); err != nil {
		return 0, err
	}
	opts.Position, opts.Backfill, opts.MaxBackfill = consumergroup.StartBeginning, true, b.c.N
	start := time.Now()
	if err := g.Start(ctx, opts); err != nil {
		return 0, err
	}
	defer g.Stop(context.Background())
	for {
		p, err := g.BackfillProgress(ctx)
		if err != nil {
			return 0, err
		}
		if p.Outcome == consumergroup.BackfillDone && tr.Distinct() == b.c.N {
			break
		}
		if p.Outcome != "" && p.Outcome != consumergroup.BackfillDone {
			return 0, fmt.Errorf("backfill ended %s", p.Outcome)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%d of %d delivered: %w", tr.Distinct(), b.c.N, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	return elapsed, tr.Check("BACKFILL")
}
