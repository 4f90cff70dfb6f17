package consumergroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/backoff"
)

// The heartbeat: one goroutine per instance, on the heartbeat pool (so a
// busy main pool cannot starve it), doing nothing else (slow lifecycle
// work, see janitor.go, never delays a beat). Every HeartbeatInterval
// (±10% jitter, so instances do not beat in step) it records the
// instance's liveness in database time and follows the subscription's
// state: a DEAD group comes back; a cancelled or deleted one stops the
// instance.
//
// A beat that fails is tried again soon, with a backoff that starts at a
// tenth of a second and is capped at a fifth of HeartbeatTimeout (and at
// the interval), so a short outage never lets a live group be declared
// DEAD. An instance that has not sent a heartbeat for HeartbeatTimeout
// stops fetching (see canFetch): to the others it may be DEAD already, and
// what it fetched could be delivered twice after its resurrection.

func (r *runner) heartbeat() {
	g := r.g
	failures := 0
	// Registering recorded the first beat: a beat at once could land after
	// the group was declared DEAD and bring it back unasked.
	for next := jittered(g.cfg.HeartbeatInterval); r.pause(next); {
		err := r.beat()
		if errors.Is(err, ErrSubscriptionGone) || errors.Is(err, ErrCancelled) {
			r.end(err)
			return
		}
		next = jittered(g.cfg.HeartbeatInterval)
		if err != nil {
			failures++
			next = backoff.Exponential(failures, 100*time.Millisecond, min(g.cfg.HeartbeatInterval, g.cfg.HeartbeatTimeout/5))
			if r.fetchCtx.Err() == nil {
				g.events.Log(slog.LevelError, "heartbeat-failed", "pgoutbox: heartbeat failed; trying again soon",
					slog.Int("failures", failures), slog.Duration("retry_in", next), slog.Any("error", err))
			}
			continue
		}
		if failures > 0 && !r.canFetch() {
			g.logger.Info("pgoutbox: heartbeats succeed again; this instance fetches again")
		}
		failures = 0
		r.lastBeat.Store(time.Now().UnixNano())
	}
}

// canFetch reports whether the instance sent a heartbeat within its
// HeartbeatTimeout.
func (r *runner) canFetch() bool {
	return time.Since(time.Unix(0, r.lastBeat.Load())) < r.g.cfg.HeartbeatTimeout
}

// jittered is d ±10%.
func jittered(d time.Duration) time.Duration {
	return d + time.Duration(rand.Int64N(int64(d)/5+1)) - d/10
}

// pause waits d, reporting false when the instance stops meanwhile.
func (r *runner) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.fetchCtx.Done():
		return false
	case <-t.C:
		return true
	}
}

// heartbeatArgs are the arguments of a heartbeat of subscription sub:
// the loop's beats and the one registering records are the same.
func (g *Group) heartbeatArgs(sub int64) pgx.StrictNamedArgs {
	return pgx.StrictNamedArgs{"sub": sub, "heartbeat_timeout_us": g.cfg.HeartbeatTimeout.Microseconds()}
}

// beat records liveness and reacts to the subscription's state.
func (r *runner) beat() error {
	g := r.g
	ctx, cancel := context.WithTimeout(r.fetchCtx, 10*time.Second)
	defer cancel()
	var status string
	err := r.hbPool.QueryRow(ctx, g.q.Heartbeat, g.heartbeatArgs(g.sub.ID)).Scan(&status)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: group %q on %q", ErrSubscriptionGone, g.cfg.Group, g.cfg.Topic)
	case err != nil:
		return err
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
