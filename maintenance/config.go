package maintenance

import (
	"cmp"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/pgoutbox/pgoutbox/consumergroup"
	"github.com/pgoutbox/pgoutbox/internal/cfgcheck"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Defaults: the values Config's zero fields take.
const (
	// DefaultDeadGroupInterval is how often groups whose heartbeats
	// stopped are declared DEAD: the seed's minute, 20% of
	// consumergroup.DefaultHeartbeatTimeout, so a group is DEAD no later
	// than its timeout plus a minute.
	DefaultDeadGroupInterval = time.Minute
	// DefaultCleanupInterval is how often finished messages, expired dead
	// letters, idempotency keys and inbox keys are deleted. Each pass
	// drains what is due, batch after batch, so the interval bounds how
	// long a deletable row waits, not how many go.
	DefaultCleanupInterval = 5 * time.Minute
	// DefaultSubscriptionCleanupInterval is how often CANCELLED and DEAD
	// subscriptions past SubscriptionRetention are deleted.
	DefaultSubscriptionCleanupInterval = time.Hour
	// DefaultBatchSize is how many rows one delete takes.
	DefaultBatchSize = 10_000
	// DefaultStatementTimeout bounds each statement; one that times out
	// makes the job's batches ten times smaller until a pass succeeds.
	DefaultStatementTimeout = 30 * time.Second
	// DefaultDeadLetterRetention is how long dead letters (of QUEUE
	// topics and of groups) are kept before they are deleted: two weeks, SQS's longest
	// retention, enough to notice and replay them.
	DefaultDeadLetterRetention = 14 * 24 * time.Hour
	// DefaultSubscriptionRetention is how long a CANCELLED or DEAD
	// subscription is kept before it is deleted.
	DefaultSubscriptionRetention = 30 * 24 * time.Hour
	// DefaultBatchPause is the pause between two batches of one job, so a
	// long drain leaves room to everything else.
	DefaultBatchPause = 50 * time.Millisecond
	// DefaultPartitionInterval is how often partitions of PUB_SUB
	// messages are added ahead of need and dropped when done.
	DefaultPartitionInterval = time.Minute
	// DefaultPartitionSpan is how long the transactions of one partition
	// take to be written: with the default day of retention, about six
	// partitions are kept.
	DefaultPartitionSpan = 6 * time.Hour
	// DefaultPartitionLockTimeout is the longest a partition is waited on
	// to be added or dropped, and so the longest inserts queue behind it.
	DefaultPartitionLockTimeout = 200 * time.Millisecond
)

// Config configures a Service. Zero durations and counts take the
// defaults above; negative ones are refused with outbox.ErrInvalidConfig.
type Config struct {
	// Client is the outbox client whose schema (and, unless set below,
	// logger and meter provider) the service uses. Required.
	Client *outbox.Client
	// Logger receives the service's logs. Defaults to Client's logger.
	Logger *slog.Logger
	// MeterProvider receives its metrics. Defaults to Client's.
	MeterProvider metric.MeterProvider

	// DeadGroupInterval: how often groups whose heartbeats stopped are
	// declared DEAD, and groups whose claims ran out (CANCELLED, DEAD past
	// ZombieTTL) forgotten. Keep it at most a fifth of your groups'
	// HeartbeatTimeout. Defaults to DefaultDeadGroupInterval.
	DeadGroupInterval time.Duration
	// CleanupInterval: how often PUB_SUB messages every group finished,
	// messages past a topic's MaxRetention, expired dead letters,
	// idempotency keys and inbox keys are deleted. Defaults to
	// DefaultCleanupInterval.
	CleanupInterval time.Duration
	// SubscriptionCleanupInterval: how often old CANCELLED and DEAD
	// subscriptions are deleted. Defaults to
	// DefaultSubscriptionCleanupInterval.
	SubscriptionCleanupInterval time.Duration
	// BatchSize is how many rows one delete takes. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// StatementTimeout bounds each statement. Defaults to
	// DefaultStatementTimeout.
	StatementTimeout time.Duration
	// BatchPause is the pause between two batches of one job. Defaults to
	// DefaultBatchPause.
	BatchPause time.Duration
	// DeadLetterRetention: QUEUE and group dead letters older than this
	// are deleted. Defaults to DefaultDeadLetterRetention.
	DeadLetterRetention time.Duration
	// SubscriptionRetention: CANCELLED subscriptions, and DEAD ones
	// without dead letters, released longer ago than this are deleted. A
	// DEAD group is warned about in the log before (see KeepDeadGroups).
	// At least consumergroup.DefaultHeartbeatTimeout. Defaults to
	// DefaultSubscriptionRetention.
	SubscriptionRetention time.Duration
	// KeepDeadGroups keeps DEAD subscriptions for ever (CANCELLED ones are
	// still deleted). Defaults to false.
	KeepDeadGroups bool

	// PartitionInterval: how often partitions of PUB_SUB messages are
	// added ahead of need and dropped once every message in them is done.
	// Keep it well below PartitionSpan. Defaults to
	// DefaultPartitionInterval.
	PartitionInterval time.Duration
	// PartitionSpan is how much time of writing one partition holds: each
	// new partition spans as many transaction ids as the database assigned
	// in this time, at the rate measured since the previous one. Larger
	// spans mean fewer partitions, and messages kept up to a span longer
	// past their retention. Defaults to DefaultPartitionSpan.
	PartitionSpan time.Duration
	// PartitionSize, when set, is how many transaction ids every new
	// partition spans, whatever the rate (PartitionSpan is then unused).
	PartitionSize int64
	// PartitionLockTimeout bounds each wait for a lock when a partition
	// is added or dropped (a long transaction that wrote messages holds
	// one): the step gives up, so inserts never queue behind it for
	// longer, and is tried again later. Defaults to
	// DefaultPartitionLockTimeout.
	PartitionLockTimeout time.Duration
	// RowCleanupDelay: finished messages are deleted one by one only once
	// they are this much older than their topic's retention. Until then
	// they wait for their partition to be dropped whole. A partition that
	// another topic's messages keep past this delay (a paused group, one
	// far behind) has the finished messages of other topics deleted, so a
	// slow topic keeps only its own messages, until its MaxRetention.
	// Defaults to twice PartitionSpan.
	RowCleanupDelay time.Duration
}

// ForLowThroughput is a configuration for services sending fewer than
// about 100 messages a second: small batches, every quarter hour.
func ForLowThroughput() Config {
	return Config{CleanupInterval: 15 * time.Minute, BatchSize: 5_000, DeadGroupInterval: time.Minute,
		SubscriptionRetention: 30 * 24 * time.Hour}
}

// ForHighThroughput is a configuration for services sending thousands of
// messages a second: large batches every minute, and old subscriptions
// go after a week.
func ForHighThroughput() Config {
	return Config{CleanupInterval: time.Minute, BatchSize: 50_000, DeadGroupInterval: time.Minute,
		SubscriptionRetention: 7 * 24 * time.Hour}
}

// ForCriticalSystem is a configuration that keeps evidence longest: dead
// letters for 90 days, DEAD groups for ever (an operator removes them),
// medium batches every five minutes.
func ForCriticalSystem() Config {
	return Config{CleanupInterval: 5 * time.Minute, BatchSize: 10_000, DeadGroupInterval: time.Minute,
		DeadLetterRetention: 90 * 24 * time.Hour, SubscriptionRetention: 90 * 24 * time.Hour, KeepDeadGroups: true}
}

func (c Config) withDefaults() Config {
	if c.Client != nil {
		if c.Logger == nil {
			c.Logger = c.Client.Logger()
		}
		if c.MeterProvider == nil {
			c.MeterProvider = c.Client.MeterProvider()
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.DeadGroupInterval = cmp.Or(c.DeadGroupInterval, DefaultDeadGroupInterval)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, DefaultCleanupInterval)
	c.SubscriptionCleanupInterval = cmp.Or(c.SubscriptionCleanupInterval, DefaultSubscriptionCleanupInterval)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.StatementTimeout = cmp.Or(c.StatementTimeout, DefaultStatementTimeout)
	c.BatchPause = cmp.Or(c.BatchPause, DefaultBatchPause)
	c.DeadLetterRetention = cmp.Or(c.DeadLetterRetention, DefaultDeadLetterRetention)
	c.SubscriptionRetention = cmp.Or(c.SubscriptionRetention, DefaultSubscriptionRetention)
	c.PartitionInterval = cmp.Or(c.PartitionInterval, DefaultPartitionInterval)
	c.PartitionSpan = cmp.Or(c.PartitionSpan, DefaultPartitionSpan)
	c.PartitionLockTimeout = cmp.Or(c.PartitionLockTimeout, DefaultPartitionLockTimeout)
	c.RowCleanupDelay = cmp.Or(c.RowCleanupDelay, 2*c.PartitionSpan)
	return c
}

func (c Config) validate() error {
	check := cfgcheck.New("maintenance")
	if c.Client == nil {
		check.Failf("Client", "is nil")
	}
	check.Positive("DeadGroupInterval", c.DeadGroupInterval)
	check.Positive("CleanupInterval", c.CleanupInterval)
	check.Positive("SubscriptionCleanupInterval", c.SubscriptionCleanupInterval)
	check.Count("BatchSize", c.BatchSize, 1)
	check.Positive("StatementTimeout", c.StatementTimeout)
	check.Positive("BatchPause", c.BatchPause)
	check.Positive("DeadLetterRetention", c.DeadLetterRetention)
	check.AtLeast("SubscriptionRetention", c.SubscriptionRetention, consumergroup.DefaultHeartbeatTimeout)
	check.Positive("PartitionInterval", c.PartitionInterval)
	check.Positive("PartitionSpan", c.PartitionSpan)
	if c.PartitionSize < 0 || c.PartitionSize > maxPartitionXids {
		check.Failf("PartitionSize", "is %d, want 0 (sized by PartitionSpan) up to %d", c.PartitionSize, maxPartitionXids)
	}
	check.AtLeast("PartitionLockTimeout", c.PartitionLockTimeout, time.Millisecond)
	check.Positive("RowCleanupDelay", c.RowCleanupDelay)
	return check.Err()
}
