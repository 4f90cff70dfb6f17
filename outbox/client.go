package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/internal/ident"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/internal/tracing"
)

// Clock tells the time. pgoutbox uses database time (now()) unless a Clock
// is configured; tests inject one to move time without sleeping.
type Clock interface {
	Now() time.Time
}

// Config configures a Client.
type Config struct {
	// Schema holds pgoutbox's tables (see package migrations).
	// Defaults to "public".
	Schema string
	// Logger receives pgoutbox's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// MeterProvider receives pgoutbox's metrics. Defaults to a no-op provider.
	MeterProvider metric.MeterProvider
	// TracerProvider receives the spans of claims and handler calls
	// ("receive {topic}", "process {topic}", OpenTelemetry messaging
	// conventions); a handler's span is a child of the trace context its
	// message carries from the send. Defaults to recording nothing.
	TracerProvider trace.TracerProvider
	// Clock replaces database time for leases, retries and availability.
	// Defaults to nil: the database's now(), which every instance agrees on.
	Clock Clock
	// ListenDSN is the connection string of the dedicated LISTEN connection
	// that wakes consumers: a direct connection to PostgreSQL, or a
	// session-mode pool. Set it when the pool goes through a transaction
	// pooler (PgBouncer in transaction mode), where LISTEN receives
	// nothing. Defaults to the pool's connection settings.
	//
	// A second connection made the same way is the client's proof of
	// life while it runs consumer group instances: its session holds a
	// session advisory lock, and the instances are recorded with it (see
	// LiveInstance). When the session ends (the process died, its
	// connection was cut, its host vanished: the session sets TCP
	// keepalives so that the server notices within KeepaliveBound), the
	// clients still running take the instances' leases back at once
	// instead of waiting for them to run out. Through a transaction
	// pooler the connection has no session of its own; the client
	// notices, logs it, and its instances' work comes back when its lease
	// ends.
	ListenDSN string
	// PollOnly opens no LISTEN connection: consumers find new messages by
	// polling, within their PollInterval (default 1 s) instead of about a
	// millisecond, and the work of a crashed process comes back when its
	// lease ends (the client has no session to prove it alive). Logged
	// once. Defaults to false.
	PollOnly bool
	// ListenProbeInterval is how often the LISTEN connection is checked
	// with a notification of its own, sent through the pool like a
	// producer's: one that receives nothing is logged as an error (and its
	// recovery as info). Negative disables the check. Defaults to
	// DefaultListenProbeInterval.
	ListenProbeInterval time.Duration
	// LogInterval is the least time between two log records of one kind
	// (a handler failure, a dead letter, a panic) for one topic or group:
	// the next record says how many were left out. Consumers and groups
	// created from the client use it. Defaults to DefaultLogInterval.
	LogInterval time.Duration
}

// DefaultLogInterval is the least time between two log records of one kind
// for one topic or group.
const DefaultLogInterval = time.Minute

// DefaultListenProbeInterval is how often the LISTEN connection is checked.
const DefaultListenProbeInterval = time.Minute

// Client is the entry point for everything that needs a connection pool:
// topic configuration, consumers and dead-letter administration. It is safe
// for concurrent use and holds nothing that needs closing; consumers it
// creates are stopped with their own Stop.
type Client struct {
	pool          *pgxpool.Pool
	listen        *pgx.ConnConfig // the LISTEN connection's settings; nil: PollOnly
	probeInterval time.Duration
	logInterval   time.Duration
	mp            metric.MeterProvider
	tp            trace.TracerProvider
	tracer        *tracing.Tracer
	schema        string
	sql           *sqlq.Outbox
	logger        *slog.Logger
	metrics       *metrics
	clock         Clock
	wake          wakeups   // the shared LISTEN connection
	live          *liveness // the client's proof of life; nil without a LISTEN connection

	hbMu    sync.Mutex
	hbPool  *pgxpool.Pool // see HeartbeatPool; nil while no one uses it
	hbUsers int
}

// NewClient returns a client using pool and the tables in cfg.Schema.
func NewClient(pool *pgxpool.Pool, cfg Config) (*Client, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	cfg.LogInterval = cmp.Or(cfg.LogInterval, DefaultLogInterval)
	if cfg.LogInterval < 0 {
		return nil, fmt.Errorf("%w: client: LogInterval is negative (%v)", ErrInvalidConfig, cfg.LogInterval)
	}
	schema, err := ident.Schema(cfg.Schema)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	var listen *pgx.ConnConfig
	switch {
	case cfg.PollOnly:
		logger.Info("pgoutbox: no LISTEN connection (PollOnly): consumers find new messages by polling, within their PollInterval, and the work of a crashed process comes back when its lease ends")
	case cfg.ListenDSN != "":
		if listen, err = pgx.ParseConfig(cfg.ListenDSN); err != nil {
			return nil, fmt.Errorf("%w: ListenDSN: %v", ErrInvalidConfig, err)
		}
	default:
		listen = pool.Config().ConnConfig
	}
	probe := cfg.ListenProbeInterval
	if probe == 0 {
		probe = DefaultListenProbeInterval
	}
	c := &Client{
		pool:          pool,
		listen:        listen,
		probeInterval: max(probe, 0),
		logInterval:   cfg.LogInterval,
		mp:            cfg.MeterProvider,
		tp:            cfg.TracerProvider,
		tracer:        tracing.New(cfg.TracerProvider),
		schema:        schema,
		sql:           sqlq.For(schema),
		logger:        logger,
		metrics:       newMetrics(cfg.MeterProvider),
		clock:         cfg.Clock,
	}
	if listen != nil {
		c.live = newLiveness(c)
	}
	return c, nil
}

// heartbeatConns is the size of the pool HeartbeatPool shares.
const heartbeatConns = 4

// HeartbeatPool returns the pool that the consumer group instances on the
// client's pool share for their heartbeats, lease renewals and liveness
// work, so that a busy main pool cannot delay them: up to 4 connections,
// opened from the main pool's configuration when the first instance
// starts. Each caller calls release once when it stops using the pool;
// the last release closes it. Package consumergroup calls it; a program
// rarely needs to.
func (c *Client) HeartbeatPool() (pool *pgxpool.Pool, release func(), err error) {
	c.hbMu.Lock()
	defer c.hbMu.Unlock()
	if c.hbPool == nil {
		pc := c.pool.Config().Copy()
		pc.MaxConns, pc.MinConns = heartbeatConns, 0
		p, err := pgxpool.NewWithConfig(context.Background(), pc)
		if err != nil {
			return nil, nil, fmt.Errorf("outbox: heartbeat pool: %w", err)
		}
		c.hbPool = p
	}
	c.hbUsers++
	p := c.hbPool
	var once sync.Once
	return p, func() {
		once.Do(func() {
			c.hbMu.Lock()
			defer c.hbMu.Unlock()
			if c.hbUsers--; c.hbUsers == 0 {
				c.hbPool.Close()
				c.hbPool = nil
			}
		})
	}, nil
}

// Schema returns the schema the client works in.
func (c *Client) Schema() string { return c.schema }

// now is the time parameter of SQL statements: nil means database time.
func (c *Client) now() *time.Time {
	if c.clock == nil {
		return nil
	}
	t := c.clock.Now()
	return &t
}

// ConfigureTopic creates or replaces a topic's configuration. Zero fields
// take the defaults (TopicConfig.WithDefaults). Messages already written
// keep flowing; consumers pick the new settings up within a poll interval.
//
// A topic's semantics are fixed by its first configuration: producers
// write a configured QUEUE topic's messages without reading its
// configuration again, so changing Queue to PubSub (or back) fails with
// ErrInvalidConfig.
//
// A PUB_SUB topic's tracking mode is set by its configuration while the
// topic has no group subscribed and no message stored. Once it has, the
// mode changes only by ChangeTrackingMode, an operation of its own: a
// ConfigureTopic naming another mode keeps the topic's (and logs a
// warning), so the releases of a service that a rolling deploy runs side
// by side never change it back and forth.
//
// ConfigureTopic waits for the topic's producer transactions and
// subscription changes in flight, and for the open transactions that sent
// to the topic before its first configuration (so do not configure a
// topic from a goroutine whose own transaction sent to it and is still
// open). Configure topics before sending to them: a send to a topic that
// was never configured fails with ErrUnknownTopic (unless the producer
// allows unconfigured topics: then it reads the topic table every time).
func (c *Client) ConfigureTopic(ctx context.Context, cfg TopicConfig) error {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	var tracking *string
	if cfg.Tracking != "" {
		s := string(cfg.Tracking)
		tracking = &s
	}
	var orderedDeadLetters *string
	if cfg.OrderedDeadLetters != "" {
		s := string(cfg.OrderedDeadLetters)
		orderedDeadLetters = &s
	}
	var tag pgconn.CommandTag
	var kept TrackingMode // a topic in use keeps its mode
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, c.sql.LockTopic, pgx.StrictNamedArgs{"topic": cfg.Name}); err != nil {
			return err
		}
		if cfg.Semantics == PubSub {
			var current string
			var inUse bool
			err := tx.QueryRow(ctx, c.sql.TrackingInUse, pgx.StrictNamedArgs{"topic": cfg.Name}).Scan(&current, &inUse)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			if inUse && current != "" && current != string(cfg.Tracking) {
				kept, tracking = TrackingMode(current), &current
			}
		}
		var err error
		tag, err = tx.Exec(ctx, c.sql.UpsertTopic, pgx.StrictNamedArgs{
			"topic":                              cfg.Name,
			"semantics":                          string(cfg.Semantics),
			"tracking_mode":                      tracking,
			"retention_us":                       cfg.Retention.Microseconds(),
			"max_attempts":                       cfg.MaxAttempts,
			"backoff_initial_us":                 cfg.BackoffInitial.Microseconds(),
			"backoff_max_us":                     cfg.BackoffMax.Microseconds(),
			"lease_duration_us":                  cfg.Lease.Microseconds(),
			"zero_subscription_retention_us":     cfg.ZeroSubscriptionRetention.Microseconds(),
			"block_writes_on_zero_subscriptions": cfg.BlockWritesOnZeroSubscriptions,
			"idempotency_window_us":              cfg.IdempotencyWindow.Microseconds(),
			"max_retention_us":                   cfg.MaxRetention.Microseconds(),
			"zombie_ttl_us":                      cfg.ZombieTTL.Microseconds(),
			"ordered":                            cfg.Ordered,
			"ordered_dead_letters":               orderedDeadLetters,
		})
		if err != nil || cfg.Semantics != Queue {
			return err
		}
		// A QUEUE topic's messages live on the log, read by its one group.
		_, err = tx.Exec(ctx, c.sql.QueueOnLog, pgx.StrictNamedArgs{"topic": cfg.Name,
			"heartbeat_timeout_us": queueGroupHeartbeatTimeout.Microseconds()})
		return err
	})
	if err != nil {
		return fmt.Errorf("outbox: configure topic %q: %w", cfg.Name, err)
	}
	if tag.RowsAffected() == 0 {
		current, err := c.loadTopic(ctx, c.pool, cfg.Name)
		if err == nil && current.Semantics != cfg.Semantics {
			return fmt.Errorf("%w: topic %q is a %s topic; a topic's semantics never change once configured", ErrInvalidConfig, cfg.Name, current.Semantics)
		}
		if err == nil && current.Ordered != cfg.Ordered {
			return fmt.Errorf("%w: topic %q: whether a topic is ordered never changes once configured (it is %s)",
				ErrInvalidConfig, cfg.Name, map[bool]string{true: "ordered", false: "not ordered"}[current.Ordered])
		}
		return fmt.Errorf("%w: topic %q cannot take this configuration", ErrInvalidConfig, cfg.Name)
	}
	if kept != "" {
		c.logger.Warn("pgoutbox: the topic's tracking mode is not the configured one; it keeps its own (change it with ChangeTrackingMode or pgoutbox mode migrate)",
			slog.String("topic", cfg.Name), slog.String("mode", string(kept)), slog.String("configured", string(cfg.Tracking)))
	}
	return nil
}

// ChangeTrackingMode changes a PUB_SUB topic's tracking mode with its
// groups and producers running; nothing is lost or delivered twice. It
// waits for the topic's producer transactions in flight: their messages
// keep the old mode's completion record, and every later one carries the
// new mode's. Until cleanup has deleted the last message written under
// an earlier mode (TopicConfig.ModeChanging), groups and cleanup read each
// message's own record, which costs up to two statements more per
// completed batch, and a dedupe row per group for each message written in
// Offset mode; running group instances pick the change up at their next
// look. A change to Bitmap gives every group a bit, and fails with
// ErrTooManyGroups (changing nothing) when more than 64 need one: a Bitmap
// topic that reaches 64 groups moves to Counter this way instead of being
// rebuilt. An unknown topic fails with ErrNotFound, a QUEUE topic with
// ErrWrongSemantics. Configure the topic with the new mode in your
// services too: until then ConfigureTopic logs a warning (and keeps it).
func (c *Client) ChangeTrackingMode(ctx context.Context, topic string, mode TrackingMode) error {
	if err := ValidateTopic(topic); err != nil {
		return err
	}
	if !mode.known() {
		return fmt.Errorf("%w: unknown tracking mode %q", ErrInvalidConfig, mode)
	}
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		// Like a change of the subscribed set: the topic's lock, waiting
		// for its producers, then its row, so that a producer statement
		// that waited re-reads it (see sqlq.insertPublished).
		if _, err := tx.Exec(ctx, c.sql.LockTopic, pgx.StrictNamedArgs{"topic": topic}); err != nil {
			return err
		}
		var semantics, current string
		err := tx.QueryRow(ctx, c.sql.LockTopicRow, pgx.StrictNamedArgs{"topic": topic}).Scan(&semantics, &current)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("%w: topic %q", ErrNotFound, topic)
		case err != nil:
			return err
		case Semantics(semantics) != PubSub:
			return fmt.Errorf("%w: %q is a %s topic; it has no tracking mode", ErrWrongSemantics, topic, semantics)
		case current == string(mode):
			return nil
		}
		if mode == Bitmap {
			var short int64
			if err := tx.QueryRow(ctx, c.sql.AssignBits, pgx.StrictNamedArgs{"topic": topic}).Scan(&short); err != nil {
				return err
			}
			if short > 0 {
				return fmt.Errorf("%w: %d more groups than free bits; choose Counter or Offset", ErrTooManyGroups, short)
			}
			if _, err := tx.Exec(ctx, c.sql.ResetSubscribedBits, pgx.StrictNamedArgs{"topic": topic}); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, c.sql.ChangeTracking, pgx.StrictNamedArgs{"topic": topic, "tracking_mode": string(mode)})
		return err
	})
	if err != nil {
		return fmt.Errorf("outbox: change tracking mode of %q: %w", topic, err)
	}
	return nil
}

// queueGroupHeartbeatTimeout is the heartbeat timeout a QUEUE topic's
// group is created with (its consumers set their own; it never becomes
// DEAD, whatever it is).
const queueGroupHeartbeatTimeout = 5 * time.Minute

// LoadTopic is Topic for a topic name read with db (a pool or a transaction).
func (c *Client) LoadTopic(ctx context.Context, db QueryRower, name string) (TopicConfig, error) {
	if err := ValidateTopic(name); err != nil {
		return TopicConfig{}, err
	}
	return c.loadTopic(ctx, db, name)
}

// SessionConfig returns the settings of a connection of the client's own
// beside its pool, as its LISTEN connection is made (Config.ListenDSN, or
// the pool's settings): a copy, or nil with PollOnly. A standby router
// holds its leadership on such a connection.
func (c *Client) SessionConfig() *pgx.ConnConfig {
	if c.listen == nil {
		return nil
	}
	return c.listen.Copy()
}

// Pool returns the client's pool.
func (c *Client) Pool() *pgxpool.Pool { return c.pool }

// TracerProvider returns the client's tracer provider (nil: none configured).
func (c *Client) TracerProvider() trace.TracerProvider { return c.tp }

// MeterProvider returns the client's meter provider (nil: none configured).
func (c *Client) MeterProvider() metric.MeterProvider { return c.mp }

// Logger returns the client's logger.
func (c *Client) Logger() *slog.Logger { return c.logger }

// LogInterval returns the client's Config.LogInterval.
func (c *Client) LogInterval() time.Duration { return c.logInterval }

// Now returns the configured clock's time, or nil for database time: the
// value pgoutbox binds as the "now" of its statements.
func (c *Client) Now() *time.Time { return c.now() }

// Topic returns a topic's configuration; for a topic never configured it
// returns the QUEUE defaults with Configured false.
func (c *Client) Topic(ctx context.Context, name string) (TopicConfig, error) {
	if err := ValidateTopic(name); err != nil {
		return TopicConfig{}, err
	}
	return c.loadTopic(ctx, c.pool, name)
}

// QueueTopic returns the configuration of QUEUE topic name, whose
// consumers are the members of its one consumer group. A topic without a
// configuration is configured with the defaults first, and one configured
// by an earlier release is moved onto the log (its group made). It fails
// with ErrWrongSemantics for a PUB_SUB topic.
func (c *Client) QueueTopic(ctx context.Context, name string) (TopicConfig, error) {
	t, err := c.Topic(ctx, name)
	if err != nil {
		return t, err
	}
	if t.Semantics != Queue {
		return t, fmt.Errorf("%w: %q is a %s topic; use a consumer group", ErrWrongSemantics, name, t.Semantics)
	}
	if t.Configured && t.Tracking != "" {
		return t, nil
	}
	if err := c.ConfigureTopic(ctx, t); err != nil {
		return t, err
	}
	return c.Topic(ctx, name)
}

// QueryRower is what reading one row needs: pgx.Tx, *pgxpool.Pool, *pgx.Conn.
type QueryRower interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (c *Client) loadTopic(ctx context.Context, db QueryRower, name string) (TopicConfig, error) {
	var (
		semantics, tracking                            string
		retention, backoffInitial, backoffMax, leaseUS int64
		zeroRetention, idempotencyWindow               int64
		maxRetention, zombieTTL                        int64
		maxAttempts                                    int
		block, ordered, modeChanging                   bool
		orderedDeadLetters                             string
	)
	err := db.QueryRow(ctx, c.sql.SelectTopic, pgx.StrictNamedArgs{"topic": name}).Scan(&semantics, &tracking, &retention, &maxAttempts,
		&backoffInitial, &backoffMax, &leaseUS, &zeroRetention, &block, &idempotencyWindow, &maxRetention, &zombieTTL,
		&ordered, &orderedDeadLetters, &modeChanging)
	if errors.Is(err, pgx.ErrNoRows) {
		return TopicConfig{Name: name}.WithDefaults(), nil
	}
	if err != nil {
		return TopicConfig{}, fmt.Errorf("outbox: load topic %q: %w", name, err)
	}
	return TopicConfig{
		Name:           name,
		Semantics:      Semantics(semantics),
		Tracking:       TrackingMode(tracking),
		Retention:      time.Duration(retention) * time.Microsecond,
		MaxAttempts:    maxAttempts,
		BackoffInitial: time.Duration(backoffInitial) * time.Microsecond,
		BackoffMax:     time.Duration(backoffMax) * time.Microsecond,
		Lease:          time.Duration(leaseUS) * time.Microsecond,

		ZeroSubscriptionRetention:      time.Duration(zeroRetention) * time.Microsecond,
		BlockWritesOnZeroSubscriptions: block,
		IdempotencyWindow:              time.Duration(idempotencyWindow) * time.Microsecond,
		MaxRetention:                   time.Duration(maxRetention) * time.Microsecond,
		ZombieTTL:                      time.Duration(zombieTTL) * time.Microsecond,
		Ordered:                        ordered,
		OrderedDeadLetters:             DeadLetterPolicy(orderedDeadLetters),
		Configured:                     true,
		ModeChanging:                   modeChanging,
	}, nil
}
