package pgoutbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/admin"
	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/startstop"
	"github.com/pgoutbox/pgoutbox/maintenance"
	"github.com/pgoutbox/pgoutbox/migrations"
	"github.com/pgoutbox/pgoutbox/outbox"
	"github.com/pgoutbox/pgoutbox/relay"
	"github.com/pgoutbox/pgoutbox/router"
)

// ErrNotMigrated: the client's schema has no pgoutbox tables, or older
// ones than this code needs. Run migrations.Up first.
var ErrNotMigrated = migrations.ErrNotMigrated

// ErrNoConnection: the database cannot be reached or refuses the
// connection. The error names the address, database and user tried.
var ErrNoConnection = migrations.ErrNoConnection

// Config configures a Client. Every component created from the client
// (consumers, consumer groups, routers) takes these settings.
type Config struct {
	// Schema holds pgoutbox's tables (see package migrations). Defaults to
	// "public".
	Schema string
	// Logger receives the logs of the client and its components.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// MeterProvider receives the metrics of the client and its components.
	// Defaults to a no-op provider.
	MeterProvider metric.MeterProvider
	// TracerProvider receives the spans of the client and its components:
	// sends, claims, handler calls and router deliveries, one trace from
	// a send to the receiver's HTTP request (W3C trace context travels in
	// the message's headers). Defaults to recording nothing.
	TracerProvider trace.TracerProvider
	// Clock replaces database time for leases, retries and availability
	// (tests). Defaults to nil: the database's now().
	Clock outbox.Clock
	// Producer tunes the client's Producer (its Schema and Clock are the
	// client's).
	Producer outbox.ProducerConfig
	// ListenDSN, PollOnly and ListenProbeInterval configure the LISTEN
	// connection that wakes consumers and proves the client alive, so that
	// a crashed process's work comes back at once (see outbox.Config):
	// behind a transaction pooler, give it a direct connection.
	ListenDSN           string
	PollOnly            bool
	ListenProbeInterval time.Duration
	// LogInterval is the least time between two log records of one kind
	// for one topic, group or router subject (a handler failure, a dead
	// letter, a retry); the next record counts those left out. Defaults
	// to outbox.DefaultLogInterval (1 minute).
	LogInterval time.Duration
	// Maintenance configures the maintenance service the client runs
	// between Start and Stop (see package maintenance): dead-group
	// detection, cleanup of what every group finished, the retention cap,
	// expiry of dead letters and idempotency keys, deletion of old
	// subscriptions. Its Client is this client's; its zero value is the
	// defaults.
	Maintenance maintenance.Config
	// NoMaintenance runs no maintenance service. Some process of the
	// schema must run one (pgoutbox.Client does, by default), or groups
	// are never declared DEAD without a running instance, and nothing is
	// ever deleted. Defaults to false.
	NoMaintenance bool
}

// Client is a service's one handle on pgoutbox: it carries the settings
// every component needs, sends messages, and starts and stops the
// consumers, consumer groups and routers created from it together.
//
// Create it at boot, after migrations.Up; create components from it; call
// Start; call Stop (or StopAndCancel) at shutdown. A stopped client starts
// again. Each component's own Start and Stop still work.
type Client struct {
	pool     *pgxpool.Pool
	cfg      Config
	outbox   *outbox.Client
	producer *outbox.Producer
	maint    *maintenance.Service // nil with NoMaintenance
	admin    *admin.Admin

	life    startstop.Base
	startMu sync.Mutex // held by Start: a Stop waits for the Start in progress
	mu      sync.Mutex // guards the fields below
	// components in the order they were created; live: between a Start
	// and the beginning of a Stop (a new component starts at once); done
	// ends the run.
	components []*component
	live       bool
	done       func()
}

// component is something the client starts and stops.
type component struct {
	name   string
	last   bool // a router: started after, and stopped before, the others
	start  func(ctx context.Context) error
	stop   func(ctx context.Context, cancel bool) error
	status func() ComponentHealth // from memory; Name is filled in
}

// NewClient returns a client on pool. It fails with ErrNotMigrated when
// cfg.Schema is not migrated to the version this code needs.
func NewClient(ctx context.Context, pool *pgxpool.Pool, cfg Config) (*Client, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", outbox.ErrInvalidConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := migrations.Check(ctx, pool, migrations.Config{Schema: cfg.Schema}); err != nil {
		return nil, err
	}
	oc, err := outbox.NewClient(pool, outbox.Config{Schema: cfg.Schema, Logger: cfg.Logger, MeterProvider: cfg.MeterProvider,
		TracerProvider: cfg.TracerProvider,
		Clock:          cfg.Clock, ListenDSN: cfg.ListenDSN, PollOnly: cfg.PollOnly, ListenProbeInterval: cfg.ListenProbeInterval,
		LogInterval: cfg.LogInterval})
	if err != nil {
		return nil, err
	}
	pcfg := cfg.Producer
	pcfg.Schema, pcfg.Clock = oc.Schema(), cfg.Clock
	if pcfg.TracerProvider == nil {
		pcfg.TracerProvider = cfg.TracerProvider
	}
	if pcfg.MeterProvider == nil { // the producer's pgoutbox.messages.sent
		pcfg.MeterProvider = cfg.MeterProvider
	}
	producer, err := outbox.NewProducer(pcfg)
	if err != nil {
		return nil, err
	}
	cfg.Schema = oc.Schema()
	adm, err := admin.New(oc, admin.Options{})
	if err != nil {
		return nil, err
	}
	c := &Client{pool: pool, cfg: cfg, outbox: oc, producer: producer, admin: adm}
	if cfg.MeterProvider != nil {
		if err := c.observeHealth(cfg.MeterProvider); err != nil {
			return nil, err
		}
	}
	if !cfg.NoMaintenance {
		mcfg := cfg.Maintenance
		mcfg.Client = oc
		if c.maint, err = maintenance.New(pool, mcfg); err != nil {
			return nil, err
		}
		c.components = append(c.components, &component{
			name:   "maintenance",
			start:  c.maint.Start,
			stop:   func(ctx context.Context, _ bool) error { return c.maint.Stop(ctx) },
			status: func() ComponentHealth { return ComponentHealth{Running: c.maint.Running()} },
		})
	}
	return c, nil
}

// Maintenance returns the client's maintenance service (nil with
// NoMaintenance): RunOnce runs every job now.
func (c *Client) Maintenance() *maintenance.Service { return c.maint }

// Admin returns the client's view of every topic and group, by name:
// backlogs, health and lag, pause, resume, cancel and removal of groups,
// dead letters.
func (c *Client) Admin() *admin.Admin { return c.admin }

// Outbox returns the client for topics, dead letters and claims.
func (c *Client) Outbox() *outbox.Client { return c.outbox }

// Producer returns the client's producer.
func (c *Client) Producer() *outbox.Producer { return c.producer }

// Pool returns the client's pool.
func (c *Client) Pool() *pgxpool.Pool { return c.pool }

// Schema returns the schema the client works in.
func (c *Client) Schema() string { return c.cfg.Schema }

// ConfigureTopic creates or replaces a topic's configuration (see
// outbox.Client.ConfigureTopic).
func (c *Client) ConfigureTopic(ctx context.Context, cfg outbox.TopicConfig) error {
	return c.outbox.ConfigureTopic(ctx, cfg)
}

// Send writes msg inside tx, the caller's transaction (see
// outbox.Producer.Send).
func (c *Client) Send(ctx context.Context, tx outbox.Executor, msg outbox.Message) (int64, error) {
	return c.producer.Send(ctx, tx, msg)
}

// SendBatch writes msgs inside tx in one statement (see
// outbox.Producer.SendBatch).
func (c *Client) SendBatch(ctx context.Context, tx outbox.Executor, msgs []outbox.Message) ([]int64, error) {
	return c.producer.SendBatch(ctx, tx, msgs)
}

// NewConsumer returns a consumer of a QUEUE topic that starts and stops
// with the client. It fails with outbox.ErrWrongSemantics for a PUB_SUB
// topic (use NewGroup) and outbox.ErrInvalidConfig for a bad cfg.
func (c *Client) NewConsumer(ctx context.Context, cfg outbox.ConsumerConfig) (*Consumer, error) {
	k, err := c.newConsumer(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return k, c.add(&component{
		name:   "consumer of " + cfg.Topic,
		status: func() ComponentHealth { return instanceHealth(k.group.Status()) },
		start:  k.Start,
		stop: func(ctx context.Context, cancel bool) error {
			if cancel {
				return k.StopAndCancel(ctx)
			}
			return k.Stop(ctx)
		},
	})
}

// NewGroup returns an instance of a consumer group that starts (with opts)
// and stops with the client. Its schema, logger, meter provider and clock
// are the client's. Add its members before the client starts.
func (c *Client) NewGroup(cfg consumergroup.Config, opts consumergroup.SubscriptionOptions) (*consumergroup.Group, error) {
	cfg.Client = c.outbox
	g, err := consumergroup.New(c.pool, cfg)
	if err != nil {
		return nil, err
	}
	return g, c.add(&component{
		name:   "consumer group " + cfg.Group + " of " + cfg.Topic,
		status: func() ComponentHealth { return instanceHealth(g.Status()) },
		start:  func(ctx context.Context) error { return g.Start(ctx, opts) },
		stop: func(ctx context.Context, cancel bool) error {
			if cancel {
				return g.StopAndCancel(ctx)
			}
			return g.Stop(ctx)
		},
	})
}

// NewRelay returns a relay instance (see package relay) that starts (with
// opts) and stops with the client. Its consumer group's schema, logger,
// meter provider and clock are the client's.
func (c *Client) NewRelay(cfg relay.Config, opts consumergroup.SubscriptionOptions) (*relay.Relay, error) {
	cfg.Consumer.Client = c.outbox
	r, err := relay.New(c.pool, cfg)
	if err != nil {
		return nil, err
	}
	return r, c.add(&component{
		name:   "relay of " + cfg.Consumer.Topic,
		status: func() ComponentHealth { return instanceHealth(r.Group().Status()) },
		start:  func(ctx context.Context) error { return r.Start(ctx, opts) },
		stop:   func(ctx context.Context, _ bool) error { return r.Stop(ctx) },
	})
}

// NewRouter returns a router that starts and stops with the client (after
// and before the client's consumers and groups). Its logger and meter
// provider, and its LogInterval, are the client's unless cfg sets them. Give it sources that use
// the client: router.QueueSourceConfig{Client: c.Outbox()} and
// router.GroupSourceConfig{Pool: c.Pool(), Group: consumergroup.Config{Client: c.Outbox()}}.
// With Standby, it delivers only while it leads its name among the
// processes that run a router of that name.
func (c *Client) NewRouter(cfg router.Config, opts ...RouterOption) (*router.Router, error) {
	if cfg.Logger == nil {
		cfg.Logger = c.cfg.Logger
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = c.cfg.MeterProvider
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = c.cfg.TracerProvider
	}
	if cfg.LogInterval == 0 {
		cfg.LogInterval = c.outbox.LogInterval()
	}
	var o routerOptions
	for _, opt := range opts {
		opt(&o)
	}
	rt, err := router.New(cfg)
	if err != nil {
		return nil, err
	}
	comp := &component{
		name:   "router",
		last:   true,
		status: func() ComponentHealth { return ComponentHealth{Running: rt.Running(), Sources: rt.Sources()} },
		start:  rt.Start,
		stop:   func(ctx context.Context, cancel bool) error { return stopRouter(ctx, rt, cancel) },
	}
	if o.standby != "" {
		if err := c.standby(comp, rt, o, cfg.Logger); err != nil {
			return nil, err
		}
	}
	return rt, c.add(comp)
}

// stopRouter stops rt; with cancel its in-flight calls are abandoned and
// their messages nacked.
func stopRouter(ctx context.Context, rt *router.Router, cancel bool) error {
	if cancel {
		done, end := context.WithCancel(ctx)
		end()
		return rt.Stop(done)
	}
	return rt.Stop(ctx)
}

// add registers a component; one created while the client runs starts at
// once.
func (c *Client) add(comp *component) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.components = append(c.components, comp)
	if c.live {
		return comp.Start(context.Background())
	}
	return nil
}

// Start implements startstop.Service: it starts the component, and
// accepts one that started on its own.
func (comp *component) Start(ctx context.Context) error {
	err := comp.start(ctx)
	if errors.Is(err, outbox.ErrAlreadyStarted) {
		return nil // started on its own
	}
	if err != nil {
		return fmt.Errorf("pgoutbox: start %s: %w", comp.name, err)
	}
	return nil
}

// Stop implements startstop.Service.
func (comp *component) Stop(ctx context.Context) error { return comp.stop(ctx, false) }

// ordered returns comps with the routers last.
func ordered(comps []*component) []startstop.Service {
	out := make([]startstop.Service, 0, len(comps))
	for _, last := range []bool{false, true} {
		for _, comp := range comps {
			if comp.last == last {
				out = append(out, comp)
			}
		}
	}
	return out
}

// Start starts every component created from the client (consumers and
// groups, then routers) and returns once they run; components created
// later start when they are created. Groups, and routers' group sources,
// are subscribed when Start returns: every message committed after it
// reaches them (Start waits for the producer transactions of their topics
// that are open when it is called). ctx bounds only the start-up. If a
// component fails to start, Start stops the ones it started and returns
// the error. Start on a running client fails with
// outbox.ErrAlreadyStarted; a stopped client starts again.
func (c *Client) Start(ctx context.Context) error {
	run, done, err := c.life.StartInit(ctx, "client")
	if err != nil {
		return err
	}
	c.startMu.Lock()
	defer c.startMu.Unlock()
	c.mu.Lock()
	comps := slices.Clone(c.components)
	c.mu.Unlock()
	if err := startstop.StartAll(ctx, ordered(comps)...); err != nil {
		c.life.StopInit()
		done()
		return err
	}
	c.mu.Lock()
	// Components created while the others started start now.
	var err2 error
	for _, comp := range c.components[len(comps):] {
		if err2 = comp.Start(ctx); err2 != nil {
			break
		}
	}
	c.live, c.done = err2 == nil && run.Err() == nil, done
	all := slices.Clone(c.components)
	c.mu.Unlock()
	if !c.live { // a component failed, or a Stop came in meanwhile: it waits for this
		_ = c.stopAll(context.WithoutCancel(ctx), all, false)
		c.life.StopInit()
		done()
		if err2 != nil {
			return err2
		}
		return fmt.Errorf("pgoutbox: client stopped while starting: %w", context.Cause(run))
	}
	c.cfg.Logger.Info("pgoutbox: client started", slog.Int("components", len(all)))
	return nil
}

// Stop stops every component: first the routers (they stop claiming, let
// the calls in flight finish and nack what they still hold), then the
// consumers and groups at once (they stop claiming, wait for running
// handlers and record what finished). Once the last consumer is gone the
// shared LISTEN connection closes. When ctx ends first, running handlers
// are cancelled and Stop returns ctx's error once the components are
// stopped or have given up on handlers that ignore their context. Stop is
// idempotent, and a Start in progress finishes first.
func (c *Client) Stop(ctx context.Context) error { return c.stop(ctx, false) }

// StopAndCancel is Stop that cancels running handlers and HTTP calls at
// once instead of waiting for them.
func (c *Client) StopAndCancel(ctx context.Context) error { return c.stop(ctx, true) }

// Stopped returns a channel closed once the client's current run stopped
// (between runs, the last run's; before Start, the first run's).
func (c *Client) Stopped() <-chan struct{} { return c.life.Stopped() }

func (c *Client) stop(ctx context.Context, cancel bool) error {
	stopped, ok := c.life.StopInit()
	if !ok {
		return nil
	}
	c.startMu.Lock()
	c.mu.Lock()
	first, done, comps := c.live, c.done, slices.Clone(c.components)
	c.live = false
	c.mu.Unlock()
	c.startMu.Unlock()
	if !first { // another Stop is under way
		return startstop.Wait(ctx, stopped)
	}
	err := c.stopAll(ctx, comps, cancel)
	c.cfg.Logger.Info("pgoutbox: client stopped")
	done()
	return err
}

// stopAll stops comps: routers first, then the others at once.
func (c *Client) stopAll(ctx context.Context, comps []*component, cancel bool) error {
	var errs []error
	for _, last := range []bool{true, false} {
		var mu sync.Mutex
		var tasks startstop.Tasks
		for _, comp := range comps {
			if comp.last != last {
				continue
			}
			tasks.Go(func() {
				if err := comp.stop(ctx, cancel); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("pgoutbox: stop %s: %w", comp.name, err))
					mu.Unlock()
				}
			})
		}
		tasks.Wait()
	}
	return errors.Join(errs...)
}
