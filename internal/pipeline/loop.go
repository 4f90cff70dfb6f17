package pipeline

import (
	"context"
	"log/slog"
	"time"

	"github.com/pgoutbox/pgoutbox/internal/backoff"
)

// Found is what one look for work found.
type Found struct {
	// Claimed is how many messages the look handed to the workers.
	Claimed int
	// More reports that more work may be waiting: look again at once.
	More bool
	// Retry, when positive, is when to look next, whatever else happens
	// (another instance is claiming, the group is paused); it leaves the
	// follow-up delay as it was.
	Retry time.Duration
	// Within, when positive, bounds the wait before the next look (a
	// throttled read that will be allowed then).
	Within time.Duration
	// Done ends the loop: the run is over.
	Done bool
}

// Loop is a pipeline's fetch step. Its fields are set before Run and not
// changed after.
type Loop struct {
	// Window bounds what the consumer holds and says when a claim is due.
	Window *Window
	// Wake receives a value when a producer committed to the topic.
	Wake <-chan struct{}
	// PollInterval is the longest wait between looks, and the longest
	// backoff after failed ones.
	PollInterval time.Duration
	// Waiting is how many claimed messages wait for a worker.
	Waiting func() int
	// Idle is how many workers have nothing to do; nil counts one.
	Idle func() int
	// Look claims at most limit messages and hands them to the workers.
	// notified reports that a producer's notification came since the
	// previous look. Look's statements must not be cut off by the end of
	// Run's context: a claim cut off after the database committed it
	// would leave its messages leased until the lease expires.
	Look func(limit int, notified bool) (Found, error)
	// Logger receives failed looks.
	Logger *slog.Logger
}

// maxQuiet caps the follow-up delay's doublings (1ms<<30 is far above any
// poll interval).
const maxQuiet = 30

// Run looks for work until ctx ends or a look reports Done.
//
// Producers notify at most once per notify interval, so a message
// committed just after a look that found work may come with no
// notification of its own: after a look that found work the next comes
// after 1ms, then 2ms, 4ms, ... up to PollInterval while looks find
// nothing.
func (l *Loop) Run(ctx context.Context) {
	timer := time.NewTimer(l.PollInterval)
	defer timer.Stop()
	failures, quiet := 0, maxQuiet
	notified := false
	wait := func(d time.Duration) {
		timer.Reset(d)
		select {
		case <-ctx.Done():
		case <-l.Wake:
			notified = true
		case <-l.Window.Room():
		case <-timer.C:
		}
	}
	for ctx.Err() == nil {
		idle := 1
		if l.Idle != nil {
			idle = l.Idle()
		}
		limit := l.Window.Next(l.Waiting(), idle)
		if limit == 0 {
			select {
			case <-ctx.Done():
			case <-l.Window.Room():
			}
			continue
		}
		found, err := l.Look(limit, notified)
		notified = false
		if err != nil {
			failures++
			delay := min(backoff.Exponential(failures, 10*time.Millisecond, l.PollInterval), l.PollInterval)
			if ctx.Err() == nil {
				l.Logger.Error("pgoutbox: claiming messages failed", slog.Any("error", err), slog.Duration("retry_in", delay))
			}
			// Only the backoff ends this wait: notifications and freed
			// room must not turn a failing database into a busy loop.
			timer.Reset(delay)
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
			continue
		}
		failures = 0
		switch {
		case found.Done:
			return
		case found.Retry > 0:
			wait(found.Retry)
			continue
		case found.More:
			quiet = 0
			continue
		case found.Claimed > 0:
			quiet = 0
		case quiet < maxQuiet:
			quiet++
		}
		d := min(l.PollInterval, time.Millisecond<<quiet)
		if found.Within > 0 {
			d = min(d, found.Within)
		}
		wait(d)
	}
}
