// Package cfgcheck holds the library's configuration errors and a small
// checker that names the field a bad value is in.
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
)

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
