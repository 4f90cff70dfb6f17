// Package backoff computes retry delays: exponential growth with jitter.
package backoff

import (
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
