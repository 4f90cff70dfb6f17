// Package sqlq holds every SQL statement pgoutbox runs against its tables,
// in one place, so it can be read and reviewed together, one file per
// concern: send.go (what producers write), topics.go (configuration),
// groups_*.go (consumer groups, which read every topic: lifecycle,
// fetch, completion, administration), tracking_*.go (one file per
// tracking mode, and mixed for a topic between two), maintenance.go,
// partitions.go, admin.go and inbox.go.
//
// Statements name tables as {{schema}}.outbox; For replaces {{schema}} with
// the caller's schema, quoted, once per client. Nothing else is ever spliced
// into SQL: every value is a bind parameter.
//
// A statement built from shared pieces (a group's stream filter, what it
// completed, a snapshot pair's unseen rows) names its parameters
// (@topic, @stream_bit, …): it is a Named, numbered once, and its Bind
// refuses a missing or unknown name. Numbered from an offset each caller
// computed, such a statement had up to 19 parameters that only a count
// could tell apart. The others still number theirs ($1, …).
//
// A parameter named now (coalesce(@now::timestamptz, now()), or $n) carries an
// injected test clock; production code passes NULL and database time is used.
package sqlq

import (
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

// Outbox is the SQL of the message tables (QUEUE messages in outbox,
// PUB_SUB messages in outbox_published) and of topic configuration.
type Outbox struct {
	// Send's single-message statements, each with a variant that also
	// notifies (the channel is the parameter after the last one).
	InsertUnconfigured, InsertUnconfiguredNotify   string // topic not seen configured: $1..$9
	InsertQueued, InsertQueuedNotify               string // configured QUEUE topic, available now: $1..$6
	InsertQueuedAt, InsertQueuedAtNotify           string // configured QUEUE topic: $1..$9
	InsertPublished, InsertPublishedNotify         string // configured PUB_SUB topic: $1..$9
	InsertPublishedOrdered                         string // configured ordered PUB_SUB topic: $1..$9
	InsertPublishedOrderedNotify                   string
	InsertOrdered, InsertOrderedNotify             string // configured ordered QUEUE topic: $1..$9
	InsertLogged, InsertLoggedNotify               string // QUEUE topic on the log, available now: $1..$6
	InsertLoggedAt, InsertLoggedAtNotify           string // QUEUE topic on the log: $1..$9
	InsertLoggedOrdered, InsertLoggedOrderedNotify string // ordered QUEUE topic on the log: $1..$9
	SelectSemantics                                string
	Insert, InsertNotify, SelectIdempotent         string
	LockTopic, UpsertTopic, SelectTopic            string
	LockTopicRow, AssignBits, ResetSubscribedBits  string
	TrackingInUse, ChangeTracking                  string
	QueueOnLog                                     string
	ExpireIdempotencyKeys                          string
}

// For returns the statements for schema (already validated).
func For(schema string) *Outbox {
	r := strings.NewReplacer("{{schema}}", ident.Quote(schema))
	return &Outbox{
		InsertUnconfigured:           r.Replace(insertUnconfigured),
		InsertUnconfiguredNotify:     r.Replace(insertUnconfiguredNotify),
		InsertQueued:                 r.Replace(insertQueued),
		InsertQueuedNotify:           r.Replace(notifying(insertQueued, 7)),
		InsertQueuedAt:               r.Replace(insertQueuedAt),
		InsertQueuedAtNotify:         r.Replace(notifying(insertQueuedAt, 10)),
		InsertPublished:              r.Replace(insertPublished),
		InsertPublishedNotify:        r.Replace(notifying(insertPublished, 10)),
		InsertPublishedOrdered:       r.Replace(insertPublishedOrdered),
		InsertPublishedOrderedNotify: r.Replace(notifying(insertPublishedOrdered, 10)),
		InsertOrdered:                r.Replace(insertOrdered),
		InsertOrderedNotify:          r.Replace(notifying(insertOrdered, 10)),
		InsertLogged:                 r.Replace(insertLogged),
		InsertLoggedNotify:           r.Replace(notifying(insertLogged, 7)),
		InsertLoggedAt:               r.Replace(insertLoggedAt),
		InsertLoggedAtNotify:         r.Replace(notifying(insertLoggedAt, 10)),
		InsertLoggedOrdered:          r.Replace(insertLoggedOrdered),
		InsertLoggedOrderedNotify:    r.Replace(notifying(insertLoggedOrdered, 10)),
		SelectSemantics:              r.Replace(selectSemantics),
		Insert:                       r.Replace(insert),
		InsertNotify:                 r.Replace(insertNotify),
		SelectIdempotent:             r.Replace(selectIdempotent),
		LockTopic:                    r.Replace(lockTopicExclusive),
		UpsertTopic:                  r.Replace(upsertTopic),
		LockTopicRow:                 r.Replace(lockTopicRow),
		TrackingInUse:                r.Replace(trackingInUse),
		ChangeTracking:               r.Replace(changeTracking),
		AssignBits:                   r.Replace(assignBits),
		ResetSubscribedBits:          r.Replace(resetSubscribedBits),
		SelectTopic:                  r.Replace(selectTopic),
		QueueOnLog:                   r.Replace(queueOnLog),
		ExpireIdempotencyKeys:        r.Replace(expireIdempotencyKeys),
	}
}
