package engine

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/backoff"
	"github.com/pgoutbox/pgoutbox/internal/pipeline"
	"github.com/pgoutbox/pgoutbox/internal/sqlq"
)

// The complete step's writes. A batch's outcome is one transaction: the
// batch row goes (if this instance still owns it), its acked messages are
// completed, and its failed and unhandled messages go to the retry table.
// A retry delivery's outcome is one statement (or a transaction with its
// completion); the acks of retry deliveries that arrive together share
// one (an ordered group's messages all come as retry deliveries).

// MaxOutcomesPerWrite bounds how many outcomes one Write takes (see
// pipeline.Complete), so how many retry deliveries one completion
// transaction acks.
const MaxOutcomesPerWrite = 256

// Write writes outcomes, in the order they came.
func (in *Instance) Write(pending []pipeline.Settled) {
	var acks []int64
	for _, s := range pending {
		switch {
		case s.Batch != nil:
			in.Held.Finishing(s.Batch.ID)
			in.completeBatch(s.Batch)
			if in.BatchFinished != nil {
				in.BatchFinished(s.Batch.ID)
			}
			in.Held.Remove(s.Batch.ID, 0)
		case s.Outcome == pipeline.Ack:
			acks = append(acks, s.Failure.ID)
		default:
			in.completeRetry(s.Outcome, s.Failure)
			in.Held.Remove(0, s.Failure.ID)
		}
	}
	if len(acks) > 0 {
		in.ackRetries(acks)
		for _, id := range acks {
			in.Held.Remove(0, id)
		}
	}
}

// ackRetries ends retry deliveries that succeeded, in one statement: with
// its retry gone, a message the group's position has passed is finished
// (see sqlq's passedBy). A delivery whose lease was lost meanwhile is left
// alone (it is redelivered).
func (in *Instance) ackRetries(ids []int64) {
	q := in.Statements
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var done int
	err := withRetry(ctx, func() error {
		rows, err := in.Pool.Query(ctx, q.DeleteRetries.Numbered, q.DeleteRetries.Bind(sqlq.Args{"sub": in.Subscription, "message_ids": ids, "member": in.ID})...)
		if err != nil {
			return err
		}
		held, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		done = len(held)
		return err
	})
	if err != nil {
		in.Logger.Error("pgoutbox: acking retries failed; they are redelivered after their lease", slog.Int("messages", len(ids)), slog.Any("error", err))
		return
	}
	in.Acked(ctx, int64(done))
}

// completeBatch ends a batch: its row goes, which moves the group's
// committed position past the messages it acked (see sqlq's passedBy: no
// mode writes anything per message), and its failed messages go to the
// retry table, in one transaction. Messages a stopping instance never
// handled go back to the group at once, with their attempt given back, so
// a graceful stop redelivers nothing that was finished. A batch whose
// every message succeeded, none acked in a handler's transaction, is one
// statement, with no transaction around it.
func (in *Instance) completeBatch(b *pipeline.Batch) {
	q := in.Statements
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acked, failed, released := b.Outcomes()
	retries := append(slices.Clip(failed), released...)
	finish := q.FinishBatch.Bind(sqlq.Args{"batch_id": b.ID, "member": in.ID})
	err := withRetry(ctx, func() error {
		if len(retries) == 0 && len(b.HandledInTx()) == 0 {
			tag, err := in.Pool.Exec(ctx, q.FinishBatch.Numbered, finish...)
			if err == nil && tag.RowsAffected() == 0 {
				return errBatchLost
			}
			return err
		}
		return pgx.BeginTxFunc(ctx, in.Pool, sqlq.ShortTx, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, q.FinishBatch.Numbered, finish...)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return errBatchLost
			}
			if len(retries) > 0 {
				if err := in.insertRetries(ctx, tx, retries); err != nil {
					return err
				}
			}
			if inTx := b.HandledInTx(); len(inTx) > 0 {
				// The records AckTx wrote for a takeover are not needed once
				// the batch is done.
				_, err := tx.Exec(ctx, q.ForgetHandled.Numbered, q.ForgetHandled.Bind(sqlq.Args{"sub": in.Subscription, "message_ids": inTx})...)
				return err
			}
			return nil
		})
	})
	switch {
	case errors.Is(err, errBatchLost):
		in.ReportLost(b.ID)
	case err != nil:
		in.Logger.Error("pgoutbox: completing a batch failed; its messages are retried when its lease expires",
			slog.Int64("batch", b.ID), slog.Any("error", err))
	default:
		in.Acked(ctx, int64(len(acked)))
		in.Retried(ctx, int64(len(failed)))
	}
}

// errBatchLost: the batch was taken over by another instance.
var errBatchLost = errors.New("batch taken over")

// insertRetries parks a batch's failed and unhandled messages in the
// group's retry table, in tx; a dead letter keeps a copy of its message.
func (in *Instance) insertRetries(ctx context.Context, tx pgx.Tx, fs []pipeline.Failure) error {
	n := len(fs)
	ids, attempts, delays, dead, errs := make([]int64, n), make([]int32, n), make([]int64, n), make([]bool, n), make([]string, n)
	at := make([]*time.Time, n)
	for i, f := range fs {
		ids[i], attempts[i], delays[i], dead[i], errs[i], at[i] = f.ID, int32(f.Attempts), f.Delay.Microseconds(), f.Dead, f.Err, f.DueAt()
	}
	if _, err := tx.Exec(ctx, in.Statements.InsertRetries.Numbered, in.Statements.InsertRetries.Bind(sqlq.Args{"sub": in.Subscription, "message_ids": ids, "attempts": attempts,
		"delays_us": delays, "dead": dead, "now": in.Now(), "errors": errs, "bit": in.Mask(), "due_at": at})...); err != nil {
		return err
	}
	if slices.Contains(dead, true) {
		_, err := tx.Exec(ctx, in.Statements.CopyDeadLetters.Numbered, in.Statements.CopyDeadLetters.Bind(sqlq.Args{"sub": in.Subscription})...)
		return err
	}
	return nil
}

// completeRetry settles a retry delivery that did not succeed: released
// (its attempt given back), or failed (a retry after its delay, or a dead
// letter with a copy of its message).
func (in *Instance) completeRetry(o pipeline.Outcome, f pipeline.Failure) {
	q := in.Statements
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := withRetry(ctx, func() error {
		if o == pipeline.Release {
			_, err := in.Pool.Exec(ctx, q.SettleRetry.Numbered, q.SettleRetry.Bind(sqlq.Args{"sub": in.Subscription, "message_id": f.ID, "member": in.ID,
				"delay_us": 0, "dead": false, "error": "", "now": in.Now(), "give_back": 1, "due_at": nil})...)
			return err
		}
		giveBack := 0
		if f.Snoozed {
			giveBack = 1
		}
		err := pgx.BeginTxFunc(ctx, in.Pool, sqlq.ShortTx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, q.SettleRetry.Numbered, q.SettleRetry.Bind(sqlq.Args{"sub": in.Subscription, "message_id": f.ID, "member": in.ID,
				"delay_us": f.Delay.Microseconds(), "dead": f.Dead, "error": f.Err, "now": in.Now(), "give_back": giveBack,
				"due_at": f.DueAt()})...); err != nil || !f.Dead {
				return err
			}
			_, err := tx.Exec(ctx, q.CopyDeadLetters.Numbered, q.CopyDeadLetters.Bind(sqlq.Args{"sub": in.Subscription})...) // a dead letter keeps a copy of its message
			return err
		})
		if err == nil {
			in.Retried(ctx, 1)
		}
		return err
	})
	if err != nil {
		in.Logger.Error("pgoutbox: settling a retry failed; it is redelivered after its lease", slog.Int64("id", f.ID), slog.Any("error", err))
	}
}

// withRetry retries a completion write briefly; a batch taken over by
// another member is final.
func withRetry(ctx context.Context, f func() error) error {
	return backoff.Retry(ctx, 3, 50*time.Millisecond, time.Second,
		func(err error) bool { return errors.Is(err, errBatchLost) }, f)
}
