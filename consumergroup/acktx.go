package consumergroup

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/pipeline"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// AckTx records message d as handled by the group inside tx, the caller's
// transaction that holds the handler's own writes: they and the group's
// completion commit together, or neither does. So a handler whose effects
// are writes to this database has them exactly once, whatever crashes,
// lease expiries or redeliveries happen around it.
//
// Call it from the handler d was given to, last in tx, just before the
// commit, and return nil after the commit (or the error, after a
// rollback). It checks that this instance still holds d's lease: a batch
// or retry taken over by another instance since (the lease ran out) makes
// it return outbox.ErrLeaseLost, and the caller must roll tx back so that
// only the redelivery's effects remain. From then until tx ends it holds
// the lease's row locked: a takeover, and the reaping or renewal of a
// retry delivery's lease, pass over it.
//
// What it writes, in every tracking mode: a record of the message beside
// it (no mode records anything per message otherwise; the record is
// deleted when the message's batch completes, or with the message), so
// that a takeover of its batch, or a failure recorded after it, skips it.
// A message delivered as a retry (and every message of an ordered group)
// has its retry row deleted instead, in tx.
//
// d must be a delivery this Group value handed to its handler, not yet
// returned: otherwise AckTx returns outbox.ErrLeaseLost too.
//
// tx must be READ COMMITTED (PostgreSQL's default): under REPEATABLE READ
// or SERIALIZABLE the lease keeper's renewals and other groups'
// completions make it fail with serialization errors. From AckTx on, tx
// may sit idle for at most 10 s (idle_in_transaction_session_timeout, as
// the group's own transactions): a process frozen before its commit then
// loses its connection and its locks rather than holding the group up. A
// handler acking several messages in one transaction (a BatchHandler)
// acks them in ascending id order, as every completion locks rows.
func (g *Group) AckTx(ctx context.Context, tx pgx.Tx, d *outbox.Delivery) error {
	if tx == nil {
		return fmt.Errorf("%w: AckTx of message %d", outbox.ErrNilExecutor, d.ID)
	}
	g.mu.Lock()
	r := g.run
	g.mu.Unlock()
	var j *pipeline.Job
	if r != nil {
		j = r.exec.HandedOut(d)
	}
	if j == nil {
		return fmt.Errorf("%w: message %d is not being handled by this instance", outbox.ErrLeaseLost, d.ID)
	}
	if j.Batch == nil {
		tag, err := tx.Exec(ctx, g.q.TakeRetry.Numbered, g.q.TakeRetry.Bind(sqlq.Args{"sub": g.sub.ID, "message_id": d.ID,
			"member": g.cfg.InstanceID, "attempt": d.Attempt})...)
		if err != nil {
			return fmt.Errorf("consumergroup: ack: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("%w: message %d attempt %d", outbox.ErrLeaseLost, d.ID, d.Attempt)
		}
		return nil // its retry gone, the message is finished (see sqlq's passedBy)
	}
	tag, err := tx.Exec(ctx, g.q.HoldBatch.Numbered, g.q.HoldBatch.Bind(sqlq.Args{"batch_id": j.Batch.ID, "member": g.cfg.InstanceID})...)
	if err != nil {
		return fmt.Errorf("consumergroup: ack: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: message %d: its batch was taken over", outbox.ErrLeaseLost, d.ID)
	}
	// Recorded, so that the batch, read again after a takeover, skips
	// the message, and a failure written after this skips it too; the
	// record goes with the batch.
	if _, err := tx.Exec(ctx, g.q.RecordHandled.Numbered, g.q.RecordHandled.Bind(sqlq.Args{"sub": g.sub.ID, "message_id": d.ID})...); err != nil {
		return fmt.Errorf("consumergroup: ack: %w", err)
	}
	j.Batch.AckedInTx(d.ID)
	return nil
}
