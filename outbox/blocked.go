package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgoutbox/pgoutbox/internal/blockedgauges"
)

// BlockedGroup is a message group of an ordered topic that its oldest
// message holds back: the message failed and waits for its retry, or was
// dead-lettered on a topic that blocks groups on dead letters.
type BlockedGroup struct {
	// Group is the message group.
	Group string
	// HeadID is the message holding it back.
	HeadID int64
	// Attempts the head has used.
	Attempts int
	// LastError is the head's last error.
	LastError string
	// Since is when the head first failed (or was dead-lettered).
	Since time.Time
	// DeadLettered: the head is a dead letter; replay or discard it
	// (Client.ReplayDeadLetters, Client.DiscardDeadLetters, or the
	// consumer group's ReplayDeadLetters and DiscardDeadLetters) to let the
	// group go on.
	DeadLettered bool
	// Behind is how many of the group's messages wait behind the head.
	Behind int
}

// DefaultBlockedGroupsPage is the page size of BlockedGroups when limit is 0.
const DefaultBlockedGroupsPage = 100

// BlockedGroups lists up to limit (DefaultBlockedGroupsPage when 0)
// blocked message groups of an ordered topic, the longest blocked first.
// A topic that is not ordered has none. It reads an index of failed
// messages, not the queue, and counts the messages behind each head.
func (c *Client) BlockedGroups(ctx context.Context, topic string, limit int) ([]BlockedGroup, error) {
	if limit < 0 {
		return nil, fmt.Errorf("%w: negative limit", ErrInvalidConfig)
	}
	t, err := c.Topic(ctx, topic)
	if err != nil {
		return nil, err
	}
	if !t.Ordered {
		return nil, nil
	}
	rows, err := c.pool.Query(ctx, c.sql.BlockedGroups, topic, t.OrderedDeadLetters == BlockGroup, cmp.Or(limit, DefaultBlockedGroupsPage))
	if err != nil {
		return nil, fmt.Errorf("outbox: blocked groups: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (BlockedGroup, error) {
		var g BlockedGroup
		err := r.Scan(&g.Group, &g.HeadID, &g.Attempts, &g.LastError, &g.Since, &g.DeadLettered, &g.Behind)
		return g, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: blocked groups: %w", err)
	}
	return out, nil
}

// blockedSummary counts an ordered topic's blocked groups and returns when
// the longest blocked one was first held back (zero when none is).
func (c *Client) blockedSummary(ctx context.Context, t TopicConfig) (int64, time.Time, error) {
	var n int64
	var since *time.Time
	err := c.pool.QueryRow(ctx, c.sql.BlockedSummary, t.Name, t.OrderedDeadLetters == BlockGroup).Scan(&n, &since)
	if err != nil || since == nil {
		return n, time.Time{}, err
	}
	return n, *since, nil
}

// watchOrdered adds an ordered topic to the blocked-group gauges while a
// consumer reads it; the returned function takes it off again.
func (c *Client) watchOrdered(t TopicConfig) (unwatch func()) {
	c.watchedMu.Lock()
	defer c.watchedMu.Unlock()
	w := c.watched[t.Name]
	w.cfg, w.consumers = t, w.consumers+1
	c.watched[t.Name] = w
	return func() {
		c.watchedMu.Lock()
		defer c.watchedMu.Unlock()
		if w := c.watched[t.Name]; w.consumers > 1 {
			w.consumers--
			c.watched[t.Name] = w
		} else {
			delete(c.watched, t.Name)
		}
	}
}

// observeBlockedGroups registers the gauges of the ordered topics this
// client's consumers read: pgoutbox.ordered.blocked_groups and
// pgoutbox.ordered.oldest_blocked_age, per topic, read from the database
// when the meter provider collects them.
func (c *Client) observeBlockedGroups(mp metric.MeterProvider) {
	if mp == nil {
		return
	}
	_, err := blockedgauges.Register(mp.Meter(meterName), c.clockNow, func(ctx context.Context) []blockedgauges.Reading {
		c.watchedMu.Lock()
		topics := make([]TopicConfig, 0, len(c.watched))
		for _, w := range c.watched {
			topics = append(topics, w.cfg)
		}
		c.watchedMu.Unlock()
		var out []blockedgauges.Reading
		for _, t := range topics {
			qctx, cancel := context.WithTimeout(ctx, time.Second)
			n, since, err := c.blockedSummary(qctx, t)
			cancel()
			if err != nil {
				c.logger.Warn("pgoutbox: reading blocked message groups failed", slog.String("topic", t.Name), slog.Any("error", err))
				continue
			}
			out = append(out, blockedgauges.Reading{Groups: n, Since: since,
				Attrs: metric.WithAttributes(attribute.String("topic", t.Name))})
		}
		return out
	})
	if err != nil {
		c.logger.Warn("pgoutbox: blocked-group gauges not registered", slog.Any("error", err))
	}
}

// clockNow is the client's clock, or the system's.
func (c *Client) clockNow() time.Time {
	if c.clock != nil {
		return c.clock.Now()
	}
	return time.Now()
}
