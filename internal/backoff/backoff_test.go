package backoff

import (
	"testing"
	"time"
)

func TestExponential(t *testing.T) {
	t.Parallel()
	for attempt, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 10: 30 * time.Second, 100: 30 * time.Second} {
		for range 200 {
			d := Exponential(attempt, time.Second, 30*time.Second)
			if d < want/2 || d > want {
				t.Fatalf("attempt %d: %v not in [%v, %v]", attempt, d, want/2, want)
			}
		}
	}
	if d := Exponential(0, 0, 0); d != 0 {
		t.Fatalf("zero config: got %v", d)
	}
}
