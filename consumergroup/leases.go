package consumergroup

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// The lease keeper: one goroutine per instance. Every third of the topic's
// Lease it extends, in one statement, the leases of the batches and retry
// deliveries that this instance still works on (held), so a message's
// lease runs out only when its instance stopped working on it: it crashed,
// froze, or lost its database connection. A lease it could not extend was
// taken over meanwhile; the outcome of that work will not be recorded, and
// the messages are retried.

func (r *runner) keepLeases() {
	g := r.g
	t := time.NewTicker(max(g.topic.Lease/3, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-r.keepCtx.Done():
			return
		case <-t.C:
		}
		r.extendLeases()
	}
}

func (r *runner) extendLeases() {
	g := r.g
	batches, retries := r.held.Snapshot()
	if len(batches)+len(retries) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.topic.Lease/3)
	defer cancel()
	rows, err := r.hbPool.Query(ctx, g.q.ExtendLeases, pgx.StrictNamedArgs{"sub": g.sub.ID, "member": g.cfg.InstanceID,
		"batch_ids": batches, "retry_ids": retries, "now": g.now(), "lease_us": g.topic.Lease.Microseconds()})
	if err != nil {
		g.logger.Error("pgoutbox: extending leases failed", slog.Any("error", err))
		return
	}
	kept := map[string]map[int64]bool{"batch": {}, "retry": {}}
	var kind string
	var id int64
	if _, err := pgx.ForEachRow(rows, []any{&kind, &id}, func() error { kept[kind][id] = true; return nil }); err != nil {
		g.logger.Error("pgoutbox: extending leases failed", slog.Any("error", err))
		return
	}
	for _, b := range batches {
		// A batch the completer began to finish is gone because it
		// finished (a takeover, the completer reports itself).
		if !kept["batch"][b] && r.held.WorkingOn(b) {
			r.loggedLost(b)
		}
	}
}

// loggedLost logs that a batch this instance worked on was taken over by
// another (its lease expired: this instance froze, or lost its database),
// once a batch (the lease keeper and the completer may both find it), at
// most once per LogInterval, the next record counting those left out: an
// instance that resumes after a long pause loses its batches all at once.
func (r *runner) loggedLost(batchID int64) {
	if !r.held.ReportLost(batchID) {
		return
	}
	r.g.events.Sum(slog.LevelWarn, "lease-lost", "pgoutbox: batches this instance worked on were taken over by another (their lease expired, or this instance's database session ended: it froze, or lost its database); what it did with their messages is not recorded, and they are retried",
		"batches", 1, slog.Int64("batch", batchID))
}
