package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/pgoutbox/pgoutbox/bench/internal/harness"
)

// SKEW: does a hot topic slow a cold one? Two topics of the same kind
// (QUEUE, or PUB_SUB with one group of -mode each), each with its own
// consumer. The cold topic gets -rate/10 msg/s for -duration on its own,
// then again while the hot topic gets -rate msg/s: the cold topic's pickup
// latency (first handler start − producer commit) in both phases.

// skewResult is SKEW's line.
type skewResult struct {
	System             string  `json:"system"`
	Workload           string  `json:"workload"`
	ColdRate           int     `json:"cold_rate"`
	HotRate            int     `json:"hot_rate"`
	AloneP50Ms         float64 `json:"alone_p50_ms"`
	AloneP99Ms         float64 `json:"alone_p99_ms"`
	BesideP50Ms        float64 `json:"beside_p50_ms"`
	BesideP99Ms        float64 `json:"beside_p99_ms"`
	BesideOverAloneP99 float64 `json:"beside_over_alone_p99"`
	HotP99Ms           float64 `json:"hot_p99_ms"`
}

func (b *bench) skew(ctx context.Context) error {
	c := b.c
	coldRate := max(1, c.Rate/10)
	perPhase := int(float64(coldRate) * c.Duration.Seconds())
	hotN := int(float64(c.Rate) * c.Duration.Seconds())
	cold, hot := harness.NewTracker(2*perPhase), harness.NewTracker(hotN)
	stopCold, err := b.startTopicConsumer(ctx, "cold", cold)
	if err != nil {
		return err
	}
	defer stopCold()
	stopHot, err := b.startTopicConsumer(ctx, "hot", hot)
	if err != nil {
		return err
	}
	defer stopHot()
	time.Sleep(500 * time.Millisecond)

	if err := b.paced(ctx, "cold", cold, 0, perPhase, coldRate); err != nil {
		return err
	}
	besideFrom := time.Now()
	var wg sync.WaitGroup
	var hotErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		hotErr = b.paced(ctx, "hot", hot, 0, hotN, c.Rate)
	}()
	coldErr := b.paced(ctx, "cold", cold, perPhase, perPhase, coldRate)
	wg.Wait()
	if coldErr != nil {
		return coldErr
	}
	if hotErr != nil {
		return hotErr
	}
	for _, w := range []struct {
		tr    *harness.Tracker
		n     int
		topic string
	}{{cold, 2 * perPhase, "cold"}, {hot, hotN, "hot"}} {
		for w.tr.Distinct() < w.n {
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: %d of %d handled: %w", w.topic, w.tr.Distinct(), w.n, ctx.Err())
			case <-time.After(time.Millisecond):
			}
		}
		if err := w.tr.Check("SKEW " + w.topic); err != nil {
			return err
		}
	}
	a50, a99, _ := cold.LatenciesBetween(time.Time{}, besideFrom)
	b50, b99, _ := cold.LatenciesBetween(besideFrom, time.Time{})
	_, h99 := hot.Latencies()
	r := skewResult{System: c.System, Workload: c.Workload, ColdRate: coldRate, HotRate: c.Rate,
		AloneP50Ms: harness.Round(a50, 3), AloneP99Ms: harness.Round(a99, 3), BesideP50Ms: harness.Round(b50, 3), BesideP99Ms: harness.Round(b99, 3),
		HotP99Ms: harness.Round(h99, 3)}
	if a99 > 0 {
		r.BesideOverAloneP99 = harness.Round(b99/a99, 2)
	}
	out, _ := json.Marshal(r)
	fmt.Println(string(out))
	return nil
}
