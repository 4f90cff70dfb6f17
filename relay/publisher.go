package relay

import (
	"context"
	"errors"
	"time"
)

// Message is one outbox message as a Publisher receives it.
type Message struct {
	// ID is the message's id in the outbox.
	ID int64
	// DedupID is the same for every publish of the message, by any relay
	// instance: the broker's idempotence key (JetStream's Nats-Msg-Id),
	// which makes a republish after a crash store nothing new.
	DedupID string
	// Subject is where the message goes, rendered from Config.Subject.
	Subject string
	// Key is the message's message group (outbox.Message.Group) on an
	// ordered topic, "" for none (and on a topic that is not ordered,
	// where no order is kept). Messages with the same Key are stored in
	// the order given.
	Key string
	// Headers are the message's headers as sent, with the trace context
	// and the relay's own headers (HeaderTopic and the rest) added.
	Headers map[string]string
	// Payload is the message's payload as sent.
	Payload []byte
	// CreatedAt is when the message was written (database time).
	CreatedAt time.Time
}

// Publisher stores messages in a broker. natsrelay.JetStreamPublisher is
// the one pgoutbox provides; anything that implements this contract can
// stand in for it (Kafka with franz-go, say: see the package
// documentation).
type Publisher interface {
	// Publish stores msgs and returns one result per message, in the
	// same order, once each is known: nil when the broker confirmed the
	// message is stored (or already was, as a duplicate of an earlier
	// publish of it). Messages with the same Key are stored in the order
	// of msgs, and none is stored after one of its Key that was not: those
	// get an error too (ErrHeldBack). An error that wraps ErrRejected
	// says the broker refuses the message itself (it is dead-lettered);
	// one that wraps ErrMisconfigured says the destination is missing or
	// not permitted (retried, and logged as an error); any other is
	// transient (retried). Publish returns when ctx ends, with an error
	// for each message not yet confirmed.
	Publish(ctx context.Context, msgs []Message) []error
}

// PublisherFunc is a function that is a Publisher: a test's stand-in, or a
// wrapper around another Publisher.
type PublisherFunc func(ctx context.Context, msgs []Message) []error

// Publish calls f.
func (f PublisherFunc) Publish(ctx context.Context, msgs []Message) []error { return f(ctx, msgs) }

// Errors a Publisher reports, classified by what the relay does next.
var (
	// ErrRejected: the broker refuses the message for itself (it is too
	// big, say). The relay dead-letters it with the reason.
	ErrRejected = errors.New("relay: message rejected by the broker")
	// ErrMisconfigured: the destination is missing or not permitted (no
	// stream captures the subject, a permission is missing). The relay
	// retries with backoff, logs an error and counts it; nothing is
	// dead-lettered for it.
	ErrMisconfigured = errors.New("relay: destination missing or not permitted")
	// ErrHeldBack: the message was not published because an earlier
	// message with its Key was not stored.
	ErrHeldBack = errors.New("relay: held back behind an earlier message of its message group")
)

// Headers the relay adds to every message it publishes.
const (
	// HeaderTopic is the outbox topic the message was sent to.
	HeaderTopic = "Pgoutbox-Topic"
	// HeaderID is the message's outbox id.
	HeaderID = "Pgoutbox-Id"
	// HeaderMessageGroup is the message's message group, when it has one.
	HeaderMessageGroup = "Pgoutbox-Message-Group"
	// HeaderCorrelationID is the message's correlation id, when it has one.
	HeaderCorrelationID = "Pgoutbox-Correlation-Id"
	// HeaderCreatedAt is when the message was written, in RFC 3339 with
	// nanoseconds.
	HeaderCreatedAt = "Pgoutbox-Created-At"
)
