package router

import (
	"cmp"
	"context"
	"fmt"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/consumergroup"
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
	// Client and Topic: the QUEUE topic to deliver. Required.
	Client *outbox.Client
	Topic  string
	// BatchSize is the most messages the source leases at once (a batch
	// of the topic, or retries). Defaults to DefaultSourceBatchSize.
	BatchSize int
	// PollInterval is the longest the source waits before looking for
	// messages when no notification woke it. Defaults to
	// DefaultSourcePollInterval.
	PollInterval time.Duration
	// Mapper maps a delivery to its route. Defaults to HeaderMapper.
	Mapper Mapper
}

// QueueSource delivers the messages of a QUEUE topic through the router.
// It is one of the topic's consumers: a member of the topic's one consumer
// group, which it runs as a GroupSource does (the group keeps the leases
// of what it handed over, and a batch ends once the router settled every
// message of it). The receiver sees a message's own id in X-Message-Id,
// as from any consumer of the topic.
type QueueSource struct {
	cfg   QueueSourceConfig
	group *GroupSource
}

// NewQueueSource returns a source for cfg.Topic.
func NewQueueSource(cfg QueueSourceConfig) (*QueueSource, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("%w: QueueSource needs a Client", ErrInvalidConfig)
	}
	if err := outbox.ValidateTopic(cfg.Topic); err != nil {
		return nil, err
	}
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultSourceBatchSize)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultSourcePollInterval)
	check := cfgcheck.New("QueueSource of " + strconv.Quote(cfg.Topic))
	check.Count("BatchSize", cfg.BatchSize, 1)
	check.Positive("PollInterval", cfg.PollInterval)
	if err := check.Err(); err != nil {
		return nil, err
	}
	// The member's name is its own (host, process and a random part):
	// the group tells its members apart by name.
	g, err := NewGroupSource(GroupSourceConfig{Pool: cfg.Client.Pool(), Mapper: cfg.Mapper, Options: consumergroup.FromBeginning(false),
		Group: consumergroup.Config{Topic: cfg.Topic, Group: sqlq.QueueGroup, Client: cfg.Client,
			BatchSize: cfg.BatchSize, PollInterval: cfg.PollInterval}})
	if err != nil {
		return nil, err
	}
	s := &QueueSource{cfg: cfg, group: g}
	g.queue = s.Name()
	return s, nil
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

// LastPoll implements Source: the group member polls on its own, so it
// reports now while it runs.
func (s *QueueSource) LastPoll() time.Time { return s.group.LastPoll() }

// Instance implements InstanceSource: the status of the member of the
// topic's group that the current (or last) Run started.
func (s *QueueSource) Instance() (consumergroup.Status, bool) { return s.group.Instance() }

var _ ReadySource = (*QueueSource)(nil)

// Run implements Source.
func (s *QueueSource) Run(ctx context.Context, route func(context.Context, []*Message)) error {
	return s.RunReady(ctx, route, func() {})
}

// RunReady implements ReadySource: Run that calls ready once the member
// started. A topic without a configuration is configured with the
// defaults first (see outbox.Client.QueueTopic).
func (s *QueueSource) RunReady(ctx context.Context, route func(context.Context, []*Message), ready func()) error {
	if _, err := s.cfg.Client.QueueTopic(ctx, s.cfg.Topic); err != nil {
		return err
	}
	return s.group.RunReady(ctx, route, ready)
}

// mapRoute runs mapper on d; a panic comes back as a *panicError.
func mapRoute(mapper Mapper, d *outbox.Delivery) (r Route, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicError{value: v, stack: debug.Stack()}
		}
	}()
	return mapper(d)
}
