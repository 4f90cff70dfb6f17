// Package cfgcheck holds the sentinel errors every package of the library
// shares (each package's ErrInvalidConfig, ErrAlreadyStarted and
// ErrNotFound is one of these) and a small checker that names the field a
// bad value is in.
package cfgcheck

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrInvalidConfig: a configuration value is missing, unknown or out of
	// range. Every package's ErrInvalidConfig is this one.
	ErrInvalidConfig = errors.New("pgoutbox: invalid configuration")
	// ErrAlreadyStarted: Start on something that already started. Every
	// package's "already started" error is this one.
	ErrAlreadyStarted = errors.New("pgoutbox: already started")
	// ErrNotFound: no such topic, group, subscription, member, source or
	// message. Every package's "not found" error is this one, or one made
	// by NotFound.
	ErrNotFound = errors.New("outbox: not found")
)

// NotFound returns a sentinel of its own, with message msg, that also
// matches ErrNotFound: a package can name what was not found (an unknown
// topic, member, source) while callers branch on ErrNotFound alone.
func NotFound(msg string) error { return &kind{msg, ErrNotFound} }

// Invalid returns a sentinel of its own, with message msg, that also
// matches ErrInvalidConfig.
func Invalid(msg string) error { return &kind{msg, ErrInvalidConfig} }

// kind is a sentinel that is also an instance of a broader one.
type kind struct {
	msg   string
	broad error
}

func (e *kind) Error() string { return e.msg }
func (e *kind) Unwrap() error { return e.broad }

// Checker keeps the first bad value it was shown. Its methods check a
// value already defaulted: zero has been replaced where zero means "the
// default", so what is left out of range was given by the caller.
type Checker struct {
	owner string // names what is configured: "router", "consumer of \"jobs\""
	err   error
}

// New returns a checker for the configuration of owner.
func New(owner string) *Checker { return &Checker{owner: owner} }

// Failf records a failure of field, unless one was recorded before.
func (c *Checker) Failf(field, format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("%w: %s: %s %s", ErrInvalidConfig, c.owner, field, fmt.Sprintf(format, args...))
	}
}

// NotNegative checks a duration where zero is allowed (it disables
// something, or meant the default).
func (c *Checker) NotNegative(field string, d time.Duration) {
	if d < 0 {
		c.Failf(field, "is negative (%v)", d)
	}
}

// Positive checks a duration that must be above zero.
func (c *Checker) Positive(field string, d time.Duration) {
	if d <= 0 {
		c.Failf(field, "must be positive (got %v)", d)
	}
}

// AtLeast checks that a duration is at least least.
func (c *Checker) AtLeast(field string, d, least time.Duration) {
	if d < least {
		c.Failf(field, "must be at least %v (got %v)", least, d)
	}
}

// Count checks that a count is at least least.
func (c *Checker) Count(field string, n, least int) {
	if n < least {
		c.Failf(field, "must be at least %d (got %d)", least, n)
	}
}

// Err returns the first failure recorded, or nil.
func (c *Checker) Err() error { return c.err }
