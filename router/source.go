package router

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

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

// QueueSourceConfig configures a QueueSource.
type QueueSourceConfig struct {
	// Client and Topic: the QUEUE topic to claim from. Required.
	Client *outbox.Client
	Topic  string
	// Owner names the claims (lease owner). Defaults to "router".
	Owner string
	// BatchSize is the most messages per claim. Defaults to 100.
	BatchSize int
	// PollInterval is the wait after a claim that found fewer than
	// BatchSize messages. Defaults to 100ms.
	PollInterval time.Duration
	// Lease is renewed (for this long) when less than half of it is left
	// before a delivery. Defaults to the topic's lease.
	Lease time.Duration
	// Mapper maps a delivery to its route. Defaults to HeaderMapper.
	Mapper Mapper
	// MaxInFlight caps this source's messages between claim and settlement;
	// it claims only what fits. Keep it at most the capacity of the pools
	// its messages go to (max(concurrency×20, 50)), so the router never has
	// to refuse a batch for lack of room. Defaults to BatchSize.
	MaxInFlight int
}

// QueueSource claims messages of a QUEUE topic for the router.
type QueueSource struct {
	cfg         QueueSourceConfig
	lastPoll    atomic.Int64 // unix nanos
	outstanding atomic.Int64 // claimed, not yet settled
	room        chan struct{}
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
	cfg.BatchSize = cmp.Or(cfg.BatchSize, 100)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, 100*time.Millisecond)
	if cfg.Mapper == nil {
		cfg.Mapper = HeaderMapper
	}
	cfg.MaxInFlight = cmp.Or(cfg.MaxInFlight, cfg.BatchSize)
	if cfg.BatchSize < 1 || cfg.MaxInFlight < 1 {
		return nil, fmt.Errorf("%w: BatchSize and MaxInFlight must be at least 1", ErrInvalidConfig)
	}
	return &QueueSource{cfg: cfg, room: make(chan struct{}, 1)}, nil
}

// Name implements Source.
func (s *QueueSource) Name() string { return "queue:" + s.cfg.Topic }

// LastPoll implements Source.
func (s *QueueSource) LastPoll() time.Time {
	n := s.lastPoll.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Run implements Source.
func (s *QueueSource) Run(ctx context.Context, route func(context.Context, []*Message)) error {
	lease := s.cfg.Lease
	if lease == 0 {
		t, err := s.cfg.Client.Topic(ctx, s.cfg.Topic)
		if err != nil {
			return err
		}
		lease = t.Lease
	}
	for ctx.Err() == nil {
		s.lastPoll.Store(time.Now().UnixNano())
		limit := min(int64(s.cfg.BatchSize), int64(s.cfg.MaxInFlight)-s.outstanding.Load())
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
		ds, err := s.cfg.Client.Claim(cctx, s.cfg.Topic, s.cfg.Owner, int(limit))
		cancel()
		if err != nil {
			if !sleep(ctx, s.cfg.PollInterval) {
				return nil
			}
			continue
		}
		batch := make([]*Message, 0, len(ds))
		s.outstanding.Add(int64(len(ds)))
		for _, d := range ds {
			st := &queueSettler{client: s.cfg.Client, d: d, lease: lease, src: s}
			r, err := s.cfg.Mapper(d)
			if err != nil {
				_ = st.DeadLetter(context.WithoutCancel(ctx), err.Error())
				continue
			}
			batch = append(batch, &Message{
				ID: strconv.FormatInt(d.ID, 10), DeliveryID: strconv.FormatInt(d.ID, 10) + "/" + strconv.Itoa(d.Attempt),
				Pool: r.Pool, Target: r.Target, Group: r.Group, HighPriority: r.HighPriority,
				Topic: d.Topic, Payload: d.Payload, Settle: st,
			})
		}
		if len(batch) > 0 {
			route(ctx, batch)
		}
		if int64(len(ds)) < limit && !sleep(ctx, s.cfg.PollInterval) {
			return nil
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// queueSettler settles a QUEUE delivery.
type queueSettler struct {
	client *outbox.Client
	d      *outbox.Delivery
	lease  time.Duration
	src    *QueueSource
}

// done frees the message's place in the source's in-flight budget.
func (q *queueSettler) done() {
	q.src.outstanding.Add(-1)
	select {
	case q.src.room <- struct{}{}:
	default:
	}
}

func (q *queueSettler) Ack(ctx context.Context) error {
	defer q.done()
	return q.client.Ack(ctx, q.d)
}

func (q *queueSettler) Nack(ctx context.Context, until time.Time, attempted bool) error {
	defer q.done()
	if attempted {
		return q.client.RetryAt(ctx, q.d, until, "router: delivery failed")
	}
	return q.client.PostponeUntil(ctx, q.d, until)
}

func (q *queueSettler) DeadLetter(ctx context.Context, reason string) error {
	defer q.done()
	return q.client.DeadLetter(ctx, q.d, "router: "+reason)
}

func (q *queueSettler) Extend(ctx context.Context) error {
	if time.Until(q.d.LeaseUntil) > q.lease/2 {
		return nil
	}
	return q.client.ExtendLease(ctx, q.d, q.lease)
}
