// Package consumergroup delivers PUB_SUB messages to consumer groups.
//
// Every group subscribed to a topic receives every message written after it
// subscribed (or earlier ones, see SubscriptionOptions), independently of
// the other groups: a slow or failing group never delays another. Within a
// group, each message is handled by one member at a time, at least once.
//
// A group's instances (one Group value per process, or several) share the
// work in batches. A batch is the topic's rows committed between two
// database snapshots, so a transaction that commits late never has its
// messages skipped (commit order is not id order), and a transaction left
// open elsewhere delays only its own messages. A fetching instance records
// the batch with a lease and handles it with no transaction open; if it
// crashes, another instance re-reads exactly that batch when the lease ends.
// Failed messages wait in a per-group retry table with backoff, and are
// dead-lettered after the topic's MaxAttempts, so their batch can finish.
//
// Which groups a message needs is fixed when it is written (package pubsub
// records completion per mode). Stop leaves the subscription ACTIVE: a
// rolling deploy loses nothing. Only Cancel unsubscribes.
package consumergroup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/instance"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/pubsub"
)

type member struct {
	id      string
	handler outbox.Handler
	filter  Filter
}

// Group is one instance of a consumer group.
type Group struct {
	cfg     Config
	pool    *pgxpool.Pool
	client  *outbox.Client
	schema  string
	q       *sqlq.PubSub
	logger  *slog.Logger
	metrics *metrics

	mu      sync.Mutex // guards members, started, stopped and the run fields
	members []member   // sorted by id: member selection hashes into it
	started bool
	stopped bool

	batchHandler BatchHandler // set before Start

	// Set by Start, read-only afterwards.
	topic   outbox.TopicConfig
	tracker pubsub.Tracker
	sub     pubsub.Subscription
	stream  streamArgs
	run     *runner
}

// New returns an instance of group cfg.Group on cfg.Topic. Add members,
// then Start it.
func New(pool *pgxpool.Pool, cfg Config) (*Group, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", outbox.ErrInvalidConfig)
	}
	schema, err := ident.Schema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	if cfg.InstanceID == "" {
		cfg.InstanceID = instance.NewID()
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With(slog.String("topic", cfg.Topic), slog.String("group", cfg.Group), slog.String("instance", cfg.InstanceID))
	client := cfg.Client
	if client == nil {
		client, err = outbox.NewClient(pool, outbox.Config{Schema: schema, Logger: logger, MeterProvider: cfg.MeterProvider, Clock: cfg.Clock})
		if err != nil {
			return nil, err
		}
	} else if client.Schema() != schema {
		return nil, fmt.Errorf("%w: Client works in schema %q, the group in %q", outbox.ErrInvalidConfig, client.Schema(), schema)
	}
	return &Group{cfg: cfg, pool: pool, client: client, schema: schema, q: sqlq.ForPubSub(schema),
		logger: logger, metrics: newMetrics(cfg.MeterProvider, cfg.Topic, cfg.Group)}, nil
}

// AddConsumer adds a member. filter may be nil (accept everything). A
// message goes to one member among those whose filter accepts it, chosen by
// a stable hash of its id; if every filter rejects it, it counts as
// processed for the group.
func (g *Group) AddConsumer(id string, handler outbox.Handler, filter Filter) error {
	if id == "" || handler == nil {
		return fmt.Errorf("%w: member needs an id and a handler", outbox.ErrInvalidConfig)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, m := range g.members {
		if m.id == id {
			return fmt.Errorf("%w: %q", ErrDuplicateMember, id)
		}
	}
	members := append(slices.Clone(g.members), member{id: id, handler: handler, filter: filter})
	slices.SortFunc(members, func(a, b member) int { return cmp.Compare(a.id, b.id) })
	g.members = members
	if g.run != nil {
		g.run.members.Store(&members)
	}
	return nil
}

// RemoveConsumer removes a member. The last member of a started group
// cannot be removed (ErrLastMember): Stop the group instead.
func (g *Group) RemoveConsumer(id string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	i := slices.IndexFunc(g.members, func(m member) bool { return m.id == id })
	if i < 0 {
		return fmt.Errorf("%w: %q", ErrUnknownMember, id)
	}
	if len(g.members) == 1 && g.started && !g.stopped && g.batchHandler == nil {
		return fmt.Errorf("%w: %q", ErrLastMember, id)
	}
	members := slices.Delete(slices.Clone(g.members), i, i+1)
	g.members = members
	if g.run != nil {
		g.run.members.Store(&members)
	}
	return nil
}

// BatchHandler handles a whole batch, in commit order, and returns one
// result per message with the meaning of a Handler's result (nil acks;
// outbox.RetryAfter, outbox.Permanent and other errors as documented
// there). ctx ends shortly before the batch's lease does.
type BatchHandler func(ctx context.Context, batch []*outbox.Delivery) []error

// SetBatchHandler makes this instance hand each batch to h as a whole
// instead of to its members one message at a time (the router's group
// source uses it to keep message groups in order). Call it before Start;
// an instance with a batch handler needs no members.
func (g *Group) SetBatchHandler(h BatchHandler) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started {
		return fmt.Errorf("%w: SetBatchHandler after Start", outbox.ErrAlreadyStarted)
	}
	g.batchHandler = h
	return nil
}

// pick chooses the member for d among those whose filter accepts it, by a
// stable, never negative hash of the message id; nil when none accepts.
func pick(members []member, d *outbox.Delivery) *member {
	var eligible []*member
	for i := range members {
		if members[i].filter == nil || members[i].filter(d) {
			eligible = append(eligible, &members[i])
		}
	}
	if len(eligible) == 0 {
		return nil
	}
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(uint64(d.ID) >> (8 * i))
	}
	h.Write(b[:])
	return eligible[h.Sum64()%uint64(len(eligible))] // unsigned: never negative
}

// Start subscribes the group (or continues its subscription) and starts
// this instance in the background. It fails fast without members
// (ErrNoMembers), on an unknown (outbox.ErrUnknownTopic) or QUEUE topic
// (outbox.ErrWrongSemantics), for a CANCELLED subscription
// (ErrInvalidTransition), and for a 65th Bitmap group (ErrTooManyGroups).
// opts apply only when the subscription is created. An instance runs once:
// a second Start returns outbox.ErrAlreadyStarted.
func (g *Group) Start(ctx context.Context, opts SubscriptionOptions) error {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.started {
		return fmt.Errorf("%w: group %q instance %s", outbox.ErrAlreadyStarted, g.cfg.Group, g.cfg.InstanceID)
	}
	if len(g.members) == 0 && g.batchHandler == nil {
		return fmt.Errorf("%w: group %q", ErrNoMembers, g.cfg.Group)
	}
	reg, err := g.register(ctx, opts)
	if err != nil {
		return err
	}
	g.topic, g.sub, g.stream = reg.topic, reg.sub, reg.stream
	g.tracker, err = pubsub.New(g.topic.Tracking, g.schema)
	if err != nil {
		return err
	}
	if reg.backfill != nil {
		if err := g.backfill(ctx, *reg.backfill, opts); err != nil {
			return err
		}
	}
	r, err := g.newRunner()
	if err != nil {
		return err
	}
	g.run = r
	g.started = true
	r.start()
	g.logger.Info("pgoutbox: consumer group started", slog.Int64("subscription", g.sub.ID), slog.Bool("created", reg.created))
	return nil
}

// Stop stops this instance: no more fetching, then it waits for running
// handlers until ctx ends (then cancels them). Batches it could not finish
// are released for another instance (or a restart) to re-read at once.
// The subscription stays ACTIVE. Stop is idempotent and safe on an instance
// never started.
func (g *Group) Stop(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.started || g.stopped {
		return nil
	}
	g.stopped = true
	err := g.run.stop(ctx)
	g.logger.Info("pgoutbox: consumer group instance stopped")
	return err
}

// Subscription returns the group's subscription (valid after Start).
func (g *Group) Subscription() pubsub.Subscription { return g.sub }

// State reads the subscription's current state.
func (g *Group) State(ctx context.Context) (State, error) {
	var s string
	err := g.pool.QueryRow(ctx, g.q.SubscriptionStatus, g.cfg.Topic, g.cfg.Group).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w: group %q has no subscription to %q", outbox.ErrNotFound, g.cfg.Group, g.cfg.Topic)
	}
	if err != nil {
		return "", fmt.Errorf("consumergroup: state: %w", err)
	}
	return State(s), nil
}

// Pause stops delivery to the group (every instance) until Resume. A paused
// group stays subscribed: messages written meanwhile still need it.
func (g *Group) Pause(ctx context.Context) error { return g.transition(ctx, Paused) }

// Resume continues a paused group.
func (g *Group) Resume(ctx context.Context) error { return g.transition(ctx, Active) }

// Cancel ends the subscription for good (CANCELLED is terminal): the group
// leaves the required set of every message it had not finished, its
// batches and retries are dropped, and this instance stops.
func (g *Group) Cancel(ctx context.Context) error {
	if err := g.transition(ctx, Cancelled); err != nil {
		return err
	}
	g.mu.Lock()
	running := g.started && !g.stopped
	g.mu.Unlock()
	if running {
		if err := g.Stop(ctx); err != nil {
			return err
		}
	}
	return g.forgetAll(ctx, subscriptionRef{id: g.sub.ID, bit: g.sub.Bit}, true)
}

// newBloom returns a Bloom filter sized for a group's recent completions
// (1M ids at 1% false positives, ~1.2 MB).
func newBloom() *bloom.BloomFilter { return bloom.NewWithEstimates(1_000_000, 0.01) }

// now is the injected clock's time, or nil for database time.
func (g *Group) now() *time.Time { return g.client.Now() }
