package sqlq

// The SQL of a consumer group's dead letters and health, for operators.

// groupSubscription is the id of the subscription of group @group_name of
// topic @topic (see bySubscriptionName).
const groupSubscription = `(SELECT id FROM {{schema}}.outbox_topic_subscriptions ` + bySubscriptionName + `)`

// listGroupDeadLetters lists up to @limit dead letters of group
// @group_name of topic @topic with a message id above @after_id (a page's
// cursor), in id order, each with its message: the copy it keeps, else
// the stored message (one without either is left out).
const listGroupDeadLetters = `
SELECT r.message_id, coalesce(r.payload, o.payload), coalesce(r.headers, o.headers),
       coalesce(r.correlation_id, o.correlation_id), coalesce(r.message_group, o.message_group, ''),
       coalesce(r.priority, o.priority), r.attempts, coalesce(r.created_at, o.created_at), r.dead_lettered_at,
       coalesce(r.last_error, '')
FROM {{schema}}.outbox_group_retries AS r LEFT JOIN {{schema}}.outbox_published AS o ON o.id = r.message_id
WHERE r.subscription_id = ` + groupSubscription + ` AND r.status = 'DEAD_LETTER' AND r.message_id > @after_id
      AND coalesce(r.payload, o.payload) IS NOT NULL
ORDER BY r.message_id
LIMIT @limit`

// replayGroupDeadLetters makes the dead letters of group @group_name of
// topic @topic (those of ids @message_ids, or all when NULL) due again as
// fresh retries: no attempts made, not failing.
const replayGroupDeadLetters = `
UPDATE {{schema}}.outbox_group_retries
SET status = 'RETRY', attempts = 0, available_at = now(), dead_lettered_at = NULL, lease_expiries = 0, failing_since = NULL
WHERE subscription_id = ` + groupSubscription + ` AND status = 'DEAD_LETTER'
      AND (@message_ids::bigint[] IS NULL OR message_id = ANY(@message_ids::bigint[]))`

// blockedMessageGroups lists up to @limit blocked message groups of
// ordered group @group_name of topic @topic, longest blocked first
// (@dead_letter_blocks: a dead letter blocks its message group): each
// head that failed (or was dead-lettered), and
// how many queued messages wait behind it. Only a head fails (a claim
// takes nothing else), and a failed retry carries failing_since, which an
// index finds.
const blockedMessageGroups = `
SELECT r.message_group, r.message_id, r.attempts, coalesce(r.last_error, ''),
       coalesce(r.failing_since, r.dead_lettered_at), r.status = 'DEAD_LETTER',
       (SELECT count(*) FROM {{schema}}.outbox_group_retries AS b
        WHERE b.subscription_id = r.subscription_id AND b.message_group COLLATE "C" = r.message_group
              AND b.message_id > r.message_id AND b.status <> 'DEAD_LETTER')
` + blockedGroupHeads + `
ORDER BY r.failing_since, r.message_id
LIMIT @limit`

// blockedGroupsSummary counts the blocked message groups of ordered
// group @group_name of topic @topic (@dead_letter_blocks as
// blockedMessageGroups) and finds when the longest blocked one was first
// held back.
const blockedGroupsSummary = `
SELECT count(*), min(r.failing_since)
` + blockedGroupHeads

// blockedGroupHeads is the FROM and WHERE of blockedMessageGroups: the
// group's failed (or dead-lettered) retries that head their message group.
const blockedGroupHeads = `
FROM {{schema}}.outbox_group_retries AS r
WHERE r.subscription_id = ` + groupSubscription + ` AND r.failing_since IS NOT NULL AND r.message_group IS NOT NULL
      AND (r.status <> 'DEAD_LETTER' OR @dead_letter_blocks::bool)
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS e
                      WHERE e.subscription_id = r.subscription_id AND e.message_group COLLATE "C" = r.message_group
                            AND e.message_id < r.message_id AND (e.status <> 'DEAD_LETTER' OR @dead_letter_blocks::bool))`

// discardGroupDeadLetters deletes the dead letters of group @group_name
// of topic @topic (those of ids @message_ids, or all when NULL) and
// returns the subscription, its
// bit (-1: none) and the ids, so that the caller records them as
// completed by the group in the same transaction.
const discardGroupDeadLetters = `
DELETE FROM {{schema}}.outbox_group_retries AS r
USING {{schema}}.outbox_topic_subscriptions AS s
WHERE s.id = r.subscription_id AND s.id = ` + groupSubscription + ` AND r.status = 'DEAD_LETTER'
      AND (@message_ids::bigint[] IS NULL OR r.message_id = ANY(@message_ids::bigint[]))
RETURNING s.id, coalesce(s.bit, -1), r.message_id`
