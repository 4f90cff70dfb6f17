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
// Every statement names its parameters (@topic, @sub, @now, …); none is
// numbered by hand. Those that run for most messages, looks or batches (a
// send, every statement of a look, a batch's completion, lease extension,
// retries, AckTx) are Named: numbered once, when their set is built, so a
// call does not read the statement again (see Named); their Bind refuses a
// missing or unknown name. The rest, run by configuration, lifecycle,
// maintenance and administration, are sent with pgx.StrictNamedArgs, which
// refuses a missing or unknown name the same way. A test prepares every statement of every set against
// the migrated schema, numbered as it is sent.
//
// A parameter named now (coalesce(@now::timestamptz, now())) carries an
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
	// notifies @channel. Parameters: @topic, @payload, @headers,
	// @correlation_id, @message_group, @priority and, but for the
	// statements of messages available at once (InsertQueued,
	// InsertLogged), @not_before, @delay_us and @now.
	InsertUnconfigured, InsertUnconfiguredNotify   Named // topic not seen configured
	InsertQueued, InsertQueuedNotify               Named // QUEUE topic an earlier release configured, available now
	InsertQueuedAt, InsertQueuedAtNotify           Named // QUEUE topic an earlier release configured
	InsertPublished, InsertPublishedNotify         Named // configured PUB_SUB topic
	InsertPublishedOrdered                         Named // configured ordered PUB_SUB topic
	InsertPublishedOrderedNotify                   Named
	InsertOrdered, InsertOrderedNotify             Named // ordered QUEUE topic an earlier release configured
	InsertLogged, InsertLoggedNotify               Named // QUEUE topic on the log, available now
	InsertLoggedAt, InsertLoggedAtNotify           Named // QUEUE topic on the log
	InsertLoggedOrdered, InsertLoggedOrderedNotify Named // ordered QUEUE topic on the log
	SelectSemantics                                Named
	// SendBatch's statements.
	Insert, InsertNotify, SelectIdempotent Named

	LockTopic, UpsertTopic, SelectTopic           string
	LockTopicRow, AssignBits, ResetSubscribedBits string
	TrackingInUse, ChangeTracking                 string
	QueueOnLog                                    string
	ExpireIdempotencyKeys                         string
}

// For returns the statements for schema (already validated).
func For(schema string) *Outbox {
	r := strings.NewReplacer("{{schema}}", ident.Quote(schema))
	n := func(sql string) Named { return named(r.Replace(sql)) }
	return &Outbox{
		InsertUnconfigured:           n(insertUnconfigured),
		InsertUnconfiguredNotify:     n(insertUnconfiguredNotify),
		InsertQueued:                 n(insertQueued),
		InsertQueuedNotify:           n(notifying(insertQueued)),
		InsertQueuedAt:               n(insertQueuedAt),
		InsertQueuedAtNotify:         n(notifying(insertQueuedAt)),
		InsertPublished:              n(insertPublished),
		InsertPublishedNotify:        n(notifying(insertPublished)),
		InsertPublishedOrdered:       n(insertPublishedOrdered),
		InsertPublishedOrderedNotify: n(notifying(insertPublishedOrdered)),
		InsertOrdered:                n(insertOrdered),
		InsertOrderedNotify:          n(notifying(insertOrdered)),
		InsertLogged:                 n(insertLogged),
		InsertLoggedNotify:           n(notifying(insertLogged)),
		InsertLoggedAt:               n(insertLoggedAt),
		InsertLoggedAtNotify:         n(notifying(insertLoggedAt)),
		InsertLoggedOrdered:          n(insertLoggedOrdered),
		InsertLoggedOrderedNotify:    n(notifying(insertLoggedOrdered)),
		SelectSemantics:              n(selectSemantics),
		Insert:                       n(insert),
		InsertNotify:                 n(insertNotify),
		SelectIdempotent:             n(selectIdempotent),
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
