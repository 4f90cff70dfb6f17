package outbox

import (
	"cmp"
	"fmt"
	"math"
	"time"
)

// Semantics says how a topic's messages reach consumers.
type Semantics string

const (
	// Queue distributes messages: each is handled by one consumer.
	Queue Semantics = "QUEUE"
	// PubSub replicates messages: each is handled by every consumer group
	// subscribed when it was written (package consumergroup).
	PubSub Semantics = "PUB_SUB"
)

// TrackingMode says how a PUB_SUB topic records that every required consumer
// group is done with a message.
type TrackingMode string

const (
	// Bitmap fixes the required groups in the message row as a bit each
	// and records each group's completions beside it: at most 64 groups
	// per topic.
	Bitmap TrackingMode = "BITMAP"
	// Counter fixes the required groups in the message row as a list and
	// a count, and records each group's completions beside it: unlimited
	// groups.
	Counter TrackingMode = "COUNTER"
	// Offset keeps only a cursor per group; messages below every active
	// group's cursor are done. Lowest write amplification.
	Offset TrackingMode = "OFFSET"
)

// known reports whether m is one of the tracking modes.
func (m TrackingMode) known() bool { return m == Bitmap || m == Counter || m == Offset }

// DeadLetterPolicy says what an ordered topic does with a message group
// whose oldest message was dead-lettered.
type DeadLetterPolicy string

const (
	// BlockGroup keeps the group's later messages until the dead letter is
	// replayed (Client.ReplayDeadLetters: it is delivered first) or
	// discarded (Client.DiscardDeadLetters), or until the maintenance
	// service deletes it past its DeadLetterRetention (14 days by default).
	// Other groups keep flowing.
	BlockGroup DeadLetterPolicy = "BLOCK"
	// SkipDeadLetters moves on to the group's next message: the dead
	// letter is left out of the group's order (a replay delivers it
	// later, out of order).
	SkipDeadLetters DeadLetterPolicy = "SKIP"
)

// Topic defaults, used for topics that were never configured and for zero
// fields of a TopicConfig.
const (
	// DefaultMaxAttempts is how often a message is tried before it is dead-lettered.
	DefaultMaxAttempts = 10
	// DefaultBackoffInitial is the retry delay after the first failure.
	DefaultBackoffInitial = time.Second
	// DefaultBackoffMax caps the retry delay.
	DefaultBackoffMax = 10 * time.Minute
	// DefaultLease is how long a claimed message stays invisible to other
	// consumers before it is redelivered (the visibility timeout).
	DefaultLease = 30 * time.Second
	// DefaultPubSubRetention is how long a completed PUB_SUB message is kept
	// (and the floor for messages of a topic with no subscriptions).
	DefaultPubSubRetention = 24 * time.Hour
	// DefaultZeroSubscriptionRetention is the floor for PUB_SUB messages
	// written while no group was subscribed.
	DefaultZeroSubscriptionRetention = 24 * time.Hour
	// DefaultIdempotencyWindow is how long an idempotency key is remembered.
	DefaultIdempotencyWindow = 24 * time.Hour
	// DefaultMaxRetention caps how long a PUB_SUB message is kept, whatever
	// holds it (the design's forced retention cap).
	DefaultMaxRetention = 30 * 24 * time.Hour
	// DefaultZombieTTL is how long a DEAD group keeps its claim on the
	// messages it had not finished when it died.
	DefaultZombieTTL = 7 * 24 * time.Hour
)

// TopicConfig is a topic's configuration. Zero fields take the defaults above.
type TopicConfig struct {
	// Name of the topic (see ValidateTopic).
	Name string
	// Semantics: Queue or PubSub. Defaults to Queue.
	Semantics Semantics
	// Tracking is the completion tracking mode of a PubSub topic. A Queue
	// topic's is Offset, the mode of its one consumer group (see
	// pgoutbox.Consumer): leave it empty. Defaults to Offset. A PubSub
	// topic's is set by the topic's first configuration: once the topic
	// has groups or messages, ConfigureTopic keeps its mode (and logs a
	// warning when it names another). Change it with
	// Client.ChangeTrackingMode, which works with groups and producers
	// running.
	Tracking TrackingMode
	// Retention is how long completed messages are kept (a QUEUE topic's
	// by default not at all: they are deleted once consumed).
	// Defaults to DefaultPubSubRetention for PubSub topics.
	Retention time.Duration
	// MaxAttempts is how often a message is delivered before it is
	// dead-lettered. Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// BackoffInitial is the delay before the first retry; each further
	// retry doubles it (with jitter) up to BackoffMax.
	// Defaults to DefaultBackoffInitial.
	BackoffInitial time.Duration
	// BackoffMax caps the retry delay. Defaults to DefaultBackoffMax.
	BackoffMax time.Duration
	// Lease is the visibility timeout of a claimed message: an instance
	// keeps the leases of what it works on alive (every third of Lease),
	// so a lease runs out only when the instance froze or hung. The work
	// of an instance whose process died, or whose connection was cut,
	// comes back sooner, within about a second (see Config.ListenDSN).
	// Defaults to DefaultLease.
	Lease time.Duration
	// ZeroSubscriptionRetention is the least time a PUB_SUB message that no
	// group was subscribed to when it was written is kept, so a group that
	// subscribes late (FromBeginning) can still read it.
	// Defaults to DefaultZeroSubscriptionRetention.
	ZeroSubscriptionRetention time.Duration
	// BlockWritesOnZeroSubscriptions makes sends to this PUB_SUB topic fail
	// with ErrNoSubscriptions while no group is subscribed. Defaults to false.
	BlockWritesOnZeroSubscriptions bool
	// IdempotencyWindow is how long a Message.IdempotencyKey is remembered
	// after the send that recorded it: another send with the key within the
	// window writes nothing and returns the first message's id, whether that
	// message is still there or was consumed long ago. A send after the
	// window writes a new message and records the key anew.
	// Defaults to DefaultIdempotencyWindow.
	IdempotencyWindow time.Duration
	// MaxRetention caps how long a PUB_SUB message is kept: the maintenance
	// service deletes a message this old even if a group has not finished
	// it (a PAUSED group, one that is stuck or keeps failing, a pending
	// retry, a DEAD group within its ZombieTTL), counting it per group
	// (logged at most daily), which then never sees it. At least
	// Retention and ZeroSubscriptionRetention. Defaults to
	// DefaultMaxRetention.
	MaxRetention time.Duration
	// ZombieTTL is how long a DEAD group keeps its claim on the PUB_SUB
	// messages it had not finished when it died (they are kept for it, and
	// it receives them, within its MaxBackfill, if it comes back
	// meanwhile); after that it is forgotten, and what cleanup deletes
	// meanwhile is lost to it. The messages written after it died are not
	// its claim, in any tracking mode: they go once the other groups
	// finished them and the topic's Retention passed. Defaults to
	// DefaultZombieTTL.
	ZombieTTL time.Duration
	// Ordered makes the topic deliver the messages of each message group
	// (Message.Group) one at a time, in the order their transactions
	// committed, in each consumer group that reads it (a QUEUE topic's
	// one group included), in every tracking mode: the group queues what
	// it reads and hands out a message only when it is the oldest of its
	// message group still queued and the one before it is done (with a
	// run of up to nine messages right behind it, which one handler works
	// through in order, handing back the rest at the first one that does
	// not succeed). It holds however many consumers, instances and
	// processes read, across retries, lease expiries and restarts. A
	// failing message holds its message group back until it succeeds or
	// is dead-lettered (see OrderedDeadLetters); other message groups are
	// not held back. Priority plays no part, and a delayed message holds
	// its message group until it is due. Messages without a group are
	// delivered as on a topic that is not ordered.
	//
	// Sends to an ordered topic take a lock per (topic, group) until their
	// transaction ends, so that ids follow commit order: two transactions
	// sending to the same group run their sends one after the other. Two
	// transactions that each send to two groups, in separate sends and in
	// opposite orders, can deadlock (PostgreSQL aborts one with SQLSTATE
	// 40P01); a SendBatch takes all its locks in one order, so two
	// transactions that each send one batch cannot.
	//
	// Set it in the topic's first configuration, before anything is sent;
	// it never changes afterwards (ConfigureTopic fails with
	// ErrInvalidConfig). Defaults to false.
	Ordered bool
	// OrderedDeadLetters is what an ordered topic does with a group whose
	// oldest message was dead-lettered: BlockGroup (the default for
	// ordered topics) or SkipDeadLetters. It must be empty for topics that
	// are not ordered, and may change at any time.
	OrderedDeadLetters DeadLetterPolicy
	// Configured reports whether the topic has a stored configuration (it
	// is set by Client.Topic; ConfigureTopic ignores it).
	Configured bool
	// ModeChanging reports that the topic's tracking mode changed while
	// messages were stored, and some written under an earlier mode may
	// still be: until cleanup finds none left, groups and cleanup read
	// each message's own completion record. It is set by Client.Topic;
	// ConfigureTopic ignores it.
	ModeChanging bool
}

// WithDefaults returns c with its zero fields filled in.
func (c TopicConfig) WithDefaults() TopicConfig {
	c.Semantics = cmp.Or(c.Semantics, Queue)
	if c.Semantics == Queue {
		c.Tracking = cmp.Or(c.Tracking, Offset)
	}
	if c.Semantics == PubSub {
		c.Tracking = cmp.Or(c.Tracking, Offset)
		c.Retention = cmp.Or(c.Retention, DefaultPubSubRetention)
	}
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.BackoffInitial = cmp.Or(c.BackoffInitial, DefaultBackoffInitial)
	c.BackoffMax = cmp.Or(c.BackoffMax, DefaultBackoffMax)
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.ZeroSubscriptionRetention = cmp.Or(c.ZeroSubscriptionRetention, DefaultZeroSubscriptionRetention)
	c.IdempotencyWindow = cmp.Or(c.IdempotencyWindow, DefaultIdempotencyWindow)
	c.MaxRetention = cmp.Or(c.MaxRetention, DefaultMaxRetention)
	c.ZombieTTL = cmp.Or(c.ZombieTTL, DefaultZombieTTL)
	if c.Ordered {
		c.OrderedDeadLetters = cmp.Or(c.OrderedDeadLetters, BlockGroup)
	}
	return c
}

func (c TopicConfig) validate() error {
	if err := ValidateTopic(c.Name); err != nil {
		return err
	}
	switch c.Semantics {
	case Queue:
		if c.Tracking != Offset {
			return fmt.Errorf("%w: topic %q: a QUEUE topic's tracking mode is Offset (got %q)", ErrInvalidConfig, c.Name, c.Tracking)
		}
	case PubSub:
		if !c.Tracking.known() {
			return fmt.Errorf("%w: topic %q: unknown tracking mode %q", ErrInvalidConfig, c.Name, c.Tracking)
		}
	default:
		return fmt.Errorf("%w: topic %q: unknown semantics %q", ErrInvalidConfig, c.Name, c.Semantics)
	}
	switch {
	case !c.Ordered && c.OrderedDeadLetters != "":
		return fmt.Errorf("%w: topic %q: OrderedDeadLetters needs an ordered topic", ErrInvalidConfig, c.Name)
	case c.Ordered && c.OrderedDeadLetters != BlockGroup && c.OrderedDeadLetters != SkipDeadLetters:
		return fmt.Errorf("%w: topic %q: unknown OrderedDeadLetters %q", ErrInvalidConfig, c.Name, c.OrderedDeadLetters)
	case c.Retention < 0:
		return fmt.Errorf("%w: topic %q: negative retention", ErrInvalidConfig, c.Name)
	case c.MaxAttempts < 1 || c.MaxAttempts > math.MaxInt32:
		return fmt.Errorf("%w: topic %q: MaxAttempts must be between 1 and %d", ErrInvalidConfig, c.Name, math.MaxInt32)
	case c.BackoffInitial < 0 || c.BackoffMax < c.BackoffInitial:
		return fmt.Errorf("%w: topic %q: need 0 <= BackoffInitial <= BackoffMax", ErrInvalidConfig, c.Name)
	case c.ZeroSubscriptionRetention < 0:
		return fmt.Errorf("%w: topic %q: negative ZeroSubscriptionRetention", ErrInvalidConfig, c.Name)
	case c.BlockWritesOnZeroSubscriptions && c.Semantics != PubSub:
		return fmt.Errorf("%w: topic %q: only PUB_SUB topics can block writes on zero subscriptions", ErrInvalidConfig, c.Name)
	case c.IdempotencyWindow < 0:
		return fmt.Errorf("%w: topic %q: negative IdempotencyWindow", ErrInvalidConfig, c.Name)
	case c.Lease < time.Second:
		return fmt.Errorf("%w: topic %q: Lease must be at least 1s", ErrInvalidConfig, c.Name)
	case c.ZombieTTL < 0:
		return fmt.Errorf("%w: topic %q: negative ZombieTTL", ErrInvalidConfig, c.Name)
	case c.MaxRetention < max(c.Retention, c.ZeroSubscriptionRetention):
		return fmt.Errorf("%w: topic %q: MaxRetention (%v) is shorter than Retention or ZeroSubscriptionRetention",
			ErrInvalidConfig, c.Name, c.MaxRetention)
	}
	return nil
}

// MaxTopicBytes is the longest topic name.
const MaxTopicBytes = 255

// ValidateTopic reports whether name can be a topic: 1 to 255 bytes of ASCII
// letters, digits, '.', '_', ':' and '-'. The error wraps ErrInvalidTopic.
func ValidateTopic(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrInvalidTopic)
	}
	if len(name) > MaxTopicBytes {
		return fmt.Errorf("%w: %d bytes, at most %d allowed", ErrInvalidTopic, len(name), MaxTopicBytes)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return fmt.Errorf("%w: %q has %q at byte %d (allowed: letters, digits, . _ : -)", ErrInvalidTopic, name, c, i)
		}
	}
	return nil
}
