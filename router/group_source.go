package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/backoff"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// DefaultGroupHandlerTimeout is how long a GroupSource lets the router
// take over one group batch (every message delivered, or nacked, or
// dead-lettered) before the group gives up on it and retries its
// unsettled messages.
const DefaultGroupHandlerTimeout = time.Hour

// GroupSourceConfig configures a GroupSource.
type GroupSourceConfig struct {
	// Pool and Group configure the consumer group instance the source runs
	// (a new one each time the source starts). Required. Group.HandlerTimeout
	// defaults to DefaultGroupHandlerTimeout.
	Pool  *pgxpool.Pool
	Group consumergroup.Config
	// Options apply when the subscription is created. Defaults to FromNow.
	Options consumergroup.SubscriptionOptions
	// Mapper maps a delivery to its route. Defaults to HeaderMapper.
	Mapper Mapper
}

// GroupSource feeds the router from a consumer group on a PUB_SUB topic.
// The group reads its topic by message group, ordered or not
// (consumergroup.Config.ByMessageGroup, which the source sets): it queues
// what it reads and hands out the next messages of each message group in
// turn, one message group's at a time, so a message group's backlog never
// delays another's and its messages go in order, whatever the number of
// routers. Each set of messages the group hands out together becomes one
// router batch, which completes once the router settled every message of
// it; the group keeps their leases alive meanwhile. A message delivered is
// recorded as done for the group at once (with Group.AckTx), not when its
// batch ends, so a crash after the receiver's 200 does not send it again;
// once the messages before it in its message group and batch are.
// Router nacks become group retries (a nack that attempted no delivery
// spends no attempt), dead letters group dead letters.
type GroupSource struct {
	cfg     GroupSourceConfig
	scope   string // where its message ids are unique
	running atomic.Bool
	queue   string                              // a QueueSource's name, when it runs this one: its messages keep a queue's ids
	group   atomic.Pointer[consumergroup.Group] // the instance of the current Run
}

// NewGroupSource returns a source for cfg.Group.
func NewGroupSource(cfg GroupSourceConfig) (*GroupSource, error) {
	if cfg.Pool == nil {
		return nil, fmt.Errorf("%w: GroupSource needs a Pool", ErrInvalidConfig)
	}
	if cfg.Options.Position == "" {
		cfg.Options = consumergroup.FromNow()
	}
	if cfg.Mapper == nil {
		cfg.Mapper = HeaderMapper
	}
	cfg.Group.HandlerTimeout = cmp.Or(cfg.Group.HandlerTimeout, DefaultGroupHandlerTimeout)
	// Each message group's next messages in turn, from the database up, on
	// any topic: a message group's backlog never delays another's, and its
	// order is kept by the group (the router holds nothing back for it).
	cfg.Group.ByMessageGroup = true
	schema := cfg.Group.Schema
	if schema == "" && cfg.Group.Client != nil {
		schema = cfg.Group.Client.Schema()
	}
	return &GroupSource{cfg: cfg, scope: scopeOf(cfg.Pool, cmp.Or(schema, "public"))}, nil
}

// Name implements Source.
func (s *GroupSource) Name() string {
	if s.queue != "" {
		return s.queue
	}
	return "group:" + s.cfg.Group.Topic + "/" + s.cfg.Group.Group
}

var _ ReadySource = (*GroupSource)(nil)

// LastPoll implements Source: a running group instance polls on its own
// (and its heartbeats say it is alive), so it reports now while running.
func (s *GroupSource) LastPoll() time.Time {
	if s.running.Load() {
		return time.Now()
	}
	return time.Time{}
}

// Instance implements InstanceSource: the status of the group instance
// of the current (or last) Run; false before the first Run started one.
func (s *GroupSource) Instance() (consumergroup.Status, bool) {
	g := s.group.Load()
	if g == nil {
		return consumergroup.Status{}, false
	}
	return g.Status(), true
}

// Run implements Source: it starts a group instance and stops it when ctx
// ends, or returns the instance's error when it stopped on its own (its
// subscription was cancelled or deleted).
func (s *GroupSource) Run(ctx context.Context, route func(context.Context, []*Message)) error {
	return s.RunReady(ctx, route, func() {})
}

// RunReady implements ReadySource: Run that calls ready once the group
// instance started, its subscription registered.
func (s *GroupSource) RunReady(ctx context.Context, route func(context.Context, []*Message), ready func()) error {
	g, err := consumergroup.New(s.cfg.Pool, s.cfg.Group)
	if err != nil {
		return err
	}
	client := s.cfg.Group.Client
	if client == nil {
		if client, err = outbox.NewClient(s.cfg.Pool, outbox.Config{Schema: s.cfg.Group.Schema}); err != nil {
			return err
		}
	}
	topic, err := client.Topic(ctx, s.cfg.Group.Topic)
	if err != nil {
		return err
	}
	acks := &acker{g: g, pool: s.cfg.Pool}
	if err := g.SetBatchHandler(func(bctx context.Context, ds []*outbox.Delivery) []error {
		return s.handle(bctx, route, topic, acks, ds)
	}); err != nil {
		return err
	}
	if err := g.Start(ctx, s.cfg.Options); err != nil {
		return err
	}
	s.group.Store(g)
	s.running.Store(true)
	defer s.running.Store(false)
	ready()
	select {
	case <-ctx.Done():
	case <-g.Stopped():
		return g.Err()
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return g.Stop(stopCtx)
}

// handle routes one group batch and waits until every message is settled.
func (s *GroupSource) handle(ctx context.Context, route func(context.Context, []*Message), topic outbox.TopicConfig, acks *acker,
	ds []*outbox.Delivery) []error {
	results := make([]error, len(ds))
	var wg sync.WaitGroup
	batch := make([]*Message, 0, len(ds))
	last := map[string]*groupSettler{} // each message group's last message so far (ds is in the group's order)
	unmapped := map[string]bool{}      // message groups with a message the mapper refused
	for i, d := range ds {
		if d.Group != "" && unmapped[d.Group] {
			continue // not delivered: the group hands it back, as it follows a message that failed
		}
		r, err := mapRoute(s.cfg.Mapper, d)
		var panicked *panicError
		if err != nil && !errors.As(err, &panicked) {
			results[i] = outbox.Permanent(err)
			if d.Group != "" {
				unmapped[d.Group] = true
			}
			continue
		}
		wg.Add(1)
		st := &groupSettler{result: &results[i], wg: &wg, acks: acks, d: d}
		if d.Group != "" {
			st.prev, last[d.Group] = last[d.Group], st
		}
		// A message is the group's copy: another group's copy of the same
		// message is a different delivery (and gets its own idempotency
		// key). A copy claimed again while in flight (its lease ran out)
		// keeps the DeliveryID and is adopted.
		id := s.Name() + "/" + strconv.FormatInt(d.ID, 10)
		deliveryID := id
		if s.queue != "" { // a QUEUE topic's message has one copy, whatever reads it
			id = strconv.FormatInt(d.ID, 10)
		}
		batch = append(batch, &Message{
			ID: id, DeliveryID: deliveryID, OutboxID: d.ID, scope: s.scope, stream: s.Name(),
			Pool: r.Pool, Target: r.Target, Group: r.Group, HighPriority: r.HighPriority,
			Topic: d.Topic, Payload: d.Payload, Settle: st, TraceContext: d.Headers,
			RetryDelay: backoff.Exponential(d.Attempt, topic.BackoffInitial, topic.BackoffMax),
			panicked:   panicked, // the router retries it and reports the panic
			ordered:    r.Group == d.Group,
		})
		if panicked != nil && d.Group != "" {
			unmapped[d.Group] = true
		}
	}
	// Batches are routed in the order the group fetched them, so that a
	// message group's later batch never reaches a pool before its
	// earlier one (batch handlers run concurrently).
	consumergroup.InTurn(ctx, func() {
		if len(batch) > 0 {
			route(ctx, batch)
		}
	})
	wg.Wait() // stopping too: the router settles everything before it stops
	return results
}

// groupSettler turns the router's settlement into a group handler result,
// and records an ack in the group at once (see acker).
type groupSettler struct {
	acks     *acker
	d        *outbox.Delivery
	prev     *groupSettler // on an ordered topic, the message before d in its message group and batch
	recorded atomic.Bool   // d's ack is recorded in the group

	mu      sync.Mutex
	settled bool
	adopted Settler // a newer copy of the message, settled alike
	result  *error
	wg      *sync.WaitGroup
}

func (g *groupSettler) set(ctx context.Context, err error, also func(Settler) error) error {
	g.mu.Lock()
	if g.settled {
		g.mu.Unlock()
		return nil
	}
	g.settled = true
	newer := g.adopted
	*g.result = err
	g.mu.Unlock()
	g.wg.Done()
	if newer != nil {
		return also(newer)
	}
	return nil
}

// Ack implements Settler: the ack is recorded in the group now, unless
// the message before it in its ordered message group was not (then, as
// when recording fails, the group records it when the batch ends).
func (g *groupSettler) Ack(ctx context.Context) error {
	if g.mayRecord() && g.acks.ack(ctx, g.d) == nil {
		g.recorded.Store(true)
	}
	return g.set(ctx, nil, func(n Settler) error { return n.Ack(ctx) })
}

// mayRecord reports whether the ack may be recorded before the batch
// ends: not once the message is settled (or adopted), nor ahead of an
// earlier message of its ordered message group.
func (g *groupSettler) mayRecord() bool {
	g.mu.Lock()
	free := !g.settled && g.adopted == nil
	g.mu.Unlock()
	return free && (g.prev == nil || g.prev.recorded.Load())
}

// Nack implements Settler: a nack that attempted no delivery (held back,
// circuit open) snoozes the message without spending an attempt.
func (g *groupSettler) Nack(ctx context.Context, r Retry) error {
	reason := errors.New(cmp.Or(r.Reason, "router: nacked"))
	err := outbox.RetryAt(r.At, reason) // the instant: a held-back message group comes back in order
	if !r.Attempted {
		err = outbox.SnoozeUntil(r.At, reason)
	}
	return g.set(ctx, err, func(n Settler) error { return n.Nack(ctx, r) })
}

// DeadLetter implements Settler.
func (g *groupSettler) DeadLetter(ctx context.Context, reason string) error {
	return g.set(ctx, outbox.Permanent(errors.New(reason)), func(n Settler) error { return n.DeadLetter(ctx, reason) })
}

// Adopt implements Adopter: the group took the message's batch over (its
// lease ran out) and handed it out again as a retry while this copy is in
// flight. This copy's outcome can no longer be recorded (its batch is
// gone), so it is passed on to the newer copy's settler.
func (g *groupSettler) Adopt(newer Settler) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.settled || g.adopted != nil {
		return false
	}
	g.adopted = newer
	return true
}

// acker records in the group the acks of a group source's messages as
// they come (Group.AckTx), so a message delivered is done even if the
// process dies before its batch ends. One caller at a time writes, in one
// transaction, its ack and those that arrived meanwhile, then hands the
// turn to an ack that arrived during its write: no caller writes more
// than one transaction.
type acker struct {
	g    *consumergroup.Group
	pool *pgxpool.Pool

	mu      sync.Mutex
	writing bool // a caller has the turn
	pending []*ackRequest
}

type ackRequest struct {
	d    *outbox.Delivery
	err  error
	wake chan bool // true: its turn to write; false: written (err says how)
}

// ack records d's ack, or returns why it could not (outbox.ErrLeaseLost:
// the group took d's batch over).
func (a *acker) ack(ctx context.Context, d *outbox.Delivery) error {
	req := &ackRequest{d: d, wake: make(chan bool, 1)}
	a.mu.Lock()
	a.pending = append(a.pending, req)
	turn := !a.writing
	a.writing = true
	a.mu.Unlock()
	if !turn && !<-req.wake {
		return req.err // another caller wrote it
	}
	a.mu.Lock()
	reqs := a.pending
	a.pending = nil
	a.mu.Unlock()
	a.write(ctx, reqs)
	a.mu.Lock()
	if len(a.pending) > 0 {
		a.pending[0].wake <- true
	} else {
		a.writing = false
	}
	a.mu.Unlock()
	return req.err
}

// write records reqs in one transaction, in ascending id order (as every
// completion locks rows), and answers each.
func (a *acker) write(ctx context.Context, reqs []*ackRequest) {
	defer func() {
		for _, r := range reqs {
			r.wake <- false
		}
	}()
	slices.SortFunc(reqs, func(x, y *ackRequest) int { return cmp.Compare(x.d.ID, y.d.ID) })
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err := pgx.BeginTxFunc(ctx, a.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		for _, r := range reqs {
			// A lease lost writes nothing: the others go on.
			if r.err = a.g.AckTx(ctx, tx, r.d); r.err != nil && !errors.Is(r.err, outbox.ErrLeaseLost) {
				return r.err
			}
		}
		return nil
	})
	if err != nil {
		for _, r := range reqs {
			r.err = err
		}
	}
}
