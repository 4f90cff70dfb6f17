package admin

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgoutbox/pgoutbox/outbox"
)

// BlockedGroups lists up to limit (outbox.DefaultBlockedGroupsPage when
// 0) message groups of an ordered topic that their oldest message holds
// back, the longest blocked first: a QUEUE topic's when group is "", else
// a consumer group's. Each comes with its head (the message that failed
// and waits for its retry, or was dead-lettered on a topic that blocks
// message groups on dead letters), its attempts and last error, since
// when it holds the message group back, and how many messages wait behind
// it. Where nothing else shows it, a blocked message group looks like a
// slow consumer: its messages stay ready (a QUEUE topic) or queued (a
// group) and age. A topic that is not ordered has none.
func (a *Admin) BlockedGroups(ctx context.Context, topic, group string, limit int) ([]outbox.BlockedGroup, error) {
	if limit < 0 {
		return nil, fmt.Errorf("%w: admin: blocked groups: limit %d is negative", outbox.ErrInvalidConfig, limit)
	}
	if group == "" {
		g, err := a.queueGroupOf(ctx, topic, "name the group whose blocked message groups you mean")
		if err != nil || g == nil {
			return nil, err
		}
		return g.BlockedGroups(ctx, limit)
	}
	g, err := a.group(ctx, topic, group)
	if err != nil {
		return nil, err
	}
	return g.BlockedGroups(ctx, limit)
}

// Blocked is a blocked message group (see Admin.BlockedGroups) and where
// it is blocked.
type Blocked struct {
	// Topic is the ordered topic, ConsumerGroup the consumer group held
	// back ("" on a QUEUE topic).
	Topic         string `json:"topic"`
	ConsumerGroup string `json:"group,omitempty"`
	outbox.BlockedGroup
}

// Blocked lists the blocked message groups of every ordered topic, by
// topic: a QUEUE topic's, and each of a PUB_SUB topic's consumer groups',
// up to limit (outbox.DefaultBlockedGroupsPage when 0) of each, the
// longest blocked first.
func (a *Admin) Blocked(ctx context.Context, limit int) ([]Blocked, error) {
	names, err := a.topicNames(ctx)
	if err != nil {
		return nil, err
	}
	var out []Blocked
	for _, name := range names {
		cfg, err := a.topicConfig(ctx, name)
		if err != nil {
			return nil, err
		}
		bs, err := a.topicBlocked(ctx, cfg, limit)
		if err != nil {
			return nil, err
		}
		out = append(out, bs...)
	}
	return out, nil
}

// TopicBlocked lists the blocked message groups of one topic, as Blocked
// does for every topic: a QUEUE topic's, or each of a PUB_SUB topic's
// consumer groups', up to limit of each (none when the topic is not
// ordered).
func (a *Admin) TopicBlocked(ctx context.Context, topic string, limit int) ([]Blocked, error) {
	cfg, err := a.topicConfig(ctx, topic)
	if err != nil {
		return nil, err
	}
	return a.topicBlocked(ctx, cfg, limit)
}

func (a *Admin) topicBlocked(ctx context.Context, cfg outbox.TopicConfig, limit int) ([]Blocked, error) {
	out := []Blocked{}
	if !cfg.Ordered {
		return out, nil
	}
	groups := []string{""}
	if cfg.Semantics == outbox.PubSub {
		var err error
		if groups, err = a.groupNames(ctx, cfg.Name); err != nil {
			return nil, err
		}
	}
	for _, group := range groups {
		bs, err := a.BlockedGroups(ctx, cfg.Name, group, limit)
		if group != "" && errors.Is(err, outbox.ErrNotFound) {
			continue // a group removed since it was listed has nothing to show
		}
		if err != nil {
			return nil, err
		}
		for _, b := range bs {
			out = append(out, Blocked{Topic: cfg.Name, ConsumerGroup: group, BlockedGroup: b})
		}
	}
	return out, nil
}
