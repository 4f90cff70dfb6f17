package router

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// GroupSourceConfig configures a GroupSource.
type GroupSourceConfig struct {
	// Pool and Group configure the consumer group instance the source runs
	// (a new one each time the source starts). Required.
	Pool  *pgxpool.Pool
	Group consumergroup.Config
	// Options apply when the subscription is created. Defaults to FromNow.
	Options consumergroup.SubscriptionOptions
	// Mapper maps a delivery to its route. Defaults to HeaderMapper.
	Mapper Mapper
}

// GroupSource feeds the router from a consumer group on a PUB_SUB topic.
// Each group batch (in commit order) becomes one router batch; the group's
// batch completes once the router settled every message of it. Router
// nacks become group retries, dead letters group dead letters. The group's
// lease must cover a batch's delivery time (it is not extended).
type GroupSource struct {
	cfg     GroupSourceConfig
	running atomic.Bool
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
	return &GroupSource{cfg: cfg}, nil
}

// Name implements Source.
func (s *GroupSource) Name() string { return "group:" + s.cfg.Group.Topic + "/" + s.cfg.Group.Group }

// LastPoll implements Source: a running group instance polls on its own
// (and its heartbeats say it is alive), so it reports now while running.
func (s *GroupSource) LastPoll() time.Time {
	if s.running.Load() {
		return time.Now()
	}
	return time.Time{}
}

// Run implements Source: it starts a group instance and stops it when ctx ends.
func (s *GroupSource) Run(ctx context.Context, route func(context.Context, []*Message)) error {
	g, err := consumergroup.New(s.cfg.Pool, s.cfg.Group)
	if err != nil {
		return err
	}
	if err := g.SetBatchHandler(func(bctx context.Context, ds []*outbox.Delivery) []error {
		return s.handle(bctx, route, ds)
	}); err != nil {
		return err
	}
	if err := g.Start(ctx, s.cfg.Options); err != nil {
		return err
	}
	s.running.Store(true)
	<-ctx.Done()
	s.running.Store(false)
	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return g.Stop(stopCtx)
}

// handle routes one group batch and waits until every message is settled.
func (s *GroupSource) handle(ctx context.Context, route func(context.Context, []*Message), ds []*outbox.Delivery) []error {
	results := make([]error, len(ds))
	var wg sync.WaitGroup
	batch := make([]*Message, 0, len(ds))
	for i, d := range ds {
		r, err := s.cfg.Mapper(d)
		if err != nil {
			results[i] = outbox.Permanent(err)
			continue
		}
		wg.Add(1)
		st := &groupSettler{result: &results[i], wg: &wg}
		batch = append(batch, &Message{
			ID: strconv.FormatInt(d.ID, 10), DeliveryID: s.Name() + "/" + strconv.FormatInt(d.ID, 10) + "/" + strconv.Itoa(d.Attempt),
			Pool: r.Pool, Target: r.Target, Group: r.Group, HighPriority: r.HighPriority,
			Topic: d.Topic, Payload: d.Payload, Settle: st,
		})
	}
	if len(batch) > 0 {
		route(ctx, batch)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done(): // lease running out or stopping: unsettled messages are retried by the group
		<-done // the router settles everything before it stops
	}
	return results
}

var errNacked = errors.New("router: nacked")

// groupSettler turns the router's settlement into a group handler result.
type groupSettler struct {
	once   sync.Once
	result *error
	wg     *sync.WaitGroup
}

func (g *groupSettler) set(err error) {
	g.once.Do(func() { *g.result = err; g.wg.Done() })
}

func (g *groupSettler) Ack(context.Context) error { g.set(nil); return nil }

func (g *groupSettler) Nack(_ context.Context, r Retry) error {
	g.set(outbox.RetryAfter(max(time.Until(r.At), 0), errNacked))
	return nil
}

func (g *groupSettler) DeadLetter(_ context.Context, reason string) error {
	g.set(outbox.Permanent(errors.New(reason)))
	return nil
}

func (g *groupSettler) Extend(context.Context) error { return nil }
