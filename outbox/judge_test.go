package outbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/pgoutbox/pgoutbox/outbox"
)

func TestJudge(t *testing.T) {
	topic := outbox.TopicConfig{MaxAttempts: 3, BackoffInitial: time.Second, BackoffMax: time.Minute}
	boom := errors.New("boom")
	cases := []struct {
		name    string
		err     error
		attempt int
		want    outbox.Verdict
	}{
		{"snooze on the last attempt", outbox.Snooze(time.Minute, boom), 3, outbox.Verdict{Snooze: true, Delay: time.Minute}},
		{"permanent on the first", outbox.Permanent(boom), 1, outbox.Verdict{DeadLetter: true}},
		{"last attempt", boom, 3, outbox.Verdict{DeadLetter: true}},
		{"RetryAfter on the last attempt", outbox.RetryAfter(time.Hour, boom), 3, outbox.Verdict{DeadLetter: true}},
		{"RetryAfter", outbox.RetryAfter(time.Hour, boom), 1, outbox.Verdict{Delay: time.Hour}},
	}
	for _, c := range cases {
		if got := topic.Judge(c.err, c.attempt); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	// The backoff: half to all of BackoffInitial doubled per attempt.
	v := topic.Judge(boom, 2)
	if v.DeadLetter || v.Snooze || v.Delay < time.Second || v.Delay > 2*time.Second {
		t.Errorf("second attempt: %+v, want a retry after 1s to 2s", v)
	}
}
