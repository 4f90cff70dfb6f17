package consumergroup

import (
	"context"
	"log/slog"
	"time"
)

// The janitor: one goroutine per instance, on the heartbeat pool. Every
// HeartbeatInterval (jittered) it marks groups of the topic whose
// heartbeats stopped as DEAD, forgets groups that left (in batches, which
// can take long on a big topic: that is why it is not the heartbeat's
// job), and deletes expired idempotency keys.

func (r *runner) janitor() {
	g := r.g
	for {
		g.detectDead(r.fetchCtx, r.hbPool)
		g.forgetPending(r.fetchCtx, r.hbPool)
		r.expireIdempotencyKeys()
		if !r.pause(jittered(g.cfg.HeartbeatInterval)) {
			return
		}
	}
}

func (r *runner) expireIdempotencyKeys() {
	ctx, cancel := context.WithTimeout(r.fetchCtx, 10*time.Second)
	defer cancel()
	if _, err := r.g.client.ExpireIdempotencyKeys(ctx); err != nil && r.fetchCtx.Err() == nil {
		r.g.logger.Error("pgoutbox: deleting expired idempotency keys failed", slog.Any("error", err))
	}
}
