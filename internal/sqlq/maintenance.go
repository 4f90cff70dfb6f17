package sqlq

import (
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

// Maintenance is the SQL of the maintenance service's jobs that span
// topics (the per-topic work of consumer groups is in PubSub). Every
// delete takes its rows FOR UPDATE SKIP LOCKED, in batches of
// @batch_size: two instances running a job at once delete different rows.
type Maintenance struct {
	StaleTopics, ForgetTopics, PubSubTopics                   string
	RetentionCap                                              string
	ExpireGroupDeadLetters                                    string
	ExpireIdempotencyKeys, CounterOrphans                     string
	CancelledSubscriptions, DeleteSubscription, DeadGroupsDue string
	CopyDeadLetters, ExpireInbox                              string
}

// ForMaintenance returns the statements for schema (already validated).
func ForMaintenance(schema string) *Maintenance {
	r := strings.NewReplacer("{{schema}}", ident.Quote(schema))
	return &Maintenance{
		StaleTopics:            r.Replace(staleTopics),
		ForgetTopics:           r.Replace(forgetTopics),
		PubSubTopics:           r.Replace(pubSubTopics),
		RetentionCap:           r.Replace(retentionCap),
		ExpireGroupDeadLetters: r.Replace(expireGroupDeadLetters),
		ExpireIdempotencyKeys:  r.Replace(expireIdempotencyKeys),
		CounterOrphans:         r.Replace(counterOrphans),
		CancelledSubscriptions: r.Replace(cancelledSubscriptions),
		DeleteSubscription:     r.Replace(deleteSubscription),
		DeadGroupsDue:          r.Replace(deadGroupsDue),
		CopyDeadLetters:        r.Replace(copyDeadLetters),
		ExpireInbox:            r.Replace(expireInbox),
	}
}

// staleTopics: topics with an ACTIVE group whose heartbeats stopped.
const staleTopics = `
SELECT DISTINCT topic FROM {{schema}}.outbox_topic_subscriptions
WHERE ` + heartbeatsStopped

// forgetTopics: topics with a group to forget (it left, and its claims ran out).
const forgetTopics = `
SELECT DISTINCT topic FROM {{schema}}.outbox_topic_subscriptions AS s
WHERE forget_pending AND NOT ` + holdsClaims

// pubSubTopics: every topic whose messages live on the log, its mode and
// its retention cap.
var pubSubTopics = `
SELECT topic, tracking_mode, (extract(epoch FROM max_retention) * 1e6)::bigint
FROM {{schema}}.outbox_topics AS t WHERE ` + onLog("t") + ` ORDER BY topic`

// retentionCap deletes up to @batch_size rows of topic @topic below xid
// @below_xid (an xid8, as text) written before @now less
// @max_retention_us microseconds, whoever still holds them, with the
// retries of them that kept no copy (dead letters keep theirs): they
// cannot be delivered any more. It counts, for each group that holds
// claims, the rows it had not finished: a retry of it was pending, or by
// the row's own record (see mixedCleanup): Bitmap, a row requiring its bit
// that its committed position does not see, without its done bit or a
// completion record of the group; Counter, a row requiring its id that its
// committed position does not see, without a completion record; Offset, a
// row its committed position does not see (for a DEAD group, written
// before it died: see deadClaims). The first row is the number
// deleted, under an empty group name.
var retentionCap = `
WITH gone AS (
    DELETE FROM {{schema}}.outbox_published WHERE id IN (
        SELECT o.id FROM {{schema}}.outbox_published AS o
        WHERE o.topic = @topic AND o.xid < @below_xid::text::xid8
              AND o.created_at < coalesce(@now::timestamptz, now()) - @max_retention_us * interval '1 microsecond'
        ORDER BY o.xid, o.id LIMIT @batch_size FOR UPDATE SKIP LOCKED)
    RETURNING id, xid, required_bits, done_bits, required_ids, required_count
), dedupe AS (
    DELETE FROM {{schema}}.outbox_consumer_groups WHERE message_id IN (SELECT id FROM gone)
    RETURNING message_id, subscription_id
), retries AS (
    DELETE FROM {{schema}}.outbox_group_retries
    WHERE message_id IN (SELECT id FROM gone) AND payload IS NULL AND status <> 'DEAD_LETTER'
    RETURNING message_id, subscription_id
), unread AS (
    SELECT s.group_name
    FROM gone
    JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.topic = @topic AND ` + holdsClaims + `
    JOIN {{schema}}.outbox_subscription_offsets AS p ON p.subscription_id = s.id
    WHERE EXISTS (SELECT 1 FROM retries AS r WHERE r.message_id = gone.id AND r.subscription_id = s.id)
       OR CASE
          WHEN gone.required_bits IS NOT NULL THEN s.bit IS NOT NULL AND gone.required_bits & (1::bigint << s.bit) <> 0
                             AND coalesce(gone.done_bits, 0) & (1::bigint << s.bit) = 0
                             AND NOT pg_visible_in_snapshot(gone.xid, ` + committedOf("s", "p") + `)
                             AND NOT EXISTS (SELECT 1 FROM dedupe AS d WHERE d.message_id = gone.id AND d.subscription_id = s.id)
          WHEN gone.required_count IS NOT NULL THEN s.id = ANY(gone.required_ids)
                              AND NOT pg_visible_in_snapshot(gone.xid, ` + committedOf("s", "p") + `)
                              AND NOT EXISTS (SELECT 1 FROM dedupe AS d WHERE d.message_id = gone.id AND d.subscription_id = s.id)
          ELSE NOT pg_visible_in_snapshot(gone.xid, ` + committedOf("s", "p") + `)
               AND (s.subscription_status <> 'DEAD' OR pg_visible_in_snapshot(gone.xid, coalesce(s.dead_upto, pg_current_snapshot())))
          END
)
SELECT '', (SELECT count(*) FROM gone)
UNION ALL
SELECT group_name, count(*) FROM unread GROUP BY group_name`

// expireGroupDeadLetters deletes up to @batch_size group dead letters
// (those of QUEUE topics' groups too) parked before now() less
// @retention_us microseconds.
const expireGroupDeadLetters = `
DELETE FROM {{schema}}.outbox_group_retries AS r
USING (SELECT subscription_id, message_id FROM {{schema}}.outbox_group_retries
       WHERE status = 'DEAD_LETTER' AND dead_lettered_at < now() - @retention_us * interval '1 microsecond'
       ORDER BY dead_lettered_at LIMIT @batch_size FOR UPDATE SKIP LOCKED) AS e
WHERE r.subscription_id = e.subscription_id AND r.message_id = e.message_id`

// counterOrphans deletes the dedupe rows of messages that are gone, among
// up to @batch_size dedupe rows with a message id above @after_id (a
// sweep's cursor); it returns the last message id it looked at (NULL: the
// sweep reached the end) and how many it deleted.
const counterOrphans = `
WITH span AS (
    SELECT message_id, subscription_id FROM {{schema}}.outbox_consumer_groups
    WHERE message_id > @after_id ORDER BY message_id, subscription_id LIMIT @batch_size
), gone AS (
    DELETE FROM {{schema}}.outbox_consumer_groups AS c USING span
    WHERE c.message_id = span.message_id AND c.subscription_id = span.subscription_id
          AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_published AS o WHERE o.id = span.message_id)
    RETURNING 1
)
SELECT CASE WHEN count(*) = @batch_size THEN max(message_id) END, (SELECT count(*) FROM gone) FROM span`

// cancelledSubscriptions deletes up to @batch_size CANCELLED
// subscriptions released before now() less @retention_us microseconds
// that nothing refers to any more (forgetting is done; a cancel dropped
// their retries), with their offsets.
const cancelledSubscriptions = `
DELETE FROM {{schema}}.outbox_topic_subscriptions WHERE id IN (
    SELECT id FROM {{schema}}.outbox_topic_subscriptions
    WHERE subscription_status = 'CANCELLED' AND NOT forget_pending
          AND released_at < now() - @retention_us * interval '1 microsecond'
    ORDER BY released_at LIMIT @batch_size FOR UPDATE SKIP LOCKED)`

// deleteSubscription deletes cancelled subscription @sub once forgetting
// is done, leaving a tombstone when @last_status (what it was before:
// DEAD) is set, so an instance of the group that comes back says it
// starts anew.
const deleteSubscription = `
WITH gone AS (
    DELETE FROM {{schema}}.outbox_topic_subscriptions
    WHERE id = @sub AND subscription_status = 'CANCELLED' AND NOT forget_pending
    RETURNING topic, group_name
)
INSERT INTO {{schema}}.outbox_deleted_subscriptions (topic, group_name, last_status)
SELECT topic, group_name, @last_status FROM gone WHERE @last_status <> ''
ON CONFLICT (topic, group_name) DO UPDATE SET last_status = excluded.last_status, deleted_at = now()`

// deadGroupsDue: DEAD groups released before now() less @warn_after_us
// microseconds with no dead letters left, and when they go (their release
// plus @retention_us microseconds); the job warns about those due within
// its warning horizon and removes those due now.
const deadGroupsDue = `
SELECT s.topic, s.group_name, s.released_at + @retention_us * interval '1 microsecond',
       s.released_at + @retention_us * interval '1 microsecond' <= now()
FROM {{schema}}.outbox_topic_subscriptions AS s
WHERE s.subscription_status = 'DEAD' AND s.released_at < now() - @warn_after_us * interval '1 microsecond'
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS r
                      WHERE r.subscription_id = s.id AND r.status = 'DEAD_LETTER')
ORDER BY s.released_at`
