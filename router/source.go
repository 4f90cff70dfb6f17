package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/backoff"
	"github.com/pgoutbox/pgoutbox/internal/cfgcheck"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Header names the default mapping reads from a message's headers.
const (
	HeaderPool   = "router-pool"
	HeaderTarget = "router-target"
)

// Route is where a delivery goes.
type Route struct {
	Pool, Target, Group string
	HighPriority        bool
}

// Mapper decides a delivery's route. An error dead-letters the message
// with the error as reason.
type Mapper func(d *outbox.Delivery) (Route, error)

// HeaderMapper is the default Mapper: pool and target from the headers
// router-pool and router-target, the group from the message group, and
// high priority for Priority > 0. A message without a target is an error.
func HeaderMapper(d *outbox.Delivery) (Route, error) {
	r := Route{Pool: d.Headers[HeaderPool], Target: d.Headers[HeaderTarget], Group: d.Group, HighPriority: d.Priority > 0}
	if r.Target == "" {
		return r, fmt.Errorf("%w: message %d has no %s header", ErrInvalidTarget, d.ID, HeaderTarget)
	}
	return r, nil
}

// QueueSource defaults.
const (
	DefaultSourceBatchSize    = 100
	DefaultSourcePollInterval = 100 * time.Millisecond
)

// QueueSourceConfig configures a QueueSource. Zero fields take their
// defaults; negative ones are refused with ErrInvalidConfig.
type QueueSourceConfig struct {
	// Client and Topic: the QUEUE topic to claim from. Required.
	Client *outbox.Client
	Topic  string
	// Owner names the claims (lease owner). Defaults to "router".
	Owner string
	// BatchSize is the most messages per claim. Defaults to
	// DefaultSourceBatchSize.
	BatchSize int
	// PollInterval is the wait after a claim that found fewer than
	// BatchSize messages. Defaults to DefaultSourcePollInterval.
	PollInterval time.Duration
	// Lease is how long each renewal keeps a claimed message leased.
	// Defaults to the topic's lease.
	Lease time.Duration
	// RenewEvery is how often the leases of all messages the source holds
	// (claimed and not yet settled: queued in a pool, waiting for a rate
	// limit, in an HTTP call) are renewed, in one statement. Defaults to a
	// third of the shorter of Lease and the topic's lease (a claim holds a
	// message for the topic's lease until its first renewal).
	RenewEvery time.Duration
	// Mapper maps a delivery to its route. Defaults to HeaderMapper.
	Mapper Mapper
	// MaxInFlight caps this source's messages between claim and settlement;
	// it claims only what fits. Keep it at most the capacity of the pools
	// its messages go to (max(concurrency×20, 50)), so the router never has
	// to refuse a batch for lack of room, and, if one message group can
	// dominate the topic, at most that group's share of it
	// (Config.GroupShare, half by default). Defaults to BatchSize.
	MaxInFlight int
}

// QueueSource claims messages of a QUEUE topic for the router. It holds
// the lease of every message it claimed until the router settles it, and
// renews them all together (it is a LeaseKeeper). On a topic whose
// messages live on the log it runs as a member of the topic's one
// consumer group instead, as a GroupSource does.
type QueueSource struct {
	cfg      QueueSourceConfig
	lastPoll atomic.Int64 // unix nanos
	room     chan struct{}
	lease    atomic.Int64 // what a renewal asks for; 0 until Run knows the topic's lease
	shortest atomic.Int64 // the shorter of a claim's lease (the topic's) and a renewal's
	scope    string       // where its message ids are unique

	mu   sync.Mutex
	held map[*queueSettler]struct{} // claimed, not settled

	onLog atomic.Bool // Run reads the topic's group (see runOnLog)
}

// NewQueueSource returns a source for cfg.Topic.
func NewQueueSource(cfg QueueSourceConfig) (*QueueSource, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("%w: QueueSource needs a Client", ErrInvalidConfig)
	}
	if err := outbox.ValidateTopic(cfg.Topic); err != nil {
		return nil, err
	}
	cfg.Owner = cmp.Or(cfg.Owner, "router")
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultSourceBatchSize)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultSourcePollInterval)
	if cfg.Mapper == nil {
		cfg.Mapper = HeaderMapper
	}
	cfg.MaxInFlight = cmp.Or(cfg.MaxInFlight, cfg.BatchSize)
	check := cfgcheck.New("QueueSource of " + strconv.Quote(cfg.Topic))
	check.Count("BatchSize", cfg.BatchSize, 1)
	check.Count("MaxInFlight", cfg.MaxInFlight, 1)
	check.Positive("PollInterval", cfg.PollInterval)
	check.NotNegative("Lease", cfg.Lease)
	check.NotNegative("RenewEvery", cfg.RenewEvery)
	if err := check.Err(); err != nil {
		return nil, err
	}
	return &QueueSource{cfg: cfg, room: make(chan struct{}, 1), held: map[*queueSettler]struct{}{},
		scope: scopeOf(cfg.Client.Pool(), cfg.Client.Schema())}, nil
}

// scopeOf names where a source's message ids are unique: the database
// (host, port, name) and schema it reads. The same id from two of them is
// two messages to the router.
func scopeOf(pool *pgxpool.Pool, schema string) string {
	cc := pool.Config().ConnConfig
	return fmt.Sprintf("%s:%d/%s/%s", cc.Host, cc.Port, cc.Database, schema)
}

// Name implements Source.
func (s *QueueSource) Name() string { return "queue:" + s.cfg.Topic }

// LastPoll implements Source.
func (s *QueueSource) LastPoll() time.Time {
	if s.onLog.Load() { // the group instance polls on its own
		return time.Now()
	}
	n := s.lastPoll.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Run implements Source.
func (s *QueueSource) Run(ctx context.Context, route func(context.Context, []*Message)) error {
	t, err := s.cfg.Client.Topic(ctx, s.cfg.Topic)
	if err != nil {
		return err
	}
	if t.Tracking != "" {
		return s.runOnLog(ctx, route)
	}
	lease := cmp.Or(s.cfg.Lease, t.Lease)
	s.lease.Store(int64(lease))
	s.shortest.Store(int64(min(lease, t.Lease))) // a claim leases for the topic's lease, whatever Lease says
	for ctx.Err() == nil {
		s.lastPoll.Store(time.Now().UnixNano())
		limit := min(s.cfg.BatchSize, s.cfg.MaxInFlight-s.holding())
		if limit <= 0 {
			select { // full: wait for settlements
			case <-ctx.Done():
				return nil
			case <-s.room:
			case <-time.After(s.cfg.PollInterval):
			}
			continue
		}
		// Claims are not cancelled by ctx: a claim cut off after it
		// committed would leave its messages leased until they expire.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		ds, err := s.cfg.Client.Claim(cctx, s.cfg.Topic, s.cfg.Owner, limit)
		cancel()
		if err != nil {
			if !sleep(ctx, s.cfg.PollInterval) {
				return nil
			}
			continue
		}
		if batch := s.messages(ctx, t, ds); len(batch) > 0 {
			route(ctx, batch)
		}
		if len(ds) < limit && !sleep(ctx, s.cfg.PollInterval) {
			return nil
		}
	}
	return nil
}

// runOnLog runs the source over a QUEUE topic whose messages live on the
// log: as a member of the topic's one group, through a GroupSource (which
// keeps the leases of what it handed over itself; Owner, Lease,
// RenewEvery and MaxInFlight do not apply). The member's name is its own
// (host, process and a random part): the group tells its members apart
// by name.
func (s *QueueSource) runOnLog(ctx context.Context, route func(context.Context, []*Message)) error {
	g, err := NewGroupSource(GroupSourceConfig{Pool: s.cfg.Client.Pool(), Mapper: s.cfg.Mapper,
		Group: consumergroup.Config{Topic: s.cfg.Topic, Group: sqlq.QueueGroup, Client: s.cfg.Client,
			BatchSize: s.cfg.BatchSize, PollInterval: s.cfg.PollInterval}})
	if err != nil {
		return err
	}
	g.queue = s.Name()
	s.onLog.Store(true)
	defer s.onLog.Store(false)
	return g.RunReady(ctx, route, func() {})
}

// messages maps claimed deliveries of topic t to router messages and holds
// their leases; a delivery the mapper refuses is dead-lettered.
func (s *QueueSource) messages(ctx context.Context, t outbox.TopicConfig, ds []*outbox.Delivery) []*Message {
	batch := make([]*Message, 0, len(ds))
	for _, d := range ds {
		r, err := s.mapRoute(d)
		var panicked *panicError
		if err != nil && !errors.As(err, &panicked) {
			_ = s.cfg.Client.DeadLetter(context.WithoutCancel(ctx), d, err.Error())
			continue
		}
		st := &queueSettler{src: s, d: d}
		s.hold(st)
		batch = append(batch, &Message{
			// One message of the table is one delivery, however often it
			// is claimed: a claim of a message the router still holds is
			// the same delivery again, which the router adopts.
			ID: strconv.FormatInt(d.ID, 10), DeliveryID: "queue:" + s.cfg.Topic + "/" + strconv.FormatInt(d.ID, 10), OutboxID: d.ID, scope: s.scope,
			stream: "queue:" + s.cfg.Topic, Pool: r.Pool, Target: r.Target, Group: r.Group, HighPriority: r.HighPriority,
			Topic: d.Topic, Payload: d.Payload, Settle: st, TraceContext: d.Headers, RetryDelay: backoff.Exponential(d.Attempt, t.BackoffInitial, t.BackoffMax),
			panicked: panicked, // the router retries it and reports the panic
			ordered:  t.Ordered && r.Group == d.Group,
		})
	}
	return batch
}

// mapRoute runs the mapper; a panic comes back as a *panicError.
func (s *QueueSource) mapRoute(d *outbox.Delivery) (r Route, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{value: v, stack: debug.Stack()}
		}
	}()
	return s.cfg.Mapper(d)
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func (s *QueueSource) holding() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

func (s *QueueSource) hold(q *queueSettler) {
	s.mu.Lock()
	s.held[q] = struct{}{}
	s.mu.Unlock()
}

// forget stops holding q and frees its place in the in-flight budget.
func (s *QueueSource) forget(q *queueSettler) {
	s.mu.Lock()
	delete(s.held, q)
	s.mu.Unlock()
	select {
	case s.room <- struct{}{}:
	default:
	}
}

// RenewEvery implements LeaseKeeper.
func (s *QueueSource) RenewEvery() time.Duration {
	if s.cfg.RenewEvery > 0 {
		return s.cfg.RenewEvery
	}
	if lease := time.Duration(s.shortest.Load()); lease > 0 {
		return lease / 3
	}
	return s.cfg.PollInterval // Run has not read the topic's lease yet
}

// KeepLeases implements LeaseKeeper: one statement renews the lease of
// every message the source holds. A lease found lost (the message was
// settled elsewhere or claimed again) is not renewed again; settling
// that message then changes nothing.
func (s *QueueSource) KeepLeases(ctx context.Context) (held, lost int, err error) {
	s.mu.Lock()
	settlers := make([]*queueSettler, 0, len(s.held))
	for q := range s.held {
		settlers = append(settlers, q)
	}
	s.mu.Unlock()
	ds := make([]*outbox.Delivery, 0, len(settlers))
	owner := make(map[*outbox.Delivery]*queueSettler, len(settlers))
	for _, q := range settlers {
		if d := q.renewable(); d != nil {
			ds = append(ds, d)
			owner[d] = q
		}
	}
	gone, err := s.cfg.Client.ExtendLeases(ctx, ds, time.Duration(s.lease.Load()))
	for _, d := range gone {
		owner[d].lose(d)
	}
	return len(settlers), len(gone), err
}

// queueSettler settles a QUEUE delivery. Its delivery changes when it
// adopts a newer claim of the same message.
type queueSettler struct {
	src *QueueSource

	mu       sync.Mutex
	d        *outbox.Delivery
	lost     bool // d's lease could not be renewed
	finished bool // settling began (or another settler adopted this one)
}

// finish marks q settled and returns the delivery to settle.
func (q *queueSettler) finish() *outbox.Delivery {
	q.mu.Lock()
	q.finished = true
	d := q.d
	q.mu.Unlock()
	q.src.forget(q)
	return d
}

// renewable returns the delivery whose lease to renew, or nil.
func (q *queueSettler) renewable() *outbox.Delivery {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.finished || q.lost {
		return nil
	}
	return q.d
}

// lose records that d's lease could not be renewed (unless q adopted a
// newer claim meanwhile).
func (q *queueSettler) lose(d *outbox.Delivery) {
	q.mu.Lock()
	if q.d == d {
		q.lost = true
	}
	q.mu.Unlock()
}

// Adopt implements Adopter: newer, a later claim of q's message (its lease
// ran out and it was claimed again while the router still held it),
// replaces q's claim; q settles and renews it from now on.
func (q *queueSettler) Adopt(newer Settler) bool {
	n, ok := newer.(*queueSettler)
	if !ok || n == q {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	n.mu.Lock()
	nd, free := n.d, !n.finished
	if free && !q.finished && nd.ID == q.d.ID && nd.Attempt > q.d.Attempt {
		n.finished = true
		q.d, q.lost = nd, false
	} else {
		free = false
	}
	n.mu.Unlock()
	if free {
		n.src.forget(n)
	}
	return free
}

// Ack implements Settler.
func (q *queueSettler) Ack(ctx context.Context) error {
	return q.src.cfg.Client.Ack(ctx, q.finish())
}

// Nack implements Settler: an attempted delivery counts and records its
// reason as the message's last error.
func (q *queueSettler) Nack(ctx context.Context, r Retry) error {
	d := q.finish()
	if r.Attempted {
		return q.src.cfg.Client.RetryAt(ctx, d, r.At, cmp.Or(r.Reason, "delivery failed"))
	}
	return q.src.cfg.Client.PostponeUntil(ctx, d, r.At)
}

// DeadLetter implements Settler.
func (q *queueSettler) DeadLetter(ctx context.Context, reason string) error {
	return q.src.cfg.Client.DeadLetter(ctx, q.finish(), reason)
}
