package consumergroup

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgoutbox/pgoutbox/internal/cfgcheck"
	"github.com/pgoutbox/pgoutbox/internal/engine"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// Errors. Each wraps into messages that say what was wrong; branch with errors.Is.
var (
	// ErrNoMembers: Start on a group without members.
	ErrNoMembers = errors.New("consumergroup: group has no members")
	// ErrLastMember: removing the last member of a started group.
	ErrLastMember = errors.New("consumergroup: cannot remove the last member of a started group")
	// ErrDuplicateMember: AddConsumer with an id already in the group.
	ErrDuplicateMember = errors.New("consumergroup: duplicate member id")
	// ErrUnknownMember: RemoveConsumer with an id not in the group. It
	// matches outbox.ErrNotFound too.
	ErrUnknownMember = cfgcheck.NotFound("consumergroup: unknown member id")
	// ErrInvalidGroup: empty, too long or badly formed group name.
	ErrInvalidGroup = errors.New("consumergroup: invalid group name")
	// ErrInvalidTransition: a state change the subscription state machine forbids.
	ErrInvalidTransition = errors.New("consumergroup: invalid subscription state transition")
	// ErrTooManyGroups: a 65th group on a Bitmap topic (or no bit is free yet).
	// It is outbox.ErrTooManyGroups.
	ErrTooManyGroups = outbox.ErrTooManyGroups
	// ErrNotStarted: an operation on a group that has no subscription yet.
	ErrNotStarted = errors.New("consumergroup: group not started")
	// ErrSubscriptionGone: the group's subscription row was deleted while
	// an instance ran; the instance stopped (see Group.Err). It matches
	// outbox.ErrNotFound too.
	ErrSubscriptionGone = engine.ErrSubscriptionGone
	// ErrCancelled: the group's subscription was cancelled (by this or
	// another instance, or an operator) while an instance ran; the
	// instance stopped (see Group.Err).
	ErrCancelled = engine.ErrCancelled
)

// State is a subscription's state.
type State string

// The states of the subscription state machine. Valid transitions:
//
//	ACTIVE → PAUSED (Pause), PAUSED → ACTIVE (Resume)
//	ACTIVE → DEAD (heartbeats stopped), DEAD → ACTIVE (a heartbeat, Start or Resume: resurrection)
//	ACTIVE, PAUSED, DEAD → CANCELLED (Cancel; terminal)
//
// Stop changes nothing: the subscription stays ACTIVE and, if no instance
// returns before the heartbeat timeout, becomes DEAD.
//
// What DEAD costs: a DEAD group is no longer required on new messages, in
// any mode (in Offset mode it stops holding the watermark back at once):
// they are deleted once the other groups are done and the topic's
// retention has passed. What it had not finished when it died stays its
// claim for the topic's ZombieTTL, then it is forgotten. When the group
// comes back it receives its new messages at once and, beside them, a
// backfill (throttled, see BackfillProgress) of at most MaxBackfill of the
// messages still stored that it had not completed, oldest first: what it
// owed when it died, then what was written while it was DEAD. Messages
// deleted meanwhile are lost to it. Size HeartbeatTimeout above the
// longest pause an instance can take (a slow deploy, a long GC or VM
// pause) and the topic's Retention above HeartbeatTimeout plus the time a
// deploy may take.
const (
	Active    State = "ACTIVE"
	Paused    State = "PAUSED"
	Dead      State = "DEAD"
	Cancelled State = "CANCELLED"
)

// CanTransition reports whether the state machine allows from → to.
func CanTransition(from, to State) bool {
	switch from {
	case Active:
		return to == Paused || to == Dead || to == Cancelled
	case Paused:
		return to == Active || to == Cancelled
	case Dead:
		return to == Active || to == Cancelled
	}
	return false
}

// Position says where a new subscription starts reading.
type Position string

// Start positions.
const (
	// StartNow: messages written after the subscription commits.
	StartNow Position = "NOW"
	// StartBeginning: every message the topic still holds, then new ones.
	StartBeginning Position = "BEGINNING"
	// StartTimestamp: messages written at or after a time.
	StartTimestamp Position = "TIMESTAMP"
	// StartMessageID: messages with an id at or above a given one.
	StartMessageID Position = "MESSAGE_ID"
)

// Backfill defaults.
const (
	// DefaultMaxBackfill caps how many old messages a backfill delivers.
	DefaultMaxBackfill = 1_000_000
	// DefaultBackfillBatchSize caps the rows of one catch-up read.
	DefaultBackfillBatchSize = 10_000
	// DefaultBackfillRate caps catch-up reads at this many rows a second
	// per instance (the design's 50,000).
	DefaultBackfillRate = 50_000
	// DefaultBackfillTargetLatency: catch-up reads pause while the p95 of
	// their latency is above it (the database is busy with other work).
	DefaultBackfillTargetLatency = 10 * time.Millisecond
	// DefaultBackfillMaxSlowdown: a backfill slows down while commits take
	// more than 1.5 times as long as when the database was quiet (so the
	// database's other clients stay well within twice their latency).
	DefaultBackfillMaxSlowdown = 1.5
)

// SubscriptionOptions say where a new subscription starts. They apply when
// the subscription is created; a group that restarts continues where it was.
type SubscriptionOptions struct {
	// Position is where a new subscription starts. Defaults to StartNow.
	Position Position
	// Timestamp is StartTimestamp's time (required there).
	Timestamp time.Time
	// MessageID is StartMessageID's first id (required there).
	MessageID int64
	// Backfill delivers the messages still stored that the start position
	// selects from before the group subscribed (up to MaxBackfill, oldest
	// first), beside the new ones: the group's stream starts now, and a
	// backfill reads the older messages alongside it, throttled, in
	// commit order; cleanup keeps them until it read them. Without it a
	// group that starts before now reads the old messages first, in one
	// stream with the new ones, and receives them only if they are still
	// there when it reads them. Defaults to false.
	Backfill bool
	// MaxBackfill caps how many messages a backfill delivers (oldest
	// first). It also caps, in every tracking mode, the backfill of a
	// group that comes back from DEAD: of the stored messages it had not
	// completed (what it owed when it died, then what was written while
	// it was DEAD), it receives at most MaxBackfill, throttled, beside its
	// new messages. Defaults to DefaultMaxBackfill.
	MaxBackfill int
	// BackfillBatchSize caps the rows of one catch-up read. Defaults to
	// DefaultBackfillBatchSize.
	BackfillBatchSize int
	// BackfillRate caps catch-up reads, in rows a second for each instance
	// of the group (each paces its own reads). Defaults to
	// DefaultBackfillRate.
	BackfillRate float64
	// BackfillTargetLatency pauses catch-up reads while the p95 of their
	// latency is above it, for the excess (at most 5 s): a backfill yields
	// to a busy database. Defaults to DefaultBackfillTargetLatency.
	BackfillTargetLatency time.Duration
	// BackfillMaxSlowdown protects the database's other clients: while a
	// backfill runs, the instance commits an empty transaction every 50 ms
	// (it takes a transaction id, nothing else) on its heartbeat pool and
	// times it; while the p95 of a second's commits is more than
	// BackfillMaxSlowdown times their quiet level (a low percentile of the
	// last five minutes), the backfill reads a quarter slower each second,
	// down to a thousandth of BackfillRate, and speeds up by a tenth a
	// second once it is not. The backfill starts at that thousandth and
	// ramps up (to BackfillRate in about 73 quiet seconds). Must be above
	// 1; negative turns the rule off (the backfill starts at BackfillRate).
	// Defaults to DefaultBackfillMaxSlowdown.
	BackfillMaxSlowdown float64
}

// FromNow starts with messages written after the subscription.
func FromNow() SubscriptionOptions { return SubscriptionOptions{Position: StartNow} }

// FromBeginning starts with every message the topic still holds.
func FromBeginning(backfill bool) SubscriptionOptions {
	return SubscriptionOptions{Position: StartBeginning, Backfill: backfill}
}

// FromTimestamp starts with messages written at or after t.
func FromTimestamp(t time.Time) SubscriptionOptions {
	return SubscriptionOptions{Position: StartTimestamp, Timestamp: t}
}

// FromMessageID starts with messages whose id is at least id.
func FromMessageID(id int64) SubscriptionOptions {
	return SubscriptionOptions{Position: StartMessageID, MessageID: id}
}

func (o SubscriptionOptions) withDefaults() SubscriptionOptions {
	o.Position = cmp.Or(o.Position, StartNow)
	o.MaxBackfill = cmp.Or(o.MaxBackfill, DefaultMaxBackfill)
	o.BackfillBatchSize = cmp.Or(o.BackfillBatchSize, DefaultBackfillBatchSize)
	o.BackfillRate = cmp.Or(o.BackfillRate, DefaultBackfillRate)
	o.BackfillTargetLatency = cmp.Or(o.BackfillTargetLatency, DefaultBackfillTargetLatency)
	o.BackfillMaxSlowdown = cmp.Or(o.BackfillMaxSlowdown, DefaultBackfillMaxSlowdown)
	return o
}

func (o SubscriptionOptions) validate() error {
	switch o.Position {
	case StartNow, StartBeginning:
	case StartTimestamp:
		if o.Timestamp.IsZero() {
			return fmt.Errorf("%w: FromTimestamp needs a time", outbox.ErrInvalidConfig)
		}
		if !outbox.StorableTime(o.Timestamp) {
			return fmt.Errorf("%w: FromTimestamp %v is outside PostgreSQL's timestamp range", outbox.ErrInvalidConfig, o.Timestamp)
		}
	case StartMessageID:
		if o.MessageID < 0 {
			return fmt.Errorf("%w: negative message id", outbox.ErrInvalidConfig)
		}
	default:
		return fmt.Errorf("%w: unknown start position %q", outbox.ErrInvalidConfig, o.Position)
	}
	check := cfgcheck.New("SubscriptionOptions")
	check.Count("MaxBackfill", o.MaxBackfill, 0)
	check.Count("BackfillBatchSize", o.BackfillBatchSize, 1)
	if o.BackfillRate <= 0 || math.IsNaN(o.BackfillRate) || math.IsInf(o.BackfillRate, 0) {
		check.Failf("BackfillRate", "must be positive and finite (got %v)", o.BackfillRate)
	}
	check.Positive("BackfillTargetLatency", o.BackfillTargetLatency)
	if o.BackfillMaxSlowdown >= 0 && o.BackfillMaxSlowdown <= 1 || math.IsNaN(o.BackfillMaxSlowdown) {
		check.Failf("BackfillMaxSlowdown", "must be above 1, or negative for none (got %v)", o.BackfillMaxSlowdown)
	}
	return check.Err()
}

// Filter decides whether a member wants a message. A message that every
// member's filter rejects counts as processed for the group.
type Filter func(d *outbox.Delivery) bool

// Defaults of Config.
const (
	DefaultBatchSize         = 100
	DefaultConcurrency       = 10
	DefaultPollInterval      = time.Second
	DefaultHeartbeatInterval = 60 * time.Second
	DefaultHeartbeatTimeout  = 5 * time.Minute
)

// Config configures one instance of a consumer group. Several instances,
// in one process or many, with the same Topic and Group share the work.
type Config struct {
	// Topic is a configured PUB_SUB topic. Required.
	Topic string
	// Group names the consumer group (1 to 255 bytes). Required.
	Group string
	// Schema holds pgoutbox's tables. Defaults to Client's schema, or "public".
	Schema string
	// Client, when set, is used for topic configuration and shares its
	// LISTEN connection with the client's other consumers and groups. The
	// group takes its Schema, Logger and MeterProvider from it unless they
	// are set (a Schema that differs is an error), and its Clock replaces
	// Clock. Defaults to a client of the group's own.
	Client *outbox.Client
	// ListenDSN and PollOnly configure the LISTEN connection of the
	// group's own client when Client is nil (see outbox.Config): behind a
	// transaction pooler, give it a direct connection. Default: the
	// pool's connection settings, and LISTEN on.
	ListenDSN string
	PollOnly  bool
	// BatchSize is the most messages one fetch hands to this instance.
	// An instance whose members handle the messages holds no more than
	// they finish within about a second, at the pace their calls have
	// taken so far (and, until one call returned, no more than they can
	// start), so slow handlers leave the rest of a backlog to the other
	// instances. A batch handler gets whole batches. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// Concurrency is the most handlers this instance runs at once.
	// Defaults to DefaultConcurrency.
	Concurrency int
	// ConcurrentBatches lets an instance with a batch handler (see
	// SetBatchHandler) hold up to BatchSize × ConcurrentBatches messages,
	// so it fetches further batches while the handler works on earlier
	// ones, each in a call of its own: ConcurrentBatches full batches at
	// once (more calls when batches are not full). The calls finish in
	// any order, so on a topic that is not ordered a message group's
	// messages in two batches may be handled out of order (an ordered
	// topic never hands out two messages of one message group at once).
	// Defaults to 0: the instance holds BatchSize + Concurrency messages
	// (a full batch at a time, and smaller ones beside it).
	ConcurrentBatches int
	// ByMessageGroup reads a topic that is not ordered the way an ordered
	// topic's groups read theirs: the group queues what it reads and hands
	// out the next messages of each message group in turn, one message
	// group's at a time (the first, or a run of the first few), so one
	// message group's backlog never delays another's messages. Messages
	// of one message group then go in the order of their ids (on a topic
	// that is not ordered, two transactions sending to one message group
	// at once may commit in the other order), priorities above 0 are not
	// taken ahead of a backlog, and a dead letter never blocks its message
	// group. Each message costs one more row write, insert and delete. The
	// router's sources set it. It changes nothing on an ordered topic.
	ByMessageGroup bool
	// PollInterval bounds how long an idle instance waits before looking
	// for messages when no notification woke it. Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// HeartbeatInterval is how often the instance tells the database it is
	// alive (with ±10% jitter). Defaults to DefaultHeartbeatInterval.
	HeartbeatInterval time.Duration
	// HeartbeatTimeout: a group none of whose instances sent a heartbeat for
	// this long becomes DEAD. Defaults to DefaultHeartbeatTimeout.
	HeartbeatTimeout time.Duration
	// HandlerTimeout bounds each handler call (and each BatchHandler
	// call): its context ends then, and if it has not returned shortly
	// after, its message is failed and retried like any failure while the
	// rest of the group goes on (the call is left to finish on its own;
	// Stop waits for it until its context ends). Defaults to the topic's
	// Lease.
	HandlerTimeout time.Duration
	// HeartbeatPool runs heartbeats, so a busy main pool cannot starve
	// them. Defaults to the pool that the instances on the client's pool
	// share (outbox.Client.HeartbeatPool: up to 4 connections for all of
	// them), or, for an instance on another pool, to a two-connection pool
	// opened from that pool's configuration (closed by Stop).
	HeartbeatPool *pgxpool.Pool
	// InstanceID names this instance in batch leases and logs.
	// Defaults to host-pid-random.
	InstanceID string
	// Logger receives the instance's logs. Defaults to Client's logger, or
	// slog.Default().
	Logger *slog.Logger
	// MeterProvider defaults to Client's, or a no-op provider.
	MeterProvider metric.MeterProvider
	// TracerProvider receives the spans of fetches and handler calls
	// ("receive {topic}", "process {topic}", with the group as
	// messaging.consumer.group.name); a handler's span is a child of the
	// trace context its message carries from the send. Defaults to
	// Client's, or recording nothing.
	TracerProvider trace.TracerProvider
	// Clock replaces database time for batch leases and retries (tests).
	// Heartbeats always use database time. Defaults to Client's clock,
	// or nil: database time.
	Clock outbox.Clock
}

func (c Config) withDefaults() Config {
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval)
	c.HeartbeatTimeout = cmp.Or(c.HeartbeatTimeout, DefaultHeartbeatTimeout)
	return c
}

func (c Config) validate() error {
	if err := outbox.ValidateTopic(c.Topic); err != nil {
		return err
	}
	if c.Group != sqlq.QueueGroup { // a QUEUE topic's group on the log
		if err := ValidateGroup(c.Group); err != nil {
			return err
		}
	}
	check := cfgcheck.New(fmt.Sprintf("group %q of %q", c.Group, c.Topic))
	check.Count("BatchSize", c.BatchSize, 1)
	check.Count("Concurrency", c.Concurrency, 1)
	check.Count("ConcurrentBatches", c.ConcurrentBatches, 0)
	check.AtLeast("PollInterval", c.PollInterval, time.Millisecond)
	check.AtLeast("HeartbeatInterval", c.HeartbeatInterval, 10*time.Millisecond)
	if c.HeartbeatTimeout <= c.HeartbeatInterval {
		check.Failf("HeartbeatTimeout", "(%v) must be longer than HeartbeatInterval (%v)", c.HeartbeatTimeout, c.HeartbeatInterval)
	}
	check.NotNegative("HandlerTimeout", c.HandlerTimeout)
	return check.Err()
}

// ValidateGroup reports whether name can name a group: 1 to 255 bytes,
// the same characters as topic names. The error wraps ErrInvalidGroup.
func ValidateGroup(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrInvalidGroup)
	}
	if err := outbox.ValidateTopic(name); err != nil {
		return fmt.Errorf("%w: %q (letters, digits, . _ : - and at most %d bytes)", ErrInvalidGroup, name, outbox.MaxTopicBytes)
	}
	return nil
}
