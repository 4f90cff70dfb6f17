// Package consumergroup delivers PUB_SUB messages to consumer groups.
//
// Every group subscribed to a topic receives every message committed after
// its Start returned (or earlier ones, see SubscriptionOptions),
// independently of the other groups: a slow or failing group never delays
// another. Within a group, each message is handled by one member at a time,
// at least once.
//
// A group's instances (one Group value per process, or several) share the
// work in batches. A batch is the topic's rows committed between two
// database snapshots, so a transaction that commits late never has its
// messages skipped (commit order is not id order), and a transaction left
// open elsewhere delays only its own messages. A fetching instance records
// the batch with a lease, handles it with no transaction open, and keeps
// the lease alive while it works. If the instance crashes or freezes, the
// lease runs out and the batch's messages move to the group's retry table,
// from where they are delivered again at the group's usual pace. A message
// whose lease ran out twice in a row (it was in flight in two instances
// that died) is suspected of crashing its process and retried apart from
// the other suspects, so one that crashes every process handling it is
// dead-lettered after the topic's MaxAttempts without taking the rest
// down. Failed messages wait in the retry table
// with backoff and are dead-lettered after MaxAttempts, so their batch can
// finish. A handler that overruns Config.HandlerTimeout is abandoned and
// its message retried.
//
// Messages come in commit order, with two exceptions: a message sent with
// a Delay or NotBefore waits in the retry table until it is due, and, on a
// topic that is not ordered, a message of a priority above 0 waiting
// behind a backlog is taken ahead of it (highest first) and delivered
// next; the stream skips it when it gets there.
//
// Which groups a message needs is fixed when it is written (each tracking
// mode records completion its own way). Every change of a group's state keeps the
// groups a message needs and what each group reads in agreement, against
// producers, other instances and crashes: see State for the state machine
// and what DEAD costs. Stop leaves the subscription ACTIVE: a rolling
// deploy loses nothing. Only Cancel unsubscribes.
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
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/completion"
	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/instance"
	"github.com/pgoutbox/pgoutbox/internal/ratelog"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
	"github.com/pgoutbox/pgoutbox/internal/tracing"
	"github.com/pgoutbox/pgoutbox/outbox"
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
	q       *sqlq.PubSub
	logger  *slog.Logger
	events  *ratelog.Log // handler failures, rate-limited
	maint   *Maintainer  // topic-wide work: dead groups, forgetting, cleanup
	metrics *metrics
	tracer  *tracing.Tracer

	life    startstop.Base // runs and stops the instance
	mu      sync.Mutex     // guards members, opts, run and the fields Start sets
	members []member       // sorted by id: member selection hashes into it

	batchHandler BatchHandler // set before Start

	testBatchFinished func(batchID int64) // see engine.Instance.BatchFinished

	// Set by Start, read-only afterwards.
	opts   SubscriptionOptions
	topic  outbox.TopicConfig
	sub    completion.Subscription // the bit may change: see tracking
	subRow subscription
	run    *runner

	track atomic.Pointer[engine.Tracking] // set by Start and each look
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
	if c := cfg.Client; c != nil { // settings come from the client unless given
		if cfg.Schema == "" {
			cfg.Schema = c.Schema()
		}
		if cfg.Logger == nil {
			cfg.Logger = c.Logger()
		}
		if cfg.MeterProvider == nil {
			cfg.MeterProvider = c.MeterProvider()
		}
		if cfg.TracerProvider == nil {
			cfg.TracerProvider = c.TracerProvider()
		}
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
		logger = slog.Default()
	}
	logger = logger.With(slog.String("topic", cfg.Topic), slog.String("group", cfg.Group), slog.String("instance", cfg.InstanceID))
	client := cfg.Client
	if client == nil {
		client, err = outbox.NewClient(pool, outbox.Config{Schema: schema, Logger: logger, MeterProvider: cfg.MeterProvider, TracerProvider: cfg.TracerProvider, Clock: cfg.Clock,
			ListenDSN: cfg.ListenDSN, PollOnly: cfg.PollOnly})
		if err != nil {
			return nil, err
		}
	} else if client.Schema() != schema {
		return nil, fmt.Errorf("%w: Client works in schema %q, the group in %q", outbox.ErrInvalidConfig, client.Schema(), schema)
	}
	return &Group{cfg: cfg, pool: pool, client: client, q: sqlq.ForPubSub(schema),
		maint:  newMaintainer(pool, client, schema),
		logger: logger, events: ratelog.New(logger, client.LogInterval(), time.Now),
		metrics: newMetrics(cfg.MeterProvider, cfg.Topic, cfg.Group), tracer: tracing.New(cfg.TracerProvider)}, nil
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
	if len(g.members) == 1 && g.run != nil && g.life.Running() && !g.run.exec.Stopping() && g.batchHandler == nil {
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
	if g.run != nil {
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

// Start subscribes the group (or continues its subscription, or brings a
// DEAD one back) and starts this instance in the background. It fails fast
// without members (ErrNoMembers), on an unknown (outbox.ErrUnknownTopic) or
// QUEUE topic (outbox.ErrWrongSemantics), for a CANCELLED subscription
// (ErrInvalidTransition), and for a 65th Bitmap group (ErrTooManyGroups).
// opts apply when the subscription is created (their MaxBackfill and
// BackfillBatchSize also when it comes back from DEAD). Every message
// committed after Start returns reaches the group. Start on a running
// instance fails with outbox.ErrAlreadyStarted; a stopped instance can be
// started again (it continues the subscription; a Start during a Stop
// waits for it).
func (g *Group) Start(ctx context.Context, opts SubscriptionOptions) error {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return err
	}
	run, done, err := g.life.StartInit(ctx, fmt.Sprintf("group %q instance %s", g.cfg.Group, g.cfg.InstanceID))
	if err != nil {
		return err
	}
	if err := g.startRun(ctx, opts, run, done); err != nil {
		done()
		return err
	}
	return nil
}

func (g *Group) startRun(ctx context.Context, opts SubscriptionOptions, run context.Context, done func()) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.members) == 0 && g.batchHandler == nil {
		return fmt.Errorf("%w: group %q", ErrNoMembers, g.cfg.Group)
	}
	g.opts = opts
	reg, err := g.register(ctx, opts)
	if err != nil {
		return err
	}
	g.topic, g.subRow = reg.topic, reg.sub
	g.sub = reg.sub.ref(g.cfg.Topic, g.cfg.Group)
	g.track.Store(nil)
	if _, err := g.setTracking(reg.sub.bit, g.topic.Tracking, g.topic.ModeChanging); err != nil {
		return err
	}
	r, err := g.newRunner()
	if err != nil {
		return err
	}
	g.run = r
	r.start(run, done)
	g.logger.Info("pgoutbox: consumer group started", slog.Int64("subscription", g.sub.ID), slog.Bool("created", reg.created))
	return nil
}

// subscriptionOptions are the options this instance started with, or the
// defaults.
func (g *Group) subscriptionOptions() SubscriptionOptions {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.run != nil {
		return g.opts
	}
	return SubscriptionOptions{}.withDefaults()
}

// Stop stops this instance: no more fetching, then it waits for running
// handlers until ctx ends (then cancels them, and returns ctx's error if
// they still do not return). What its members finished is recorded; the
// messages it fetched and did not finish are handed back for another
// instance (or a restart) to take at once, without spending an attempt.
// A handler that does not return soon after it is cancelled (a quarter of
// HandlerTimeout, at most a second) is given up on and has spent its
// attempt: it may still finish its work, so its message's next delivery
// is a later attempt.
// The subscription stays ACTIVE. Stop is idempotent and safe on an
// instance never started.
func (g *Group) Stop(ctx context.Context) error { return g.stop(ctx, false) }

// StopAndCancel is Stop that cancels running handlers at once instead of
// waiting for them.
func (g *Group) StopAndCancel(ctx context.Context) error { return g.stop(ctx, true) }

func (g *Group) stop(ctx context.Context, cancelHandlers bool) error {
	g.mu.Lock()
	r := g.run
	g.mu.Unlock()
	if r == nil {
		return nil
	}
	return r.stop(ctx, cancelHandlers, nil)
}

// Stopped returns a channel that is closed once this instance's current
// run has stopped: after Stop, or on its own when its subscription was
// cancelled or deleted (see Err). Between runs it is the last run's;
// before Start, the first run's.
func (g *Group) Stopped() <-chan struct{} { return g.life.Stopped() }

// Err returns why the instance stopped on its own (ErrCancelled,
// ErrSubscriptionGone), or nil while it runs or after a plain Stop.
func (g *Group) Err() error {
	g.mu.Lock()
	r := g.run
	g.mu.Unlock()
	if r == nil {
		return nil
	}
	return r.cause()
}

// Subscription identifies a group's subscription to a topic: its id, its
// topic and group, and in Bitmap mode its bit (Mask).
type Subscription = completion.Subscription

// Subscription returns the group's subscription (valid after Start).
func (g *Group) Subscription() Subscription {
	if t := g.track.Load(); t != nil {
		return t.Sub
	}
	return g.sub
}

// State reads the subscription's current state.
func (g *Group) State(ctx context.Context) (State, error) {
	var id int64
	var s string
	err := g.pool.QueryRow(ctx, g.q.SubscriptionStatus, pgx.StrictNamedArgs{"topic": g.cfg.Topic, "group_name": g.cfg.Group}).Scan(&id, &s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("%w: group %q has no subscription to %q", outbox.ErrNotFound, g.cfg.Group, g.cfg.Topic)
	}
	if err != nil {
		return "", fmt.Errorf("consumergroup: state: %w", err)
	}
	return State(s), nil
}

// Pause stops delivery to the group until Resume: every running instance
// stops fetching within its poll interval (handlers already running
// finish), and an instance started while the group is paused fetches
// nothing. A paused group stays subscribed: messages written meanwhile
// still need it. Pause works on a Group value that was never started.
func (g *Group) Pause(ctx context.Context) error { return g.transition(ctx, Paused) }

// Resume continues a paused group (every instance within its poll
// interval), or brings a DEAD one back like a heartbeat would.
func (g *Group) Resume(ctx context.Context) error { return g.transition(ctx, Active) }

// Cancel ends the subscription for good (CANCELLED is terminal): the group
// leaves the required set of every message, its batches and retries are
// dropped, and this instance stops (other instances stop within their
// poll interval, with Err returning ErrCancelled). Cancel works on a Group
// value that was never started, and calling it again after a failure
// finishes what the first call left.
func (g *Group) Cancel(ctx context.Context) error {
	sub, err := g.cancel(ctx)
	if err != nil {
		return err
	}
	g.mu.Lock()
	r := g.run
	g.mu.Unlock()
	if r != nil {
		if err := r.stop(ctx, false, ErrCancelled); err != nil {
			return err
		}
	}
	topic, err := g.client.Topic(ctx, g.cfg.Topic)
	if err != nil {
		return err
	}
	return g.maint.forget(ctx, g.pool, topic, sub.id)
}

// now is the injected clock's time, or nil for database time.
func (g *Group) now() *time.Time { return g.client.Now() }

// byMessageGroup says whether the group reads its topic by message group:
// an ordered topic's groups, and those configured so (Config.ByMessageGroup).
// They queue what they read and claim each message group's next messages
// (see internal/engine/ordered.go).
func (g *Group) byMessageGroup() bool { return g.topic.Ordered || g.cfg.ByMessageGroup }

// deadLettersBlock says whether a dead letter blocks its message group: on
// an ordered topic with that policy.
func (g *Group) deadLettersBlock() bool {
	return g.topic.Ordered && g.topic.OrderedDeadLetters == outbox.BlockGroup
}

// handlerTimeout is how long a handler call may take.
func (g *Group) handlerTimeout() time.Duration { return cmp.Or(g.cfg.HandlerTimeout, g.topic.Lease) }
