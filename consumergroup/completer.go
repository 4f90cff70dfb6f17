package consumergroup

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/backoff"
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
)

// The completer: one goroutine per instance, writing outcomes in the order
// they come. A batch's outcome is one transaction: the batch row goes (if
// this instance still owns it), its acked messages are completed, and its
// failed and unhandled messages go to the retry table. A retry delivery's
// outcome is one statement (or a transaction with its completion).

func (r *runner) complete() {
	// The acks of retry deliveries that arrive together share one
	// transaction (an ordered group's messages all come as retry
	// deliveries).
	pipeline.Complete(r.exec.Settled(), r.window, maxAcksPerTx, r.write)
}

// write writes outcomes, in the order they came.
func (r *runner) write(pending []pipeline.Settled) {
	var acks []int64
	for _, s := range pending {
		switch {
		case s.Batch != nil:
			r.held.Finishing(s.Batch.ID)
			r.completeBatch(s.Batch)
			if r.testBatchFinished != nil {
				r.testBatchFinished(s.Batch.ID)
			}
			r.held.Remove(s.Batch.ID, 0)
		case s.Outcome == pipeline.Ack:
			acks = append(acks, s.Failure.ID)
		default:
			r.completeRetry(s.Outcome, s.Failure)
			r.held.Remove(0, s.Failure.ID)
		}
	}
	if len(acks) > 0 {
		r.ackRetries(acks)
		for _, id := range acks {
			r.held.Remove(0, id)
		}
	}
}

// maxAcksPerTx bounds how many outcomes one write takes, so how many
// retry deliveries one completion transaction acks.
const maxAcksPerTx = 256

// ackRetries ends retry deliveries that succeeded, in one statement: with
// its retry gone, a message the group's position has passed is finished
// (see sqlq's passedBy). A delivery whose lease was lost meanwhile is left
// alone (it is redelivered).
func (r *runner) ackRetries(ids []int64) {
	g := r.g
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var done int
	err := withRetry(ctx, func() error {
		rows, err := g.pool.Query(ctx, g.q.DeleteRetries, pgx.StrictNamedArgs{"sub": g.sub.ID, "message_ids": ids, "member": g.cfg.InstanceID})
		if err != nil {
			return err
		}
		held, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		done = len(held)
		return err
	})
	if err != nil {
		g.logger.Error("pgoutbox: acking retries failed; they are redelivered after their lease", slog.Int("messages", len(ids)), slog.Any("error", err))
		return
	}
	g.metrics.acked.Add(ctx, int64(done))
}

// completeBatch ends a batch: its row goes, which moves the group's
// committed position past the messages it acked (see sqlq's passedBy: no
// mode writes anything per message), and its failed messages go to the
// retry table, in one transaction. Messages a stopping instance never
// handled go back to the group at once, with their attempt given back, so
// a graceful stop redelivers nothing that was finished. A batch whose
// every message succeeded, none acked in a handler's transaction, is one
// statement, with no transaction around it.
func (r *runner) completeBatch(b *pipeline.Batch) {
	g := r.g
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acked, failed, released := b.Outcomes()
	retries := append(slices.Clip(failed), released...)
	err := withRetry(ctx, func() error {
		if len(retries) == 0 && len(b.HandledInTx()) == 0 {
			tag, err := g.pool.Exec(ctx, g.q.FinishBatch, pgx.StrictNamedArgs{"batch_id": b.ID, "member": g.cfg.InstanceID})
			if err == nil && tag.RowsAffected() == 0 {
				return errBatchLost
			}
			return err
		}
		return pgx.BeginTxFunc(ctx, g.pool, shortTx, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, g.q.FinishBatch, pgx.StrictNamedArgs{"batch_id": b.ID, "member": g.cfg.InstanceID})
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return errBatchLost
			}
			t := g.tracking()
			if len(retries) > 0 {
				if err := r.insertRetries(ctx, tx, t, retries); err != nil {
					return err
				}
			}
			if inTx := b.HandledInTx(); len(inTx) > 0 {
				// The records AckTx wrote for a takeover are not needed once
				// the batch is done.
				_, err := tx.Exec(ctx, g.q.ForgetHandled, pgx.StrictNamedArgs{"sub": g.sub.ID, "message_ids": inTx})
				return err
			}
			return nil
		})
	})
	switch {
	case errors.Is(err, errBatchLost):
		r.loggedLost(b.ID)
	case err != nil:
		g.logger.Error("pgoutbox: completing a batch failed; its messages are retried when its lease expires",
			slog.Int64("batch", b.ID), slog.Any("error", err))
	default:
		g.metrics.acked.Add(ctx, int64(len(acked)))
		g.metrics.retried.Add(ctx, int64(len(failed)))
	}
}

var errBatchLost = errors.New("batch taken over")

func (r *runner) insertRetries(ctx context.Context, tx pgx.Tx, t *tracking, fs []pipeline.Failure) error {
	n := len(fs)
	ids, attempts, delays, dead, errs := make([]int64, n), make([]int32, n), make([]int64, n), make([]bool, n), make([]string, n)
	at := make([]*time.Time, n)
	for i, f := range fs {
		ids[i], attempts[i], delays[i], dead[i], errs[i], at[i] = f.ID, int32(f.Attempts), f.Delay.Microseconds(), f.Dead, f.Err, f.DueAt()
	}
	if _, err := tx.Exec(ctx, r.g.q.InsertRetries, pgx.StrictNamedArgs{"sub": r.g.sub.ID, "message_ids": ids, "attempts": attempts,
		"delays_us": delays, "dead": dead, "now": r.g.now(), "errors": errs, "bit": t.sub.Mask(), "due_at": at}); err != nil {
		return err
	}
	if slices.Contains(dead, true) {
		_, err := tx.Exec(ctx, r.g.q.CopyDeadLetters, pgx.StrictNamedArgs{"sub": r.g.sub.ID})
		return err
	}
	return nil
}

func (r *runner) completeRetry(o pipeline.Outcome, f pipeline.Failure) {
	g := r.g
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := withRetry(ctx, func() error {
		switch o {
		case pipeline.Release:
			_, err := g.pool.Exec(ctx, g.q.SettleRetry, pgx.StrictNamedArgs{"sub": g.sub.ID, "message_id": f.ID, "member": g.cfg.InstanceID,
				"delay_us": 0, "dead": false, "error": "", "now": g.now(), "give_back": 1, "due_at": nil})
			return err
		default:
			uncount := 0
			if f.Snoozed {
				uncount = 1
			}
			err := pgx.BeginTxFunc(ctx, g.pool, shortTx, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, g.q.SettleRetry, pgx.StrictNamedArgs{"sub": g.sub.ID, "message_id": f.ID, "member": g.cfg.InstanceID,
					"delay_us": f.Delay.Microseconds(), "dead": f.Dead, "error": f.Err, "now": g.now(), "give_back": uncount,
					"due_at": f.DueAt()}); err != nil || !f.Dead {
					return err
				}
				_, err := tx.Exec(ctx, g.q.CopyDeadLetters, pgx.StrictNamedArgs{"sub": g.sub.ID}) // a dead letter keeps a copy of its message
				return err
			})
			if err == nil {
				g.metrics.retried.Add(ctx, 1)
			}
			return err
		}
	})
	if err != nil {
		g.logger.Error("pgoutbox: settling a retry failed; it is redelivered after its lease", slog.Int64("id", f.ID), slog.Any("error", err))
	}
}

// withRetry retries a completion write briefly; a batch taken over by
// another member is final.
func withRetry(ctx context.Context, f func() error) error {
	return backoff.Retry(ctx, 3, 50*time.Millisecond, time.Second,
		func(err error) bool { return errors.Is(err, errBatchLost) }, f)
}
