package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
)

// The heartbeat: one goroutine per instance, on the heartbeat pool (so a
// busy main pool cannot starve it). Every HeartbeatInterval (±10%
// jitter, so instances do not beat in step) it records the instance's
// liveness in database time, follows the subscription's state (a DEAD
// group comes back; a cancelled or deleted one stops the instance), marks
// other groups of the topic whose heartbeats stopped as DEAD, forgets
// groups that left, and deletes expired idempotency keys.

func (r *runner) heartbeat() {
	defer r.fetchWG.Done()
	g := r.g
	for {
		if err := r.beat(); errors.Is(err, ErrSubscriptionGone) || errors.Is(err, ErrCancelled) {
			r.end(err)
			return
		}
		g.detectDead(r.fetchCtx, r.hbPool)
		g.forgetPending(r.fetchCtx, r.hbPool)
		r.expireIdempotencyKeys()
		jitter := time.Duration(rand.Int64N(int64(g.cfg.HeartbeatInterval)/5+1)) - g.cfg.HeartbeatInterval/10
		select {
		case <-r.fetchCtx.Done():
			return
		case <-time.After(g.cfg.HeartbeatInterval + jitter):
		}
	}
}

// beat records liveness and reacts to the subscription's state.
func (r *runner) beat() error {
	g := r.g
	ctx, cancel := context.WithTimeout(r.fetchCtx, 10*time.Second)
	defer cancel()
	var status string
	err := r.hbPool.QueryRow(ctx, g.q.Heartbeat, g.sub.ID, g.cfg.HeartbeatTimeout.Microseconds()).Scan(&status)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: group %q on %q", ErrSubscriptionGone, g.cfg.Group, g.cfg.Topic)
	case err != nil:
		if r.fetchCtx.Err() == nil {
			g.logger.Error("pgoutbox: heartbeat failed", slog.Any("error", err))
		}
		return nil
	}
	switch State(status) {
	case Cancelled:
		return fmt.Errorf("%w: group %q on %q", ErrCancelled, g.cfg.Group, g.cfg.Topic)
	case Dead:
		if err := g.resurrect(ctx, g.opts); err != nil && r.fetchCtx.Err() == nil {
			g.logger.Error("pgoutbox: bringing the group back from DEAD failed; the next heartbeat tries again", slog.Any("error", err))
		}
	}
	return nil
}

func (r *runner) expireIdempotencyKeys() {
	ctx, cancel := context.WithTimeout(r.fetchCtx, 10*time.Second)
	defer cancel()
	if _, err := r.g.client.ExpireIdempotencyKeys(ctx); err != nil && r.fetchCtx.Err() == nil {
		r.g.logger.Error("pgoutbox: deleting expired idempotency keys failed", slog.Any("error", err))
	}
}
