// Package router delivers claimed messages to downstream HTTP endpoints:
// FIFO within a message group, concurrent across groups, through pools with
// a concurrency limit and an optional rate limit, with precise ack/nack.
//
// Sources (QueueSource for a QUEUE topic, GroupSource for a consumer group,
// any Source implementation of your own) hand the
// router batches of claimed messages. Routing follows three phases:
//
//  1. Dedupe against the in-flight map: a physical redelivery (same
//     delivery id: a lease ran out and the message was claimed again) is
//     adopted by the delivery in flight when its settler can (Adopter),
//     nacked otherwise; a logical requeue (same message, new delivery id)
//     is acked. Either way the original is still being delivered.
//  2. Capacity: a pool that cannot take all of the batch's messages for it
//     gets none of them (they are nacked); unknown pools fall back to
//     DEFAULT-POOL with a warning.
//  3. Per message group, in batch order: each message is submitted to its
//     pool; after the first refusal (the pool is full, or the group holds
//     its share of it) the rest of that group in this batch is nacked, so
//     redelivery keeps the order.
//
// In a pool, up to its concurrency of workers deliver; each message group's
// messages go one at a time, high priority first, and the groups with
// messages waiting take turns.
// When a delivery fails, the later messages of the same batch and group are
// nacked with a short delay instead of being delivered out of order.
// Messages without a group have no order to keep: up to the pool's
// concurrency of them are delivered at once.
package router

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/ratelog"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
)

// Settler ends a message's life in its source.
type Settler interface {
	// Ack: delivered (or not to be delivered again).
	Ack(ctx context.Context) error
	// Nack: deliver again later, as r says.
	Nack(ctx context.Context, r Retry) error
	// DeadLetter: park the message with the reason; it will not be retried.
	DeadLetter(ctx context.Context, reason string) error
}

// Retry says when and why a nacked message is to be delivered again.
type Retry struct {
	// At: deliver again from this instant on. Messages nacked to the same
	// instant should come back in the order they were written.
	At time.Time
	// Attempted says whether a delivery was tried: a message held back or
	// refused before delivery should not use up one of its attempts.
	Attempted bool
	// Reason says why the attempted delivery failed (the HTTP status, the
	// timeout, the connection error); empty when none was attempted.
	Reason string
}

// Adopter is a Settler that can take over a newer claim of its message.
// When a source hands the router a message it still holds under the same
// DeliveryID (a lease ran out and the message was claimed again), the
// router asks the settler it holds to adopt the new claim's settler; the
// new copy is then neither delivered nor settled. A settler that cannot
// adopt (it is settling already) returns false, and the copy is nacked.
type Adopter interface {
	Adopt(newer Settler) bool
}

// LeaseKeeper is a Source whose claimed messages hold leases that run out
// and that it renews only when asked (a source of your own: QueueSource
// and GroupSource keep their batches' leases themselves). From the source's start until Stop has settled the last
// message, the router calls KeepLeases every RenewEvery, so no lease runs
// out while its message waits in a pool, waits for a rate-limit permit or
// is in an HTTP call.
type LeaseKeeper interface {
	// KeepLeases renews, in one round trip, the lease of every message the
	// source claimed and has not settled yet. It returns how many messages
	// the source holds and how many leases it found lost.
	KeepLeases(ctx context.Context) (held, lost int, err error)
	// RenewEvery is the wait between two calls of KeepLeases.
	RenewEvery() time.Duration
}

// Message is a claimed message on its way to an endpoint.
type Message struct {
	// ID is the application message id. DeliveryID names the copy of it
	// the source delivers: the same copy claimed again (its lease ran out)
	// keeps its DeliveryID and is adopted (see Adopter); a copy requeued by
	// someone else gets a new one and is acked while the original is in
	// flight. Both required.
	ID, DeliveryID string
	// Pool chooses the pool (DEFAULT-POOL when unknown); Target is the URL
	// to POST to; Group the message group (blank: none, no order to keep;
	// sent as __DEFAULT__). A group is one within the message's Topic (and,
	// from a GroupSource, within its consumer group's copy of the topic):
	// groups of the same name in two topics are two groups. After a
	// failure the router holds the rest of a message group back in memory
	// (in this process) until the failed message's retry, unless its
	// source keeps the order: QueueSource and GroupSource do, when Group
	// is the group the message was sent with.
	Pool, Target, Group string
	HighPriority        bool
	Topic               string
	Payload             []byte
	// IdempotencyKey is sent as Idempotency-Key (defaults to ID).
	IdempotencyKey string
	// OutboxID is the message's id in pgoutbox's tables, the same for
	// every group's copy, sent as X-Outbox-Message-Id when not zero
	// (QueueSource and GroupSource set it).
	OutboxID int64
	// RetryDelay is how long a failed delivery waits for its retry when
	// the receiver names no delay: the source's backoff for this attempt
	// (QueueSource sets the topic's exponential backoff with jitter).
	// Zero: Config.DefaultRetryDelay.
	RetryDelay time.Duration
	// Settle is how the router acks and nacks it. Required.
	Settle Settler
	// TraceContext is the W3C trace context the message carries
	// (traceparent, tracestate): its delivery joins that trace (see
	// Config.TracerProvider). pgoutbox's sources set it to the message's
	// headers, of which the router reads only those two.
	TraceContext map[string]string

	scope    string // where ID is unique (a database and schema); set by pgoutbox's sources
	stream   string // which of scope's streams it comes from (a topic, or a group's copy of one); Topic when empty
	key, idk string // DeliveryID and ID within scope, set by Route (see scopeKeys)
	groupKey string // its message group within its stream, set by Route (see scopeKeys)
	batchKey string // its message group within its batch, set by Route
	batchID  string
	batchSeq uint64      // batches are numbered in routing order
	ordered  bool        // its source keeps its message group's order (see holds)
	panicked *panicError // the source's mapper panicked on this message
	target   *url.URL    // Target, parsed and allow-listed by Route
	poolCode string      // the pool Route gave it (Pool, or DEFAULT-POOL)
	settled  atomic.Bool
}

// scopeKeys computes, once, DeliveryID and ID within the message's scope
// (ids of two databases, or schemas, are different messages), and its
// message group within its stream (see lane).
func (m *Message) scopeKeys() {
	m.key, m.idk = m.scope+"\x00"+m.DeliveryID, m.scope+"\x00"+m.ID
	m.groupKey = m.scope + "\x00" + cmp.Or(m.stream, m.Topic) + "\x00" + m.group()
}

// pipelineKey and idKey are what the in-flight tracker knows a message by.
func (m *Message) pipelineKey() string { return m.key }
func (m *Message) idKey() string       { return m.idk }

func (m *Message) group() string {
	if !m.grouped() {
		return DefaultGroup
	}
	return m.Group
}

// grouped reports whether m has a message group: an order to keep.
func (m *Message) grouped() bool { return strings.TrimSpace(m.Group) != "" }

// lane is the queue m waits in within a pool: its message group's within
// its stream, or for a message without a group the pool's ungrouped lane
// (""). Groups of the same name in two topics, or in two consumer groups'
// copies of one topic, are different groups and do not wait for each
// other.
func (m *Message) lane() string {
	if !m.grouped() {
		return ""
	}
	return m.groupKey
}

// batchGroup is the message's message group within its batch (set by Route).
func (m *Message) batchGroup() string { return m.batchKey }

// Source feeds the router.
type Source interface {
	// Name identifies the source in logs and warnings.
	Name() string
	// Run claims batches and passes them to route until ctx ends. It returns
	// when it stopped claiming. The router never runs two Runs of one
	// source at once: a stalled source is restarted once its Run returned.
	Run(ctx context.Context, route func(ctx context.Context, batch []*Message)) error
	// LastPoll is when the source last asked for messages, by the wall
	// clock (time.Now; zero: never). A source that has not polled for
	// Config.StallTimeout of real time is restarted.
	LastPoll() time.Time
}

// ReadySource is a Source that subscribes before it claims, as a
// GroupSource registers its consumer group. Router.Start waits until each
// ReadySource added before it has subscribed, so every message committed
// after Start returns reaches it.
type ReadySource interface {
	Source
	// RunReady is Run that calls ready once the source is subscribed:
	// from then on, every message committed reaches it. It may return
	// before calling ready (with the error that prevented it).
	RunReady(ctx context.Context, route func(ctx context.Context, batch []*Message), ready func()) error
}

// InstanceSource is a Source run by a consumer group instance, as
// QueueSource and GroupSource are: its status shows in the router's
// SourceStatus, and in pgoutbox.Client.Health.
type InstanceSource interface {
	Source
	// Instance returns the status of the instance of the current (or
	// last) Run; false when no Run started one yet.
	Instance() (consumergroup.Status, bool)
}

// Router routes messages from sources to pools. Create it with New, add
// sources, Start it, Stop it.
type Router struct {
	cfg      Config
	logger   *slog.Logger
	events   *ratelog.Log // rate-limited records of what goes wrong
	warn     *warnings
	inflight *tracker
	mediator *mediator
	metrics  *metrics
	gauges   metric.Registration // the run's gauges (see observe); guarded by mu
	batches  atomic.Uint64       // batch ids
	holds    *holds              // groups held back behind a message awaiting its retry
	recovery *recoveries         // hosts whose deliveries fail, until one succeeds
	shared   *shared             // limits shared with other routers (Config.Shared); nil: each pool's are its own

	life    startstop.Base // runs and stops the router
	startMu sync.Mutex     // held by Start: a Stop waits for the Start in progress
	syncMu  sync.Mutex     // one configuration sync at a time
	mu      sync.Mutex     // guards pools, draining, sources and the fields of the run below
	pools   map[string]*pool
	drained []*pool
	sources []*runningSource

	// The current run, set by Start. live: between Start and the
	// beginning of Stop (sources may start); done ends the run.
	live     bool
	done     func()
	bg       context.Context // the run's context: loops, sources
	loops    startstop.Tasks // sync, health, leaks, cleanup, restarts
	runs     startstop.Tasks // sources' Runs
	keepStop chan struct{}   // closed when Stop settled everything: lease keepers end
	keepers  startstop.Tasks // lease keepers
}

// New validates cfg and returns a router.
func New(cfg Config) (*Router, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Router{
		cfg:      cfg,
		logger:   cfg.Logger,
		inflight: newTracker(),
		holds:    newHolds(),
		pools:    map[string]*pool{},
		metrics:  newMetrics(cfg.MeterProvider),
	}
	r.events = ratelog.New(cfg.Logger, cfg.LogInterval, cfg.Clock.Now)
	r.warn = newWarnings(cfg.WarningTTL, cfg.MaxWarnings, cfg.Clock.Now, r.events)
	r.recovery = newRecoveries(r.events, cfg.Clock.Now)
	r.mediator = newMediator(cfg, r.warn, r.events)
	if cfg.Shared != nil {
		r.shared = newShared(*cfg.Shared, cfg.Logger)
	}
	return r, nil
}

// Warnings returns the current (unexpired) warnings.
func (r *Router) Warnings() []Warning { return r.warn.list() }

// Start loads the configuration (from ConfigSource: up to StartupAttempts
// tries, then ErrConfigUnavailable), creates the pools and starts the
// sources and the background checks. It returns once every source is
// running and every ReadySource (a GroupSource) is subscribed: a group
// source's Start waits, as consumergroup.Group.Start does, for the
// producer transactions of its topic that are open, and every message
// committed after Start returns reaches it. If a source fails before it
// subscribed, or ctx ends first, Start stops the router and returns the
// error. Sources added after Start start at once, without such a wait.
// A stopped router can be started again.
func (r *Router) Start(ctx context.Context) error {
	run, done, err := r.life.StartInit(ctx, "router")
	if err != nil {
		return err
	}
	r.startMu.Lock() // a Stop meanwhile cancels run, then waits for this Start
	defer r.startMu.Unlock()
	r.mu.Lock()
	r.live, r.done, r.bg, r.keepStop = true, done, run, make(chan struct{})
	for _, rs := range r.sources {
		rs.restarting = false
	}
	r.mu.Unlock()
	if err := r.startRun(ctx, run); err != nil {
		r.mu.Lock()
		r.live = false
		r.mu.Unlock()
		r.life.StopInit()
		r.shutdown(context.WithoutCancel(ctx), done)
		return err
	}
	gauges, err := r.observe()
	if err != nil {
		r.logger.Warn("pgoutbox router: registering its gauges failed; it runs without them", slog.Any("error", err))
	}
	r.mu.Lock()
	r.gauges = gauges
	r.mu.Unlock()
	return nil
}

func (r *Router) startRun(ctx context.Context, run context.Context) error {
	r.applyPools(r.cfg.Pools)
	if r.cfg.ConfigSource != nil {
		if err := r.initialSync(ctx); err != nil {
			return err
		}
		r.loop(r.cfg.SyncInterval, func() { _ = r.Sync(r.bg) })
	}
	r.loop(r.cfg.HealthInterval, r.checkSources)
	r.loop(r.cfg.LeakCheckInterval, r.checkLeaks)
	r.loop(r.cfg.CleanupInterval, r.cleanup)
	if r.shared != nil {
		r.loops.Go(func() { r.shared.run(r.bg, r) })
	}
	r.mu.Lock()
	runs := make([]*sourceRun, 0, len(r.sources))
	for _, rs := range r.sources {
		r.runSource(rs, false)
		runs = append(runs, rs.current)
	}
	r.mu.Unlock()
	return waitReady(ctx, run, runs)
}

func (r *Router) loop(every time.Duration, f func()) {
	r.loops.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-r.bg.Done():
				return
			case <-t.C:
				f()
			}
		}
	})
}

func (r *Router) initialSync(ctx context.Context) error {
	var err error
	for attempt := 1; attempt <= r.cfg.StartupAttempts; attempt++ {
		if err = r.Sync(ctx); err == nil {
			return nil
		}
		r.logger.Warn("pgoutbox router: configuration sync failed at start-up", slog.Int("attempt", attempt), slog.Any("error", err))
		if attempt < r.cfg.StartupAttempts {
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w: %w", ErrConfigUnavailable, ctx.Err())
			case <-time.After(r.cfg.StartupRetryDelay):
			}
		}
	}
	r.warn.add(WarnConfigSyncFailed, SeverityCritical, "", fmt.Sprintf("initial configuration sync failed after %d attempts: %v", r.cfg.StartupAttempts, err))
	return fmt.Errorf("%w after %d attempts: %w", ErrConfigUnavailable, r.cfg.StartupAttempts, err)
}

// Sync fetches the configuration once and applies it; on failure the last
// good configuration stays and a warning is raised.
func (r *Router) Sync(ctx context.Context) error {
	if r.cfg.ConfigSource == nil {
		return nil
	}
	r.syncMu.Lock()
	defer r.syncMu.Unlock()
	pools, err := r.cfg.ConfigSource.Pools(ctx)
	if err == nil {
		for _, p := range pools {
			if err = p.validate(); err != nil {
				break
			}
		}
	}
	if err != nil {
		r.mu.Lock()
		have := len(r.pools) > 0
		r.mu.Unlock()
		if have {
			r.warn.add(WarnConfigSyncFailed, SeverityWarn, "", "configuration sync failed; keeping the last configuration: "+err.Error())
		}
		return err
	}
	r.applyPools(pools)
	return nil
}

// applyPools creates new pools, updates changed ones live, and drains
// pools that left the configuration.
func (r *Router) applyPools(cfgs []PoolConfig) {
	var leaving []*pool
	// Drain after unlocking: nacking what a pool queued can be slow, and
	// routing must not wait for it.
	defer func() {
		for _, p := range leaving {
			p.drain()
		}
	}()
	r.mu.Lock()
	defer r.mu.Unlock()
	want := map[string]PoolConfig{}
	for _, c := range cfgs {
		want[c.Code] = c
	}
	for code, p := range r.pools {
		c, keep := want[code]
		if !keep && code != DefaultPoolCode {
			leaving = append(leaving, p)
			r.drained = append(r.drained, p)
			delete(r.pools, code)
			st := p.stats()
			r.logger.Info("pgoutbox router: pool left the configuration; draining", slog.String("pool", code),
				slog.Int("queued", st.Queued), slog.Int("in_flight", st.InFlight), slog.Int("active_groups", st.ActiveGroups))
			continue
		}
		if keep {
			p.update(c)
		}
	}
	for code, c := range want {
		if _, ok := r.pools[code]; ok || !r.live {
			continue // a pool made outside a run would have workers nothing stops: Start makes it
		}
		if len(r.pools) >= r.cfg.MaxPools {
			r.warn.add(WarnPoolLimit, SeverityCritical, code, fmt.Sprintf("pool %q not created: %d pools is the maximum", code, r.cfg.MaxPools))
			continue
		}
		if len(r.pools) >= r.cfg.PoolWarningThreshold {
			r.warn.add(WarnPoolLimit, SeverityWarn, "", fmt.Sprintf("%d pools, warning threshold %d", len(r.pools)+1, r.cfg.PoolWarningThreshold))
		}
		r.pools[code] = newPool(r, c)
	}
}

// PoolStats describes a pool.
type PoolStats struct {
	Code               string `json:"code"`
	Concurrency        int    `json:"concurrency"`
	RateLimitPerMinute int    `json:"rate_limit_per_minute"`
	// Capacity is how many messages the pool queues at most; Queued how
	// many it holds now.
	Capacity int `json:"capacity"`
	Queued   int `json:"queued"`
	// InFlight counts the messages a worker took: being delivered, or
	// waiting for the rate limit, or being sent back.
	InFlight int `json:"in_flight"`
	// ActiveGroups counts the message groups with messages queued or
	// being delivered (the lane of messages without a group counts as one
	// while it has messages queued).
	ActiveGroups int `json:"active_groups"`
	// Shared: the pool's limits hold for every router of its
	// Config.Shared name together, and Permits is how many deliveries
	// this router may run at once now (the permits it holds).
	Shared  bool `json:"shared,omitempty"`
	Permits int  `json:"permits,omitempty"`
}

// Pools describes the active pools.
func (r *Router) Pools() []PoolStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]PoolStats, 0, len(r.pools))
	for _, p := range r.pools {
		out = append(out, p.stats())
	}
	return out
}

// InFlight is the number of messages between routing and their ack/nack.
func (r *Router) InFlight() int { return r.inflight.size() }

// Route takes a batch of claimed messages through the three routing phases.
// It returns once every message was submitted to a pool or settled.
func (r *Router) Route(ctx context.Context, batch []*Message) {
	batchSeq := r.batches.Add(1)
	batchID := strconv.FormatUint(batchSeq, 36)
	pools := map[string]*pool{} // the pools of this batch, as they were when it first met each
	poolFor := func(code string) (*pool, bool) {
		if p, ok := pools[code]; ok {
			return p, true
		}
		r.mu.Lock()
		p, ok := r.pools[code]
		r.mu.Unlock()
		if ok {
			pools[code] = p
		}
		return p, ok
	}

	targets := batchTargets{m: r.mediator, seen: map[string]checkedTarget{}}

	// Phase 1: dedupe against the in-flight map.
	byPool := map[string][]*Message{}
	var poolOrder []string
	for _, m := range batch {
		m.batchID, m.batchSeq = batchID, batchSeq
		m.scopeKeys()
		m.batchKey = batchID + "|" + m.groupKey
		if m.panicked != nil {
			r.mapperPanicked(ctx, m)
			continue
		}
		switch res, orig := r.inflight.check(m); res {
		case physicalDuplicate:
			r.metrics.duplicates.Add(ctx, 1)
			if a, ok := adopter(orig, m); ok && a.Adopt(m.Settle) {
				continue // the message in flight carries the new claim now
			}
			s := nackWith(r.cfg.DefaultRetryDelay)
			s.result = resultDuplicate
			r.settle(ctx, m, s, false)
			continue
		case logicalRequeue:
			r.settle(ctx, m, settlement{kind: 0, result: resultDuplicate}, false)
			r.metrics.duplicates.Add(ctx, 1)
			continue
		}
		u, err := targets.check(m.Target)
		if err != nil {
			r.warn.add(WarnTargetNotAllowed, SeverityError, targetSubject(m.Target), fmt.Sprintf("message %s: %v", m.ID, err))
			s := deadLetterWith(err.Error())
			s.result = resultNotAllowed
			r.settle(ctx, m, s, false)
			continue
		}
		m.target = u
		code := m.Pool
		if _, ok := poolFor(code); !ok {
			if code != DefaultPoolCode {
				r.warn.add(WarnRouting, SeverityWarn, code, fmt.Sprintf("no pool %q; message %s routed to %s", code, m.ID, DefaultPoolCode))
				r.metrics.defaultPool.Add(ctx, 1, metric.WithAttributes(attribute.String("requested", code)))
			}
			code = DefaultPoolCode
			pools[code] = r.defaultPool()
		}
		m.poolCode = code
		if _, seen := byPool[code]; !seen {
			poolOrder = append(poolOrder, code)
		}
		byPool[code] = append(byPool[code], m)
	}

	for _, code := range poolOrder {
		r.routeToPool(ctx, pools[code], byPool[code])
	}
}

// routeToPool is phases 2 and 3 for one pool's messages of a batch.
func (r *Router) routeToPool(ctx context.Context, p *pool, msgs []*Message) {
	// Phase 2: the pool takes all of them or none.
	if !p.fits(msgs) {
		r.refused(ctx, p, len(msgs))
		held := map[string]bool{}
		for _, m := range msgs {
			r.settle(ctx, m, nackWith(r.cfg.DefaultRetryDelay), false)
			if g := m.lane(); m.grouped() && !held[g] {
				held[g] = true
				r.holds.hold(m, r.cfg.Clock.Now().Add(r.cfg.DefaultRetryDelay), r.cfg.FastFailDelay)
			}
		}
		return
	}
	// Phase 3: per group, in order; after a refusal the rest of the group is nacked.
	// The pool remembers a failure of the batch's group until its last
	// message is done: the first one may be delivered, fail and settle
	// before the rest is queued, and must still hold the rest back.
	for _, key := range p.routing(msgs) {
		defer p.done(key)
	}
	refused := map[string]bool{} // by lane; the ungrouped lane is never refused as a whole
	for _, m := range msgs {
		g := m.lane()
		if resume, held := r.holds.heldBack(m, r.cfg.Clock.Now()); held {
			// An earlier message of the group awaits its retry: this one
			// must not overtake it.
			r.settle(ctx, m, settlement{kind: 1, until: resume}, false)
			continue
		}
		if refused[g] {
			r.settle(ctx, m, nackWith(r.cfg.FastFailDelay), false)
			continue
		}
		if r.inflight.track(m) != tracked {
			r.settle(ctx, m, nackWith(r.cfg.DefaultRetryDelay), false)
			continue
		}
		if !p.submit(m) {
			// Full, or the group holds its share: m and the rest of its
			// group come back after FastFailDelay, later batches of the
			// group are held back until then.
			r.refused(ctx, p, 1)
			r.inflight.remove(m)
			r.settle(ctx, m, nackWith(r.cfg.FastFailDelay), false)
			if m.grouped() {
				r.holds.hold(m, r.cfg.Clock.Now().Add(r.cfg.FastFailDelay), r.cfg.FastFailDelay)
				refused[g] = true
			}
		}
	}
}

// refused counts n messages p had no room for, sent back to their source:
// back-pressure, which the source's claims follow, so it is logged at
// Info (once per LogInterval and pool), not raised as a warning.
func (r *Router) refused(ctx context.Context, p *pool, n int) {
	r.metrics.refused.Add(ctx, int64(n), metric.WithAttributes(attribute.String("pool", p.code)))
	r.events.Log(slog.LevelInfo, "pool-full|"+p.code, "pgoutbox router: pool full; messages sent back to their source for later",
		slog.String("event", "pool-full"), slog.String("pool", p.code), slog.Int("messages", n))
}

// defaultPool returns DEFAULT-POOL, creating it on demand.
func (r *Router) defaultPool() *pool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.pools[DefaultPoolCode]; ok {
		return p
	}
	p := newPool(r, PoolConfig{Code: DefaultPoolCode, Concurrency: DefaultPoolConcurrency})
	if !r.live {
		// The run is over (a source's Run outlived Stop's deadline): a
		// drained pool refuses the message, which is nacked, and starts no
		// worker that nothing would stop.
		p.running = false
		return p
	}
	r.pools[DefaultPoolCode] = p
	return p
}

// batchTargets checks each target of a batch once: its messages usually
// share a few.
type batchTargets struct {
	m    *mediator
	seen map[string]checkedTarget
}

type checkedTarget struct {
	u   *url.URL
	err error
}

func (b batchTargets) check(target string) (*url.URL, error) {
	c, ok := b.seen[target]
	if !ok {
		c.u, c.err = b.m.checkTarget(target)
		b.seen[target] = c
	}
	return c.u, c.err
}

type settlement struct {
	kind      int    // 0 ack, 1 nack, 2 dead-letter
	result    string // the metrics' result attribute; "" is SUCCESS, NOT_DELIVERED or ERROR_CONFIG by kind
	delay     time.Duration
	until     time.Time // nack to this instant instead of now+delay
	reason    string
	attempted bool
}

var ackIt = settlement{kind: 0}

func nackWith(d time.Duration) settlement { return settlement{kind: 1, delay: d} }
func retryWith(d time.Duration, reason string) settlement {
	return settlement{kind: 1, delay: d, attempted: true, reason: reason}
}
func deadLetterWith(r string) settlement { return settlement{kind: 2, reason: r} }

// panicError is a panic recovered in code the router calls.
type panicError struct {
	value any
	stack []byte
}

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v", e.value) }

// mapperPanicked retries m, whose mapping panicked, as a failed attempt
// (so a message that always makes it panic ends as a dead letter), and
// reports the panic.
func (r *Router) mapperPanicked(ctx context.Context, m *Message) {
	r.reportPanic("mapper of "+m.Topic, fmt.Sprintf("mapping message %s of %s panicked: %v; the source goes on", m.ID, m.Topic, m.panicked.value),
		m.panicked.stack)
	s := retryWith(r.retryDelay(m, Outcome{}), "mapper "+m.panicked.Error())
	s.result = resultMapperPanic
	r.settle(ctx, m, s, false)
}

// reportPanic raises GROUP_THREAD_RESTART about subject and logs it with
// the stack (rate-limited like the other warnings).
func (r *Router) reportPanic(subject, msg string, stack []byte) {
	r.warn.record(WarnGroupThreadRestart, SeverityWarn, subject, msg)
	r.events.Log(slog.LevelError, "warning:"+WarnGroupThreadRestart+"|"+subject, "pgoutbox router: "+msg,
		slog.String("code", WarnGroupThreadRestart), slog.String("subject", subject), slog.String("stack", string(stack)))
}

// settle acks, nacks or dead-letters m exactly once and, when it was
// tracked, removes it from the in-flight map. A Settler that panics is
// logged like one that fails.
func (r *Router) settle(ctx context.Context, m *Message, s settlement, wasTracked bool) {
	if !m.settled.CompareAndSwap(false, true) {
		return
	}
	if wasTracked {
		defer r.inflight.remove(m)
	}
	ctx = context.WithoutCancel(ctx)
	var err error
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("panic: %v", v)
		}
		if err != nil {
			r.events.Log(slog.LevelWarn, "settle-failed|"+m.Topic, "pgoutbox router: settling a message failed; its source redelivers it",
				slog.String("event", "settle-failed"), slog.String("topic", m.Topic), slog.String("id", m.ID), slog.Any("error", err))
		}
	}()
	result := s.result
	if result == "" {
		result = [...]string{"SUCCESS", resultNotDelivered, "ERROR_CONFIG"}[s.kind]
	}
	// Counted before the source hears of it: whoever sees a message
	// settled sees it counted (and a settler that panics does not hide it).
	attrs := settleAttrs(m, result)
	switch s.kind {
	case 0:
		r.metrics.acked.Add(ctx, 1, attrs)
		err = m.Settle.Ack(ctx)
	case 1:
		until := s.until
		if until.IsZero() {
			until = r.cfg.Clock.Now().Add(clampDelay(s.delay))
		}
		r.metrics.nacked.Add(ctx, 1, attrs)
		err = m.Settle.Nack(ctx, Retry{At: until, Attempted: s.attempted, Reason: s.reason})
	case 2:
		r.metrics.deadLettered.Add(ctx, 1, attrs)
		err = m.Settle.DeadLetter(ctx, s.reason)
		host := targetSubject(m.Target)
		r.events.Log(slog.LevelWarn, "dead-letter|"+host, "pgoutbox router: message dead-lettered", slog.String("event", "dead-letter"),
			slog.String("host", host), slog.String("topic", m.Topic), slog.String("id", m.ID), slog.String("reason", s.reason))
	}
}

func clampDelay(d time.Duration) time.Duration { return min(max(d, MinDelay), MaxDelay) }

// cleanup forgets lapsed holds and pools that finished draining.
func (r *Router) cleanup() {
	r.holds.prune(r.cfg.Clock.Now())
	r.events.Prune()
	r.mu.Lock()
	r.drained = slices.DeleteFunc(r.drained, (*pool).finished)
	r.mu.Unlock()
}

// checkLeaks warns when the in-flight map outgrows what the pools can hold.
func (r *Router) checkLeaks() {
	r.mu.Lock()
	total := 0
	for _, p := range r.pools {
		total += p.stats().Capacity
	}
	r.mu.Unlock()
	total = max(total, MinQueueCapacity)
	if n := r.inflight.size(); n > total {
		r.warn.add(WarnPipelineMapLeak, SeverityWarn, "", fmt.Sprintf("in-flight map holds %d messages, pools hold at most %d", n, total))
	}
}

// Stop shuts down gracefully: sources stop claiming, pools stop accepting
// and nack what they queued, in-progress HTTP calls finish (until ctx
// ends), then everything still tracked is nacked. Nothing is acked that was
// not delivered. Safe to call more than once, and on a router never
// started; a stopped router can be started again.
func (r *Router) Stop(ctx context.Context) error {
	stopped, ok := r.life.StopInit() // ends the run's context: a Start in progress gives up
	if !ok {
		return nil
	}
	r.startMu.Lock()
	r.mu.Lock()
	first, done := r.live, r.done
	r.live = false
	r.mu.Unlock()
	r.startMu.Unlock()
	if !first { // another Stop (or the Start that failed) does it
		return startstop.Wait(ctx, stopped)
	}
	return r.shutdown(ctx, done)
}

// allPools returns the active pools and those drained by a change of
// configuration.
func (r *Router) allPools() []*pool {
	r.mu.Lock()
	defer r.mu.Unlock()
	pools := make([]*pool, 0, len(r.pools)+len(r.drained))
	for _, p := range r.pools {
		pools = append(pools, p)
	}
	return append(pools, r.drained...)
}

// shutdown ends the run whose context was cancelled: it drains the pools
// while the sources stop, waits for the sources, nacks what is left and
// calls done once the last Run returned.
func (r *Router) shutdown(ctx context.Context, done func()) error {
	// The pools stop taking messages and hand back what they queued now,
	// not after the sources return: a source whose Run waits until what it
	// routed is settled (GroupSource: its group's batch ends then) would
	// otherwise wait for the pools to deliver all of it.
	for _, p := range r.allPools() {
		p.drain()
	}
	runsDone := r.runs.Done()
	err := startstop.Wait(ctx, runsDone) // every source's Run, removed ones too
	r.loops.Wait()

	pools := r.allPools()
	r.mu.Lock()
	r.pools, r.drained = map[string]*pool{}, nil // a new run makes new ones
	if r.gauges != nil {
		_ = r.gauges.Unregister()
		r.gauges = nil
	}
	for _, rs := range r.sources {
		rs.keeping = false // the lease keepers end below
	}
	r.mu.Unlock()
	for _, p := range pools {
		p.drain() // one made while the sources stopped
	}
	for _, p := range pools {
		if werr := startstop.WaitGroup(ctx, &p.workers); werr != nil && err == nil {
			err = werr
		}
	}
	failures := 0
	for _, m := range r.inflight.drain() {
		if e := m.Settle.Nack(context.WithoutCancel(ctx), Retry{At: r.cfg.Clock.Now().Add(MinDelay)}); e != nil {
			failures++
		}
		m.settled.Store(true)
	}
	if failures > 0 {
		r.warn.add(WarnShutdownCleanup, SeverityWarn, "", fmt.Sprintf("%d messages could not be nacked at shutdown", failures))
	}
	close(r.keepStop)
	r.keepers.Wait()
	r.mediator.close()
	// The run ends when the last Run returned (one that ignores its
	// context past ctx's end keeps a new Start waiting).
	go func() { <-runsDone; done() }()
	return err
}

// targetSubject is what a warning about a refused target is about: its
// host, or "invalid target URL".
func targetSubject(target string) string {
	if u, err := url.Parse(target); err == nil && u.Host != "" {
		return u.Host
	}
	return "invalid target URL"
}

// validTarget parses an absolute http(s) URL.
func validTarget(target string) (*url.URL, error) {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: %q", ErrInvalidTarget, target)
	}
	return u, nil
}

// adopter returns the settler of orig, the message in flight m duplicates,
// if it can adopt m's claim.
func adopter(orig, m *Message) (Adopter, bool) {
	if orig == nil || orig == m {
		return nil, false
	}
	a, ok := orig.Settle.(Adopter)
	return a, ok
}
