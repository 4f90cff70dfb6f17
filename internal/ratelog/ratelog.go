// Package ratelog writes log records at most once per kind and subject per
// interval, and says in the next record how many it left out: a flood of
// failures costs one line a minute, not one per message.
package ratelog

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

// Log writes log records through the configured logger, at most one
// per key (what happened, and to what) per interval; the next record of a
// key says how many were left out since.
type Log struct {
	logger *slog.Logger
	every  time.Duration
	now    func() time.Time

	mu   sync.Mutex
	seen map[string]*logged
}

type logged struct {
	at         time.Time
	suppressed int
	sum        int64 // Sum's counts of the records left out
}

// New returns a Log writing through logger, at most one record per key
// every interval, by the clock now.
func New(logger *slog.Logger, every time.Duration, now func() time.Time) *Log {
	return &Log{logger: logger, every: every, now: now, seen: map[string]*logged{}}
}

// Log writes the record unless one of the same key was written within the
// interval. A key is a kind and a subject separated by "|"; past 1,024
// keys, new subjects of a kind share one budget.
func (l *Log) Log(level slog.Level, key, msg string, attrs ...slog.Attr) {
	ctx := context.Background()
	if !l.logger.Enabled(ctx, level) {
		return
	}
	suppressed, _, ok := l.allow(key, 0)
	if !ok {
		return
	}
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	l.logger.LogAttrs(ctx, level, msg, attrs...)
}

// Sum is Log for a record that counts something (messages taken over,
// say): its attribute name is n plus the counts of the records of key
// left out since the last one written, so that rate limiting loses no
// count. The counts add up even while the level is disabled.
func (l *Log) Sum(level slog.Level, key, msg, name string, n int64, attrs ...slog.Attr) {
	suppressed, sum, ok := l.allow(key, n)
	if !ok {
		return
	}
	attrs = append([]slog.Attr{slog.Int64(name, sum)}, attrs...)
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	l.logger.LogAttrs(context.Background(), level, msg, attrs...)
}

// allow reports whether a record of key may be written now, how many were
// suppressed since the last one, and n plus the counts they carried.
func (l *Log) allow(key string, n int64) (suppressed int, sum int64, ok bool) {
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
		return 0, n, true
	}
	if now.Sub(e.at) < l.every {
		e.suppressed++
		e.sum += n
		return 0, 0, false
	}
	suppressed, sum, e.at, e.suppressed, e.sum = e.suppressed, e.sum+n, now, 0, 0
	return suppressed, sum, true
}

// Prune forgets keys not logged within the interval, except those with
// records left out since (the next record says how many).
func (l *Log) Prune() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pruneLocked(l.now())
}

func (l *Log) pruneLocked(now time.Time) {
	for k, e := range l.seen {
		if now.Sub(e.at) >= l.every && e.suppressed == 0 {
			delete(l.seen, k)
		}
	}
}
