package sqlq

import (
	"strconv"
	"strings"

	"github.com/pgoutbox/pgoutbox/internal/ident"
)

// PubSub is the SQL of consumer groups on PUB_SUB topics.
//
// Snapshots (pg_snapshot) and transaction ids (xid8) travel as text.
//
// Locks are always taken in one order, so lifecycle changes never
// deadlock: a subscription row, then its offsets row, then the topic row.
// Producers take the topic row FOR KEY SHARE (see insertPublished), so a
// change of the subscribed set waits for the producer transactions that
// read the old set and holds back those that would read it next.
type PubSub struct {
	// Subscriptions and their state.
	LockTopic, LockTopicShared                                     string
	SelectSubscription, InsertSubscription, InsertOffset           string
	SubscribedBits, AddSubscribed, RemoveSubscribed, SetStatus     string
	LockOffsetWait, ResurrectOffset, SubscriptionStatus, Heartbeat string
	ResurrectOffsetMode                                            string
	DeadCandidates, AnyDeadCandidate, LockOffsetsSkipLocked        string
	PendingForgets, LockForget, ForgetDone, DeleteGroupState       string
	CommittedPosition, DeletedTombstone                            string

	// Fetching.
	LockOffset, OffsetExists, FetchState           string
	CatchupRows, CatchupSize, CatchupProgress      string
	FinishBackfill, CancelBackfill, BackfillState  string
	NextBackfillPair                               string
	TakeExpiredBatch, MoveBatchToRetries           string
	FetchRows, AdvanceOffset, InsertBatch, AnyWork string
	ReapRetries, DeleteOrphanRetries, ClaimRetries string
	ParkRows, ClaimOrderedRetries                  string
	CopyDeadLetters, DeadLettersToComplete         string

	// Completing.
	FinishBatch, InsertRetries, SettleRetry, DeleteRetries, ExtendLeases string
	HoldBatch, TakeRetry, RecordHandled, ForgetHandled                   string

	// Administration.
	ListDeadLetters, ReplayDeadLetters, DiscardDeadLetters    string
	BlockedMessageGroups, BlockedGroupsSummary                string
	GroupHealthHead, GroupHealth                              string
	ResurrectFromNow, ForceCompleteRetries, ForceCompleteRows string
	ForceTarget, ForceAdvance                                 string
	Inconsistencies                                           string

	CompleteRecords, CompleteTracked                              string
	BitmapCompleted, BitmapForget, BitmapStrip, BitmapCleanup     string
	CounterCompleted                                              string
	CounterForgetCandidates                                       string
	CounterForget, CounterCleanup, OffsetCleanup, UpsertWatermark string
	BitmapHeld, CounterHeld, OffsetHeld                           string
	MixedHeld, MixedCleanup, ModeChangeOver                       string
	RetentionFrontier, SnapshotXmax                               string
}

// ForPubSub returns the statements for schema (already validated).
func ForPubSub(schema string) *PubSub {
	r := strings.NewReplacer("{{schema}}", ident.Quote(schema))
	q := func(s string) string { return r.Replace(s) }
	return &PubSub{
		LockTopic:             q(lockTopic),
		LockTopicShared:       q(lockTopicShared),
		DeletedTombstone:      q(deletedTombstone),
		CopyDeadLetters:       q(copyDeadLetters),
		DeadLettersToComplete: q(deadLettersToComplete),
		SelectSubscription:    q(selectSubscription),
		InsertSubscription:    q(insertSubscription),
		InsertOffset:          q(insertOffset),
		SubscribedBits:        q(subscribedBits),
		AddSubscribed:         q(addSubscribed),
		RemoveSubscribed:      q(removeSubscribed),
		SetStatus:             q(setStatus),
		LockOffsetWait:        q(lockOffsetWait),
		ResurrectOffset:       q(resurrectOffset),
		ResurrectOffsetMode:   q(resurrectOffsetMode),
		SubscriptionStatus:    q(subscriptionStatus),
		Heartbeat:             q(heartbeat),
		DeadCandidates:        q(deadCandidates),
		AnyDeadCandidate:      q(anyDeadCandidate),
		LockOffsetsSkipLocked: q(lockOffsetsSkipLocked),
		PendingForgets:        q(pendingForgets),
		LockForget:            q(lockForget),
		ForgetDone:            q(forgetDone),
		DeleteGroupState:      q(deleteGroupState),
		CommittedPosition:     q(committedPosition),

		LockOffset:          q(lockOffset),
		OffsetExists:        q(offsetExists),
		FetchState:          q(fetchState),
		CatchupRows:         q(catchupRows),
		CatchupSize:         q(catchupSize),
		CatchupProgress:     q(catchupProgress),
		FinishBackfill:      q(finishBackfill),
		CancelBackfill:      q(cancelBackfill),
		BackfillState:       q(backfillState),
		NextBackfillPair:    q(nextBackfillPair),
		TakeExpiredBatch:    q(takeExpiredBatch),
		MoveBatchToRetries:  q(moveBatchToRetries),
		FetchRows:           q(fetchRows),
		AnyWork:             q(anyWork),
		AdvanceOffset:       q(advanceOffset),
		InsertBatch:         q(insertBatch),
		ReapRetries:         q(reapRetries),
		DeleteOrphanRetries: q(deleteOrphanRetries),
		ClaimRetries:        q(claimRetries),
		ParkRows:            q(parkRows),
		ClaimOrderedRetries: q(claimOrderedRetries),

		FinishBatch:   q(finishBatch),
		InsertRetries: q(insertRetries),
		SettleRetry:   q(settleRetry),
		DeleteRetries: q(deleteRetries),
		ExtendLeases:  q(extendGroupLeases),
		HoldBatch:     q(holdBatch),
		TakeRetry:     q(takeRetry),
		RecordHandled: q(recordHandled),
		ForgetHandled: q(forgetHandled),

		ListDeadLetters:      q(listGroupDeadLetters),
		ReplayDeadLetters:    q(replayGroupDeadLetters),
		DiscardDeadLetters:   q(discardGroupDeadLetters),
		BlockedMessageGroups: q(blockedMessageGroups),
		BlockedGroupsSummary: q(blockedGroupsSummary),
		GroupHealthHead:      q(groupHealthHead),
		GroupHealth:          q(groupHealth),
		ResurrectFromNow:     q(resurrectFromNow),
		ForceCompleteRetries: q(forceCompleteRetries),
		ForceCompleteRows:    q(forceCompleteRows),
		ForceTarget:          q(forceTarget),
		ForceAdvance:         q(forceAdvance),
		Inconsistencies:      q(inconsistencies),

		CompleteRecords:         q(completeRecords),
		CompleteTracked:         q(completeTracked),
		BitmapCompleted:         q(bitmapCompleted),
		BitmapForget:            q(bitmapForget),
		BitmapStrip:             q(bitmapStrip),
		BitmapCleanup:           q(bitmapCleanup),
		CounterCompleted:        q(counterCompleted),
		CounterForgetCandidates: q(counterForgetCandidates),
		CounterForget:           q(counterForget),
		CounterCleanup:          q(counterCleanup),
		OffsetCleanup:           q(offsetCleanup),
		BitmapHeld:              q(partitionHeld(unfinishedInRange(bitmapDone("o")))),
		CounterHeld:             q(partitionHeld(unfinishedInRange(counterDone("o")))),
		OffsetHeld:              q(partitionHeld(beforeWatermark)),
		MixedHeld:               q(partitionHeld(unfinishedInRange(mixedDone("$8")))),
		MixedCleanup:            q(mixedCleanup),
		ModeChangeOver:          q(modeChangeOver),
		UpsertWatermark:         q(upsertWatermark),
		RetentionFrontier:       q(retentionFrontier),
		SnapshotXmax:            q(snapshotXmax),
	}
}

// ---------------------------------------------------------------- subscriptions

// lockTopic serialises changes of a topic's subscribed set with the
// producers that copy it (see insertPublished): it takes the topic's lock
// exclusively, waiting for every producer transaction that read the set
// (producers arriving meanwhile queue behind it), then the row FOR UPDATE,
// which makes a producer statement that waited re-read the row.
const lockTopic = `
SELECT semantics, coalesce(tracking_mode, '') FROM {{schema}}.outbox_topics AS t
WHERE t.topic = $1 AND pg_advisory_xact_lock(` + topicLockClass + `, hashtext(t.topic)) IS NOT NULL
FOR UPDATE`

// lockTopicShared is what cleanup takes (like a producer): subscription
// changes wait for it.
const lockTopicShared = `SELECT pg_advisory_xact_lock_shared(` + topicLockClass + `, hashtext($1))`

// holdsClaims is true for a subscription s whose claims on messages
// count: an ACTIVE or PAUSED group, and a DEAD one for its topic's
// ZombieTTL after it died (it may come back for them; it claims only
// what it had not finished when it died, see deadClaims).
const holdsClaims = `(s.subscription_status IN ('ACTIVE', 'PAUSED')
       OR (s.subscription_status = 'DEAD'
           AND s.released_at > now() - (SELECT t.zombie_ttl FROM {{schema}}.outbox_topics AS t WHERE t.topic = s.topic)))`

// bySubscriptionName picks the subscription of a name: the live one (at
// most one is not CANCELLED), else the latest cancelled one.
const bySubscriptionName = `WHERE topic = $1 AND group_name = $2
ORDER BY subscription_status = 'CANCELLED', id DESC LIMIT 1`

const selectSubscription = `
SELECT id, subscription_status, coalesce(bit, -1), start_position,
       start_from_timestamp, start_from_message_id
FROM {{schema}}.outbox_topic_subscriptions
` + bySubscriptionName + `
FOR UPDATE`

// deletedTombstone tells (and forgets) that a group of this name was
// deleted by subscription cleanup.
const deletedTombstone = `
DELETE FROM {{schema}}.outbox_deleted_subscriptions WHERE topic = $1 AND group_name = $2
RETURNING last_status, deleted_at`

const insertSubscription = `
INSERT INTO {{schema}}.outbox_topic_subscriptions
    (topic, group_name, bit, start_position, start_from_timestamp, start_from_message_id, heartbeat_timeout)
VALUES ($1, $2, $3, $4, $5, $6, $7 * interval '1 microsecond')
RETURNING id`

// insertOffset sets a new group's start: the current snapshot for "from
// now" (taken inside the registering transaction after it locked the topic
// row, so every message written with the old subscribed set is visible in
// it), or the empty snapshot, which sees nothing, for every other start.
// $3 > 0 asks for a backfill of up to $3 older messages: the group's
// stream then starts now, and a catch-up reads the older ones beside it
// (the rows visible now and in the empty snapshot's future).
const insertOffset = `
INSERT INTO {{schema}}.outbox_subscription_offsets
    (subscription_id, position, backfill_from, backfill_upto, backfill_left, backfill_started_at)
VALUES ($1, CASE WHEN $2 OR $3 > 0 THEN pg_current_snapshot() ELSE '1:1:'::pg_snapshot END,
        CASE WHEN $3 > 0 THEN '1:1:'::pg_snapshot END, CASE WHEN $3 > 0 THEN pg_current_snapshot() END,
        $3, CASE WHEN $3 > 0 THEN now() END)`

// subscribedBits are the bits taken on topic $1: a bit belongs to its
// subscription until a CANCELLED group was forgotten everywhere.
const subscribedBits = `
SELECT bit FROM {{schema}}.outbox_topic_subscriptions WHERE topic = $1 AND bit IS NOT NULL`

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

// setStatus records a state change; leaving (DEAD, CANCELLED) makes
// forgetting pending, coming back (ACTIVE) ends it. A group declared DEAD
// records the current snapshot (dead_upto): run under the topic's lock,
// it sees every message written before, and none written after, which
// are not the DEAD group's claim (see deadClaims).
const setStatus = `
UPDATE {{schema}}.outbox_topic_subscriptions
SET subscription_status = $2, last_active_at = now(),
    released_at = CASE WHEN $2 IN ('DEAD', 'CANCELLED') THEN now() END,
    dead_upto = CASE WHEN $2 = 'DEAD' THEN pg_current_snapshot() END,
    forget_pending = $2 IN ('DEAD', 'CANCELLED'),
    last_heartbeat_at = CASE WHEN $2 = 'ACTIVE' THEN now() ELSE last_heartbeat_at END
WHERE id = $1`

// lockOffsetWait: a state change waits for a fetch in progress, so every
// fetch sees the state it runs under until it commits.
const lockOffsetWait = `
SELECT 1 FROM {{schema}}.outbox_subscription_offsets WHERE subscription_id = $1 FOR UPDATE`

// resurrectOffset prepares a Bitmap or Counter group that comes back. Its
// stream starts now; a catch-up reads, beside it, what lies between its
// position (or the start of a catch-up it left unfinished) and now and it
// has not completed, up to $2 rows: what it owed, and what was written
// while it was DEAD (still stored) and so does not require it. Its open
// batches are expired: the next fetch moves their rows to the retry
// table, which the catch-up leaves alone.
const resurrectOffset = `
WITH expired AS (
    UPDATE {{schema}}.outbox_group_batches SET lease_until = '-infinity' WHERE subscription_id = $1
)
UPDATE {{schema}}.outbox_subscription_offsets AS o
SET backfill_from = CASE WHEN o.backfill_upto IS NOT NULL THEN o.backfill_from ELSE o.position END,
    backfill_upto = pg_current_snapshot(), backfill_xid = NULL, backfill_id = NULL, backfill_left = $2,
    backfill_lower = NULL, backfill_next = NULL,
    backfill_total = 0, backfill_done = 0, backfill_started_at = now(), backfill_ended_at = NULL, backfill_outcome = NULL,
    position = pg_current_snapshot(), pair_cur = NULL, resume_xid = NULL, resume_id = NULL, updated_at = now()
WHERE o.subscription_id = $1`

// resurrectOffsetMode is resurrectOffset for a group of an Offset topic,
// which records nothing per message: its catch-up cannot skip what it
// completed, so it reads exactly what the group had not read, pair after
// pair (see backfillSegment): the rest of the backfill it was reading
// when it died, then the rest of the snapshot pair its stream had begun,
// then what lies between there and now (what it owed, and what was
// written while it was DEAD and is still stored), up to $2 rows in all.
// Its stream starts now. Cleanup keeps, until the catch-up ends,
// everything its committed position had not seen (backfill_from), the
// rows of its open batches too: they are expired, and the next fetch
// moves them to the retry table.
var resurrectOffsetMode = `
WITH expired AS (
    UPDATE {{schema}}.outbox_group_batches SET lease_until = '-infinity' WHERE subscription_id = $1
), reading AS (
    SELECT CASE WHEN o.backfill_upto IS NOT NULL AND o.backfill_ended_at IS NULL
                THEN jsonb_build_array(` + backfillSegment("coalesce(o.backfill_lower, o.backfill_from)", "o.backfill_upto", "o.backfill_xid", "o.backfill_id") + `)
                     || coalesce(o.backfill_next, '[]')
                ELSE '[]' END
           || CASE WHEN o.pair_cur IS NOT NULL
                   THEN jsonb_build_array(` + backfillSegment("o.position", "o.pair_cur", "o.resume_xid", "o.resume_id") + `)
                   ELSE '[]' END
           || jsonb_build_array(` + backfillSegment("coalesce(o.pair_cur, o.position)", "pg_current_snapshot()", "NULL::xid8", "NULL::bigint") + `) AS pairs,
           ` + committedOf("s", "o") + ` AS committed
    FROM {{schema}}.outbox_subscription_offsets AS o
    JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = o.subscription_id
    WHERE o.subscription_id = $1
)
UPDATE {{schema}}.outbox_subscription_offsets AS o
SET backfill_from = r.committed, ` + popBackfillPair("r.pairs") + `,
    backfill_left = $2, backfill_total = 0, backfill_done = 0, backfill_started_at = now(), backfill_ended_at = NULL,
    backfill_outcome = NULL,
    position = pg_current_snapshot(), pair_cur = NULL, resume_xid = NULL, resume_id = NULL, updated_at = now()
FROM reading AS r
WHERE o.subscription_id = $1`

// backfillSegment is a snapshot pair a backfill reads, after a cursor,
// as an element of backfill_next.
func backfillSegment(lower, upto, xid, id string) string {
	return `jsonb_build_object('lower', ` + lower + `::text, 'upto', ` + upto + `::text, 'xid', ` + xid + `::text, 'id', ` + id + `)`
}

// popBackfillPair sets a backfill's current pair and cursor to the first
// of pairs (a jsonb array of backfillSegment) and queues the rest.
func popBackfillPair(pairs string) string {
	return `backfill_lower = (` + pairs + `->0->>'lower')::pg_snapshot, backfill_upto = (` + pairs + `->0->>'upto')::pg_snapshot,
    backfill_xid = (` + pairs + `->0->>'xid')::xid8, backfill_id = (` + pairs + `->0->>'id')::bigint,
    backfill_next = nullif(` + pairs + ` - 0, '[]')`
}

// nextBackfillPair moves subscription $1's backfill, whose current pair
// is read, to the next it queues, returning it (lower, upto, cursor) and
// whether more are queued behind it.
var nextBackfillPair = `
UPDATE {{schema}}.outbox_subscription_offsets
SET ` + popBackfillPair("backfill_next") + `, backfill_total = 0, updated_at = now()
WHERE subscription_id = $1 AND backfill_next IS NOT NULL
RETURNING backfill_lower::text, backfill_upto::text, coalesce(backfill_xid::text, '0'), coalesce(backfill_id, 0),
          backfill_next IS NOT NULL`

// resurrectFromNow prepares a group that comes back without a backfill:
// its stream starts now, a backfill it left unfinished ends (SKIPPED),
// and its open batches are dropped (their messages, like every other it
// had not completed, were released before: see Group.Resurrect). Its
// retries and dead letters stay.
const resurrectFromNow = `
WITH batches AS (
    DELETE FROM {{schema}}.outbox_group_batches WHERE subscription_id = $1
)
UPDATE {{schema}}.outbox_subscription_offsets
SET backfill_from = NULL, backfill_upto = NULL, backfill_xid = NULL, backfill_id = NULL, backfill_left = 0,
    backfill_lower = NULL, backfill_next = NULL,
    backfill_ended_at = CASE WHEN backfill_upto IS NOT NULL AND backfill_ended_at IS NULL THEN now() ELSE backfill_ended_at END,
    backfill_outcome = CASE WHEN backfill_upto IS NOT NULL AND backfill_ended_at IS NULL THEN 'SKIPPED' ELSE backfill_outcome END,
    position = pg_current_snapshot(), pair_cur = NULL, resume_xid = NULL, resume_id = NULL, updated_at = now()
WHERE subscription_id = $1`

// forceCompleteRetries deletes up to $3 retries and dead letters of
// subscription $1 (not leased: an instance is handling those) of messages
// written before $2, returning their message ids.
const forceCompleteRetries = `
DELETE FROM {{schema}}.outbox_group_retries WHERE (subscription_id, message_id) IN (
    SELECT r.subscription_id, r.message_id FROM {{schema}}.outbox_group_retries AS r
    LEFT JOIN {{schema}}.outbox_published AS o ON o.id = r.message_id
    WHERE r.subscription_id = $1 AND r.status <> 'PROCESSING' AND coalesce(o.created_at, r.created_at) < $2
    ORDER BY r.message_id LIMIT $3 FOR UPDATE OF r SKIP LOCKED)
RETURNING message_id`

// forceCompleteRows lists up to $6 stored messages of topic $1 with ids
// above $5 written before $2 that require subscription $4 (by bit $3 or
// by id) and that it has not completed, in id order.
var forceCompleteRows = `
SELECT o.id FROM {{schema}}.outbox_published AS o
WHERE o.topic = $1 AND o.id > $5 AND o.created_at < $2 AND o.status = 'PUBLISHED'
      AND ((o.required_bits & $3::bigint <> 0 AND coalesce(o.done_bits, 0) & $3::bigint = 0)
           OR $4::bigint = ANY(o.required_ids))
      AND NOT ` + recordedBy("o", "$4") + `
ORDER BY o.id LIMIT $6`

// forceTarget is where ForceComplete may move subscription $1's read
// position to pass the messages of topic $2 written before $3 that it has
// not read: a snapshot that sees every xid below X, the lesser of the
// database's xmin (every xid below it has ended) and the first xid, in
// commit order, of a message it has not read written at or after $3. X is
// returned as text.
var forceTarget = `
SELECT least(pg_snapshot_xmin(pg_current_snapshot()),
             (SELECT u.xid FROM (` + unseenRows("o.xid, o.id", "o.topic = $2 AND o.created_at >= $3", "p.position", "'0'::xid8", "-1", "1") + `) AS u
              ORDER BY u.xid, u.id LIMIT 1))::text
FROM {{schema}}.outbox_subscription_offsets AS p WHERE p.subscription_id = $1`

// forceAdvance moves subscription $1's read position to see every xid
// below $2 (forceTarget's), when it can without reading anything twice:
// no batch open, no snapshot pair in progress, and $2 past the position's
// xmax (so the new position sees all the old one saw).
const forceAdvance = `
UPDATE {{schema}}.outbox_subscription_offsets AS f
SET position = ($2 || ':' || $2 || ':')::pg_snapshot, updated_at = now()
WHERE f.subscription_id = $1 AND f.pair_cur IS NULL AND $2::xid8 > pg_snapshot_xmax(f.position)
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_batches AS b WHERE b.subscription_id = $1)`

// inconsistencies reads every stored PUB_SUB message (up to $1 per topic
// and kind are counted) and reports, per topic, the messages whose
// completion record does not add up: COUNT, a Counter record whose count
// is not its number of required groups; GROUP, a message that requires a group (by id or
// bit) that no longer has a subscription that may complete it; MODE, a
// record of another mode than the topic's while no mode change is under
// way. None should ever exist: each is a bug, or a hand edit.
const inconsistencies = `
WITH bad AS (
    SELECT o.topic, o.id, CASE
        WHEN o.required_count IS NOT NULL
             AND o.required_count <> cardinality(o.required_ids) THEN 'COUNT'
        WHEN o.required_ids IS NOT NULL
             AND EXISTS (SELECT 1 FROM unnest(o.required_ids) AS r(id)
                         WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_topic_subscriptions AS s
                                           WHERE s.id = r.id AND s.topic = o.topic
                                                 AND (s.subscription_status <> 'CANCELLED' OR s.forget_pending))) THEN 'GROUP'
        WHEN o.required_bits IS NOT NULL
             AND o.required_bits & ~(SELECT coalesce(bit_or(1::bigint << s.bit), 0) FROM {{schema}}.outbox_topic_subscriptions AS s
                                     WHERE s.topic = o.topic AND s.bit IS NOT NULL) <> 0 THEN 'GROUP'
        WHEN t.mode_changed_below IS NULL
             AND ((t.tracking_mode = 'BITMAP') <> (o.required_bits IS NOT NULL)
                  OR (t.tracking_mode = 'COUNTER') <> (o.required_count IS NOT NULL)) THEN 'MODE'
        END AS kind
    FROM {{schema}}.outbox_published AS o
    JOIN {{schema}}.outbox_topics AS t ON t.topic = o.topic
    WHERE t.semantics = 'PUB_SUB'
), ranked AS (
    SELECT topic, kind, id, row_number() OVER (PARTITION BY topic, kind ORDER BY id) AS n FROM bad WHERE kind IS NOT NULL
)
SELECT topic, kind, count(*), min(id) FROM ranked WHERE n <= $1 GROUP BY topic, kind ORDER BY topic, kind`

const subscriptionStatus = `
SELECT id, subscription_status FROM {{schema}}.outbox_topic_subscriptions
` + bySubscriptionName

// groupHealthHead reads what a group's health starts from (by name): its
// subscription, as streamFor needs it, and its liveness.
const groupHealthHead = `
SELECT id, subscription_status, coalesce(bit, -1), start_position, start_from_timestamp, start_from_message_id,
       last_heartbeat_at, extract(epoch FROM heartbeat_timeout)::float8, subscribed_at
FROM {{schema}}.outbox_topic_subscriptions
` + bySubscriptionName

// scheduledRetry is true for a retry row that waits for its message to be
// due (Delay, NotBefore: see parkRows), having never failed.
const scheduledRetry = `(status = 'RETRY' AND failing_since IS NULL AND available_at > now())`

// groupHealth measures subscription $1 of topic $2 (stream $3..$7, see
// streamFilter; completions of bit $8 or subscription $9, see
// notCompleted), each count at most $10: the committed rows its position
// had not seen and it has not completed (their count, read in no order so
// the count stops early, and the created_at of the first in commit order), its batches and retry deliveries under lease, its waiting
// retries (messages that failed: failing_since is set), its queued
// messages (due for a delivery that is not a retry: an ordered group's
// queue, replayed dead letters, messages a stopping instance handed back
// untried), the created_at of the oldest message it retries or queues
// (the lowest id: one probe),
// and its dead letters. The unread rows are read only when $11 is true:
// a DEAD group is in no new message's required set, so reading its
// stream would walk everything written since it died to find nothing.
var groupHealth = `
WITH f AS (
    SELECT position FROM {{schema}}.outbox_subscription_offsets WHERE subscription_id = $1
), unread AS (
    SELECT 1 FROM (` + unseenRows("1", healthUnread, "(SELECT position FROM f)", "'0'::xid8", "-1", "") + `) AS o
    WHERE $11::bool
    LIMIT $10
), oldest_unread AS (
    SELECT o.created_at FROM (` + unseenRows("o.created_at, o.xid, o.id", healthUnread, "(SELECT position FROM f)", "'0'::xid8", "-1", "1") + `) AS o
    WHERE $11::bool
    ORDER BY o.xid, o.id LIMIT 1
), oldest_retry AS (
    SELECT min(message_id) AS id FROM {{schema}}.outbox_group_retries
    WHERE subscription_id = $1 AND status <> 'DEAD_LETTER' AND NOT ` + scheduledRetry + `
)
SELECT (SELECT count(*) FROM unread), (SELECT created_at FROM oldest_unread),
       (SELECT count(*) FROM {{schema}}.outbox_group_batches WHERE subscription_id = $1),
       (SELECT count(*) FROM (SELECT 1 FROM {{schema}}.outbox_group_retries
                              WHERE subscription_id = $1 AND status = 'PROCESSING' LIMIT $10) AS r),
       (SELECT count(*) FROM (SELECT 1 FROM {{schema}}.outbox_group_retries
                              WHERE subscription_id = $1 AND status = 'RETRY' AND failing_since IS NOT NULL
                              LIMIT $10) AS r),
       (SELECT count(*) FROM (SELECT 1 FROM {{schema}}.outbox_group_retries
                              WHERE subscription_id = $1 AND status = 'RETRY' AND failing_since IS NULL
                                    AND available_at <= now() LIMIT $10) AS r),
       (SELECT count(*) FROM (SELECT 1 FROM {{schema}}.outbox_group_retries
                              WHERE subscription_id = $1 AND ` + scheduledRetry + ` LIMIT $10) AS r),
       (SELECT o.created_at FROM {{schema}}.outbox_published AS o, oldest_retry WHERE o.topic = $2 AND o.id = oldest_retry.id),
       (SELECT count(*) FROM (SELECT 1 FROM {{schema}}.outbox_group_retries
                              WHERE subscription_id = $1 AND status = 'DEAD_LETTER' LIMIT $10) AS r),
       now()`

// healthUnread is what groupHealth counts as unread: committed rows of
// the group's stream it has not completed.
var healthUnread = `o.topic = $2 AND pg_visible_in_snapshot(o.xid, pg_current_snapshot())` + streamFilter("o", 3) + notCompleted("o", 8)

// heartbeat records database time only. It reports the status, so a DEAD
// group's instance can resurrect it; no row: the subscription is gone.
const heartbeat = `
UPDATE {{schema}}.outbox_topic_subscriptions
SET last_heartbeat_at = now(), heartbeat_timeout = $2 * interval '1 microsecond'
WHERE id = $1
RETURNING subscription_status`

// anyDeadCandidate is deadCandidates' cheap, lock-free pre-check.
const anyDeadCandidate = `
SELECT EXISTS (SELECT 1 FROM {{schema}}.outbox_topic_subscriptions
               WHERE topic = $1 AND subscription_status = 'ACTIVE'
                     AND last_heartbeat_at < now() - heartbeat_timeout)`

// deadCandidates: ACTIVE groups of topic $1 whose heartbeats stopped.
const deadCandidates = `
SELECT id, group_name, coalesce(bit, -1) FROM {{schema}}.outbox_topic_subscriptions
WHERE topic = $1 AND subscription_status = 'ACTIVE'
      AND last_heartbeat_at < now() - heartbeat_timeout
FOR UPDATE SKIP LOCKED`

// lockOffsetsSkipLocked locks the offsets rows of subscriptions $1 that no
// fetch holds: a group fetching right now is not dead.
const lockOffsetsSkipLocked = `
SELECT subscription_id FROM {{schema}}.outbox_subscription_offsets
WHERE subscription_id = ANY($1::bigint[])
FOR UPDATE SKIP LOCKED`

// pendingForgets: groups of topic $1 that left and may still be referred
// to: CANCELLED ones, and DEAD ones whose ZombieTTL ran out.
const pendingForgets = `
SELECT id FROM {{schema}}.outbox_topic_subscriptions AS s
WHERE topic = $1 AND forget_pending AND NOT ` + holdsClaims

// lockForget: a forget pass holds the subscription row, so a resurrection
// waits for the pass in progress and later passes see it came back. The
// last column says whether the group still holds its claims (a DEAD group
// within its ZombieTTL).
const lockForget = `
SELECT subscription_status, coalesce(bit, -1), forget_pending, ` + holdsClaims + `
FROM {{schema}}.outbox_topic_subscriptions AS s WHERE id = $1 FOR UPDATE`

// forgetDone: nothing refers to the group any more. A CANCELLED group's
// bit is free again; a backfill the group had pending ends (its rows are
// no longer kept for it).
const forgetDone = `
WITH catchup AS (
    UPDATE {{schema}}.outbox_subscription_offsets
    SET backfill_from = NULL, backfill_upto = NULL, backfill_lower = NULL, backfill_next = NULL, backfill_left = 0,
        backfill_ended_at = now(), backfill_outcome = 'FORGOTTEN'
    WHERE subscription_id = $1 AND backfill_from IS NOT NULL
)
UPDATE {{schema}}.outbox_topic_subscriptions
SET forget_pending = false,
    bit = CASE WHEN subscription_status = 'CANCELLED' THEN NULL ELSE bit END
WHERE id = $1`

// deleteGroupState drops a cancelled group's batches and retries.
const deleteGroupState = `
WITH b AS (DELETE FROM {{schema}}.outbox_group_batches WHERE subscription_id = $1)
DELETE FROM {{schema}}.outbox_group_retries WHERE subscription_id = $1`

// committedPosition is, for each ACTIVE or PAUSED group of topic $1,
// what it has finished (see committedOf). A DEAD group within its
// ZombieTTL holds only what it owes (see deadClaims).
var committedPosition = `
SELECT s.id, ` + committedOf("s", "o") + `::text
FROM {{schema}}.outbox_topic_subscriptions AS s
JOIN {{schema}}.outbox_subscription_offsets AS o ON o.subscription_id = s.id
WHERE s.topic = $1 AND s.subscription_status IN ('ACTIVE', 'PAUSED')`

// deadClaims lists the claims of topic $1's DEAD groups within their
// ZombieTTL: such a group owes the messages visible in upto (the snapshot
// taken when it was declared DEAD: written before it died) and not in
// done (its committed position: not finished). Messages written after it
// died are not its claim. In Bitmap and Counter mode the messages' own
// records say the same (it is in the required set of those it owes);
// Offset messages record nothing, so cleanup and the partition check ask
// this (see owedToDead).
var deadClaims = `
SELECT coalesce(s.dead_upto, pg_current_snapshot()) AS upto, ` + committedOf("s", "p") + ` AS done
FROM {{schema}}.outbox_topic_subscriptions AS s
JOIN {{schema}}.outbox_subscription_offsets AS p ON p.subscription_id = s.id
WHERE s.topic = $1 AND s.subscription_status = 'DEAD' AND ` + holdsClaims

// withDeadClaims begins a statement that reads deadClaims, once, as dead.
var withDeadClaims = `WITH dead AS MATERIALIZED (` + deadClaims + `)`

// owedToDead is true for a row of alias that a DEAD group of its topic
// owes (see deadClaims; the statement begins withDeadClaims).
func owedToDead(alias string) string {
	return `EXISTS (SELECT 1 FROM dead AS d WHERE pg_visible_in_snapshot(` + alias + `.xid, d.upto)
                                   AND NOT pg_visible_in_snapshot(` + alias + `.xid, d.done))`
}

// committedOf is what subscription sub (its offsets row: offsets) has
// finished: the lower bound of its pending backfill, else the prev of its
// oldest open batch, else its position. Rows visible in it are done by
// the group (except its pending retries).
func committedOf(sub, offsets string) string {
	return `coalesce(` + offsets + `.backfill_from,
                      (SELECT b.prev FROM {{schema}}.outbox_group_batches AS b
                       WHERE b.subscription_id = ` + sub + `.id ORDER BY b.id LIMIT 1),
                      ` + offsets + `.position)`
}

// ---------------------------------------------------------------- fetching

// lockOffset: the instance that gets the row fetches; the others skip.
// Nobody holds it while handling. The backfill's columns are those of its
// current pair, and whether more are queued.
const lockOffset = `
SELECT position::text, pair_cur::text, resume_xid::text, resume_id,
       coalesce(backfill_lower, backfill_from)::text, backfill_upto::text, backfill_xid::text, backfill_id, backfill_left,
       backfill_total, backfill_done, coalesce(backfill_started_at, now()), backfill_ended_at IS NOT NULL,
       backfill_next IS NOT NULL
FROM {{schema}}.outbox_subscription_offsets
WHERE subscription_id = $1
FOR UPDATE SKIP LOCKED`

// offsetExists tells a locked offsets row (another instance is fetching)
// from a deleted subscription.
const offsetExists = `
SELECT EXISTS (SELECT 1 FROM {{schema}}.outbox_subscription_offsets WHERE subscription_id = $1)`

// fetchState runs after lockOffset: a state change holds the offsets row
// while it commits, so this read is current until the fetch commits.
// It also reads how the group tracks messages (see trackingState).
const fetchState = `
SELECT s.subscription_status, pg_current_snapshot()::text, ` + trackingState + `
FROM {{schema}}.outbox_topic_subscriptions AS s JOIN {{schema}}.outbox_topics AS t ON t.topic = s.topic
WHERE s.id = $1`

// trackingState is how subscription s of topic t tracks messages: its
// bit (-1: none), the topic's mode, and whether messages written under an
// earlier mode may be stored. A change of the topic's mode changes them.
const trackingState = `coalesce(s.bit, -1) AS bit, coalesce(t.tracking_mode, '') AS tracking_mode,
       t.mode_changed_below IS NOT NULL AS mode_changing`

// catchupRows reads the next rows of a pending backfill: the rows of pair
// ($2 from, $3 upto) after ($4, $5), in commit order, of the group's start
// range ($7 every row, or from time $8 or message id $9), that the group
// has not completed (bit $10, subscription $11) and that do not wait in its
// retry table.
var catchupRows = nextUnseenRows(`
      AND ($7::bool OR o.created_at >= $8::timestamptz OR o.id >= $9::bigint)` + notCompleted("o", 10) + `
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS r
                      WHERE r.subscription_id = $11::bigint AND r.message_id = o.id` + perRow + `)`)

// catchupSize estimates a backfill's size: the rows of its pair, at most $4.
var catchupSize = `
SELECT count(*) FROM (SELECT 1 FROM (` + unseenRows("o.id", `o.topic = $1 AND o.xid < pg_snapshot_xmax($3::pg_snapshot)
          AND pg_visible_in_snapshot(o.xid, $3::pg_snapshot) AND NOT pg_visible_in_snapshot(o.xid, $2::pg_snapshot)`,
	"$2::pg_snapshot", "'0'::xid8", "-1", "$4") + `) AS u LIMIT $4) AS r`

// catchupProgress records a catch-up batch: the cursor moves to ($2, $3),
// $4 more rows are handed out; $5 ends the reading ($6 says why: DONE, or
// CAPPED at MaxBackfill). $7 records the estimated size when not 0.
const catchupProgress = `
UPDATE {{schema}}.outbox_subscription_offsets
SET backfill_xid = coalesce($2::text::xid8, backfill_xid), backfill_id = coalesce($3, backfill_id),
    backfill_left = backfill_left - $4, backfill_done = backfill_done + $4,
    backfill_total = CASE WHEN $7 > 0 THEN $7 ELSE backfill_total END,
    backfill_ended_at = CASE WHEN $5 THEN now() ELSE backfill_ended_at END,
    backfill_outcome = CASE WHEN $5 THEN $6 ELSE backfill_outcome END, updated_at = now()
WHERE subscription_id = $1`

// finishBackfill drops a backfill whose reading ended once none of its
// batches is open: from then on its rows are no longer kept for it.
const finishBackfill = `
UPDATE {{schema}}.outbox_subscription_offsets
SET backfill_from = NULL, backfill_upto = NULL, backfill_lower = NULL, backfill_next = NULL, updated_at = now()
WHERE subscription_id = $1 AND backfill_ended_at IS NOT NULL AND backfill_upto IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_batches WHERE subscription_id = $1 AND catchup)`

// cancelBackfill ends the reading of the group's pending backfill (by
// name: $1 topic, $2 group).
const cancelBackfill = `
UPDATE {{schema}}.outbox_subscription_offsets
SET backfill_ended_at = now(), backfill_outcome = 'CANCELLED', updated_at = now()
WHERE subscription_id = ` + groupSubscription + ` AND backfill_upto IS NOT NULL AND backfill_ended_at IS NULL`

// backfillState reads the group's backfill (by name).
const backfillState = `
SELECT backfill_upto IS NOT NULL AND backfill_ended_at IS NULL, coalesce(backfill_outcome, ''), backfill_done,
       backfill_left, backfill_total, backfill_started_at, backfill_ended_at, now()
FROM {{schema}}.outbox_subscription_offsets WHERE subscription_id = ` + groupSubscription

// unseenRows selects cols (over alias o) of the rows matching where that
// snapshot prev had not seen, after (rxid, rid) in (xid, id) order, at
// most limit of each part ("": all of them, unordered). They are the rows
// of the transactions in progress in prev (its xip list: one index scan
// each) and of those that began after it (one index range scan from its
// xmax). Scanning from prev's xmin instead would read every row written
// since the oldest transaction still open in the database when prev was
// taken, and a transaction held open elsewhere (a report, an idle
// session) makes that ever more: 3,000 rows read and thrown away by each
// fetch a minute into one.
//
// The range scan starts after the later of (rxid, rid) and (xmax, -1), one
// row comparison: with two lower bounds, a generic plan may start the scan
// at the weaker one, the topic's first row (71 ms instead of 0.2 ms beside
// a million stored messages). Every row of the first part sorts before
// every row of the second (an xid in progress in prev is below its xmax).
func unseenRows(cols, where, prev, rxid, rid, limit string) string {
	order := func(by string) string {
		if limit == "" {
			return ""
		}
		return `
    ORDER BY ` + by + ` LIMIT ` + limit
	}
	xmax := `pg_snapshot_xmax(` + prev + `)`
	return `(SELECT ` + cols + `
    FROM (SELECT pg_snapshot_xip(` + prev + `) AS xid) AS x
    CROSS JOIN LATERAL (
        SELECT * FROM {{schema}}.outbox_published AS o
        WHERE o.xid = x.xid AND (o.xid, o.id) > (` + rxid + `, ` + rid + `) AND ` + where + order("o.id") + `) AS o` + order("o.xid, o.id") + `)
UNION ALL
(SELECT ` + cols + ` FROM {{schema}}.outbox_published AS o
    WHERE (o.xid, o.id) > (greatest(` + rxid + `, ` + xmax + `), CASE WHEN ` + rxid + ` >= ` + xmax + ` THEN ` + rid + ` ELSE -1 END)
      AND ` + where + order("o.xid, o.id") + `)`
}

// streamFilter says which rows of a pair belong to the group, with bind
// parameters from $first: rows requiring it (bit $first / subscription
// $first+1), or every row ($first+2), or rows from a start time
// ($first+3) or message id ($first+4).
func streamFilter(alias string, first int) string {
	p := func(i int) string { return "$" + strconv.Itoa(first+i) }
	a := alias + "."
	return `
      AND ((` + a + `required_bits & ` + p(0) + `::bigint <> 0) OR (` + p(1) + `::bigint = ANY(` + a + `required_ids)) OR ` + p(2) + `::bool
           OR ` + a + `created_at >= ` + p(3) + `::timestamptz OR ` + a + `id >= ` + p(4) + `::bigint)`
}

// notCompleted excludes rows the group finished: recorded by subscription
// $first+1, or, on a row written before completions were recorded off the
// row, its done bit $first (Bitmap mode; 0 in the others). The bit test
// is written as "<> bit" on purpose: the planner guesses 0.5% of rows for
// an "= 0" on an expression, which made it sort a whole topic instead of
// reading the (topic, xid, id) index in order (a catch-up read of a
// 300,000-row Counter topic took seconds, not ms).
func notCompleted(alias string, first int) string {
	p := func(i int) string { return "$" + strconv.Itoa(first+i) }
	bit := p(0) + `::bigint`
	return `
      AND (` + bit + ` = 0 OR coalesce(` + alias + `.done_bits & ` + bit + `, 0) <> ` + bit + `)
      AND NOT ` + recordedBy(alias, p(1)+`::bigint`)
}

// perRow ends a NOT EXISTS that must stay a per-row index probe. Without
// it the planner may turn the test into an anti join against everything the
// group completed or retries, materialized once and compared with every row
// read: a dedupe or retry table analyzed while it was small and grown since
// (a backfill fills it fast) made a 1,000-row catch-up read cost 5,000,000
// comparisons. "OFFSET 0" keeps a subquery from being pulled up into a join.
const perRow = ` OFFSET 0`

// takeExpiredBatch removes one batch of subscription $1 whose lease ran out
// before $2 (its instance crashed or hung) and returns what it covered;
// moveBatchToRetries, in the same transaction, then moves its rows to the
// retry table: each has spent an attempt and counts a lease expiry (see
// isSuspect), so a message that crashes its process cannot hold its batch,
// or the group's position, for ever. Two statements,
// not one: the common case (no batch expired) stays a single cheap lookup,
// and the move is planned knowing the batch's bounds (as one statement its
// estimate crossed jit_above_cost, and JIT compiled it on every poll).
const takeExpiredBatch = `
DELETE FROM {{schema}}.outbox_group_batches
WHERE id = (SELECT id FROM {{schema}}.outbox_group_batches
            WHERE subscription_id = $1 AND lease_until < coalesce($2::timestamptz, now())
            ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING prev::text, cur::text, after_xid::text, after_id, last_xid::text, last_id, member, catchup`

// moveBatchToRetries: see takeExpiredBatch. $1 subscription, $2 now, $3
// topic, $4.. the stream, $9.. the catch-up filter, $12.. the batch (prev,
// cur, after, last, member, catchup); it returns how many rows it moved.
var moveBatchToRetries = `
WITH moved AS (
    INSERT INTO {{schema}}.outbox_group_retries
        (subscription_id, message_id, status, attempts, available_at, last_error, lease_expiries, failing_since)
    SELECT $1, u.id, 'RETRY', 1, coalesce($2::timestamptz, now()), 'lease expired (member ' || $18::text || ')', 1,
           coalesce($2::timestamptz, now())
    FROM (` + unseenRows("o.id", `o.topic = $3 AND (o.xid, o.id) <= ($16::text::xid8, $17::bigint)
          AND pg_visible_in_snapshot(o.xid, $13::pg_snapshot) AND NOT pg_visible_in_snapshot(o.xid, $12::pg_snapshot)
          AND CASE WHEN $19::bool THEN ($9::bool OR o.created_at >= $10::timestamptz OR o.id >= $11::bigint)
                   ELSE true`+streamFilter("o", 4)+` END`+notCompleted("o", 4),
	"$12::pg_snapshot", "$14::text::xid8", "$15::bigint", "") + `) AS u
    ON CONFLICT (subscription_id, message_id) DO NOTHING
    RETURNING 1
)
SELECT count(*) FROM moved`

// fetchRows reads the next rows of snapshot pair ($2 prev, $3 cur) after
// ($4, $5), in commit-safe order: only transactions that committed between
// the two snapshots, whatever their ids.
var fetchRows = nextUnseenRows(streamFilter("o", 7))

// nextUnseenRows is a statement that reads the next $6 messages of topic
// $1 committed between snapshots $2 and $3, after ($4, $5) in (xid, id)
// order, that also match filter (over alias o, from $7 on): an index
// read per part of unseenRows, at most $6 rows each, merged. It returns
// id, xid (as text), payload, headers, correlation_id, message_group (”:
// none), priority, created_at, available_at and whether the message is
// scheduled: sent to be available later than it was written (Delay,
// NotBefore), and not due yet. It orders by the
// xid8 itself: the text of an xid orders differently from the resume point
// once xids cross a power of ten (rows then came twice, or never).
func nextUnseenRows(filter string) string {
	const cols = `o.id, o.xid::text AS xid_text, o.payload, o.headers, o.correlation_id,
           coalesce(o.message_group, '') AS message_group, o.priority, o.created_at, o.available_at, o.xid AS sort_xid`
	return `
SELECT r.id, r.xid_text, r.payload, r.headers, r.correlation_id, r.message_group, r.priority, r.created_at,
       r.available_at, r.available_at > greatest(r.created_at, now())
FROM (` + unseenRows(cols, `o.topic = $1 AND o.status = 'PUBLISHED' AND o.xid < pg_snapshot_xmax($3::pg_snapshot)
      AND pg_visible_in_snapshot(o.xid, $3::pg_snapshot)
      AND NOT pg_visible_in_snapshot(o.xid, $2::pg_snapshot)`+filter,
		"$2::pg_snapshot", "$4::text::xid8", "$5::bigint", "$6") + `) AS r
ORDER BY r.sort_xid, r.id
LIMIT $6`
}

// anyWork tells an idle instance of subscription $1 (topic $2, stream
// $3..$7, now $8) whether a full look could find anything: its state and
// how it tracks messages (see trackingState), and
// whether it is in the middle of a pair or a backfill, has a batch whose
// lease ran out, a retry that is due, leased past its lease or a dead
// letter without its copy, or a message its position has not seen. One
// statement without a transaction instead of the ten of a look: a
// thousand idle groups polling once a second were most of the database's
// work.
var anyWork = `
WITH p AS (
    SELECT s.subscription_status, f.position, f.pair_cur IS NOT NULL OR f.backfill_upto IS NOT NULL AS busy,
           ` + trackingState + `
    FROM {{schema}}.outbox_subscription_offsets AS f
    JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = f.subscription_id
    JOIN {{schema}}.outbox_topics AS t ON t.topic = s.topic
    WHERE f.subscription_id = $1
)
SELECT p.subscription_status, p.bit, p.tracking_mode, p.mode_changing,
       p.busy
       OR EXISTS (SELECT 1 FROM {{schema}}.outbox_group_batches
                  WHERE subscription_id = $1 AND lease_until < coalesce($8::timestamptz, now()))
       OR EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries
                  WHERE subscription_id = $1
                        AND CASE status WHEN 'RETRY' THEN available_at <= coalesce($8::timestamptz, now())
                                        WHEN 'PROCESSING' THEN lease_until < coalesce($8::timestamptz, now())
                                        ELSE payload IS NULL END)
       OR EXISTS (SELECT 1 FROM (` + unseenRows("1", `o.topic = $2 AND pg_visible_in_snapshot(o.xid, pg_current_snapshot())`+streamFilter("o", 3),
	"(SELECT position FROM p)", "'0'::xid8", "-1", "1") + `) AS u)
FROM p`

const insertBatch = `
INSERT INTO {{schema}}.outbox_group_batches
    (subscription_id, prev, cur, after_xid, after_id, last_xid, last_id, member, lease_until, catchup)
VALUES ($1, $2::pg_snapshot, $3::pg_snapshot, $4::text::xid8, $5, $6::text::xid8, $7, $8,
        coalesce($9::timestamptz, now()) + $10 * interval '1 microsecond', $11)
RETURNING id, lease_until`

const advanceOffset = `
UPDATE {{schema}}.outbox_subscription_offsets
SET position = $2::pg_snapshot, pair_cur = $3::pg_snapshot,
    resume_xid = $4::text::xid8, resume_id = $5, updated_at = now()
WHERE subscription_id = $1`

// reapRetries returns retries whose lease ran out to the queue (or the
// dead letters, on their last attempt), counting the expiry.
const reapRetries = `
UPDATE {{schema}}.outbox_group_retries
SET status = CASE WHEN attempts >= $3 THEN 'DEAD_LETTER' ELSE 'RETRY' END,
    dead_lettered_at = CASE WHEN attempts >= $3 THEN coalesce($2::timestamptz, now()) END,
    available_at = coalesce($2::timestamptz, now()),
    last_error = 'lease expired (member ' || coalesce(lease_owner, '?') || ')',
    lease_expiries = lease_expiries + 1, failing_since = coalesce(failing_since, $2::timestamptz, now()),
    lease_owner = NULL, lease_until = NULL
WHERE subscription_id = $1 AND message_id = ANY (ARRAY(
    SELECT message_id FROM {{schema}}.outbox_group_retries
    WHERE subscription_id = $1 AND status = 'PROCESSING' AND lease_until < coalesce($2::timestamptz, now())
    FOR UPDATE SKIP LOCKED))` // a locked row is being acked in a handler's transaction (see takeRetry)

// deleteOrphanRetries drops retries of messages that no longer exist
// (deleted while the group was DEAD, or by the retention cap) of which the
// retry kept no copy.
const deleteOrphanRetries = `
DELETE FROM {{schema}}.outbox_group_retries AS r
WHERE r.subscription_id = $1 AND r.payload IS NULL
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_published AS o WHERE o.id = r.message_id)`

// deadLettersToComplete: per subscription of topic $1, the dead letters
// with a copy whose message is stored and not completed by the group (by
// the message's own record: see mixedCleanup): completing them lets cleanup delete the message (the dead
// letter stays, with its copy).
var deadLettersToComplete = `
SELECT r.subscription_id, coalesce(s.bit, -1), array_agg(r.message_id ORDER BY r.message_id)
FROM {{schema}}.outbox_group_retries AS r
JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = r.subscription_id
JOIN {{schema}}.outbox_published AS o ON o.id = r.message_id
WHERE s.topic = $1 AND r.status = 'DEAD_LETTER' AND r.payload IS NOT NULL
      AND CASE WHEN o.required_bits IS NOT NULL
               THEN s.bit IS NOT NULL AND coalesce(o.done_bits, 0) & (1::bigint << s.bit) = 0
                    AND NOT ` + recordedBy("o", "s.id") + `
               WHEN o.required_count IS NOT NULL
               THEN NOT ` + recordedBy("o", "s.id") + `
               ELSE false END -- Offset: the group's position passes it
GROUP BY r.subscription_id, s.bit`

// copyDeadLetters gives the dead letters of subscription $1 (of every
// subscription when $1 is NULL) a copy of their message, so they survive
// its row and no longer keep it from cleanup.
const copyDeadLetters = `
UPDATE {{schema}}.outbox_group_retries AS r
SET payload = o.payload, headers = o.headers, correlation_id = o.correlation_id,
    message_group = o.message_group, priority = o.priority, created_at = o.created_at, xid = o.xid
FROM {{schema}}.outbox_published AS o
WHERE o.id = r.message_id AND r.status = 'DEAD_LETTER' AND r.payload IS NULL
      AND ($1::bigint IS NULL OR r.subscription_id = $1)`

// claimRetries leases due retries of subscription $1 to member $2: up to
// $5 ordinary ones, and at most one suspect (see isSuspect) while no other
// suspect of the group is leased. A message that crashes every process
// handling it is so tried apart from the other suspects, and runs out of
// attempts alone.
var claimRetries = `
WITH ordinary AS (
    SELECT message_id FROM {{schema}}.outbox_group_retries
    WHERE subscription_id = $1 AND status = 'RETRY' AND available_at <= coalesce($3::timestamptz, now())
          AND NOT ` + isSuspect("") + `
    ORDER BY available_at LIMIT $5 FOR UPDATE SKIP LOCKED
), suspect AS (
    SELECT message_id FROM {{schema}}.outbox_group_retries
    WHERE subscription_id = $1 AND status = 'RETRY' AND available_at <= coalesce($3::timestamptz, now())
          AND ` + isSuspect("") + ` AND NOT ` + suspectLeased + `
    ORDER BY available_at LIMIT 1 FOR UPDATE SKIP LOCKED
), due AS (
    SELECT message_id FROM ordinary UNION ALL SELECT message_id FROM suspect
)` + leaseDue

// leaseDue ends claimRetries and claimOrderedRetries: it leases the
// retries of subscription $1 that CTE due lists to member $2, for $4
// microseconds from $3, and returns their messages in commit order. A
// retry settled since the statement's snapshot is left alone. The ids in
// due are looked up as one array (primary key probes): joined with due,
// the planner, guessing it holds a row or two, scanned the group's due
// retries and compared each with every row of due (1.5 s a claim with
// 14,000 messages queued).
const leaseDue = `, claimed AS (
    UPDATE {{schema}}.outbox_group_retries AS r
    SET status = 'PROCESSING', attempts = r.attempts + 1, lease_owner = $2,
        lease_until = coalesce($3::timestamptz, now()) + $4 * interval '1 microsecond'
    WHERE r.subscription_id = $1 AND r.message_id = ANY (ARRAY(SELECT message_id FROM due)) AND r.status = 'RETRY'
    RETURNING r.message_id, r.attempts, r.lease_until
)
SELECT c.message_id, coalesce(o.xid, r.xid)::text, coalesce(o.payload, r.payload), coalesce(o.headers, r.headers),
       coalesce(o.correlation_id, r.correlation_id), coalesce(o.message_group, r.message_group, ''),
       coalesce(o.priority, r.priority), coalesce(o.created_at, r.created_at), c.attempts, c.lease_until
FROM claimed AS c
JOIN {{schema}}.outbox_group_retries AS r ON r.subscription_id = $1 AND r.message_id = c.message_id
LEFT JOIN {{schema}}.outbox_published AS o ON o.id = c.message_id
WHERE coalesce(o.payload, r.payload) IS NOT NULL -- neither: an orphan, deleted at the next reap
ORDER BY coalesce(o.xid, r.xid), c.message_id`

// parkRows puts messages ($3 ids, $4 message groups, empty for none, $5
// the times they are due) in the retry table of subscription $1, as
// retries that never ran, available from their due time or now ($2),
// the later: an ordered group queues what it reads there (and takes it
// with claimOrderedRetries), and every group parks a scheduled message
// there until it is due (and takes it with claimRetries). A message
// already there (a batch read again after a takeover) keeps its row.
const parkRows = `
INSERT INTO {{schema}}.outbox_group_retries
    (subscription_id, message_id, status, attempts, available_at, message_group)
SELECT $1, u.id, 'RETRY', 0, greatest(coalesce($2::timestamptz, now()), u.due), nullif(u.message_group, '')
FROM unnest($3::bigint[], $4::text[], $5::timestamptz[]) AS u(id, message_group, due)
ON CONFLICT (subscription_id, message_id) DO NOTHING`

// claimOrderedRetries is claimRetries for an ordered group: $1..$5 as
// there, $6 the message group to start the walk after (empty: the first),
// $7 whether a dead letter blocks its message group, $8 the most messages
// of one message group a claim takes (a run).
//
// The group's queue is its retry table (see parkRows). A message group's
// head is its retry with the lowest message id (a dead letter counts only
// when it blocks): on an ordered topic, ids follow commit order within a
// message group. A head is free when it is due and not leased; only a
// free head, and the retries right behind it that are due and not
// suspects (a run, up to $8), are claimed, so a message group never
// has two deliveries that could overlap or overtake each other except in
// one run, which one executor handles in order.
//
// Heads are found by walking outbox_group_retries_group_idx from one
// message group to the next (one index probe each), from the group after
// $6 to the last, then from the first, until the walk is back at $6 or
// has met $5 free heads. A message group with a long queue so never
// crowds out the others. A head that is a suspect (see isSuspect) is, as
// in claimRetries, claimed alone (no run) and only while no other suspect
// is leased. Retries of
// messages without a group are claimed as in claimRetries.
var claimOrderedRetries = `
WITH RECURSIVE walk AS (
    SELECT n.message_group, n.wrapped, h.message_id, coalesce(h.free, false) AS free, h.suspect,
           coalesce(h.free, false)::int AS found
    FROM (` + nextMessageGroup("$6::text", "false") + `) AS n
    LEFT JOIN LATERAL (` + orderedHead("n") + `) AS h ON true
    UNION ALL
    SELECT n.message_group, n.wrapped, h.message_id, coalesce(h.free, false), h.suspect,
           w.found + coalesce(h.free, false)::int
    FROM walk AS w
    CROSS JOIN LATERAL (` + nextMessageGroup("w.message_group", "w.wrapped") + `) AS n
    LEFT JOIN LATERAL (` + orderedHead("n") + `) AS h ON true
    WHERE w.found < $5 AND NOT (n.wrapped AND n.message_group COLLATE "C" > $6::text)
), runs AS (
    SELECT message_id, 1 AS pos, suspect FROM walk WHERE free
    UNION ALL
    SELECT b.message_id, b.pos, false
    FROM walk AS h
    CROSS JOIN LATERAL (
        SELECT message_id, pos FROM (
            SELECT message_id, 1 + row_number() OVER (ORDER BY message_id) AS pos,
                   bool_and(status = 'RETRY' AND NOT ` + isSuspect("") + ` AND available_at <= coalesce($3::timestamptz, now()))
                       OVER (ORDER BY message_id) AS unbroken
            FROM (SELECT message_id, status, lease_expiries, available_at FROM {{schema}}.outbox_group_retries
                  WHERE subscription_id = $1 AND message_group COLLATE "C" = h.message_group
                        AND message_id > h.message_id AND (status <> 'DEAD_LETTER' OR $7::bool)
                  ORDER BY message_id LIMIT $8 - 1) AS x) AS y
        WHERE unbroken) AS b
    WHERE h.free AND NOT h.suspect
), ungrouped AS (
    SELECT message_id, ` + isSuspect("") + ` AS suspect FROM {{schema}}.outbox_group_retries
    WHERE subscription_id = $1 AND message_group IS NULL AND status = 'RETRY'
          AND available_at <= coalesce($3::timestamptz, now())
          AND (NOT ` + isSuspect("") + ` OR NOT ` + suspectLeased + `)
    ORDER BY ` + isSuspect("") + `, available_at LIMIT $5
), due AS (
    (SELECT message_id FROM (SELECT message_id, pos FROM runs WHERE NOT suspect
                             UNION ALL SELECT message_id, 1 FROM ungrouped WHERE NOT suspect) AS ordinary
     ORDER BY pos, message_id LIMIT $5)
    UNION ALL
    (SELECT message_id FROM (SELECT message_id FROM runs WHERE suspect
                             UNION ALL SELECT message_id FROM ungrouped WHERE suspect) AS suspects
     LIMIT 1)
)` + leaseDue

// nextMessageGroup is the first message group, in the walk of
// claimOrderedRetries, after message group after: the next one in
// outbox_group_retries_group_idx, or once past the last (wrapped is
// false), the first, with wrapped true.
func nextMessageGroup(after, wrapped string) string {
	return `SELECT * FROM (
        (SELECT message_group, ` + wrapped + ` AS wrapped FROM {{schema}}.outbox_group_retries
         WHERE subscription_id = $1 AND message_group COLLATE "C" > ` + after + `
         ORDER BY message_group COLLATE "C" LIMIT 1)
        UNION ALL
        (SELECT message_group, true FROM {{schema}}.outbox_group_retries
         WHERE subscription_id = $1 AND message_group IS NOT NULL AND NOT ` + wrapped + `
         ORDER BY message_group COLLATE "C" LIMIT 1)) AS next
    LIMIT 1`
}

// orderedHead is the head of message group g.message_group in
// claimOrderedRetries: its id, whether it is free, and whether it is a
// suspect (see there).
func orderedHead(g string) string {
	return `SELECT message_id, status = 'RETRY' AND available_at <= coalesce($3::timestamptz, now())
                   AND (NOT ` + isSuspect("") + ` OR NOT ` + suspectLeased + `) AS free,
                   ` + isSuspect("") + ` AS suspect
            FROM {{schema}}.outbox_group_retries
            WHERE subscription_id = $1 AND message_group COLLATE "C" = ` + g + `.message_group
                  AND (status <> 'DEAD_LETTER' OR $7::bool)
            ORDER BY message_id LIMIT 1`
}

// isSuspect: the retry (of table alias alias, "" for none) is suspected
// of crashing the processes that handle it. Its lease ran out twice in a
// row: it was in flight in two instances that died or froze, with no
// outcome recorded in between. One expiry is no suspicion: an instance
// killed (a deploy, the OOM killer, a lost node) takes its whole window
// of messages with it, and retrying each of them alone made a group
// crawl for minutes after every crash. A message that does crash every
// process takes one more instance down with its first retry, and is a
// suspect after that.
func isSuspect(alias string) string {
	if alias != "" {
		alias += "."
	}
	return "(" + alias + "lease_expiries >= 2)"
}

// suspectLeased: subscription $1 has a suspect retry (see isSuspect)
// leased.
var suspectLeased = `EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS p
                WHERE p.subscription_id = $1 AND p.status = 'PROCESSING' AND ` + isSuspect("p") + `)`

// ---------------------------------------------------------------- completing

// finishBatch deletes a batch its member completed; no row means the lease
// expired and another member took the batch over.
const finishBatch = `DELETE FROM {{schema}}.outbox_group_batches WHERE id = $1 AND member = $2`

// insertRetries parks failed messages of a batch (retry after a delay or
// dead-letter), and messages a stopping instance never handled (attempts
// given back, available at once), except those the group ($8: its bit,
// 0 for none) recorded as completed: a handler that acked in its own
// transaction (see Group.AckTx) and then failed, or overran its timeout,
// has its message done. It runs after finishBatch, whose delete waited
// for such a transaction to end.
const insertRetries = `
INSERT INTO {{schema}}.outbox_group_retries
    (subscription_id, message_id, status, attempts, available_at, last_error, dead_lettered_at, failing_since)
SELECT $1, r.message_id, CASE WHEN r.dead THEN 'DEAD_LETTER' ELSE 'RETRY' END, r.attempts,
       coalesce($6::timestamptz, now()) + r.delay_us * interval '1 microsecond', nullif(r.err, ''),
       CASE WHEN r.dead THEN coalesce($6::timestamptz, now()) END,
       CASE WHEN r.err <> '' THEN coalesce($6::timestamptz, now()) END
FROM unnest($2::bigint[], $3::int[], $4::bigint[], $5::bool[], $7::text[]) AS r(message_id, attempts, delay_us, dead, err)
WHERE NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_consumer_groups AS c
                  WHERE c.message_id = r.message_id AND c.subscription_id = $1)
  AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_published AS o
                  WHERE o.id = r.message_id AND o.done_bits & $8::bigint <> 0)
ON CONFLICT (subscription_id, message_id) DO NOTHING`

// settleRetry ends a retry delivery that did not succeed: retry after $4
// microseconds, dead-letter ($5), or give the attempt back ($8 = 1) when a
// stopping instance never ran it. The message ran to an end, so it is no
// longer suspected of crashing its process.
const settleRetry = `
UPDATE {{schema}}.outbox_group_retries
SET status = CASE WHEN $5 THEN 'DEAD_LETTER' ELSE 'RETRY' END,
    attempts = attempts - $8,
    available_at = coalesce($7::timestamptz, now()) + $4 * interval '1 microsecond',
    dead_lettered_at = CASE WHEN $5 THEN coalesce($7::timestamptz, now()) END,
    last_error = coalesce(nullif($6, ''), last_error), lease_owner = NULL, lease_until = NULL,
    lease_expiries = CASE WHEN $8 = 1 THEN lease_expiries ELSE 0 END,
    failing_since = CASE WHEN $8 = 1 THEN failing_since ELSE coalesce(failing_since, $7::timestamptz, now()) END
WHERE subscription_id = $1 AND message_id = $2 AND lease_owner = $3 AND status = 'PROCESSING'`

// deleteRetries ends retry deliveries ($2 ids) of subscription $1 that
// member $3 handled, and returns the ids whose lease it still held.
const deleteRetries = `
DELETE FROM {{schema}}.outbox_group_retries
WHERE subscription_id = $1 AND message_id = ANY($2::bigint[]) AND lease_owner = $3 AND status = 'PROCESSING'
RETURNING message_id`

// holdBatch checks, in a handler's transaction, that member $2 still
// holds batch $1 (Group.AckTx): the row is locked FOR KEY SHARE until the
// transaction ends, so a takeover (FOR UPDATE SKIP LOCKED) passes over it
// and finishBatch waits, while the lease keeper's update (which changes
// no key) goes on.
//
// Both statements AckTx runs first also bound how long the caller's
// transaction may sit idle from then on (idleAfterAck), as the group's own
// transactions are bound (a frozen process would otherwise keep those
// rows locked until it died).
const holdBatch = idleAfterAck + `
SELECT 1 FROM {{schema}}.outbox_group_batches AS b, idle WHERE b.id = $1 AND b.member = $2 AND idle.v IS NOT NULL
FOR KEY SHARE OF b`

// idleAfterAck sets idle_in_transaction_session_timeout to 10 s for the
// rest of the transaction (see holdBatch).
const idleAfterAck = `WITH idle AS (SELECT set_config('idle_in_transaction_session_timeout', '10s', true) AS v)`

// takeRetry ends retry delivery $4 (its attempt) of message $2 held by
// member $3, in a handler's transaction (Group.AckTx); no row means its
// lease was lost.
const takeRetry = idleAfterAck + `
DELETE FROM {{schema}}.outbox_group_retries
WHERE subscription_id = $1 AND message_id = $2 AND lease_owner = $3 AND status = 'PROCESSING' AND attempts = $4
      AND (SELECT v FROM idle) IS NOT NULL`

// recordHandled records that subscription $1 completed message $2 where
// its mode records nothing per message (Offset), so that a takeover of
// its batch, or a failure written after it, skips the message (see
// notCompleted and insertRetries).
const recordHandled = `
INSERT INTO {{schema}}.outbox_consumer_groups (message_id, subscription_id) VALUES ($2, $1)
ON CONFLICT DO NOTHING`

// forgetHandled drops the records of recordHandled once their batch ($2
// ids) completed: nothing reads them after that.
const forgetHandled = `
DELETE FROM {{schema}}.outbox_consumer_groups WHERE subscription_id = $1 AND message_id = ANY($2::bigint[])`

// extendGroupLeases keeps the leases of the batches ($3) and retry deliveries
// ($4) that member $2 is still working on, in one statement. It returns
// the ids it extended: the others were taken over.
const extendGroupLeases = `
WITH b AS (
    UPDATE {{schema}}.outbox_group_batches
    SET lease_until = coalesce($5::timestamptz, now()) + $6 * interval '1 microsecond'
    WHERE subscription_id = $1 AND member = $2 AND id = ANY($3::bigint[])
    RETURNING id
), r AS (
    UPDATE {{schema}}.outbox_group_retries
    SET lease_until = coalesce($5::timestamptz, now()) + $6 * interval '1 microsecond'
    WHERE subscription_id = $1 AND message_id = ANY (ARRAY(
        SELECT message_id FROM {{schema}}.outbox_group_retries
        WHERE subscription_id = $1 AND lease_owner = $2 AND status = 'PROCESSING' AND message_id = ANY($4::bigint[])
        FOR UPDATE SKIP LOCKED)) -- a locked row is being acked in a handler's transaction (see takeRetry)
    RETURNING message_id
)
SELECT 'batch', id FROM b UNION ALL SELECT 'retry', message_id FROM r`

// ---------------------------------------------------------------- administration

const groupSubscription = `(SELECT id FROM {{schema}}.outbox_topic_subscriptions ` + bySubscriptionName + `)`

const listGroupDeadLetters = `
SELECT r.message_id, coalesce(r.payload, o.payload), coalesce(r.headers, o.headers),
       coalesce(r.correlation_id, o.correlation_id), coalesce(r.message_group, o.message_group, ''),
       coalesce(r.priority, o.priority), r.attempts, coalesce(r.created_at, o.created_at), r.dead_lettered_at,
       coalesce(r.last_error, '')
FROM {{schema}}.outbox_group_retries AS r LEFT JOIN {{schema}}.outbox_published AS o ON o.id = r.message_id
WHERE r.subscription_id = ` + groupSubscription + ` AND r.status = 'DEAD_LETTER' AND r.message_id > $3
      AND coalesce(r.payload, o.payload) IS NOT NULL
ORDER BY r.message_id
LIMIT $4`

const replayGroupDeadLetters = `
UPDATE {{schema}}.outbox_group_retries
SET status = 'RETRY', attempts = 0, available_at = now(), dead_lettered_at = NULL, lease_expiries = 0, failing_since = NULL
WHERE subscription_id = ` + groupSubscription + ` AND status = 'DEAD_LETTER'
      AND ($3::bigint[] IS NULL OR message_id = ANY($3::bigint[]))`

// blockedMessageGroups lists up to $4 blocked message groups of ordered
// group $2 of topic $1, longest blocked first ($3: a dead letter blocks
// its message group): each head that failed (or was dead-lettered), and
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
LIMIT $4`

// blockedGroupsSummary counts the blocked message groups of ordered
// group $2 of topic $1 ($3 as blockedMessageGroups) and finds when the
// longest blocked one was first held back.
const blockedGroupsSummary = `
SELECT count(*), min(r.failing_since)
` + blockedGroupHeads

// blockedGroupHeads is the FROM and WHERE of blockedMessageGroups: the
// group's failed (or dead-lettered) retries that head their message group.
const blockedGroupHeads = `
FROM {{schema}}.outbox_group_retries AS r
WHERE r.subscription_id = ` + groupSubscription + ` AND r.failing_since IS NOT NULL AND r.message_group IS NOT NULL
      AND (r.status <> 'DEAD_LETTER' OR $3::bool)
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS e
                      WHERE e.subscription_id = r.subscription_id AND e.message_group COLLATE "C" = r.message_group
                            AND e.message_id < r.message_id AND (e.status <> 'DEAD_LETTER' OR $3::bool))`

// discardGroupDeadLetters deletes the dead letters of group $2 of topic $1
// (those of ids $3, or all when NULL) and returns the subscription, its
// bit (-1: none) and the ids, so that the caller records them as
// completed by the group in the same transaction.
const discardGroupDeadLetters = `
DELETE FROM {{schema}}.outbox_group_retries AS r
USING {{schema}}.outbox_topic_subscriptions AS s
WHERE s.id = r.subscription_id AND s.id = ` + groupSubscription + ` AND r.status = 'DEAD_LETTER'
      AND ($3::bigint[] IS NULL OR r.message_id = ANY($3::bigint[]))
RETURNING s.id, coalesce(s.bit, -1), r.message_id`

// ---------------------------------------------------------------- bitmap

// Completion is recorded off the message row, in every mode that records
// it per message: a row (message, subscription) in outbox_consumer_groups,
// inserted by the group that finished the message. No completion writes,
// locks or versions the message row, so groups completing the same
// messages never wait for each other (a frozen member's open completion
// used to hold the row locks every other group's completion needed) and a
// held xmin leaves no dead versions of message rows behind. Rows written
// before this (done_bits, completed_count) keep their own record, which the
// checks below still read.

// completeRecords records that subscription $2 finished the messages $1.
// A redelivered message is recorded once.
const completeRecords = `
INSERT INTO {{schema}}.outbox_consumer_groups (message_id, subscription_id)
SELECT unnest($1::bigint[]), $2
ON CONFLICT DO NOTHING`

// recordedBy is true when subscription sub recorded finishing row alias.
func recordedBy(alias, sub string) string {
	return `EXISTS (SELECT 1 FROM {{schema}}.outbox_consumer_groups AS c
                      WHERE c.message_id = ` + alias + `.id AND c.subscription_id = ` + sub + perRow + `)`
}

// bitmapCompleted lists which of the messages $1 the group (bit $2,
// subscription $3) finished.
const bitmapCompleted = `
SELECT id FROM {{schema}}.outbox_published WHERE id = ANY($1::bigint[]) AND done_bits & $2 <> 0
UNION
SELECT message_id FROM {{schema}}.outbox_consumer_groups WHERE message_id = ANY($1::bigint[]) AND subscription_id = $3`

// bitmapForget drops a DEAD group (bit $2, subscription $4) from up to $3
// rows it had not finished. The row conditions are repeated outside the
// subquery so that a completion committed while the update waited for a
// row is seen.
var bitmapForget = `
UPDATE {{schema}}.outbox_published AS o SET required_bits = o.required_bits & ~$2::bigint
WHERE o.id IN (
    SELECT o.id FROM {{schema}}.outbox_published AS o
    WHERE o.topic = $1 AND o.status = 'PUBLISHED' AND o.required_bits & $2 <> 0 AND o.done_bits & $2 = 0
          AND NOT ` + recordedBy("o", "$4") + `
    ORDER BY o.id LIMIT $3)
  AND o.required_bits & $2 <> 0 AND o.done_bits & $2 = 0 AND NOT ` + recordedBy("o", "$4")

// bitmapStrip removes a CANCELLED group's bit $2 from up to $3 rows,
// required or done: its completions no longer matter, and the bit can go
// to another group once no row has it.
const bitmapStrip = `
UPDATE {{schema}}.outbox_published
SET required_bits = required_bits & ~$2::bigint, done_bits = done_bits & ~$2::bigint
WHERE id IN (
    SELECT id FROM {{schema}}.outbox_published
    WHERE topic = $1 AND (required_bits | done_bits) & $2 <> 0
    ORDER BY id LIMIT $3)
  AND (required_bits | done_bits) & $2 <> 0`

// retention: rows older than the topic's retention (and, for rows nobody
// was subscribed to, older than the zero-subscription floor), with no
// pending retry of a subscribed group, and out of reach of every pending
// backfill (a group that came back, or subscribed with Backfill, may still
// be raised on them). Cleanup runs under the topic's lock in shared mode
// (see lockTopicShared), so a subscription change that starts a backfill
// waits for cleanups in progress and later ones see it.
const retention = `
      AND o.created_at < coalesce($2::timestamptz, now()) - $3 * interval '1 microsecond'
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS r
                      JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = r.subscription_id
                      WHERE r.message_id = o.id AND r.payload IS NULL AND ` + holdsClaims + `)
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_subscription_offsets AS b
                      JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = b.subscription_id
                      WHERE s.topic = o.topic AND ` + holdsClaims + `
                            AND b.backfill_from IS NOT NULL AND NOT pg_visible_in_snapshot(o.xid, b.backfill_from))`

// pastZeroFloor: row o is older than the zero-subscription floor ($5
// microseconds before now, $2), as every cleanup asks of the rows no group
// required.
const pastZeroFloor = `o.created_at < coalesce($2::timestamptz, now()) - $5 * interval '1 microsecond'`

// bitmapDone is true for row alias of a Bitmap topic when every required
// group finished it: each required bit is a done bit or belongs to a
// subscription that recorded the message.
func bitmapDone(alias string) string {
	a := alias + "."
	return a + `required_bits & ~(coalesce(` + a + `done_bits, 0)
        | coalesce((SELECT bit_or(1::bigint << s.bit) FROM {{schema}}.outbox_consumer_groups AS c
                    JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = c.subscription_id
                    WHERE c.message_id = ` + a + `id AND s.bit IS NOT NULL), 0)) = 0`
}

// FinishedByAll is, for tests and tools, the condition on row alias of
// schema's outbox_published that cleanup deletes Bitmap and Counter rows
// by: every group its record requires has finished it.
func FinishedByAll(schema, alias string) string {
	return strings.NewReplacer("{{schema}}", ident.Quote(schema)).Replace(
		`CASE WHEN ` + alias + `.required_bits IS NOT NULL THEN ` + bitmapDone(alias) + ` ELSE ` + counterDone(alias) + ` END`)
}

// FinishedBy is, for tests and tools, the condition on row alias of
// schema's outbox_published that subscription sub recorded finishing it.
func FinishedBy(schema, alias string, sub int64) string {
	return strings.NewReplacer("{{schema}}", ident.Quote(schema)).Replace(recordedBy(alias, strconv.FormatInt(sub, 10)))
}

// bitmapCleanup deletes up to $4 rows of topic $1 below xid $6 that every
// required group finished and that retention lets go, in (topic, xid)
// index order, skipping rows another cleanup holds, with their records; it
// returns how many it deleted. Finishing is never undone (a group only adds
// records, a forget only drops required bits), so a row found done stays
// done and needs no re-check under its lock.
var bitmapCleanup = `
WITH gone AS (
DELETE FROM {{schema}}.outbox_published WHERE id IN (
    SELECT o.id FROM {{schema}}.outbox_published AS o
    WHERE o.topic = $1 AND o.xid < $6::text::xid8 AND o.status = 'PUBLISHED'
          AND ` + bitmapDone("o") + `
          AND (o.required_bits <> 0 OR ` + pastZeroFloor + `)` +
	retention + `
    ORDER BY o.xid, o.id LIMIT $4 FOR UPDATE SKIP LOCKED)
RETURNING id
), dedupe AS (
    DELETE FROM {{schema}}.outbox_consumer_groups WHERE message_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone`

// ---------------------------------------------------------------- counter

// completeTracked is completeRecords for a topic whose tracking mode
// changed, back in Offset mode: only the messages ids $1 that carry a
// Bitmap or Counter record get one of the group's.
const completeTracked = `
INSERT INTO {{schema}}.outbox_consumer_groups (message_id, subscription_id)
SELECT o.id, $2 FROM {{schema}}.outbox_published AS o
WHERE o.id = ANY($1::bigint[]) AND (o.required_count IS NOT NULL OR o.required_bits IS NOT NULL)
ON CONFLICT DO NOTHING`

const counterCompleted = `
SELECT message_id FROM {{schema}}.outbox_consumer_groups
WHERE message_id = ANY($1::bigint[]) AND subscription_id = $2`

// counterForgetCandidates locks up to $3 rows that still require
// subscription $2 and that it had not finished when the statement began.
// counterForget, a later statement, re-checks them under those locks: a
// completion that committed meanwhile is visible to it. One that commits
// later is not counted (the group is no longer in the row's required ids),
// which is what forgetting the group means.
var counterForgetCandidates = `
SELECT o.id FROM {{schema}}.outbox_published AS o
WHERE o.topic = $1 AND o.status = 'PUBLISHED' AND $2::bigint = ANY(o.required_ids)
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_consumer_groups AS c
                      WHERE c.message_id = o.id AND c.subscription_id = $2` + perRow + `)
ORDER BY o.id LIMIT $3
FOR UPDATE`

const counterForget = `
UPDATE {{schema}}.outbox_published AS o
SET required_ids = array_remove(o.required_ids, $2::bigint), required_count = o.required_count - 1
WHERE o.id = ANY($1::bigint[]) AND $2::bigint = ANY(o.required_ids)
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_consumer_groups AS c
                      WHERE c.message_id = o.id AND c.subscription_id = $2)`

// counterDone is true for row alias of a Counter topic when every
// required group finished it: as many of its required ids recorded it as
// it requires. A row without a Counter record (written under another
// mode, see mixedCleanup) is never done by it.
func counterDone(alias string) string {
	a := alias + "."
	return a + `required_count IS NOT NULL
          AND (SELECT count(*) FROM {{schema}}.outbox_consumer_groups AS c
               WHERE c.message_id = ` + a + `id AND c.subscription_id = ANY(` + a + `required_ids)) >= ` + a + `required_count`
}

// counterCleanup is bitmapCleanup for a Counter topic.
var counterCleanup = `
WITH gone AS (
    DELETE FROM {{schema}}.outbox_published WHERE id IN (
        SELECT o.id FROM {{schema}}.outbox_published AS o
        WHERE o.topic = $1 AND o.xid < $6::text::xid8 AND o.status = 'PUBLISHED'
              AND ` + counterDone("o") + `
              AND (o.required_count > 0 OR ` + pastZeroFloor + `)` +
	retention + `
        ORDER BY o.xid, o.id LIMIT $4 FOR UPDATE SKIP LOCKED)
    RETURNING id
), dedupe AS (
    DELETE FROM {{schema}}.outbox_consumer_groups WHERE message_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone`

// ---------------------------------------------------------------- offset

// partitionHeld is true when topic $1 may still need a message with an
// xid in [$4, $7), a range no transaction writes into any more, sealed
// (seen so) at $6: the topic's retention ($3, or the zero-subscription
// floor $5, the longer, in microseconds) has not passed since, a group
// holding claims has a pending retry of one of them or a backfill that
// may read them, or done (by mode) says a group has not finished one. It
// reads the retries and backfills of the topic and, in Bitmap and Counter
// mode, the topic's messages in the range until it finds an unfinished
// one; in Offset mode, those the slowest group and the DEAD ones may not
// have finished.
func partitionHeld(done string) string {
	return withDeadClaims + `
SELECT $6::timestamptz > coalesce($2::timestamptz, now()) - greatest($3::bigint, $5::bigint) * interval '1 microsecond'
    OR EXISTS (SELECT 1 FROM {{schema}}.outbox_group_retries AS r
               JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = r.subscription_id
               JOIN {{schema}}.outbox_published AS o ON o.id = r.message_id
               WHERE s.topic = $1 AND r.payload IS NULL AND ` + holdsClaims + `
                     AND o.xid >= $4::text::xid8 AND o.xid < $7::text::xid8)
    OR EXISTS (SELECT 1 FROM {{schema}}.outbox_subscription_offsets AS b
               JOIN {{schema}}.outbox_topic_subscriptions AS s ON s.id = b.subscription_id
               WHERE s.topic = $1 AND ` + holdsClaims + `
                     AND b.backfill_from IS NOT NULL AND pg_snapshot_xmin(b.backfill_from) < $7::text::xid8)
    OR ` + done
}

// unfinishedInRange is partitionHeld's done for Bitmap and Counter mode:
// a message of the range that finished is false for.
func unfinishedInRange(finished string) string {
	return `EXISTS (SELECT 1 FROM {{schema}}.outbox_published AS o
               WHERE o.topic = $1 AND o.xid >= $4::text::xid8 AND o.xid < $7::text::xid8
                     AND NOT coalesce(` + finished + `, false))`
}

// beforeWatermark is partitionHeld's done for Offset mode: a message of
// the range that the watermark $8 (the least committed position of the
// ACTIVE and PAUSED groups; NULL when there is none) does not see, or
// that a DEAD group owes (see deadClaims). Every xid below a snapshot's
// xmin is visible in it, so only the rows from there on are read: those
// written after the slowest group's position, and those between a DEAD
// group's position and its death.
const beforeWatermark = `EXISTS (SELECT 1 FROM {{schema}}.outbox_published AS o
               WHERE o.topic = $1 AND o.xid >= greatest($4::text::xid8, pg_snapshot_xmin($8::pg_snapshot))
                     AND o.xid < $7::text::xid8 AND NOT pg_visible_in_snapshot(o.xid, $8::pg_snapshot))
    OR EXISTS (SELECT 1 FROM dead AS d CROSS JOIN LATERAL (
                   SELECT 1 FROM {{schema}}.outbox_published AS o
                   WHERE o.topic = $1 AND o.xid >= greatest($4::text::xid8, pg_snapshot_xmin(d.done))
                         AND o.xid < least($7::text::xid8, pg_snapshot_xmax(d.upto))
                         AND pg_visible_in_snapshot(o.xid, d.upto) AND NOT pg_visible_in_snapshot(o.xid, d.done)
                   LIMIT 1) AS owed)`

// offsetCleanup deletes rows below xid $7 that every ACTIVE and PAUSED
// group has passed (visible in the watermark $6, their least committed
// position; with no such group, $6 NULL, past the zero-subscription
// floor) and that no DEAD group owes.
var offsetCleanup = withDeadClaims + `
DELETE FROM {{schema}}.outbox_published WHERE id IN (
    SELECT o.id FROM {{schema}}.outbox_published AS o
    WHERE o.topic = $1 AND o.xid < $7::text::xid8 AND o.status = 'PUBLISHED'
          AND CASE WHEN $6::pg_snapshot IS NULL
                   THEN ` + pastZeroFloor + `
                   ELSE pg_visible_in_snapshot(o.xid, $6::pg_snapshot) END
          AND NOT ` + owedToDead("o") +
	retention + `
    ORDER BY o.xid, o.id LIMIT $4 FOR UPDATE SKIP LOCKED)`

// ---------------------------------------------------------------- mixed

// A topic whose tracking mode changed stores messages written under
// several modes. Each row says which by the columns it carries:
// required_bits (Bitmap), required_count (Counter), or neither (Offset);
// mixedDone judges a row o by its own (for Offset rows, the watermark wm,
// NULL when no group is ACTIVE or PAUSED, and the claims of the DEAD
// groups: the statement begins withDeadClaims).
func mixedDone(wm string) string {
	return `CASE WHEN o.required_bits IS NOT NULL THEN ` + bitmapDone("o") + `
                       WHEN o.required_count IS NOT NULL THEN ` + counterDone("o") + `
                       ELSE (` + wm + `::pg_snapshot IS NULL OR pg_visible_in_snapshot(o.xid, ` + wm + `::pg_snapshot))
                            AND NOT ` + owedToDead("o") + ` END`
}

// mixedCleanup is the cleanup of a topic whose tracking mode changed, with
// offsetCleanup's parameters: each row goes by its own record, as
// bitmapCleanup, counterCleanup or offsetCleanup would delete it.
var mixedCleanup = withDeadClaims + `, gone AS (
    DELETE FROM {{schema}}.outbox_published WHERE id IN (
        SELECT o.id FROM {{schema}}.outbox_published AS o
        WHERE o.topic = $1 AND o.xid < $7::text::xid8 AND o.status = 'PUBLISHED'
              AND CASE WHEN o.required_bits IS NOT NULL
                       THEN ` + bitmapDone("o") + ` AND (o.required_bits <> 0 OR ` + pastZeroFloor + `)
                       WHEN o.required_count IS NOT NULL
                       THEN ` + counterDone("o") + ` AND (o.required_count > 0 OR ` + pastZeroFloor + `)
                       WHEN $6::pg_snapshot IS NULL THEN ` + pastZeroFloor + ` AND NOT ` + owedToDead("o") + `
                       ELSE pg_visible_in_snapshot(o.xid, $6::pg_snapshot) AND NOT ` + owedToDead("o") + ` END` +
	retention + `
        ORDER BY o.xid, o.id LIMIT $4 FOR UPDATE SKIP LOCKED)
    RETURNING id
), dedupe AS (
    DELETE FROM {{schema}}.outbox_consumer_groups WHERE message_id IN (SELECT id FROM gone)
)
SELECT count(*) FROM gone`

// modeChangeOver ends topic $1's mode change once no message written
// before it is stored. Run it holding the topic's lock in shared mode (a
// later change waits for it).
const modeChangeOver = `
UPDATE {{schema}}.outbox_topics AS t SET mode_changed_below = NULL
WHERE t.topic = $1 AND t.mode_changed_below IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_published AS o
                      WHERE o.topic = t.topic AND o.xid < t.mode_changed_below)`

// retentionFrontier is the xid of topic $1's first row (in xid order) below
// $2 written at or after $3: the rows before it were written earlier, so a
// cleanup that needs rows older than $3 scans no further. NULL: none.
const retentionFrontier = `
SELECT o.xid::text FROM {{schema}}.outbox_published AS o
WHERE o.topic = $1 AND o.xid < $2::text::xid8 AND o.created_at >= $3::timestamptz
ORDER BY o.xid, o.id LIMIT 1`

// snapshotXmax is the current snapshot's xmax (every committed row sorts
// below it), and the database's time.
const snapshotXmax = `SELECT pg_snapshot_xmax(pg_current_snapshot())::text, now()`

const upsertWatermark = `
INSERT INTO {{schema}}.outbox_topic_watermarks (topic, watermark) VALUES ($1, $2::pg_snapshot)
ON CONFLICT (topic) DO UPDATE SET watermark = excluded.watermark, updated_at = now()`
