package router

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/internal/cfgcheck"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Errors. Bad configuration and refused targets wrap one of these.
var (
	// ErrInvalidConfig: a configuration value is out of range. It is
	// outbox.ErrInvalidConfig: errors.Is matches either.
	ErrInvalidConfig = outbox.ErrInvalidConfig
	// ErrTargetNotAllowed: a message's target host is not on the allow-list.
	ErrTargetNotAllowed = errors.New("router: target host not allowed")
	// ErrInvalidTarget: a message's target is not an absolute http(s) URL.
	ErrInvalidTarget = errors.New("router: invalid target URL")
	// ErrConfigUnavailable: the configuration source failed every start-up attempt.
	ErrConfigUnavailable = errors.New("router: configuration unavailable")
	// ErrStarted: Start on a router that already started. It is
	// outbox.ErrAlreadyStarted: errors.Is matches either.
	ErrStarted = outbox.ErrAlreadyStarted
	// ErrInvalidAllowedHost: an AllowedHosts entry that can never match a
	// target's host (a URL, a path, spaces). It comes wrapped with
	// ErrInvalidConfig.
	ErrInvalidAllowedHost = errors.New("router: allow-list entry is not a host or host:port")
	// ErrUnknownSource: RemoveSource of a source the router does not run.
	// It matches outbox.ErrNotFound too.
	ErrUnknownSource = cfgcheck.NotFound("router: unknown source")
)

// Pool and routing defaults: the values Config's zero fields take.
const (
	// DefaultPoolCode names the pool of messages whose pool is unknown.
	DefaultPoolCode = "DEFAULT-POOL"
	// DefaultPoolConcurrency is DEFAULT-POOL's concurrency when it is not
	// configured.
	DefaultPoolConcurrency = 20
	// DefaultGroup is sent as X-Message-Group for messages without a group.
	DefaultGroup = "__DEFAULT__"
	// QueueCapacityMultiplier and MinQueueCapacity size a pool's buffer:
	// max(concurrency×QueueCapacityMultiplier, MinQueueCapacity).
	QueueCapacityMultiplier = 20
	MinQueueCapacity        = 50
	// DefaultIdleTimeout is IdleTimeout's default.
	//
	// Deprecated: IdleTimeout is ignored.
	DefaultIdleTimeout = 5 * time.Minute
	// DefaultRetryDelay is the nack delay of a message refused before
	// delivery (its pool was full, it duplicates a delivery in flight),
	// and of a failed delivery only when neither the receiver nor the
	// message names one: failed deliveries from QueueSource and
	// GroupSource wait their topic's backoff.
	DefaultRetryDelay = 30 * time.Second
	// DefaultFastFailDelay is the nack delay of the messages behind a
	// failed one of their batch and group.
	DefaultFastFailDelay = 10 * time.Second
	// MinDelay and MaxDelay bound every nack delay.
	MinDelay = time.Second
	MaxDelay = 12 * time.Hour
	// DefaultMaxAttempts is how often one delivery calls the receiver for
	// retryable errors (1 s, then 2 s apart) before the message is nacked.
	DefaultMaxAttempts = 3
	// DefaultConnectTimeout and DefaultRequestTimeout bound each HTTP
	// attempt's connection and whole call.
	DefaultConnectTimeout = 30 * time.Second
	DefaultRequestTimeout = 15 * time.Minute
	// DefaultSyncInterval is how often a ConfigSource is polled.
	DefaultSyncInterval = 5 * time.Minute
	// DefaultStartupAttempts and DefaultStartupRetryDelay: how often, and
	// how far apart, Start tries a ConfigSource before it fails.
	DefaultStartupAttempts   = 12
	DefaultStartupRetryDelay = 5 * time.Second
	// DefaultMaxPools refuses pools beyond it; DefaultPoolWarnThreshold
	// warns from that many pools on.
	DefaultMaxPools          = 10_000
	DefaultPoolWarnThreshold = 5_000
	// DefaultHealthInterval is how often sources are checked;
	// DefaultStallTimeout how long one may go without polling before it
	// is restarted.
	DefaultHealthInterval = 60 * time.Second
	DefaultStallTimeout   = 60 * time.Second
	// DefaultLeakCheckInterval is how often the in-flight map is checked.
	DefaultLeakCheckInterval = 30 * time.Second
	// DefaultRateLimitPollEvery is how often a rate-limited worker tries again.
	DefaultRateLimitPollEvery = 100 * time.Millisecond
	// DefaultCleanupInterval is how often expired holds and drained pools
	// are dropped.
	DefaultCleanupInterval = 10 * time.Second
	// DefaultGroupShare is the part of a pool one message group may hold.
	DefaultGroupShare = 0.5
	// DefaultLogInterval is the least time between two log records of one
	// kind and subject.
	DefaultLogInterval = time.Minute
)

// PoolConfig describes one processing pool. Its limits hold in one
// router (one process): N routers configured alike (replicas of a
// service, each running a router on the same sources) allow N times the
// concurrency and N times the rate, together, to the pool's receivers.
// Divide the receiver's limits by the number of routers when you set
// them.
type PoolConfig struct {
	// Code names the pool; messages choose a pool by code.
	Code string `json:"code"`
	// Concurrency is the most deliveries in flight at once in this
	// router; every router running the pool has its own.
	Concurrency int `json:"concurrency"`
	// RateLimitPerMinute caps this router's deliveries per minute; 0
	// means no limit. Every router running the pool has its own: three
	// routers send up to three times the rate.
	RateLimitPerMinute int `json:"rateLimitPerMinute"`
}

// Capacity is how many messages the pool buffers: max(concurrency×20, 50).
func (p PoolConfig) Capacity() int {
	return max(p.Concurrency*QueueCapacityMultiplier, MinQueueCapacity)
}

func (p PoolConfig) validate() error {
	switch {
	case p.Code == "":
		return fmt.Errorf("%w: pool without a code", ErrInvalidConfig)
	case p.Concurrency < 1:
		return fmt.Errorf("%w: pool %q: concurrency %d must be at least 1", ErrInvalidConfig, p.Code, p.Concurrency)
	case p.RateLimitPerMinute < 0:
		return fmt.Errorf("%w: pool %q: negative rate limit", ErrInvalidConfig, p.Code)
	}
	return nil
}

// ConfigSource supplies the pools; the router polls it.
type ConfigSource interface {
	Pools(ctx context.Context) ([]PoolConfig, error)
}

// HTTPConfigSource reads pools from a JSON endpoint answering
// {"pools":[{"code":"…","concurrency":n,"rateLimitPerMinute":n}]}.
type HTTPConfigSource struct {
	URL    string
	Client *http.Client // defaults to a client with a 10s timeout
}

// Pools implements ConfigSource.
func (s *HTTPConfigSource) Pools(ctx context.Context) ([]PoolConfig, error) {
	client := s.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("configuration request: %w", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err // names the request already
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, fmt.Errorf("GET %s: HTTP %d", s.URL, resp.StatusCode)
	}
	var body struct {
		Pools []PoolConfig `json:"pools"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("GET %s: reading the pools: %w", s.URL, err)
	}
	return body.Pools, nil
}

// BreakerConfig configures the circuit breaker of each target host.
type BreakerConfig struct {
	// MinRequests before the failure ratio is judged. Defaults to 10.
	// (Zero fields take the defaults; a negative OpenFor or Interval, or a
	// FailureRatio outside (0, 1], is refused.)
	MinRequests uint32
	// FailureRatio at which the breaker opens. Defaults to 0.5.
	FailureRatio float64
	// OpenFor is how long it stays open before trying again. Defaults to 5s.
	OpenFor time.Duration
	// HalfOpenRequests is how many successes close it again. Defaults to 3.
	HalfOpenRequests uint32
	// Interval is the window the failure ratio is judged over (a rolling
	// window of ten buckets): older requests no longer count, so a long
	// run of successes does not hide a new failure streak. Defaults to 1
	// minute.
	Interval time.Duration
}

// SuccessRule chooses which responses acknowledge a message.
type SuccessRule int

const (
	// Any2xx acks a message on any 2xx status (the default). A body
	// {"ack":false,"delaySeconds":n} still asks for a retry.
	Any2xx SuccessRule = iota
	// Only200 is the original response table: only 200 acks (unless its
	// body says {"ack":false}); another 2xx is unexpected and retried.
	Only200
)

// Clock is outbox.Clock, pgoutbox's one clock: the router reads it for
// rate limits, breakers, holds and retry times; tests inject one to move
// time without sleeping.
type Clock = outbox.Clock

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Config configures a Router. A zero duration or count takes the default
// its field names; a negative one is refused by New with ErrInvalidConfig.
type Config struct {
	// Pools is the static pool configuration (used when ConfigSource is nil,
	// and as the starting set otherwise).
	Pools []PoolConfig
	// ConfigSource, when set, is polled every SyncInterval (default
	// DefaultSyncInterval); at start-up it is tried StartupAttempts times
	// (default DefaultStartupAttempts), StartupRetryDelay apart (default
	// DefaultStartupRetryDelay), before Start fails.
	ConfigSource      ConfigSource
	SyncInterval      time.Duration
	StartupAttempts   int
	StartupRetryDelay time.Duration
	// MaxPools refuses pools beyond it (critical warning; default
	// DefaultMaxPools); a warning is raised from PoolWarningThreshold on
	// (default DefaultPoolWarnThreshold).
	MaxPools             int
	PoolWarningThreshold int

	// AllowedHosts lists the host[:port] values targets may name. Required:
	// a message can never send the router somewhere else.
	AllowedHosts []string
	// Tokens gives a bearer token per target host; TokenFunc, when set, is
	// asked instead. Credentials never come from message rows. Default:
	// no token.
	Tokens    map[string]string
	TokenFunc func(ctx context.Context, target *url.URL) (string, error)

	// Success chooses which statuses ack a message. Defaults to Any2xx.
	Success SuccessRule
	// PointerBody sends {"messageId": id} instead of the payload. Defaults
	// to false.
	PointerBody bool
	// ConnectTimeout and RequestTimeout bound each HTTP attempt: the
	// connection (default DefaultConnectTimeout) and the whole call
	// (default DefaultRequestTimeout).
	ConnectTimeout time.Duration
	RequestTimeout time.Duration
	// MaxAttempts is how often one delivery calls the receiver for
	// retryable errors (timeouts, connection errors, 5xx) before the
	// message is nacked (default DefaultMaxAttempts, 3), with
	// RetryBackoff(n) between call n and n+1 (default n seconds: 1 s, then
	// 2 s).
	MaxAttempts  int
	RetryBackoff func(attempt int) time.Duration
	// Breaker configures each target host's circuit breaker (see
	// BreakerConfig for its defaults).
	Breaker BreakerConfig
	// HTTPClient overrides the client built from the timeouts. Default:
	// a client of the router's own.
	HTTPClient *http.Client

	// IdleTimeout is ignored: message groups no longer have goroutines
	// of their own (a pool runs up to its concurrency of workers), so there
	// is nothing idle to end.
	//
	// Deprecated: a message group costs nothing once its messages are done.
	IdleTimeout time.Duration
	// DefaultRetryDelay is the nack delay of a message refused before
	// delivery (its pool was full, or it duplicates a delivery in flight),
	// and of a failed delivery when neither the receiver (Retry-After,
	// delaySeconds) nor the message (Message.RetryDelay: a QueueSource or
	// GroupSource sets the topic's backoff) names one. Defaults to the
	// constant DefaultRetryDelay.
	DefaultRetryDelay time.Duration
	// FastFailDelay is the nack delay of messages behind a failed one of
	// their batch and message group. Defaults to DefaultFastFailDelay. A
	// delivery the circuit breaker refused (the host was not called) waits
	// Breaker.OpenFor and spends no attempt.
	FastFailDelay time.Duration
	// RateLimitPollEvery is how often a rate-limited worker tries again.
	// Defaults to DefaultRateLimitPollEvery.
	RateLimitPollEvery time.Duration

	// HealthInterval is how often sources are checked (default
	// DefaultHealthInterval); a source that has not polled for
	// StallTimeout (default DefaultStallTimeout) is restarted.
	HealthInterval time.Duration
	StallTimeout   time.Duration
	// LeakCheckInterval is how often the in-flight map is compared with the
	// pools' capacity. Defaults to DefaultLeakCheckInterval.
	LeakCheckInterval time.Duration
	// CleanupInterval is how often state that outlived its use is dropped:
	// holds on message groups whose retry time passed, pools that left the
	// configuration and finished draining. Defaults to
	// DefaultCleanupInterval.
	CleanupInterval time.Duration
	// WarningTTL is how long a warning is kept after it was last raised
	// (default DefaultWarningTTL, 8 hours); MaxWarnings how many distinct
	// warnings (code and subject) are kept, the least recently raised
	// dropped first (default DefaultMaxWarnings, 1000).
	WarningTTL  time.Duration
	MaxWarnings int
	// LogInterval is the least time between two log records about the
	// same kind of event and subject (a dead letter to a host, a retry, a
	// warning); the next record says how many were left out. Defaults to
	// DefaultLogInterval.
	LogInterval time.Duration
	// GroupShare is the largest part of a pool's capacity one message
	// group (or the messages without one) may hold; the rest of a batch's
	// messages of that group are sent back and come back after
	// FastFailDelay, so one busy group never fills a pool and gets every
	// other group's batches refused. Between 0 and 1; defaults to
	// DefaultGroupShare.
	GroupShare float64

	// Clock tells the router's time for rate limits, holds, retry times
	// and warnings (tests inject one). Stall checks measure real time, as
	// sources report it (Source.LastPoll). Defaults to the system clock.
	Clock Clock
	// Logger receives what goes wrong (rate-limited, see LogInterval).
	// Defaults to slog.Default().
	Logger *slog.Logger
	// Shared, when set, makes every pool's Concurrency and
	// RateLimitPerMinute hold for all routers of its Name together (see
	// SharedLimits). Without it each router keeps its pools' limits alone.
	Shared *SharedLimits

	// MeterProvider receives the router's metrics. Defaults to a no-op
	// provider.
	MeterProvider metric.MeterProvider
	// TracerProvider receives a "deliver {topic}" span per HTTP attempt
	// (OpenTelemetry messaging conventions), a child of the trace context
	// the message carries (Message.TraceContext), and the request carries
	// the span's context to the receiver (W3C traceparent). Without one,
	// the request carries the message's context as it came. Defaults to
	// recording nothing.
	TracerProvider trace.TracerProvider
}

func (c Config) withDefaults() Config {
	c.SyncInterval = cmp.Or(c.SyncInterval, DefaultSyncInterval)
	c.StartupRetryDelay = cmp.Or(c.StartupRetryDelay, DefaultStartupRetryDelay)
	c.ConnectTimeout = cmp.Or(c.ConnectTimeout, DefaultConnectTimeout)
	c.RequestTimeout = cmp.Or(c.RequestTimeout, DefaultRequestTimeout)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.DefaultRetryDelay = cmp.Or(c.DefaultRetryDelay, DefaultRetryDelay)
	c.FastFailDelay = cmp.Or(c.FastFailDelay, DefaultFastFailDelay)
	c.RateLimitPollEvery = cmp.Or(c.RateLimitPollEvery, DefaultRateLimitPollEvery)
	c.HealthInterval = cmp.Or(c.HealthInterval, DefaultHealthInterval)
	c.StallTimeout = cmp.Or(c.StallTimeout, DefaultStallTimeout)
	c.LeakCheckInterval = cmp.Or(c.LeakCheckInterval, DefaultLeakCheckInterval)
	c.WarningTTL = cmp.Or(c.WarningTTL, DefaultWarningTTL)
	c.MaxWarnings = cmp.Or(c.MaxWarnings, DefaultMaxWarnings)
	c.LogInterval = cmp.Or(c.LogInterval, DefaultLogInterval)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, DefaultCleanupInterval)
	c.GroupShare = cmp.Or(c.GroupShare, DefaultGroupShare)
	c.Breaker.OpenFor = cmp.Or(c.Breaker.OpenFor, 5*time.Second)
	c.Breaker.Interval = cmp.Or(c.Breaker.Interval, time.Minute)
	c.StartupAttempts = cmp.Or(c.StartupAttempts, DefaultStartupAttempts)
	c.MaxPools = cmp.Or(c.MaxPools, DefaultMaxPools)
	c.PoolWarningThreshold = cmp.Or(c.PoolWarningThreshold, DefaultPoolWarnThreshold)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	if c.RetryBackoff == nil {
		c.RetryBackoff = func(attempt int) time.Duration { return time.Duration(attempt) * time.Second }
	}
	c.Breaker.MinRequests = cmp.Or(c.Breaker.MinRequests, 10)
	c.Breaker.FailureRatio = cmp.Or(c.Breaker.FailureRatio, 0.5)
	c.Breaker.HalfOpenRequests = cmp.Or(c.Breaker.HalfOpenRequests, 3)
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Shared != nil {
		shared := *c.Shared
		shared.withDefaults()
		c.Shared = &shared
	}
	return c
}

func (c Config) validate() error {
	if len(c.AllowedHosts) == 0 {
		return fmt.Errorf("%w: AllowedHosts is empty (targets must be allow-listed)", ErrInvalidConfig)
	}
	for _, h := range c.AllowedHosts {
		if err := validAllowedHost(h); err != nil {
			return err
		}
	}
	for _, p := range c.Pools {
		if err := p.validate(); err != nil {
			return err
		}
	}
	if c.Shared != nil {
		if err := c.Shared.validate(); err != nil {
			return err
		}
	}
	check := cfgcheck.New("router")
	for _, d := range []struct {
		field string
		value time.Duration
	}{
		{"SyncInterval", c.SyncInterval}, {"StartupRetryDelay", c.StartupRetryDelay},
		{"ConnectTimeout", c.ConnectTimeout}, {"RequestTimeout", c.RequestTimeout},
		{"IdleTimeout", c.IdleTimeout}, {"DefaultRetryDelay", c.DefaultRetryDelay}, {"FastFailDelay", c.FastFailDelay},
		{"RateLimitPollEvery", c.RateLimitPollEvery}, {"HealthInterval", c.HealthInterval},
		{"StallTimeout", c.StallTimeout}, {"LeakCheckInterval", c.LeakCheckInterval},
		{"CleanupInterval", c.CleanupInterval}, {"WarningTTL", c.WarningTTL}, {"LogInterval", c.LogInterval},
		{"Breaker.OpenFor", c.Breaker.OpenFor}, {"Breaker.Interval", c.Breaker.Interval},
	} {
		check.Positive(d.field, d.value)
	}
	check.Count("MaxAttempts", c.MaxAttempts, 1)
	check.Count("StartupAttempts", c.StartupAttempts, 1)
	check.Count("MaxPools", c.MaxPools, 1)
	check.Count("PoolWarningThreshold", c.PoolWarningThreshold, 1)
	check.Count("MaxWarnings", c.MaxWarnings, 1)
	if c.GroupShare <= 0 || c.GroupShare > 1 {
		check.Failf("GroupShare", "%v is not in (0, 1]", c.GroupShare)
	}
	if c.Breaker.FailureRatio <= 0 || c.Breaker.FailureRatio > 1 {
		check.Failf("Breaker.FailureRatio", "%v is not in (0, 1]", c.Breaker.FailureRatio)
	}
	return check.Err()
}

// validAllowedHost checks that an allow-list entry is a host, an IP
// address or either with a port (an IPv6 address with a port in
// brackets): the forms a target's host is compared with.
func validAllowedHost(entry string) error {
	if net.ParseIP(entry) != nil {
		return nil
	}
	u, err := url.Parse("http://" + entry)
	if err == nil && entry != "" && u.Host == entry && u.User == nil && u.Path == "" && u.RawQuery == "" && u.Fragment == "" && !u.ForceQuery {
		return nil
	}
	return fmt.Errorf("%w: %w: %q (list a host or host:port, such as \"hooks.internal:8443\")", ErrInvalidConfig, ErrInvalidAllowedHost, entry)
}
