package outbox

import (
	"errors"

	"github.com/pgoutbox/pgoutbox/internal/cfgcheck"
	"github.com/pgoutbox/pgoutbox/internal/ident"
)

// Sentinel errors. Every error pgoutbox returns for bad input wraps one of
// these, so callers branch with errors.Is; the message says what was wrong.
var (
	// ErrInvalidTopic: a topic name is empty, too long or has characters
	// outside [A-Za-z0-9._:-].
	ErrInvalidTopic = errors.New("outbox: invalid topic name")
	// ErrInvalidPayload: a payload is empty, not valid JSON, or JSON that
	// PostgreSQL's jsonb cannot store (invalid UTF-8, \u0000, an unpaired
	// surrogate escape).
	ErrInvalidPayload = errors.New("outbox: invalid payload")
	// ErrInvalidMessage: a message field other than topic and payload is out
	// of range (priority, delay, not-before time) or cannot be stored (a NUL
	// byte or invalid UTF-8 in the group, correlation id, idempotency key,
	// or a header name or value).
	ErrInvalidMessage = errors.New("outbox: invalid message")
	// ErrHeadersTooLarge: a message's headers encode to more than MaxHeaderBytes.
	ErrHeadersTooLarge = errors.New("outbox: headers too large")
	// ErrNilExecutor: Send was given no transaction (or a nil one).
	ErrNilExecutor = errors.New("outbox: nil transaction or executor")
	// ErrInvalidConfig: a configuration field has an unknown or out-of-range
	// value (unknown semantics or tracking mode, negative durations, ...).
	// Every package's ErrInvalidConfig is this one.
	ErrInvalidConfig = cfgcheck.ErrInvalidConfig
	// ErrInvalidSchema: a schema name pgoutbox refuses to use.
	ErrInvalidSchema = ident.ErrInvalidSchema
	// ErrWrongSemantics: a QUEUE topic's consumer was made for a PUB_SUB topic
	// (use the consumergroup package) or the other way round.
	ErrWrongSemantics = errors.New("outbox: topic has other semantics")
	// ErrAlreadyStarted: Start was called on something that already
	// started (a consumer, group, router or client). Every package's
	// "already started" error is this one.
	ErrAlreadyStarted = cfgcheck.ErrAlreadyStarted
	// ErrNoSubscriptions: a send to a PUB_SUB topic configured with
	// BlockWritesOnZeroSubscriptions while no group is subscribed.
	ErrNoSubscriptions = errors.New("outbox: topic has no subscriptions and blocks writes")
	// ErrTooManyGroups: a Bitmap topic has no free bit for a group (at
	// most 64 groups): a 65th group subscribing, or a change to Bitmap
	// mode of a topic with more than 64 groups. Change the topic to
	// Counter or Offset mode instead (see Client.ConfigureTopic).
	ErrTooManyGroups = errors.New("outbox: no free bitmap bit on topic (at most 64 groups)")
	// ErrNotFound: no such topic, group, subscription or message (e.g.
	// replaying a dead letter that is not one). Every package's "not
	// found" errors match it.
	ErrNotFound = cfgcheck.ErrNotFound
	// ErrUnknownTopic: an operation needs a configured topic (a send,
	// unless ProducerConfig.AllowUnconfiguredTopics; a PUB_SUB
	// subscription) and the topic was never configured. It matches
	// ErrNotFound too.
	ErrUnknownTopic = cfgcheck.NotFound("outbox: unknown topic")
	// ErrLeaseLost: the delivery's lease ran out and its message was
	// taken back (or handed out again); its outcome was not recorded.
	ErrLeaseLost = errors.New("outbox: lease lost")
)
