package pgoutbox

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Consumer processes a QUEUE topic with competing consumers: any number of
// them, in this and other processes, share the topic's messages, each
// message handled by one of them at a time, at least once (see
// outbox.ConsumerConfig for the settings and outbox.Handler for what a
// handler's result means).
//
// A topic whose messages live on the log is read by the topic's one
// consumer group, whose members are its consumers: they lease distinct
// batches of the log, with the retries, dead letters, ordering and
// takeover of package consumergroup. A topic still on the queue table is
// claimed from it as outbox.Consumer does. Start reads which one the
// topic is.
type Consumer struct {
	client *Client
	cfg    outbox.ConsumerConfig
	table  *outbox.Consumer     // the topic's messages are on the queue table
	group  *consumergroup.Group // … or on the log

	mu     sync.Mutex
	onLog  bool // the last Start found the topic on the log
	chosen bool // a Start read the topic
}

// newConsumer returns a consumer of cfg.Topic, not started.
func (c *Client) newConsumer(ctx context.Context, cfg outbox.ConsumerConfig) (*Consumer, error) {
	table, err := c.outbox.NewConsumer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	group, err := consumergroup.New(c.pool, consumergroup.Config{Topic: cfg.Topic, Group: sqlq.QueueGroup, Client: c.outbox,
		InstanceID: table.ID(), Concurrency: cfg.Concurrency, BatchSize: cfg.BatchSize, PollInterval: cfg.PollInterval})
	if err != nil {
		return nil, err
	}
	if err := group.AddConsumer(table.ID(), cfg.Handler, nil); err != nil {
		return nil, err
	}
	return &Consumer{client: c, cfg: cfg, table: table, group: group}, nil
}

// ID names the consumer in leases and logs.
func (k *Consumer) ID() string { return k.table.ID() }

// Start reads the topic's configuration and starts consuming in the
// background; it returns at once. ctx bounds only the start-up queries.
// Start on a running consumer fails with outbox.ErrAlreadyStarted; a
// stopped consumer can be started again.
func (k *Consumer) Start(ctx context.Context) error {
	topic, err := k.client.outbox.Topic(ctx, k.cfg.Topic)
	if err != nil {
		return err
	}
	if topic.Semantics != outbox.Queue {
		return fmt.Errorf("%w: %q is a %s topic; use a consumer group", outbox.ErrWrongSemantics, k.cfg.Topic, topic.Semantics)
	}
	onLog := topic.Tracking != ""
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.chosen && k.onLog != onLog {
		// The topic moved to the log while this consumer was stopped: the
		// last run must have stopped before the other one starts.
		if err := k.stopRun(ctx, false); err != nil {
			return err
		}
	}
	k.onLog, k.chosen = onLog, true
	if onLog {
		return k.group.Start(ctx, consumergroup.FromBeginning(false))
	}
	return k.table.Start(ctx)
}

// Stop stops consuming, hands back the messages no handler has started
// (another consumer, or a restart, takes them at once), and waits for
// running handlers until ctx ends: then it cancels them and returns ctx's
// error. Stop is safe to call more than once and on a consumer never
// started.
func (k *Consumer) Stop(ctx context.Context) error { return k.stop(ctx, false) }

// StopAndCancel is Stop that cancels the running handlers' contexts at once.
func (k *Consumer) StopAndCancel(ctx context.Context) error { return k.stop(ctx, true) }

func (k *Consumer) stop(ctx context.Context, cancel bool) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.stopRun(ctx, cancel)
}

// stopRun stops the current run; callers hold mu.
func (k *Consumer) stopRun(ctx context.Context, cancel bool) error {
	switch {
	case !k.chosen:
		return nil
	case k.onLog && cancel:
		return k.group.StopAndCancel(ctx)
	case k.onLog:
		return k.group.Stop(ctx)
	case cancel:
		return k.table.StopAndCancel(ctx)
	default:
		return k.table.Stop(ctx)
	}
}

// Stopped returns a channel closed once the consumer's current run
// stopped (between runs, the last run's). Call it after Start.
func (k *Consumer) Stopped() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.chosen && k.onLog {
		return k.group.Stopped()
	}
	return k.table.Stopped()
}

// AckTx records message d as handled inside tx, the caller's transaction
// that holds the handler's own writes: they and the acknowledgement commit
// together, or neither does. Call it from the handler d was given to, last
// in tx; it returns outbox.ErrLeaseLost when the message was taken back
// since (its lease ran out), and the caller must then roll tx back. See
// consumergroup.Group.AckTx and outbox.Client.AckTx for the details.
func (k *Consumer) AckTx(ctx context.Context, tx pgx.Tx, d *outbox.Delivery) error {
	k.mu.Lock()
	onLog := k.chosen && k.onLog
	k.mu.Unlock()
	if onLog {
		return k.group.AckTx(ctx, tx, d)
	}
	return k.client.outbox.AckTx(ctx, tx, d)
}
