// Command watermill runs the benchmark's workloads (bench/README.md) on
// Watermill (github.com/ThreeDotsLabs/watermill) with its SQL Pub/Sub
// (watermill-sql) on pgx: the default PostgreSQL schema (a table per
// topic, read only below the oldest running transaction, so it is
// commit-safe) and the default offsets adapter (a row per consumer group,
// locked while a batch is delivered). Messages are sent with a Publisher
// on the caller's transaction, Watermill's way to an outbox. It prints
// one JSON line.
//
//	cd bench && go run ./cmd/watermill -workload W3
//
// A QUEUE consumer (W2, W4, W5) is -workers subscriptions of one consumer
// group; fan-out (W3) is one subscription for each of -groups groups.
// Watermill's SQL subscriber polls (once a second by default) and has no
// LISTEN/NOTIFY, so its W4 latency is up to that interval.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/bench/internal/harness"
)

const schema = "bench_watermill"

var (
	tables  = wsql.DefaultPostgreSQLSchema{}
	offsets = wsql.DefaultPostgreSQLOffsetsAdapter{}
	logger  = watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
)

type program struct {
	harness.Run
	pool  *pgxpool.Pool
	db    wsql.Beginner
	topic string
}

func main() {
	p := &program{Run: harness.Run{System: "watermill"}}
	p.Register(flag.CommandLine)
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
	// Watermill names its tables without a schema: they go to the
	// connections' search_path.
	if p.pool, err = harness.OpenPool(ctx, p.DSN, p.Workers, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["search_path"] = schema
	}); err != nil {
		return err
	}
	defer p.pool.Close()
	p.db = wsql.BeginnerFromPgx(p.pool)
	p.topic = "bench_" + strings.ToLower(p.Workload)
	if err := harness.ResetSchema(ctx, p.pool, schema, func(ctx context.Context) error {
		if _, err := p.pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			return err
		}
		sub, err := p.subscriber("init")
		if err != nil {
			return err
		}
		defer sub.Close()
		return sub.SubscribeInitialize(p.topic)
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

func (p *program) subscriber(group string) (*wsql.Subscriber, error) {
	return wsql.NewSubscriber(p.db, wsql.SubscriberConfig{ConsumerGroup: group, SchemaAdapter: tables, OffsetsAdapter: offsets}, logger)
}

// send publishes message seq in a transaction of its own.
func (p *program) send(ctx context.Context, seq int) error {
	return pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: tables}, logger)
		if err != nil {
			return err
		}
		return pub.Publish(p.topic, message.NewMessage(watermill.NewUUID(), harness.Payload(seq)))
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
	if err := p.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT (payload->>'seq')::int) FROM `+tables.MessagesTable(p.topic)).Scan(&rows, &distinct); err != nil {
		return err
	}
	if rows != p.N || distinct != p.N {
		return fmt.Errorf("expected %d messages, the table has %d rows, %d distinct", p.N, rows, distinct)
	}
	p.Emit(elapsed, p.N, 0, 0)
	return nil
}

// preload publishes n messages, 1,000 a call.
func (p *program) preload() error {
	pub, err := wsql.NewPublisher(p.db, wsql.PublisherConfig{SchemaAdapter: tables}, logger)
	if err != nil {
		return err
	}
	for lo := 0; lo < p.N; lo += 1000 {
		msgs := make([]*message.Message, 0, 1000)
		for seq := lo; seq < min(p.N, lo+1000); seq++ {
			msgs = append(msgs, message.NewMessage(watermill.NewUUID(), harness.Payload(seq)))
		}
		if err := pub.Publish(p.topic, msgs...); err != nil {
			return fmt.Errorf("preload: %w", err)
		}
	}
	return nil
}

// consumer is one consumer group's subscriptions.
type consumer struct {
	group string
	tr    *harness.Tracker
	sub   *wsql.Subscriber
	wg    sync.WaitGroup
}

// consume subscribes group with subs subscriptions whose handler records
// each message in a new tracker and acks it.
func (p *program) consume(ctx context.Context, group string, subs int) (*consumer, error) {
	sub, err := p.subscriber(group)
	if err != nil {
		return nil, err
	}
	c := &consumer{group: group, tr: harness.NewTracker(p.N), sub: sub}
	for range subs {
		msgs, err := sub.Subscribe(ctx, p.topic)
		if err != nil {
			c.close()
			return nil, err
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for msg := range msgs {
				if err := c.tr.HandledPayload(msg.Payload); err != nil {
					harness.Logf("watermill: %v", err)
				}
				msg.Ack()
			}
		}()
	}
	return c, nil
}

func (c *consumer) close() {
	c.sub.Close()
	c.wg.Wait()
}

// waitDrained waits until every consumer handled every message and its
// group's acked offset reached the topic's last message.
func (p *program) waitDrained(ctx context.Context, cs ...*consumer) error {
	var last int64
	if err := p.pool.QueryRow(ctx, `SELECT "offset" FROM `+tables.MessagesTable(p.topic)+` ORDER BY transaction_id DESC, "offset" DESC LIMIT 1`).Scan(&last); err != nil {
		return err
	}
	for _, c := range cs {
		if err := c.tr.WaitHandled(ctx); err != nil {
			return fmt.Errorf("group %s: %w", c.group, err)
		}
		for {
			var acked int64
			if err := p.pool.QueryRow(ctx, `SELECT offset_acked FROM `+offsets.MessagesOffsetsTable(p.topic)+` WHERE consumer_group = $1`, c.group).Scan(&acked); err != nil {
				return err
			}
			if acked >= last {
				break
			}
			if err := harness.SleepUntil(ctx, time.Now().Add(time.Millisecond)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *program) w2(ctx context.Context) error {
	if err := p.preload(); err != nil {
		return err
	}
	start := time.Now()
	c, err := p.consume(ctx, "w2", p.Workers)
	if err != nil {
		return err
	}
	err = p.waitDrained(ctx, c)
	elapsed := time.Since(start)
	c.close()
	if err != nil {
		return err
	}
	if err := c.tr.Check("watermill W2"); err != nil {
		return err
	}
	p.Emit(elapsed, p.N, 0, 0)
	return nil
}

func (p *program) w3(ctx context.Context) error {
	if err := p.preload(); err != nil {
		return err
	}
	cs := make([]*consumer, 0, p.Groups)
	defer func() {
		for _, c := range cs {
			c.close()
		}
	}()
	start := time.Now()
	for i := range p.Groups {
		c, err := p.consume(ctx, "g"+strconv.Itoa(i), 1)
		if err != nil {
			return err
		}
		cs = append(cs, c)
	}
	if err := p.waitDrained(ctx, cs...); err != nil {
		return err
	}
	elapsed := time.Since(start)
	for _, c := range cs {
		if err := c.tr.Check("watermill W3 group " + c.group); err != nil {
			return err
		}
	}
	p.Emit(elapsed, p.N*p.Groups, 0, 0)
	return nil
}

// w4 is W4, and W5 with the horizon held in its middle third.
func (p *program) w4(ctx context.Context) error {
	c, err := p.consume(ctx, strings.ToLower(p.Workload), p.Workers)
	if err != nil {
		return err
	}
	defer c.close()
	time.Sleep(500 * time.Millisecond)
	held, err := p.Pace(ctx, c.tr, p.pool.Config().ConnConfig, harness.TableStats(p.pool, schema, "watermill%"), p.send)
	if err != nil {
		return err
	}
	if err := p.waitDrained(ctx, c); err != nil {
		return err
	}
	if err := c.tr.Check("watermill " + p.Workload); err != nil {
		return err
	}
	p.EmitPaced(c.tr, held, nil)
	return nil
}
