package consumergroup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgoutbox/pgoutbox/internal/sqlq"
	"github.com/pgoutbox/pgoutbox/outbox"
)

// DefaultHealthCountLimit is where Health stops counting by default.
const DefaultHealthCountLimit = 10_000

// Health is a group's state and how far behind it is, as Group.Health
// reads it. Counts stop at the limit Health was given: a count equal to
// it means "at least".
type Health struct {
	Topic string `json:"topic"`
	Group string `json:"group"`
	State State  `json:"state"`
	// SubscribedAt is when the subscription was made.
	SubscribedAt time.Time `json:"subscribed_at"`
	// LastHeartbeat is the last heartbeat of any of the group's instances;
	// HeartbeatTimeout is how long without one makes the group DEAD.
	LastHeartbeat    time.Time     `json:"last_heartbeat"`
	HeartbeatTimeout time.Duration `json:"-"`
	// SinceHeartbeat is the database's time since LastHeartbeat.
	SinceHeartbeat time.Duration `json:"-"`
	// Unread counts the committed messages for the group written since
	// its position, due now: those it has not read, and those in the
	// batches it is handling that it has not completed (in Offset mode,
	// which records nothing per message, all of them). It is not
	// counted for a DEAD group: what that one missed is read by the
	// backfill its return starts (Backfill).
	Unread int64 `json:"unread"`
	// LeasedBatches and LeasedRetries count what instances hold now:
	// batches of the stream, and messages delivered one by one (retries,
	// and every message of a group that reads by message group).
	LeasedBatches int64 `json:"leased_batches"`
	LeasedRetries int64 `json:"leased_retries"`
	// Waiting counts messages that failed and wait for their next
	// attempt (a retry).
	Waiting int64 `json:"waiting"`
	// Queued counts messages the group read and will deliver, that have
	// not failed: the queue of a group that reads by message group (an
	// ordered topic's, or one with Config.ByMessageGroup: it queues what
	// it reads and delivers each message group's oldest first), replayed
	// dead letters, and messages a stopping instance handed back untried.
	Queued int64 `json:"queued"`
	// Scheduled counts messages that are not due yet (sent with Delay or
	// NotBefore), read by the group or not: it delivers them when they
	// are. They do not count in Lag.
	Scheduled int64 `json:"scheduled"`
	// DeadLetters counts the group's dead letters.
	DeadLetters int64 `json:"dead_letters"`
	// Lag is the age of the oldest message the group has not finished:
	// the oldest unread, or the lowest id it retries (0 when there is
	// none).
	Lag time.Duration `json:"-"`
	// Backfill is the group's latest backfill (zero when it had none).
	Backfill BackfillProgress `json:"backfill,omitzero"`
}

// MarshalJSON writes the durations in seconds and adds near_timeout
// (NearTimeout): the shape the admin JSON API and the CLI's --json share.
func (h Health) MarshalJSON() ([]byte, error) {
	type plain Health
	return json.Marshal(struct {
		plain
		SinceHeartbeat   float64 `json:"since_heartbeat_seconds"`
		HeartbeatTimeout float64 `json:"heartbeat_timeout_seconds"`
		NearTimeout      bool    `json:"near_timeout"`
		Lag              float64 `json:"lag_seconds"`
	}{plain(h), h.SinceHeartbeat.Seconds(), h.HeartbeatTimeout.Seconds(), h.NearTimeout(), h.Lag.Seconds()})
}

// NearTimeout reports whether an ACTIVE group's last heartbeat is older
// than 80% of its HeartbeatTimeout: the time to look, before it is
// declared DEAD.
func (h Health) NearTimeout() bool {
	return h.State == Active && h.SinceHeartbeat >= h.HeartbeatTimeout*8/10
}

// Health reads the group's state and lag. Each count stops at limit (0:
// DefaultHealthCountLimit), so reading the health of a group far behind
// costs a bounded number of index reads, not a scan of its backlog. It
// works on a Group value that was never started, and fails with
// outbox.ErrNotFound when the group has no subscription.
func (g *Group) Health(ctx context.Context, limit int) (Health, error) {
	if limit <= 0 {
		limit = DefaultHealthCountLimit
	}
	h := Health{Topic: g.cfg.Topic, Group: g.cfg.Group}
	topic, err := g.client.Topic(ctx, g.cfg.Topic)
	if err != nil {
		return h, err
	}
	var sub subscription
	var status, kind string
	var timeoutSecs float64
	err = g.pool.QueryRow(ctx, g.q.GroupHealthHead, pgx.StrictNamedArgs{"topic": g.cfg.Topic, "group_name": g.cfg.Group}).Scan(&sub.id, &status, &sub.bit, &kind,
		&sub.fromTS, &sub.fromID, &h.LastHeartbeat, &timeoutSecs, &h.SubscribedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return h, fmt.Errorf("%w: group %q has no subscription to %q", outbox.ErrNotFound, g.cfg.Group, g.cfg.Topic)
	}
	if err != nil {
		return h, fmt.Errorf("consumergroup: health: %w", err)
	}
	sub.status, sub.kind = State(status), Position(kind)
	h.State, h.HeartbeatTimeout = sub.status, time.Duration(timeoutSecs*float64(time.Second))
	// The completions it looks for are those of the records its stream
	// reads by: its bit, its subscription id.
	stream := streamFor(topic.Tracking, topic.ModeChanging, sub)
	doneSub := int64(-1)
	if stream.SubID != nil {
		doneSub = *stream.SubID
	}
	args := stream.Bind(sqlq.Args{"sub": sub.id, "topic": g.cfg.Topic, "done_bit": stream.Bit, "done_sub": doneSub,
		"limit": limit, "read_unread": sub.status != Dead})
	var oldestUnread, oldestRetry *time.Time
	var now time.Time
	// In a read-only transaction of its own, without JIT (see sqlq's
	// WithoutJIT), in one round trip.
	var b pgx.Batch
	b.Queue("BEGIN READ ONLY")
	b.Queue(sqlq.WithoutJIT)
	b.Queue(g.q.GroupHealth.Numbered, g.q.GroupHealth.Bind(args)...).QueryRow(func(row pgx.Row) error {
		return row.Scan(&h.Unread, &oldestUnread, &h.LeasedBatches, &h.LeasedRetries, &h.Waiting, &h.Queued, &h.Scheduled,
			&oldestRetry, &h.DeadLetters, &now)
	})
	b.Queue("COMMIT")
	if err := g.pool.SendBatch(ctx, &b).Close(); err != nil {
		return h, fmt.Errorf("consumergroup: health: %w", err)
	}
	h.SinceHeartbeat = max(now.Sub(h.LastHeartbeat), 0)
	for _, t := range []*time.Time{oldestUnread, oldestRetry} {
		if t != nil {
			h.Lag = max(h.Lag, now.Sub(*t))
		}
	}
	if h.Backfill, err = g.BackfillProgress(ctx); err != nil {
		return h, err
	}
	return h, nil
}
