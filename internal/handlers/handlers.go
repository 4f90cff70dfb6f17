// Package handlers calls user handlers the way every consumer does: a
// panic becomes an error, and failures are logged at most once a
// LogInterval per kind and topic or group.
package handlers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/pgoutbox/pgoutbox/internal/ratelog"
)

// Panic is a handler's panic, recovered.
type Panic struct {
	Value any
	Stack string
}

func (p *Panic) Error() string { return fmt.Sprintf("handler panic: %v", p.Value) }

// Call calls h with d and turns a panic into a *Panic error.
func Call[D any](ctx context.Context, h func(context.Context, D) error, d D) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &Panic{Value: p, Stack: string(debug.Stack())}
		}
	}()
	return h(ctx, d)
}

// LogFailure logs a failed handler call through events, which keys it by
// kind (a panic, a dead letter, a failure to retry) and subject (the topic,
// or topic and group): a flood of failures makes one record per kind and
// subject per interval, the next one counting those left out.
func LogFailure(events *ratelog.Log, subject string, err error, deadLettered bool, attrs ...slog.Attr) {
	attrs = append(attrs, slog.Bool("dead_lettered", deadLettered))
	var p *Panic
	switch {
	case errors.As(err, &p):
		events.Log(slog.LevelError, "handler-panic|"+subject, "pgoutbox: handler panicked",
			append(attrs, slog.Any("panic", p.Value), slog.String("stack", p.Stack))...)
	case deadLettered:
		events.Log(slog.LevelWarn, "dead-letter|"+subject, "pgoutbox: handler failed; message dead-lettered",
			append(attrs, slog.Any("error", err))...)
	default:
		events.Log(slog.LevelWarn, "handler-failed|"+subject, "pgoutbox: handler failed; message retried later",
			append(attrs, slog.Any("error", err))...)
	}
}
