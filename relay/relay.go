package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/backoff"
	"github.com/pgoutbox/pgoutbox/internal/cfgcheck"
	"github.com/pgoutbox/pgoutbox/internal/ratelog"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Defaults of Config.
const (
	// DefaultGroup is the consumer group a relay reads its topic with.
	DefaultGroup = "relay"
	// DefaultRetryInitial is the wait before a failed publish is tried
	// again; each further failure doubles it, up to DefaultRetryMax.
	DefaultRetryInitial = 100 * time.Millisecond
	// DefaultConcurrentBatches is how many full batches a relay instance
	// publishes at once (consumergroup.Config.ConcurrentBatches): while
	// JetStream confirms one batch, the next ones are read and sent.
	DefaultConcurrentBatches = 4
	// MinHandlerTimeout is the least Consumer.HandlerTimeout a relay
	// takes: a batch's publishes need time to be confirmed, and a call
	// that overran it would spend an attempt.
	MinHandlerTimeout = time.Second
	// DefaultRetryMax caps the wait between publishes of a message that
	// keeps failing.
	DefaultRetryMax = 5 * time.Second
)

// Errors of New and Start.
var (
	// ErrInvalidConfig reports a Config that cannot work. It is
	// outbox.ErrInvalidConfig: errors.Is matches either.
	ErrInvalidConfig = outbox.ErrInvalidConfig
	// ErrUnorderedTopic: the topic is not ordered, so a message group's
	// messages could reach the broker out of commit order. Configure the
	// topic with outbox.TopicConfig.Ordered, or set Config.AllowUnordered.
	// It also matches ErrInvalidConfig.
	ErrUnorderedTopic = cfgcheck.Invalid("relay: topic is not ordered")
)

// Config configures one relay instance.
type Config struct {
	// Consumer configures the consumer group the relay reads the topic
	// with. Its Topic (a PUB_SUB topic) is required; its Group defaults
	// to DefaultGroup, its ConcurrentBatches to DefaultConcurrentBatches.
	// Its other fields are as documented there: BatchSize is the most
	// messages one Publish call gets, ConcurrentBatches the most calls at
	// once.
	Consumer consumergroup.Config
	// Publisher stores the messages in the broker. Required.
	Publisher Publisher
	// Subject is the template of each message's subject: literal text
	// and the placeholders {topic}, {group} (Consumer.Group),
	// {message_group} and {header.NAME} (the value of one of the
	// message's headers). An empty value (a message without a message
	// group, a header it lacks) renders as "_". A message whose subject
	// is not valid (a value with white space, or making a token a
	// wildcard) is dead-lettered with ErrInvalidSubject. Defaults to
	// DefaultSubject.
	Subject string
	// DedupPrefix starts every message's DedupID, which is otherwise
	// "{topic}:{id}". Set it when more than one database relays into the
	// same stream, so their ids cannot collide. Defaults to "".
	DedupPrefix string
	// AllowUnordered lets the relay run on a topic that is not ordered,
	// where instances publish batches concurrently and retries come
	// after newer messages: a message group's messages may then reach the
	// broker out of commit order. Defaults to false (Start fails with
	// ErrUnorderedTopic).
	AllowUnordered bool
	// RetryInitial and RetryMax bound the backoff between publishes of
	// messages that failed (the broker down, slow or misconfigured).
	// Default to DefaultRetryInitial and DefaultRetryMax.
	RetryInitial, RetryMax time.Duration
}

// Relay forwards a topic's committed messages to a broker: one instance of
// a consumer group whose handler publishes each batch and acks it once
// the broker confirmed it. Several instances, in one process or many,
// share the topic.
type Relay struct {
	cfg     Config
	pool    *pgxpool.Pool
	group   *consumergroup.Group
	subject subjectTemplate
	ordered atomic.Bool // the topic is ordered: messages carry their message group as Key
	// misconfiguredSince is when publishes began failing for a
	// configuration fault without one succeeding since (unix ns, 0: none).
	misconfiguredSince atomic.Int64
	logger             *slog.Logger
	events             *ratelog.Log
	metrics            *metrics
}

// New returns a relay instance; Start starts it.
func New(pool *pgxpool.Pool, cfg Config) (*Relay, error) {
	c := cfgcheck.New("relay")
	if pool == nil {
		c.Failf("pool", "is nil")
	}
	if cfg.Publisher == nil {
		c.Failf("Publisher", "is required")
	}
	c.NotNegative("RetryInitial", cfg.RetryInitial)
	c.NotNegative("RetryMax", cfg.RetryMax)
	if t := cfg.Consumer.HandlerTimeout; t != 0 {
		c.AtLeast("Consumer.HandlerTimeout", t, MinHandlerTimeout) // shorter is too short to publish a batch
	}
	if err := c.Err(); err != nil {
		return nil, err
	}
	cfg.Consumer.Group = cmp.Or(cfg.Consumer.Group, DefaultGroup)
	cfg.Consumer.ConcurrentBatches = cmp.Or(cfg.Consumer.ConcurrentBatches, DefaultConcurrentBatches)
	cfg.Subject = cmp.Or(cfg.Subject, DefaultSubject)
	cfg.RetryInitial = cmp.Or(cfg.RetryInitial, DefaultRetryInitial)
	cfg.RetryMax = max(cmp.Or(cfg.RetryMax, DefaultRetryMax), cfg.RetryInitial)
	subject, err := parseSubject(cfg.Subject)
	if err != nil {
		return nil, fmt.Errorf("%w: relay: Subject: %w", ErrInvalidConfig, err)
	}
	group, err := consumergroup.New(pool, cfg.Consumer)
	if err != nil {
		return nil, err
	}
	logger := cfg.Consumer.Logger
	if logger == nil && cfg.Consumer.Client != nil {
		logger = cfg.Consumer.Client.Logger()
	}
	logger = cmp.Or(logger, slog.Default())
	mp := cfg.Consumer.MeterProvider
	if mp == nil && cfg.Consumer.Client != nil {
		mp = cfg.Consumer.Client.MeterProvider()
	}
	r := &Relay{cfg: cfg, pool: pool, group: group, subject: subject, logger: logger,
		events: ratelog.New(logger, time.Minute, time.Now)}
	if r.metrics, err = newMetrics(mp, cfg.Consumer.Topic, cfg.Consumer.Group); err != nil {
		return nil, err
	}
	if err := group.SetBatchHandler(r.publishBatch); err != nil {
		return nil, err
	}
	return r, nil
}

// Start checks the topic and starts the relay's consumer group (see
// consumergroup.Group.Start, whose errors it returns too): opts say where a
// new subscription starts.
func (r *Relay) Start(ctx context.Context, opts consumergroup.SubscriptionOptions) error {
	client := r.cfg.Consumer.Client
	if client == nil {
		var err error
		client, err = outbox.NewClient(r.pool, outbox.Config{Schema: r.cfg.Consumer.Schema, Logger: r.logger})
		if err != nil {
			return err
		}
	}
	tc, err := client.Topic(ctx, r.cfg.Consumer.Topic)
	if err != nil {
		return err
	}
	if tc.Configured && tc.Semantics == outbox.PubSub && !tc.Ordered && !r.cfg.AllowUnordered {
		return fmt.Errorf("%w: %q (set outbox.TopicConfig.Ordered, or relay.Config.AllowUnordered)", ErrUnorderedTopic, tc.Name)
	}
	r.ordered.Store(tc.Ordered)
	if err := r.group.Start(ctx, opts); err != nil {
		return err
	}
	if err := r.metrics.observe(r.group); err != nil {
		r.logger.Warn("pgoutbox: relay lag gauges not registered", slog.Any("error", err))
	}
	return nil
}

// Stop stops the relay instance (see consumergroup.Group.Stop): what the
// broker confirmed is acked, the rest handed back for another instance.
func (r *Relay) Stop(ctx context.Context) error {
	err := r.group.Stop(ctx)
	r.metrics.unregister()
	return err
}

// Group is the relay's consumer group instance, for its health, dead
// letters and operations (pausing, replaying).
func (r *Relay) Group() *consumergroup.Group { return r.group }

// publishBatch is the group's batch handler: it publishes the batch,
// retrying what failed with backoff until the broker confirmed it or ctx
// ends. A message is acked only once it is stored; one the broker
// rejects for itself is dead-lettered; one still unconfirmed when ctx
// ends comes back later without spending an attempt.
func (r *Relay) publishBatch(ctx context.Context, ds []*outbox.Delivery) []error {
	results := make([]error, len(ds))
	msgs := make([]Message, 0, len(ds))
	at := make([]int, 0, len(ds)) // msgs[k] is ds[at[k]]
	rejected := map[string]bool{} // message groups with a message dead-lettered in this batch
	for i, d := range ds {
		if d.Group != "" && rejected[d.Group] {
			results[i] = heldBack
			continue
		}
		subject, err := r.subject.render(d, r.cfg.Consumer.Group)
		if err != nil {
			r.metrics.failed(ctx, reasonRejected, 1)
			results[i] = outbox.Permanent(err)
			if d.Group != "" {
				rejected[d.Group] = true
			}
			continue
		}
		msgs = append(msgs, r.message(d, subject))
		at = append(at, i)
	}
	for attempt := 1; len(msgs) > 0; attempt++ {
		errs := r.cfg.Publisher.Publish(ctx, msgs)
		if len(errs) != len(msgs) {
			err := fmt.Errorf("relay: Publish returned %d results for %d messages", len(errs), len(msgs))
			errs = make([]error, len(msgs))
			for k := range errs {
				errs[k] = err
			}
		}
		now := time.Now()
		var stored []Message
		retry, retryAt := msgs[:0:0], at[:0:0]
		var lastTransient, lastMisconfigured error
		var transient, misconfigured int
		for k, err := range errs {
			m, i := msgs[k], at[k]
			switch {
			case err == nil:
				stored = append(stored, m)
			case errors.Is(err, ErrRejected):
				r.metrics.failed(ctx, reasonRejected, 1)
				results[i] = outbox.Permanent(err)
				if m.Key != "" {
					rejected[m.Key] = true
				}
			default:
				retry, retryAt = append(retry, m), append(retryAt, i)
				switch {
				case errors.Is(err, ErrMisconfigured):
					misconfigured++
					lastMisconfigured = err
				case !errors.Is(err, ErrHeldBack):
					transient++
					lastTransient = err
				}
			}
		}
		r.metrics.published(ctx, now, stored)
		if misconfigured > 0 {
			r.misconfiguredSince.CompareAndSwap(0, now.UnixNano())
		} else if len(stored) > 0 {
			r.misconfiguredSince.Store(0)
		}
		msgs, at = msgs[:0], at[:0]
		for k, m := range retry {
			if m.Key != "" && rejected[m.Key] {
				results[retryAt[k]] = heldBack
				continue
			}
			msgs, at = append(msgs, m), append(at, retryAt[k])
		}
		if len(msgs) == 0 {
			break
		}
		failure := cmp.Or(lastMisconfigured, lastTransient)
		delay := backoff.Exponential(attempt, r.cfg.RetryInitial, r.cfg.RetryMax)
		r.reportFailure(ctx, failure, transient, misconfigured, len(msgs), delay)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			for _, i := range at {
				results[i] = outbox.Snooze(delay, fmt.Errorf("relay: not confirmed: %w", cmp.Or(failure, ctx.Err())))
			}
			return results
		case <-t.C:
		}
	}
	return results
}

// misconfiguredGrace is how long a configuration fault lasts before the
// relay logs it as an error (a warning before).
const misconfiguredGrace = 5 * time.Second

// heldBack is the result of a message behind one of its message group that
// was dead-lettered in the same batch: it comes back, without spending an
// attempt, once that one is recorded.
var heldBack = outbox.Snooze(0, ErrHeldBack)

// reportFailure logs and counts one failed round of publishes.
func (r *Relay) reportFailure(ctx context.Context, err error, transient, misconfigured, waiting int, delay time.Duration) {
	r.metrics.failed(ctx, reasonTransient, transient)
	r.metrics.failed(ctx, reasonMisconfigured, misconfigured)
	if err == nil {
		return
	}
	subject := r.cfg.Consumer.Topic + "|" + r.cfg.Consumer.Group
	attrs := []slog.Attr{slog.String("topic", r.cfg.Consumer.Topic), slog.String("group", r.cfg.Consumer.Group),
		slog.Int("waiting", waiting), slog.Duration("retry_in", delay), slog.String("error", err.Error())}
	if misconfigured > 0 {
		// JetStream answers "no responders" for a while as it starts: an
		// error only once the fault outlasts that.
		level, kind := slog.LevelWarn, "relay-misconfigured|"
		if since := r.misconfiguredSince.Load(); since != 0 && time.Since(time.Unix(0, since)) >= misconfiguredGrace {
			level, kind = slog.LevelError, "relay-misconfigured-error|"
		}
		r.events.Log(level, kind+subject,
			"pgoutbox: relay cannot publish: the destination is missing or not permitted; retrying", attrs...)
		return
	}
	r.events.Log(slog.LevelWarn, "relay-transient|"+subject, "pgoutbox: relay publish failed; retrying", attrs...)
}

// isJetStreamHeader reports whether a header is one of JetStream's own
// (Nats-Msg-Id, Nats-Expected-Last-Sequence, Nats-Rollup, ...), which tell
// the stream what to do with the message: a sender's are not forwarded.
func isJetStreamHeader(name string) bool {
	return len(name) >= len("Nats-") && strings.EqualFold(name[:len("Nats-")], "Nats-")
}

// message is d as the Publisher gets it: the message's headers, with its
// trace context as sent, and the relay's own.
func (r *Relay) message(d *outbox.Delivery, subject string) Message {
	h := make(map[string]string, len(d.Headers)+5)
	for k, v := range d.Headers {
		if !isJetStreamHeader(k) {
			h[k] = v
		}
	}
	id := strconv.FormatInt(d.ID, 10)
	h[HeaderTopic] = d.Topic
	h[HeaderID] = id
	h[HeaderCreatedAt] = d.CreatedAt.UTC().Format(time.RFC3339Nano)
	if d.Group != "" {
		h[HeaderMessageGroup] = d.Group
	}
	if d.CorrelationID != "" {
		h[HeaderCorrelationID] = d.CorrelationID
	}
	m := Message{
		ID:        d.ID,
		DedupID:   r.cfg.DedupPrefix + d.Topic + ":" + id,
		Subject:   subject,
		Headers:   h,
		Payload:   d.Payload,
		CreatedAt: d.CreatedAt,
	}
	if r.ordered.Load() { // elsewhere no order is kept anyway: nothing waits for another message
		m.Key = d.Group
	}
	return m
}
