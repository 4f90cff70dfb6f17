package outbox

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// Limits on a message's fields.
const (
	// MaxHeaderBytes caps a message's headers, encoded as a JSON object.
	MaxHeaderBytes = 16 << 10
	// MaxKeyBytes caps the correlation id, message group and idempotency key.
	MaxKeyBytes = 255
	// DefaultMaxPayloadBytes is the largest payload a producer accepts
	// unless ProducerConfig.MaxPayloadBytes says otherwise: 1 MiB, like
	// Kafka's and NATS's default message size. A message is a row that
	// every consumer reads whole; put large documents elsewhere and send a
	// reference.
	DefaultMaxPayloadBytes = 1 << 20
	// MaxStorablePayloadBytes is the most ProducerConfig.MaxPayloadBytes
	// may be: 256 MiB less one byte, PostgreSQL's limit on a jsonb value.
	MaxStorablePayloadBytes = 1<<28 - 1
)

// Message is what a producer writes.
type Message struct {
	// Topic the message goes to (see ValidateTopic). Required.
	Topic string
	// Payload is the message body: valid JSON, at most the producer's
	// MaxPayloadBytes (default DefaultMaxPayloadBytes). Required.
	Payload json.RawMessage
	// Headers travel with the message; at most MaxHeaderBytes as JSON.
	Headers map[string]string
	// CorrelationID ties messages of one flow together. A random UUID when empty.
	CorrelationID string
	// Group is the message group: the router and ordered topics keep
	// messages of one group in order; other consumers do not.
	Group string
	// Priority (int16 range): a consumer group (a QUEUE topic's consumers
	// included) of a topic that is not ordered takes a message above 0
	// ahead of the backlog it is reading, highest first; with no backlog,
	// and on an ordered topic, it reads in commit order. Defaults to 0.
	Priority int
	// Delay makes the message available this long after the transaction's
	// start (database time). Must not be negative; exclusive with NotBefore.
	Delay time.Duration
	// NotBefore makes the message available no earlier than this time.
	NotBefore time.Time
	// IdempotencyKey, when set, makes every later Send of the same key to the
	// same topic, within the topic's IdempotencyWindow (default 24h), a no-op
	// that returns the first message's id, whether or not that message was
	// consumed since. The key is recorded by the sending transaction.
	IdempotencyKey string
}

// NewMessage returns a message for topic whose payload is v encoded as JSON.
// An invalid topic name is ErrInvalidTopic, a value JSON cannot encode
// ErrInvalidPayload.
func NewMessage[T any](topic string, v T) (Message, error) {
	if err := ValidateTopic(topic); err != nil {
		return Message{}, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return Message{}, fmt.Errorf("%w: %v", ErrInvalidPayload, err)
	}
	return Message{Topic: topic, Payload: b}, nil
}

// validate checks m, whose payload may have at most maxPayload bytes, and
// returns its headers encoded as JSON (nil for none).
func (m *Message) validate(maxPayload int) (headers []byte, err error) {
	if err := ValidateTopic(m.Topic); err != nil {
		return nil, err
	}
	if len(m.Payload) == 0 {
		return nil, fmt.Errorf("%w: topic %q: empty payload", ErrInvalidPayload, m.Topic)
	}
	if len(m.Payload) > maxPayload {
		return nil, fmt.Errorf("%w: topic %q: payload of %d bytes, at most %d allowed (ProducerConfig.MaxPayloadBytes)",
			ErrInvalidPayload, m.Topic, len(m.Payload), maxPayload)
	}
	if !json.Valid(m.Payload) {
		return nil, fmt.Errorf("%w: topic %q: payload is not valid JSON", ErrInvalidPayload, m.Topic)
	}
	if p := jsonbProblem(m.Payload); p != "" {
		return nil, fmt.Errorf("%w: topic %q: payload %s", ErrInvalidPayload, m.Topic, p)
	}
	if m.Priority < math.MinInt16 || m.Priority > math.MaxInt16 {
		return nil, fmt.Errorf("%w: priority %d outside [%d, %d]", ErrInvalidMessage, m.Priority, math.MinInt16, math.MaxInt16)
	}
	if m.Delay < 0 {
		return nil, fmt.Errorf("%w: negative delay %v", ErrInvalidMessage, m.Delay)
	}
	if m.Delay > 0 && !m.NotBefore.IsZero() {
		return nil, fmt.Errorf("%w: set Delay or NotBefore, not both", ErrInvalidMessage)
	}
	if !m.NotBefore.IsZero() && !StorableTime(m.NotBefore) {
		return nil, fmt.Errorf("%w: NotBefore %v is outside PostgreSQL's timestamp range", ErrInvalidMessage, m.NotBefore)
	}
	for _, f := range [...]struct{ name, value string }{
		{"correlation id", m.CorrelationID}, {"group", m.Group}, {"idempotency key", m.IdempotencyKey},
	} {
		if len(f.value) > MaxKeyBytes {
			return nil, fmt.Errorf("%w: %s is %d bytes, at most %d allowed", ErrInvalidMessage, f.name, len(f.value), MaxKeyBytes)
		}
		if p := textProblem(f.value); p != "" {
			return nil, fmt.Errorf("%w: %s %s", ErrInvalidMessage, f.name, p)
		}
	}
	if len(m.Headers) == 0 {
		return nil, nil // stored as NULL
	}
	for k, v := range m.Headers {
		if k == "" {
			return nil, fmt.Errorf("%w: empty header name", ErrInvalidMessage)
		}
		if p := textProblem(k); p != "" {
			return nil, fmt.Errorf("%w: header name %q %s", ErrInvalidMessage, k, p)
		}
		if p := textProblem(v); p != "" {
			return nil, fmt.Errorf("%w: header %q %s", ErrInvalidMessage, k, p)
		}
	}
	headers, err = json.Marshal(m.Headers)
	if err != nil {
		return nil, fmt.Errorf("%w: headers: %v", ErrInvalidMessage, err)
	}
	if len(headers) > MaxHeaderBytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d allowed", ErrHeadersTooLarge, len(headers), MaxHeaderBytes)
	}
	return headers, nil
}

// newCorrelationID returns a random (version 4) UUID.
func newCorrelationID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:], b[10:])
	return string(s[:])
}

// Delivery is a claimed message handed to a handler.
type Delivery struct {
	// ID is the message id.
	ID int64
	// Topic, Payload, Headers, CorrelationID, Group and Priority are as sent.
	Topic         string
	Payload       json.RawMessage
	Headers       map[string]string
	CorrelationID string
	Group         string
	Priority      int
	// Attempt counts deliveries of this message, starting at 1.
	Attempt int
	// MaxAttempts is the topic's limit: after a failed last attempt the
	// message is dead-lettered.
	MaxAttempts int
	// CreatedAt is when the message was written (database time).
	CreatedAt time.Time
	// LeaseUntil is when the claim expires and the message may be
	// redelivered; the handler's context ends shortly before.
	LeaseUntil time.Time
}

// Decode unmarshals a delivery's JSON payload into a T.
func Decode[T any](d *Delivery) (T, error) {
	var v T
	if err := json.Unmarshal(d.Payload, &v); err != nil {
		return v, fmt.Errorf("%w: message %d: %v", ErrInvalidPayload, d.ID, err)
	}
	return v, nil
}
