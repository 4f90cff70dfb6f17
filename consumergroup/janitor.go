package consumergroup

import (
	"log/slog"
)

// The janitor: one goroutine per instance, on the heartbeat pool. Every
// HeartbeatInterval (jittered) it marks groups of the topic whose
// heartbeats stopped as DEAD and forgets groups that left and whose claims
// ran out (in batches, which can take long on a big topic: that is why it
// is not the heartbeat's job). The maintenance service does the same for
// every topic, whether or not an instance runs.

func (r *runner) janitor() {
	g := r.g
	for {
		if _, err := g.maint.detectDeadAndForget(r.fetchCtx, r.hbPool, g.cfg.Topic); err != nil && r.fetchCtx.Err() == nil {
			g.events.Log(slog.LevelWarn, "dead-detection-failed", "pgoutbox: dead group detection failed; the next heartbeat tries again",
				slog.Any("error", err))
		}
		if !r.pause(jittered(g.cfg.HeartbeatInterval)) {
			return
		}
	}
}
