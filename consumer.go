package pgoutbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

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
	id     string
	table  queueRun // the topic's messages are on the queue table
	log    queueRun // … or on the log

	startMu sync.Mutex               // serialises Start's choice of a run
	current atomic.Pointer[queueRun] // the run the last Start chose; nil before
}

// queueRun is one of the two ways a Consumer reads its topic.
type queueRun interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
	StopAndCancel(ctx context.Context) error
	Stopped() <-chan struct{}
	AckTx(ctx context.Context, tx pgx.Tx, d *outbox.Delivery) error
}

// tableRun claims from the queue table.
type tableRun struct {
	*outbox.Consumer
	client *outbox.Client
}

func (r tableRun) AckTx(ctx context.Context, tx pgx.Tx, d *outbox.Delivery) error {
	return r.client.AckTx(ctx, tx, d)
}

// logRun is a member of the topic's group.
type logRun struct{ *consumergroup.Group }

func (r logRun) Start(ctx context.Context) error {
	return r.Group.Start(ctx, consumergroup.FromBeginning(false))
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
	return &Consumer{client: c, cfg: cfg, id: table.ID(), table: tableRun{table, c.outbox}, log: logRun{group}}, nil
}

// ID names the consumer in leases and logs.
func (k *Consumer) ID() string { return k.id }

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
	want := &k.table
	if topic.Tracking != "" {
		want = &k.log
	}
	k.startMu.Lock()
	defer k.startMu.Unlock()
	last := k.current.Load()
	if last != nil && last != want {
		select {
		case <-(*last).Stopped(): // the topic moved to the log while this consumer was stopped
		default:
			return fmt.Errorf("%w: consumer of %q", outbox.ErrAlreadyStarted, k.cfg.Topic)
		}
	}
	k.current.Store(want)
	if err := (*want).Start(ctx); err != nil {
		if last != want {
			k.current.Store(last)
		}
		return err
	}
	return nil
}

// Stop stops consuming, hands back the messages no handler has started
// (another consumer, or a restart, takes them at once), and waits for
// running handlers until ctx ends: then it cancels them and returns ctx's
// error. Stop is safe to call more than once and on a consumer never
// started.
func (k *Consumer) Stop(ctx context.Context) error {
	if run := k.current.Load(); run != nil {
		return (*run).Stop(ctx)
	}
	return nil
}

// StopAndCancel is Stop that cancels the running handlers' contexts at once.
func (k *Consumer) StopAndCancel(ctx context.Context) error {
	if run := k.current.Load(); run != nil {
		return (*run).StopAndCancel(ctx)
	}
	return nil
}

// Stopped returns a channel closed once the consumer's current run
// stopped (between runs, the last run's). Call it after Start.
func (k *Consumer) Stopped() <-chan struct{} {
	if run := k.current.Load(); run != nil {
		return (*run).Stopped()
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
	run := k.current.Load()
	if run == nil {
		return fmt.Errorf("%w: message %d: the consumer of %q was never started", outbox.ErrLeaseLost, d.ID, k.cfg.Topic)
	}
	return (*run).AckTx(ctx, tx, d)
}
