// Package backoff computes retry delays: exponential growth with jitter.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Exponential returns the delay before retry number attempt (1 for the
// first retry): initial·2^(attempt-1), capped at max, then drawn uniformly
// from the upper half of that ("equal jitter"), so concurrent failures
// spread out but a retry never comes much earlier than planned.
func Exponential(attempt int, initial, max time.Duration) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := initial
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max || d <= 0 {
		d = max
	}
	half := d / 2
	if half <= 0 {
		return d
	}
	return half + rand.N(d-half+1)
}

// Retry calls f up to attempts times, waiting Exponential(n, initial, max)
// after the n-th failure, until f succeeds, stop(err) reports an error not
// worth retrying, or ctx ends. It returns f's last error.
func Retry(ctx context.Context, attempts int, initial, max time.Duration, stop func(error) bool, f func() error) error {
	var err error
	for n := 1; n <= attempts; n++ {
		if err = f(); err == nil || (stop != nil && stop(err)) || n == attempts {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(Exponential(n, initial, max)):
		}
	}
	return err
}
