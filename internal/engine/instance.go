package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgoutbox/pgoutbox/internal/pipeline"
	"github.com/pgoutbox/pgoutbox/internal/ratelog"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
)

// Instance is one running consumer group instance, as the engine sees it:
// where its group's state is, who it is, and what it holds. Its fields
// are set once, before its goroutines start.
type Instance struct {
	Pool         *pgxpool.Pool // the group's: its batches, retries and messages
	Statements   *sqlq.PubSub
	Subscription int64  // the group's subscription id
	ID           string // the instance's id, which its leases name
	// Now is the time the statements take as now: nil, the server's
	// (a test's clock otherwise).
	Now    func() *time.Time
	Logger *slog.Logger
	Events *ratelog.Log   // records the engine rate-limits (a lease lost)
	Held   *pipeline.Held // the leases the instance works on

	// Mask is the group's completion bit, as its tracking has it now
	// (0: the group has none).
	Mask func() int64
	// Acked and Retried count the messages the instance completed, and
	// those it parked for a retry or dead-lettered.
	Acked, Retried func(ctx context.Context, n int64)
	// BatchFinished, when set (tests), is called after a batch's outcome
	// was written and before it leaves Held.
	BatchFinished func(batchID int64)
}

// ReportLost logs that a batch the instance worked on was taken over by
// another (its lease expired: this instance froze, or lost its database),
// once a batch (the lease keeper and the completer may both find it), at
// most once per the client's log interval, the next record counting
// those left out: an instance that resumes after a long pause loses its
// batches all at once.
func (in *Instance) ReportLost(batchID int64) {
	if !in.Held.ReportLost(batchID) {
		return
	}
	in.Events.Sum(slog.LevelWarn, "lease-lost", "pgoutbox: batches this instance worked on were taken over by another (their lease expired, or this instance's database session ended: it froze, or lost its database); what it did with their messages is not recorded, and they are retried",
		"batches", 1, slog.Int64("batch", batchID))
}
