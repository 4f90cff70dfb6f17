package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/backoff"
	"github.com/pgoutbox/pgoutbox/internal/cfgcheck"
	"github.com/pgoutbox/pgoutbox/internal/instance"
)

// Handler handles one delivery. Returning nil acks the message. Returning
// an error retries it after the topic's backoff, or the delay given with
// RetryAfter (the instant given with RetryAt); Permanent dead-letters it at
// once; Snooze and SnoozeUntil bring it back later without spending an
// attempt. After the topic's MaxAttempts the message is dead-lettered.
//
// ctx ends when the handler's time is up (the group's HandlerTimeout, by
// default the topic's Lease), and when the consumer is stopped past its
// deadline: a handler must return when ctx is done.
type Handler func(ctx context.Context, d *Delivery) error

// RetryAfter wraps err so the message is retried after delay instead of the
// topic's backoff (it still counts as an attempt).
func RetryAfter(delay time.Duration, err error) error {
	if delay < 0 {
		delay = 0
	}
	return &retryError{delay: delay, err: err}
}

// RetryAt wraps err so the message is retried at the instant at instead
// of after the topic's backoff (it still counts as an attempt). Messages
// given one instant come back in the order they were sent.
func RetryAt(at time.Time, err error) error {
	return &retryError{delay: max(time.Until(at), 0), at: at, err: err}
}

// SnoozeUntil is Snooze to an instant: the message comes back at at
// without spending an attempt.
func SnoozeUntil(at time.Time, err error) error {
	return &retryError{delay: max(time.Until(at), 0), at: at, err: err, snooze: true}
}

// Permanent wraps err so the message is dead-lettered at once, without
// further attempts.
func Permanent(err error) error { return &permanentError{err: err} }

// Snooze makes the message come back after delay without spending an
// attempt: the handler did not try it (its destination is known to be down,
// a rate limit, a dependency not ready). err, which may be nil, is
// recorded as the message's last error.
func Snooze(delay time.Duration, err error) error {
	return &retryError{delay: max(delay, 0), err: err, snooze: true}
}

type retryError struct {
	delay  time.Duration
	at     time.Time // RetryAt, SnoozeUntil: the instant, which delay approximates
	err    error
	snooze bool // the attempt is not spent
}

func (e *retryError) Error() string {
	if e.snooze {
		return fmt.Sprintf("snoozed for %v: %v", e.delay, e.err)
	}
	return fmt.Sprintf("retry after %v: %v", e.delay, e.err)
}
func (e *retryError) Unwrap() error { return e.err }

type permanentError struct{ err error }

func (e *permanentError) Error() string { return fmt.Sprintf("permanent: %v", e.err) }
func (e *permanentError) Unwrap() error { return e.err }

// Consumer defaults.
const (
	DefaultConcurrency  = 10
	DefaultBatchSize    = 1000
	DefaultPollInterval = time.Second
)

// ConsumerConfig configures a consumer of a QUEUE topic (a member of the
// topic's consumer group: see pgoutbox.Client.NewConsumer).
type ConsumerConfig struct {
	// Topic to consume. Required; must not be a PUB_SUB topic.
	Topic string
	// Handler is called for every delivery. Required.
	Handler Handler
	// Concurrency is the most handlers running at once. Defaults to DefaultConcurrency.
	Concurrency int
	// BatchSize is the most messages the consumer leases at once (a
	// batch of the topic, or retries). It holds no more than its handlers
	// finish within about a second, at the pace their calls have taken
	// so far (and, until one call returned, no more than they can start),
	// so slow handlers leave the rest of a backlog to the consumers of
	// other processes. Defaults to DefaultBatchSize.
	BatchSize int
	// PollInterval is the longest an idle consumer waits before looking for
	// work when no notification woke it (a batch whose lease expired is
	// taken over by the next look). Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// ID names this consumer (a member of the topic's group) in leases
	// and logs. Defaults to host-pid-random.
	ID string
}

// WithDefaults returns cfg with its zero fields set to the defaults.
func (cfg ConsumerConfig) WithDefaults() ConsumerConfig {
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultPollInterval)
	if cfg.ID == "" {
		cfg.ID = instance.NewID()
	}
	return cfg
}

// Validate reports what is wrong with cfg (after WithDefaults) as an
// error wrapping ErrInvalidConfig.
func (cfg ConsumerConfig) Validate() error {
	if err := ValidateTopic(cfg.Topic); err != nil {
		return err
	}
	check := cfgcheck.New("consumer of " + strconv.Quote(cfg.Topic))
	if cfg.Handler == nil {
		check.Failf("Handler", "is nil")
	}
	check.Count("Concurrency", cfg.Concurrency, 1)
	check.Count("BatchSize", cfg.BatchSize, 1)
	check.AtLeast("PollInterval", cfg.PollInterval, time.Millisecond)
	if len(cfg.ID) > MaxKeyBytes {
		check.Failf("ID", "is longer than %d bytes", MaxKeyBytes)
	}
	return check.Err()
}

// IsSnooze reports whether err was made with Snooze, and its delay.
func IsSnooze(err error) (time.Duration, bool) {
	var r *retryError
	if errors.As(err, &r) && r.snooze {
		return r.delay, true
	}
	return 0, false
}

// RetryDelay reports the delay err carries from RetryAfter (or Snooze), if any.
func RetryDelay(err error) (time.Duration, bool) {
	var r *retryError
	if errors.As(err, &r) {
		return r.delay, true
	}
	return 0, false
}

// IsPermanent reports whether err was wrapped with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// Verdict is what becomes of a delivery whose handler failed, under its
// topic's rules (see TopicConfig.Judge).
type Verdict struct {
	// DeadLetter: the message is dead-lettered now (Permanent, or its
	// last attempt).
	DeadLetter bool
	// Snooze: the attempt is given back (Snooze).
	Snooze bool
	// Delay is how long until the message is delivered again, when it
	// is not dead-lettered: the error's RetryAfter or Snooze delay, else
	// the topic's backoff for the attempt.
	Delay time.Duration
	// At, when set (RetryAt, SnoozeUntil), is the instant the message is
	// delivered again; Delay is the time until it when the error was made.
	At time.Time
}

// Judge returns what becomes of a delivery on attempt (1 for the first)
// whose handler returned err, which is not nil. Every consumer of this
// module follows it.
func (t TopicConfig) Judge(err error, attempt int) Verdict {
	var r *retryError
	isRetry := errors.As(err, &r)
	switch {
	case isRetry && r.snooze:
		return Verdict{Snooze: true, Delay: r.delay, At: r.at}
	case IsPermanent(err), attempt >= t.MaxAttempts:
		return Verdict{DeadLetter: true}
	case isRetry:
		return Verdict{Delay: r.delay, At: r.at}
	default:
		return Verdict{Delay: backoff.Exponential(attempt, t.BackoffInitial, t.BackoffMax)}
	}
}
