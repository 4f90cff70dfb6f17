package pgoutbox

import (
	"context"
	"fmt"

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
// A QUEUE topic is read by its one consumer group, whose members are its
// consumers: they lease distinct batches of the topic, with the retries,
// dead letters, ordering and takeover of package consumergroup.
type Consumer struct {
	client *Client
	cfg    outbox.ConsumerConfig
	group  *consumergroup.Group
}

// newConsumer returns a consumer of cfg.Topic, not started.
func (c *Client) newConsumer(ctx context.Context, cfg outbox.ConsumerConfig) (*Consumer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	topic, err := c.outbox.Topic(ctx, cfg.Topic)
	if err != nil {
		return nil, err
	}
	if topic.Semantics != outbox.Queue {
		return nil, fmt.Errorf("%w: %q is a %s topic; use a consumer group", outbox.ErrWrongSemantics, cfg.Topic, topic.Semantics)
	}
	group, err := consumergroup.New(c.pool, consumergroup.Config{Topic: cfg.Topic, Group: sqlq.QueueGroup, Client: c.outbox,
		InstanceID: cfg.ID, Concurrency: cfg.Concurrency, BatchSize: cfg.BatchSize, PollInterval: cfg.PollInterval})
	if err != nil {
		return nil, err
	}
	if err := group.AddConsumer(cfg.ID, cfg.Handler, nil); err != nil {
		return nil, err
	}
	return &Consumer{client: c, cfg: cfg, group: group}, nil
}

// ID names the consumer in leases and logs.
func (k *Consumer) ID() string { return k.cfg.ID }

// Start reads the topic's configuration and starts consuming in the
// background; it returns at once. ctx bounds only the start-up queries.
// A topic without a configuration is configured with the defaults (see
// outbox.Client.QueueTopic). Start on a running consumer fails with
// outbox.ErrAlreadyStarted; a stopped consumer can be started again.
func (k *Consumer) Start(ctx context.Context) error {
	if _, err := k.client.outbox.QueueTopic(ctx, k.cfg.Topic); err != nil {
		return err
	}
	return k.group.Start(ctx, consumergroup.FromBeginning(false))
}

// Stop stops consuming, hands back the messages no handler has started
// (another consumer, or a restart, takes them at once), and waits for
// running handlers until ctx ends: then it cancels them and returns ctx's
// error. A handler that returns when cancelled gets its attempt back; one
// that does not return soon after (a quarter of its timeout, at most a
// second) has spent it: it may still finish its work, so its message's
// next delivery is a later attempt. Stop is safe to call more than once
// and on a consumer never started.
func (k *Consumer) Stop(ctx context.Context) error { return k.group.Stop(ctx) }

// StopAndCancel is Stop that cancels the running handlers' contexts at once.
func (k *Consumer) StopAndCancel(ctx context.Context) error { return k.group.StopAndCancel(ctx) }

// Stopped returns a channel closed once the consumer's current run
// stopped (between runs, the last run's). Call it after Start.
func (k *Consumer) Stopped() <-chan struct{} { return k.group.Stopped() }

// AckTx records message d as handled inside tx, the caller's transaction
// that holds the handler's own writes: they and the acknowledgement commit
// together, or neither does. Call it from the handler d was given to, last
// in tx; it returns outbox.ErrLeaseLost when the message was taken back
// since (its lease ran out), and the caller must then roll tx back. See
// consumergroup.Group.AckTx for the details.
func (k *Consumer) AckTx(ctx context.Context, tx pgx.Tx, d *outbox.Delivery) error {
	return k.group.AckTx(ctx, tx, d)
}
