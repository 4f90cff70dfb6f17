package backoff

import (
	"context"
	"errors"
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

func TestRetry(t *testing.T) {
	t.Parallel()
	calls := 0
	errBoom := errors.New("boom")
	err := Retry(context.Background(), 3, time.Millisecond, time.Millisecond, nil, func() error { calls++; return errBoom })
	if !errors.Is(err, errBoom) || calls != 3 {
		t.Fatalf("3 failing attempts: err %v, calls %d", err, calls)
	}
	calls = 0
	errStop := errors.New("stop")
	err = Retry(context.Background(), 3, time.Millisecond, time.Millisecond, func(e error) bool { return errors.Is(e, errStop) },
		func() error { calls++; return errStop })
	if !errors.Is(err, errStop) || calls != 1 {
		t.Fatalf("stop error: err %v, calls %d", err, calls)
	}
	calls = 0
	err = Retry(context.Background(), 3, time.Millisecond, time.Millisecond, nil, func() error {
		if calls++; calls < 2 {
			return errBoom
		}
		return nil
	})
	if err != nil || calls != 2 {
		t.Fatalf("success on the 2nd attempt: err %v, calls %d", err, calls)
	}
}
