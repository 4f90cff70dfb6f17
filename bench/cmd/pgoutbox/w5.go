package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pgoutbox/pgoutbox/bench/internal/harness"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// W5, held xmin (bench/README.md, "W5 held xmin"): W4's load (one
// consumer or group instance with -workers handlers, a producer paced at
// -rate, one message a transaction) for -duration, with the horizon held
// in its middle third (harness.HoldXmin). Latency percentiles per phase,
// and the dead tuples of every pgoutbox table at the end of A, B and C,
// per table, with their sizes.
//
// Without -mode it runs on a QUEUE topic; with -mode on a PUB_SUB topic
// with one group of that tracking mode.

func (b *bench) w5(ctx context.Context) error {
	const topic = "w5"
	c := b.c
	tr := harness.NewTracker(c.N)
	stop, err := b.startTopicConsumer(ctx, topic, tr)
	if err != nil {
		return err
	}
	defer stop()
	time.Sleep(500 * time.Millisecond)

	start := time.Now()
	tables := harness.TableStats(b.pool, schema, "outbox%")
	type held struct {
		harness.Held
		err error
	}
	hc := make(chan held, 1)
	hctx, cancelHold := context.WithCancel(ctx)
	defer cancelHold()
	go func() {
		h, err := harness.HoldXmin(hctx, b.pool.Config().ConnConfig, start, c.Duration, c.noHold, tables)
		hc <- held{h, err}
	}()
	if err := b.paced(ctx, topic, tr, 0, c.N, c.Rate); err != nil {
		return err
	}
	h := <-hc
	if h.err != nil {
		return fmt.Errorf("held transaction: %w", h.err)
	}
	if err := b.waitDrained(ctx, topic, tr); err != nil {
		return err
	}
	if err := tr.Check("W5"); err != nil {
		return err
	}
	cEnd, err := tables(ctx)
	if err != nil {
		return err
	}
	harness.Print(c.W5Result(tr, h.Held, cEnd))
	return nil
}

// startTopicConsumer starts what consumes topic: a member of a QUEUE
// topic's group, or (with
// -mode) one instance of group g0, subscribed from now.
func (b *bench) startTopicConsumer(ctx context.Context, topic string, tr *harness.Tracker) (stop func(), err error) {
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
		Concurrency: b.c.Workers, HeartbeatPool: b.pool, MeterProvider: b.fetches})
	if err != nil {
		return nil, err
	}
	if err := g.AddConsumer("c", handler(tr), nil); err != nil {
		return nil, err
	}
	if err := g.Start(ctx, consumergroup.FromNow()); err != nil {
		return nil, err
	}
	return func() { g.Stop(context.Background()) }, nil
}
