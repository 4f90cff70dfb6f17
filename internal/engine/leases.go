package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
)

// The lease keeper: one goroutine per instance. Every third of the topic's
// lease it extends, in one statement, the leases of the batches and retry
// deliveries that the instance still works on (Held), so a message's
// lease runs out only when its instance stopped working on it: it crashed,
// froze, or lost its database connection. A lease it could not extend was
// taken over meanwhile; the outcome of that work will not be recorded, and
// the messages are retried.

// KeepLeases extends the instance's leases (see ExtendLeases) every third
// of lease, on pool (the instance's heartbeat pool, so that a busy main
// pool does not let them run out), until ctx ends.
func (in *Instance) KeepLeases(ctx context.Context, pool *pgxpool.Pool, lease time.Duration) {
	t := time.NewTicker(max(lease/3, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		in.ExtendLeases(pool, lease)
	}
}

// ExtendLeases extends, once, the leases of what the instance works on to
// lease from now, and reports the batches among them that were taken
// over (see ReportLost).
func (in *Instance) ExtendLeases(pool *pgxpool.Pool, lease time.Duration) {
	batches, retries := in.Held.Snapshot()
	if len(batches)+len(retries) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), lease/3)
	defer cancel()
	rows, err := pool.Query(ctx, in.Statements.ExtendLeases.Numbered, in.Statements.ExtendLeases.Bind(sqlq.Args{"sub": in.Subscription, "member": in.ID,
		"batch_ids": batches, "retry_ids": retries, "now": in.Now(), "lease_us": lease.Microseconds()})...)
	if err != nil {
		in.Logger.Error("pgoutbox: extending leases failed", slog.Any("error", err))
		return
	}
	kept := map[string]map[int64]bool{"batch": {}, "retry": {}}
	var kind string
	var id int64
	if _, err := pgx.ForEachRow(rows, []any{&kind, &id}, func() error { kept[kind][id] = true; return nil }); err != nil {
		in.Logger.Error("pgoutbox: extending leases failed", slog.Any("error", err))
		return
	}
	for _, b := range batches {
		// A batch the completer began to finish is gone because it
		// finished (a takeover, the completer reports itself).
		if !kept["batch"][b] && in.Held.WorkingOn(b) {
			in.ReportLost(b)
		}
	}
}
