package consumergroup

import (
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// orphanSweepEvery is how often an instance drops retries of messages
// that no longer exist (see janitor).
const orphanSweepEvery = 10 * time.Second

// The janitor: one goroutine per instance, on the heartbeat pool. Every
// HeartbeatInterval (jittered) it marks groups of the topic whose
// heartbeats stopped as DEAD and forgets groups that left and whose claims
// ran out (in batches, which can take long on a big topic: that is why it
// is not the heartbeat's job). The maintenance service does the same for
// every topic, whether or not an instance runs.
//
// Every orphanSweepEvery it also drops the group's retries of messages
// that no longer exist (sqlq's deleteOrphanRetries: deleted while the
// group was DEAD, or by the retention cap). The statement reads every
// retry of the group, and a group that reads by message group holds its
// whole queue there: 300 ms beside 100,000 queued messages, which in a
// look held up every delivery of the group once every sweep.
func (r *runner) janitor() {
	g := r.g
	var nextDetect, nextSweep time.Time
	for {
		if now := time.Now(); !now.Before(nextDetect) {
			nextDetect = now.Add(jittered(g.cfg.HeartbeatInterval))
			if _, err := g.maint.detectDeadAndForget(r.fetchCtx, r.hbPool, g.cfg.Topic); err != nil && r.fetchCtx.Err() == nil {
				g.events.Log(slog.LevelWarn, "dead-detection-failed", "pgoutbox: dead group detection failed; the next heartbeat tries again",
					slog.Any("error", err))
			}
		}
		if now := time.Now(); !now.Before(nextSweep) {
			nextSweep = now.Add(orphanSweepEvery)
			if _, err := r.hbPool.Exec(r.fetchCtx, g.q.DeleteOrphanRetries, pgx.StrictNamedArgs{"sub": g.sub.ID}); err != nil && r.fetchCtx.Err() == nil {
				g.events.Log(slog.LevelWarn, "orphan-sweep-failed", "pgoutbox: dropping retries of deleted messages failed; the next sweep tries again",
					slog.Any("error", err))
			}
		}
		next := nextDetect
		if nextSweep.Before(next) {
			next = nextSweep
		}
		if !r.pause(time.Until(next)) {
			return
		}
	}
}
