package sqlq

import (
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

// PubSub is the SQL of consumer groups on PUB_SUB topics.
//
// Snapshots (pg_snapshot) and transaction ids (xid8) travel as text.
type PubSub struct {
	LockTopic, SelectSubscription, InsertSubscription, InsertOffset string
	SubscribedBits, BitStillReferenced, ReleaseBit                  string
	AddSubscribed, RemoveSubscribed, SetStatus, Heartbeat           string
	LockOffset, TakeExpiredBatch, CurrentSnapshot, FetchRows        string
	InsertBatch, AdvanceOffset, FinishBatch, ReleaseBatch           string
	ReadBatchRows, InsertRetries, ClaimRetries, SettleRetry         string
	DeleteRetry, ReapRetries, ListDeadLetters, ReplayDeadLetters    string
	DeadCandidates, CommittedPosition, DeleteGroupState             string
	SubscriptionStatus, AnyDeadCandidate                            string

	BitmapComplete, BitmapCompleted, BitmapBackfill, BitmapForget, BitmapCleanup      string
	CounterComplete, CounterCompleted, CounterBackfill, CounterForget, CounterCleanup string
	OffsetCleanup, UpsertWatermark                                                    string
}

// ForPubSub returns the statements for schema (already validated).
func ForPubSub(schema string) *PubSub {
	r := strings.NewReplacer("{{schema}}", ident.Quote(schema))
	q := func(s string) string { return r.Replace(s) }
	return &PubSub{
		LockTopic:          q(lockTopic),
		SelectSubscription: q(selectSubscription),
		InsertSubscription: q(insertSubscription),
		InsertOffset:       q(insertOffset),
		SubscribedBits:     q(subscribedBits),
		BitStillReferenced: q(bitStillReferenced),
		ReleaseBit:         q(releaseBit),
		AddSubscribed:      q(addSubscribed),
		RemoveSubscribed:   q(removeSubscribed),
		SetStatus:          q(setStatus),
		Heartbeat:          q(heartbeat),
		LockOffset:         q(lockOffset),
		TakeExpiredBatch:   q(takeExpiredBatch),
		CurrentSnapshot:    `SELECT pg_current_snapshot()::text`,
		FetchRows:          q(fetchRows),
		InsertBatch:        q(insertBatch),
		AdvanceOffset:      q(advanceOffset),
		FinishBatch:        q(finishBatch),
		ReleaseBatch:       q(releaseBatch),
		ReadBatchRows:      q(readBatchRows),
		InsertRetries:      q(insertRetries),
		ClaimRetries:       q(claimRetries),
		SettleRetry:        q(settleRetry),
		DeleteRetry:        q(deleteRetry),
		ReapRetries:        q(reapRetries),
		ListDeadLetters:    q(listGroupDeadLetters),
		ReplayDeadLetters:  q(replayGroupDeadLetters),
		DeadCandidates:     q(deadCandidates),
		CommittedPosition:  q(committedPosition),
		DeleteGroupState:   q(deleteGroupState),
		SubscriptionStatus: q(subscriptionStatus),
		AnyDeadCandidate:   q(anyDeadCandidate),

		BitmapComplete:   q(bitmapComplete),
		BitmapCompleted:  q(bitmapCompleted),
		BitmapBackfill:   q(bitmapBackfill),
		BitmapForget:     q(bitmapForget),
		BitmapCleanup:    q(bitmapCleanup),
		CounterComplete:  q(counterComplete),
		CounterCompleted: q(counterCompleted),
		CounterBackfill:  q(counterBackfill),
		CounterForget:    q(counterForget),
		CounterCleanup:   q(counterCleanup),
		OffsetCleanup:    q(offsetCleanup),
		UpsertWatermark:  q(upsertWatermark),
	}
}

// lockTopic serialises subscription changes of a topic: inserts read the
// same row, so a change and the required sets it implies commit together.
const lockTopic = `
SELECT semantics, coalesce(tracking_mode, '') FROM {{schema}}.outbox_topics WHERE topic = $1 FOR UPDATE`

const selectSubscription = `
SELECT id, subscription_status, coalesce(bit, -1), start_position,
       start_from_timestamp, start_from_message_id
FROM {{schema}}.outbox_topic_subscriptions
WHERE topic = $1 AND group_name = $2
FOR UPDATE`

const insertSubscription = `
INSERT INTO {{schema}}.outbox_topic_subscriptions
    (topic, group_name, bit, start_position, start_from_timestamp, start_from_message_id, heartbeat_timeout)
VALUES ($1, $2, $3, $4, $5, $6, $7 * interval '1 microsecond')
RETURNING id`

// insertOffset sets a new group's start: the current snapshot for "from
// now" (taken inside the registering transaction, under the topic lock), or
// the empty snapshot, which sees nothing, for every other start.
const insertOffset = `
INSERT INTO {{schema}}.outbox_subscription_offsets (subscription_id, position)
VALUES ($1, CASE WHEN $2 THEN pg_current_snapshot() ELSE '1:1:'::pg_snapshot END)`

const subscribedBits = `
SELECT bit, subscription_status FROM {{schema}}.outbox_topic_subscriptions
WHERE topic = $1 AND bit IS NOT NULL`

const bitStillReferenced = `
SELECT EXISTS (SELECT 1 FROM {{schema}}.outbox_published
               WHERE topic = $1 AND status = 'PUBLISHED' AND required_bits & $2 <> 0)`

const releaseBit = `
UPDATE {{schema}}.outbox_topic_subscriptions SET bit = NULL
WHERE topic = $1 AND bit = $2 AND subscription_status = 'CANCELLED'`

// addSubscribed and removeSubscribed keep the topic row's subscribed set,
// which every insert copies into the message, idempotently.
const addSubscribed = `
UPDATE {{schema}}.outbox_topics
SET subscribed_bits = subscribed_bits | $2,
    subscribed_ids = CASE WHEN $3::bigint = ANY(subscribed_ids) THEN subscribed_ids
                          ELSE array_append(subscribed_ids, $3::bigint) END
WHERE topic = $1`

const removeSubscribed = `
UPDATE {{schema}}.outbox_topics
SET subscribed_bits = subscribed_bits & ~$2::bigint,
    subscribed_ids = array_remove(subscribed_ids, $3::bigint)
WHERE topic = $1`

const setStatus = `
UPDATE {{schema}}.outbox_topic_subscriptions
SET subscription_status = $2, last_active_at = now(),
    released_at = CASE WHEN $2 IN ('DEAD', 'CANCELLED') THEN now() END,
    last_heartbeat_at = CASE WHEN $2 = 'ACTIVE' THEN now() ELSE last_heartbeat_at END
WHERE id = $1`

// heartbeat records database time only. It reports the status, so a DEAD
// group's instance can resurrect it.
const heartbeat = `
UPDATE {{schema}}.outbox_topic_subscriptions
SET last_heartbeat_at = now(), heartbeat_timeout = $2 * interval '1 microsecond'
WHERE id = $1
RETURNING subscription_status`

// lockOffset: the member that gets the row fetches; the others skip.
const lockOffset = `
SELECT position::text, pair_cur::text, resume_xid::text, resume_id
FROM {{schema}}.outbox_subscription_offsets
WHERE subscription_id = $1
FOR UPDATE SKIP LOCKED`

// takeExpiredBatch hands a batch whose member's lease ran out to member $2.
const takeExpiredBatch = `
UPDATE {{schema}}.outbox_group_batches AS b
SET member = $2, lease_until = coalesce($3::timestamptz, now()) + $4 * interval '1 microsecond'
FROM (SELECT id FROM {{schema}}.outbox_group_batches
      WHERE subscription_id = $1 AND lease_until < coalesce($3::timestamptz, now())
      ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) AS e
WHERE b.id = e.id
RETURNING b.id, b.prev::text, b.cur::text, b.after_xid::text, b.after_id, b.last_xid::text, b.last_id, b.lease_until`

// streamFilter says which rows of a pair belong to the group ($7..$11):
// those requiring it (bit $7 / subscription $8), or every row ($9), or rows
// from a start time ($10) or message id ($11).
const streamFilter = `
      AND ((required_bits & $7::bigint <> 0) OR ($8::bigint = ANY(required_ids)) OR $9::bool
           OR created_at >= $10::timestamptz OR id >= $11::bigint)`

const messageColumns = `id, xid::text, payload, headers, correlation_id, coalesce(message_group, ''), priority, created_at`

// fetchRows reads the next rows of snapshot pair ($2 prev, $3 cur) after
// ($4, $5), in commit-safe order: only transactions that committed between
// the two snapshots, whatever their ids.
const fetchRows = `
SELECT ` + messageColumns + `
FROM {{schema}}.outbox_published
WHERE topic = $1 AND status = 'PUBLISHED'
      AND xid >= pg_snapshot_xmin($2::pg_snapshot) AND xid < pg_snapshot_xmax($3::pg_snapshot)
      AND (xid, id) > ($4::text::xid8, $5::bigint)
      AND pg_visible_in_snapshot(xid, $3::pg_snapshot)
      AND NOT pg_visible_in_snapshot(xid, $2::pg_snapshot)` + streamFilter + `
ORDER BY xid, id
LIMIT $6`

// readBatchRows re-reads a batch exactly: the same pair, the same range.
const readBatchRows = `
SELECT ` + messageColumns + `
FROM {{schema}}.outbox_published
WHERE topic = $1 AND status = 'PUBLISHED'
      AND xid >= pg_snapshot_xmin($2::pg_snapshot) AND xid <= $12::text::xid8
      AND (xid, id) > ($4::text::xid8, $5::bigint) AND (xid, id) <= ($12::text::xid8, $6::bigint)
      AND pg_visible_in_snapshot(xid, $3::pg_snapshot)
      AND NOT pg_visible_in_snapshot(xid, $2::pg_snapshot)` + streamFilter + `
ORDER BY xid, id`

const insertBatch = `
INSERT INTO {{schema}}.outbox_group_batches
    (subscription_id, prev, cur, after_xid, after_id, last_xid, last_id, member, lease_until)
VALUES ($1, $2::pg_snapshot, $3::pg_snapshot, $4::text::xid8, $5, $6::text::xid8, $7, $8,
        coalesce($9::timestamptz, now()) + $10 * interval '1 microsecond')
RETURNING id, lease_until`

const advanceOffset = `
UPDATE {{schema}}.outbox_subscription_offsets
SET position = $2::pg_snapshot, pair_cur = $3::pg_snapshot,
    resume_xid = $4::text::xid8, resume_id = $5, updated_at = now()
WHERE subscription_id = $1`

// finishBatch deletes a batch its member completed; no row means the lease
// expired and another member took the batch over.
const finishBatch = `DELETE FROM {{schema}}.outbox_group_batches WHERE id = $1 AND member = $2`

// releaseBatch ends a lease early so another member re-reads the batch now.
const releaseBatch = `
UPDATE {{schema}}.outbox_group_batches SET lease_until = '-infinity' WHERE id = $1 AND member = $2`

const insertRetries = `
INSERT INTO {{schema}}.outbox_group_retries
    (subscription_id, message_id, status, attempts, available_at, last_error, dead_lettered_at)
SELECT $1, r.message_id, CASE WHEN r.dead THEN 'DEAD_LETTER' ELSE 'RETRY' END, r.attempts,
       coalesce($6::timestamptz, now()) + r.delay_us * interval '1 microsecond', r.err,
       CASE WHEN r.dead THEN coalesce($6::timestamptz, now()) END
FROM unnest($2::bigint[], $3::int[], $4::bigint[], $5::bool[], $7::text[]) AS r(message_id, attempts, delay_us, dead, err)
ON CONFLICT (subscription_id, message_id) DO NOTHING`

// claimRetries leases due retries of subscription $1 to member $2.
const claimRetries = `
WITH claimed AS (
    UPDATE {{schema}}.outbox_group_retries AS r
    SET status = 'PROCESSING', attempts = r.attempts + 1, lease_owner = $2,
        lease_until = coalesce($3::timestamptz, now()) + $4 * interval '1 microsecond'
    FROM (SELECT message_id FROM {{schema}}.outbox_group_retries
          WHERE subscription_id = $1 AND status = 'RETRY' AND available_at <= coalesce($3::timestamptz, now())
          ORDER BY available_at LIMIT $5 FOR UPDATE SKIP LOCKED) AS due
    WHERE r.subscription_id = $1 AND r.message_id = due.message_id
    RETURNING r.message_id, r.attempts, r.lease_until
)
SELECT o.id, o.xid::text, o.payload, o.headers, o.correlation_id, coalesce(o.message_group, ''), o.priority,
       o.created_at, c.attempts, c.lease_until
FROM claimed AS c JOIN {{schema}}.outbox_published AS o ON o.id = c.message_id`

const settleRetry = `
UPDATE {{schema}}.outbox_group_retries
SET status = CASE WHEN $5 THEN 'DEAD_LETTER' ELSE 'RETRY' END,
    available_at = coalesce($7::timestamptz, now()) + $4 * interval '1 microsecond',
    dead_lettered_at = CASE WHEN $5 THEN coalesce($7::timestamptz, now()) END,
    last_error = $6, lease_owner = NULL, lease_until = NULL
WHERE subscription_id = $1 AND message_id = $2 AND lease_owner = $3 AND status = 'PROCESSING'`

const deleteRetry = `
DELETE FROM {{schema}}.outbox_group_retries
WHERE subscription_id = $1 AND message_id = $2 AND lease_owner = $3 AND status = 'PROCESSING'`

const reapRetries = `
UPDATE {{schema}}.outbox_group_retries
SET status = CASE WHEN attempts >= $3 THEN 'DEAD_LETTER' ELSE 'RETRY' END,
    dead_lettered_at = CASE WHEN attempts >= $3 THEN coalesce($2::timestamptz, now()) END,
    available_at = coalesce($2::timestamptz, now()),
    last_error = 'lease expired (member ' || coalesce(lease_owner, '?') || ')',
    lease_owner = NULL, lease_until = NULL
WHERE subscription_id = $1 AND status = 'PROCESSING' AND lease_until < coalesce($2::timestamptz, now())`

const listGroupDeadLetters = `
SELECT o.id, o.payload, o.headers, o.correlation_id, coalesce(o.message_group, ''), o.priority,
       r.attempts, o.created_at, r.dead_lettered_at, coalesce(r.last_error, '')
FROM {{schema}}.outbox_group_retries AS r JOIN {{schema}}.outbox_published AS o ON o.id = r.message_id
WHERE r.subscription_id = $1 AND r.status = 'DEAD_LETTER' AND r.message_id > $2
ORDER BY r.message_id
LIMIT $3`

const replayGroupDeadLetters = `
UPDATE {{schema}}.outbox_group_retries
SET status = 'RETRY', attempts = 0, available_at = now(), dead_lettered_at = NULL
WHERE subscription_id = $1 AND status = 'DEAD_LETTER' AND ($2::bigint[] IS NULL OR message_id = ANY($2::bigint[]))`

const subscriptionStatus = `
SELECT subscription_status FROM {{schema}}.outbox_topic_subscriptions WHERE topic = $1 AND group_name = $2`

// anyDeadCandidate is deadCandidates' cheap, lock-free pre-check.
const anyDeadCandidate = `
SELECT EXISTS (SELECT 1 FROM {{schema}}.outbox_topic_subscriptions
               WHERE topic = $1 AND subscription_status = 'ACTIVE'
                     AND last_heartbeat_at < now() - heartbeat_timeout)`

// deadCandidates: ACTIVE groups of topic $1 whose heartbeats stopped.
const deadCandidates = `
SELECT id, coalesce(bit, -1) FROM {{schema}}.outbox_topic_subscriptions
WHERE topic = $1 AND subscription_status = 'ACTIVE'
      AND last_heartbeat_at < now() - heartbeat_timeout
FOR UPDATE SKIP LOCKED`

// committedPosition is what a group has finished: the prev of its oldest
// open batch, else its position. Rows visible in it are done by the group
// (except its pending retries).
const committedPosition = `
SELECT s.id, coalesce((SELECT b.prev FROM {{schema}}.outbox_group_batches AS b
                       WHERE b.subscription_id = s.id ORDER BY b.id LIMIT 1), o.position)::text
FROM {{schema}}.outbox_topic_subscriptions AS s
JOIN {{schema}}.outbox_subscription_offsets AS o ON o.subscription_id = s.id
WHERE s.topic = $1 AND s.subscription_status IN ('ACTIVE', 'PAUSED')`

// deleteGroupState drops a cancelled group's batches and retries.
const deleteGroupState = `
WITH b AS (DELETE FROM {{schema}}.outbox_group_batches WHERE subscription_id = $1)
DELETE FROM {{schema}}.outbox_group_retries WHERE subscription_id = $1`

// ---------------------------------------------------------------- bitmap

// bitmapComplete ORs the group's bit into done_bits: one UPDATE a batch.
const bitmapComplete = `
UPDATE {{schema}}.outbox_published SET done_bits = done_bits | $2
WHERE id = ANY($1::bigint[]) AND required_bits & $2 <> 0 AND done_bits & $2 = 0`

const bitmapCompleted = `
SELECT id FROM {{schema}}.outbox_published WHERE id = ANY($1::bigint[]) AND done_bits & $2 <> 0`

// bitmapBackfill makes a late group required on up to $4 unfinished rows of
// its stream (not visible in $3) it is not yet required on; finished rows
// are never re-opened. $5 all rows / $6 from time / $7 from id narrow it.
const bitmapBackfill = `
UPDATE {{schema}}.outbox_published SET required_bits = required_bits | $2
WHERE id IN (
    SELECT id FROM {{schema}}.outbox_published
    WHERE topic = $1 AND status = 'PUBLISHED' AND required_bits & $2 = 0
          AND required_bits <> 0 AND done_bits & required_bits <> required_bits
          AND NOT pg_visible_in_snapshot(xid, $3::pg_snapshot)
          AND ($5::bool OR created_at >= $6::timestamptz OR id >= $7::bigint)
    ORDER BY id LIMIT $4)`

// bitmapForget drops the group from up to $3 rows it had not completed.
const bitmapForget = `
UPDATE {{schema}}.outbox_published SET required_bits = required_bits & ~$2::bigint
WHERE id IN (
    SELECT id FROM {{schema}}.outbox_published
    WHERE topic = $1 AND status = 'PUBLISHED' AND required_bits & $2 <> 0 AND done_bits & $2 = 0
    ORDER BY id LIMIT $3)`

// retention: rows older than the topic's retention (and, for rows nobody
// was subscribed to, older than the zero-subscription floor), with no
// pending retry of a subscribed group.
const retention = `
      AND o.created_at < coalesce($2::timestamptz, now()) - $3 * interval '1 microsecond'
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS r
                      JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = r.subscription_id
                      WHERE r.message_id = o.id AND s.subscription_status IN ('ACTIVE', 'PAUSED'))`

const bitmapCleanup = `
DELETE FROM {{schema}}.outbox_published WHERE id IN (
    SELECT o.id FROM {{schema}}.outbox_published AS o
    WHERE o.topic = $1 AND o.status = 'PUBLISHED' AND coalesce(o.done_bits, 0) & o.required_bits = o.required_bits
          AND (o.required_bits <> 0 OR o.created_at < coalesce($2::timestamptz, now()) - $5 * interval '1 microsecond')` +
	retention + `
    ORDER BY o.id LIMIT $4)`

// ---------------------------------------------------------------- counter

// counterComplete inserts dedupe rows and counts only the new ones, so a
// redelivered message is never counted twice.
const counterComplete = `
WITH fresh AS (
    INSERT INTO {{schema}}.outbox_consumer_groups (message_id, subscription_id)
    SELECT unnest($1::bigint[]), $2
    ON CONFLICT DO NOTHING
    RETURNING message_id
)
UPDATE {{schema}}.outbox_published AS o SET completed_count = o.completed_count + 1
FROM (SELECT message_id FROM fresh ORDER BY message_id) AS f -- lock rows in id order, like every group
WHERE o.id = f.message_id AND $2 = ANY(o.required_ids)`

const counterCompleted = `
SELECT message_id FROM {{schema}}.outbox_consumer_groups
WHERE message_id = ANY($1::bigint[]) AND subscription_id = $2`

const counterBackfill = `
UPDATE {{schema}}.outbox_published
SET required_ids = array_append(required_ids, $2::bigint), required_count = required_count + 1
WHERE id IN (
    SELECT id FROM {{schema}}.outbox_published AS o
    WHERE topic = $1 AND status = 'PUBLISHED' AND NOT ($2::bigint = ANY(required_ids))
          AND required_count > 0 AND completed_count < required_count
          AND NOT pg_visible_in_snapshot(xid, $3::pg_snapshot)
          AND ($5::bool OR created_at >= $6::timestamptz OR id >= $7::bigint)
          AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_consumer_groups AS c
                          WHERE c.message_id = o.id AND c.subscription_id = $2)
    ORDER BY id LIMIT $4)`

const counterForget = `
UPDATE {{schema}}.outbox_published
SET required_ids = array_remove(required_ids, $2::bigint), required_count = required_count - 1
WHERE id IN (
    SELECT id FROM {{schema}}.outbox_published AS o
    WHERE topic = $1 AND status = 'PUBLISHED' AND $2::bigint = ANY(required_ids)
          AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_consumer_groups AS c
                          WHERE c.message_id = o.id AND c.subscription_id = $2)
    ORDER BY id LIMIT $3)`

const counterCleanup = `
WITH gone AS (
    DELETE FROM {{schema}}.outbox_published WHERE id IN (
        SELECT o.id FROM {{schema}}.outbox_published AS o
        WHERE o.topic = $1 AND o.status = 'PUBLISHED' AND coalesce(o.completed_count, 0) >= coalesce(o.required_count, 0)
              AND (o.required_count > 0 OR o.created_at < coalesce($2::timestamptz, now()) - $5 * interval '1 microsecond')` +
	retention + `
        ORDER BY o.id LIMIT $4)
    RETURNING id
), dedupe AS (
    DELETE FROM {{schema}}.outbox_consumer_groups WHERE message_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone`

// ---------------------------------------------------------------- offset

// offsetCleanup deletes rows every subscribed group has passed: visible in
// the watermark $6 (the least committed position), or, with no subscribed
// group ($6 NULL), past the zero-subscription floor.
const offsetCleanup = `
DELETE FROM {{schema}}.outbox_published WHERE id IN (
    SELECT o.id FROM {{schema}}.outbox_published AS o
    WHERE o.topic = $1 AND o.status = 'PUBLISHED'
          AND CASE WHEN $6::pg_snapshot IS NULL
                   THEN o.created_at < coalesce($2::timestamptz, now()) - $5 * interval '1 microsecond'
                   ELSE pg_visible_in_snapshot(o.xid, $6::pg_snapshot) END` +
	retention + `
    ORDER BY o.id LIMIT $4)`

const upsertWatermark = `
INSERT INTO {{schema}}.outbox_topic_watermarks (topic, watermark) VALUES ($1, $2::pg_snapshot)
ON CONFLICT (topic) DO UPDATE SET watermark = excluded.watermark, updated_at = now()`
