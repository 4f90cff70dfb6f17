package router

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// maxLogKeys bounds how many kinds and subjects the log limiter tells
// apart; beyond it, new subjects of a kind share one budget.
const maxLogKeys = 1024

// eventLog writes log records through the configured logger, at most one
// per key (what happened, and to what) per interval; the next record of a
// key says how many were left out since.
type eventLog struct {
	logger *slog.Logger
	every  time.Duration
	now    func() time.Time

	mu   sync.Mutex
	seen map[string]*logged
}

type logged struct {
	at         time.Time
	suppressed int
}

func newEventLog(logger *slog.Logger, every time.Duration, now func() time.Time) *eventLog {
	return &eventLog{logger: logger, every: every, now: now, seen: map[string]*logged{}}
}

// log writes the record unless one of the same key was written within the interval.
func (l *eventLog) log(level slog.Level, key, msg string, attrs ...slog.Attr) {
	ctx := context.Background()
	if !l.logger.Enabled(ctx, level) {
		return
	}
	suppressed, ok := l.allow(key)
	if !ok {
		return
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	l.logger.LogAttrs(ctx, level, msg, attrs...)
}

// allow reports whether a record of key may be written now, and how many
// were suppressed since the last one.
func (l *eventLog) allow(key string) (suppressed int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	e := l.seen[key]
	if e == nil {
		if len(l.seen) >= maxLogKeys {
			l.pruneLocked(now)
		}
		if len(l.seen) >= maxLogKeys {
			kind, _, _ := strings.Cut(key, "|")
			key = kind + "|…" // too many subjects: they share one budget
			e = l.seen[key]
		}
	}
	if e == nil {
		l.seen[key] = &logged{at: now}
		return 0, true
	}
	if now.Sub(e.at) < l.every {
		e.suppressed++
		return 0, false
	}
	suppressed, e.at, e.suppressed = e.suppressed, now, 0
	return suppressed, true
}

// prune forgets keys not logged within the interval.
func (l *eventLog) prune() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pruneLocked(l.now())
}

func (l *eventLog) pruneLocked(now time.Time) {
	for k, e := range l.seen {
		if now.Sub(e.at) >= l.every {
			delete(l.seen, k)
		}
	}
}

// levelOf is the log level of a warning's severity.
func levelOf(sev Severity) slog.Level {
	if sev == SeverityWarn {
		return slog.LevelWarn
	}
	return slog.LevelError
}
