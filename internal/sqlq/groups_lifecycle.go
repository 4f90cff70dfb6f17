package sqlq

// The SQL of a consumer group's subscription and lifecycle: registering,
// heartbeats, DEAD, resurrection, forgetting.

// lockTopic serialises changes of topic @topic's subscribed set with the
// producers that copy it (see insertPublished): it takes the topic's lock
// exclusively, waiting for every producer transaction that read the set
// (producers arriving meanwhile queue behind it), then the row FOR UPDATE,
// which makes a producer statement that waited re-read the row.
const lockTopic = `
SELECT semantics, coalesce(tracking_mode, '') FROM {{schema}}.outbox_topics AS t
WHERE t.topic = @topic AND pg_advisory_xact_lock(` + topicLockClass + `, hashtext(t.topic)) IS NOT NULL
FOR UPDATE`

// lockTopicShared is what cleanup takes (like a producer), on topic
// @topic: subscription changes wait for it. It also turns JIT compilation
// off for the rest of the cleanup's transaction: each statement deletes
// or checks a few hundred rows, and compiling them (their estimates pass jit_above_cost
// beside a large topic) cost more than running them: a Bitmap cleanup
// deleted 6,600 rows a second with JIT, and 50,000 without.
const lockTopicShared = `SELECT pg_advisory_xact_lock_shared(` + topicLockClass + `, hashtext(@topic)), set_config('jit', 'off', true)`

// holdsClaims is true for a subscription s whose claims on messages
// count: an ACTIVE or PAUSED group, and a DEAD one for its topic's
// ZombieTTL after it died (it may come back for them; it claims only
// what it had not finished when it died, see deadClaims).
const holdsClaims = `(s.subscription_status IN ('ACTIVE', 'PAUSED')
       OR (s.subscription_status = 'DEAD'
           AND s.released_at > now() - (SELECT t.zombie_ttl FROM {{schema}}.outbox_topics AS t WHERE t.topic = s.topic)))`

// bySubscriptionName picks the subscription of group @group_name of
// topic @topic: the live one (at most one is not CANCELLED), else the
// latest cancelled one.
const bySubscriptionName = `WHERE topic = @topic AND group_name = @group_name
ORDER BY subscription_status = 'CANCELLED', id DESC LIMIT 1`

// selectSubscription reads and locks the subscription of group
// @group_name of topic @topic (see bySubscriptionName).
const selectSubscription = `
SELECT id, subscription_status, coalesce(bit, -1), start_position,
       start_from_timestamp, start_from_message_id
FROM {{schema}}.outbox_topic_subscriptions
` + bySubscriptionName + `
FOR UPDATE`

// deletedTombstone tells (and forgets) that group @group_name of topic
// @topic was deleted by subscription cleanup.
const deletedTombstone = `
DELETE FROM {{schema}}.outbox_deleted_subscriptions WHERE topic = @topic AND group_name = @group_name
RETURNING last_status, deleted_at`

// QueueGroup names the one group of a QUEUE topic whose messages live on
// the log: its members are the topic's consumers. A user's group name
// cannot take it (it has characters group names may not have).
const QueueGroup = "(queue)"

// queueOnLog puts QUEUE topic @topic on the log, idempotently: its messages go
// to outbox_published from then on, and its consumers are the members of
// its one group, which reads every message ever written to the topic
// (its position is the empty snapshot, which sees nothing) and never
// leaves (it is never declared DEAD, see heartbeatsStopped).
// @heartbeat_timeout_us is the group's heartbeat timeout in microseconds
// (its instances set their own).
const queueOnLog = `
WITH topic AS (
    UPDATE {{schema}}.outbox_topics SET tracking_mode = 'OFFSET'
    WHERE topic = @topic AND semantics = 'QUEUE'
    RETURNING topic
), sub AS (
    INSERT INTO {{schema}}.outbox_topic_subscriptions (topic, group_name, start_position, heartbeat_timeout)
    SELECT topic, '` + QueueGroup + `', 'BEGINNING', @heartbeat_timeout_us * interval '1 microsecond' FROM topic
    ON CONFLICT DO NOTHING -- it has one already (the name is taken while the group is not CANCELLED, which it never is)
    RETURNING id
)
INSERT INTO {{schema}}.outbox_subscription_offsets (subscription_id, position)
SELECT id, '1:1:'::pg_snapshot FROM sub`

// insertSubscription creates the subscription of group @group_name of
// topic @topic, with its bit (@bit, NULL: none), its start (@start_position,
// and @start_from_timestamp or @start_from_message_id for a start at a
// time or a message) and its heartbeat timeout in microseconds
// (@heartbeat_timeout_us), returning its id.
const insertSubscription = `
INSERT INTO {{schema}}.outbox_topic_subscriptions
    (topic, group_name, bit, start_position, start_from_timestamp, start_from_message_id, heartbeat_timeout)
VALUES (@topic, @group_name, @bit, @start_position, @start_from_timestamp, @start_from_message_id,
        @heartbeat_timeout_us * interval '1 microsecond')
RETURNING id`

// insertOffset sets new subscription @sub's start: the current snapshot
// when @from_now (taken inside the registering transaction after it
// locked the topic row, so every message written with the old subscribed
// set is visible in it), or the empty snapshot, which sees nothing, for
// every other start. @max_backfill > 0 asks for a backfill of up to
// @max_backfill older messages: the group's stream then starts now, and a
// catch-up reads the older ones beside it (the rows visible now and in
// the empty snapshot's future).
const insertOffset = `
INSERT INTO {{schema}}.outbox_subscription_offsets
    (subscription_id, position, backfill_from, backfill_upto, backfill_left, backfill_started_at)
VALUES (@sub, CASE WHEN @from_now OR @max_backfill > 0 THEN pg_current_snapshot() ELSE '1:1:'::pg_snapshot END,
        CASE WHEN @max_backfill > 0 THEN '1:1:'::pg_snapshot END, CASE WHEN @max_backfill > 0 THEN pg_current_snapshot() END,
        @max_backfill, CASE WHEN @max_backfill > 0 THEN now() END)`

// subscribedBits are the bits taken on topic @topic: a bit belongs to its
// subscription until a CANCELLED group was forgotten everywhere.
const subscribedBits = `
SELECT bit FROM {{schema}}.outbox_topic_subscriptions WHERE topic = @topic AND bit IS NOT NULL`

// addSubscribed and removeSubscribed keep topic @topic's subscribed set,
// which every insert copies into the message, idempotently: they add
// (remove) subscription @sub and its bit, @bit_mask (0: none).
const addSubscribed = `
UPDATE {{schema}}.outbox_topics
SET subscribed_bits = subscribed_bits | @bit_mask,
    subscribed_ids = CASE WHEN @sub::bigint = ANY(subscribed_ids) THEN subscribed_ids
                          ELSE array_append(subscribed_ids, @sub::bigint) END
WHERE topic = @topic`

const removeSubscribed = `
UPDATE {{schema}}.outbox_topics
SET subscribed_bits = subscribed_bits & ~@bit_mask::bigint,
    subscribed_ids = array_remove(subscribed_ids, @sub::bigint)
WHERE topic = @topic`

// setStatus records subscription @sub's change to state @status; leaving
// (DEAD, CANCELLED) makes forgetting pending, coming back (ACTIVE) ends
// it. A group declared DEAD records the current snapshot (dead_upto): run
// under the topic's lock, it sees every message written before, and none
// written after, which are not the DEAD group's claim (see deadClaims).
const setStatus = `
UPDATE {{schema}}.outbox_topic_subscriptions
SET subscription_status = @status, last_active_at = now(),
    released_at = CASE WHEN @status IN ('DEAD', 'CANCELLED') THEN now() END,
    dead_upto = CASE WHEN @status = 'DEAD' THEN pg_current_snapshot() END,
    forget_pending = @status IN ('DEAD', 'CANCELLED'),
    last_heartbeat_at = CASE WHEN @status = 'ACTIVE' THEN now() ELSE last_heartbeat_at END
WHERE id = @sub`

// lockOffsetWait: a state change of subscription @sub waits for a fetch
// in progress, so every fetch sees the state it runs under until it
// commits.
const lockOffsetWait = `
SELECT 1 FROM {{schema}}.outbox_subscription_offsets WHERE subscription_id = @sub FOR UPDATE`

// resurrectOffset prepares subscription @sub, which comes back from DEAD.
// No mode records per message what a group finished, so its catch-up
// cannot skip what it completed: it reads exactly what the group had not
// read, pair after pair (see backfillSegment): the rest of the backfill it was reading
// when it died, then the rest of the snapshot pair its stream had begun,
// then what lies between there and now (what it owed, and what was
// written while it was DEAD and is still stored), up to @max_backfill
// rows in all. Its stream starts now. Cleanup keeps, until the catch-up
// ends, everything its committed position had not seen (backfill_from),
// the rows of its open batches too: they are expired, and the next fetch
// moves them to the retry table.
var resurrectOffset = `
WITH expired AS (
    UPDATE {{schema}}.outbox_group_batches SET lease_until = '-infinity' WHERE subscription_id = @sub
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
    WHERE o.subscription_id = @sub
)
UPDATE {{schema}}.outbox_subscription_offsets AS o
SET backfill_from = r.committed, ` + popBackfillPair("r.pairs") + `,
    backfill_left = @max_backfill, backfill_total = 0, backfill_done = 0, backfill_started_at = now(), backfill_ended_at = NULL,
    backfill_outcome = NULL,
    position = pg_current_snapshot(), pair_cur = NULL, resume_xid = NULL, resume_id = NULL, updated_at = now()
FROM reading AS r
WHERE o.subscription_id = @sub`

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

// nextBackfillPair moves subscription @sub's backfill, whose current pair
// is read, to the next it queues, returning it (lower, upto, cursor) and
// whether more are queued behind it.
var nextBackfillPair = `
UPDATE {{schema}}.outbox_subscription_offsets
SET ` + popBackfillPair("backfill_next") + `, backfill_total = 0, updated_at = now()
WHERE subscription_id = @sub AND backfill_next IS NOT NULL
RETURNING backfill_lower::text, backfill_upto::text, coalesce(backfill_xid::text, '0'), coalesce(backfill_id, 0),
          backfill_next IS NOT NULL`

// resurrectFromNow prepares subscription @sub, which comes back without a
// backfill: its stream starts now, a backfill it left unfinished ends
// (SKIPPED), and its open batches are dropped (their messages, like every
// other it had not completed, were released before: see
// Group.Resurrect). Its retries and dead letters stay.
const resurrectFromNow = `
WITH batches AS (
    DELETE FROM {{schema}}.outbox_group_batches WHERE subscription_id = @sub
)
UPDATE {{schema}}.outbox_subscription_offsets
SET backfill_from = NULL, backfill_upto = NULL, backfill_xid = NULL, backfill_id = NULL, backfill_left = 0,
    backfill_lower = NULL, backfill_next = NULL,
    backfill_ended_at = CASE WHEN backfill_upto IS NOT NULL AND backfill_ended_at IS NULL THEN now() ELSE backfill_ended_at END,
    backfill_outcome = CASE WHEN backfill_upto IS NOT NULL AND backfill_ended_at IS NULL THEN 'SKIPPED' ELSE backfill_outcome END,
    position = pg_current_snapshot(), pair_cur = NULL, resume_xid = NULL, resume_id = NULL, updated_at = now()
WHERE subscription_id = @sub`

// forceCompleteRetries deletes up to @limit retries and dead letters of
// subscription @sub (not leased: an instance is handling those) of
// messages written before @before, returning their message ids.
const forceCompleteRetries = `
DELETE FROM {{schema}}.outbox_group_retries WHERE (subscription_id, message_id) IN (
    SELECT r.subscription_id, r.message_id FROM {{schema}}.outbox_group_retries AS r
    LEFT JOIN {{schema}}.outbox_published AS o ON o.id = r.message_id
    WHERE r.subscription_id = @sub AND r.status <> 'PROCESSING' AND coalesce(o.created_at, r.created_at) < @before
    ORDER BY r.message_id LIMIT @limit FOR UPDATE OF r SKIP LOCKED)
RETURNING message_id`

// forceCompleteRows lists up to @limit stored messages of topic @topic
// with ids above @after_id written before @before that require
// subscription @sub (by its bit, @bit_mask, or by id) and that it has not
// completed, in id order.
var forceCompleteRows = `
SELECT o.id FROM {{schema}}.outbox_published AS o
WHERE o.topic = @topic AND o.id > @after_id AND o.created_at < @before AND o.status = 'PUBLISHED'
      AND ((o.required_bits & @bit_mask::bigint <> 0 AND coalesce(o.done_bits, 0) & @bit_mask::bigint = 0)
           OR @sub::bigint = ANY(o.required_ids))
      AND NOT ` + finishedBy("o", "@sub") + `
ORDER BY o.id LIMIT @limit`

// forceTarget is where ForceComplete may move subscription @sub's read
// position to pass the messages of topic @topic written before @before
// that it has not read: a snapshot that sees every xid below X, the
// lesser of the database's xmin (every xid below it has ended) and the
// first xid, in commit order, of a message it has not read written at or
// after @before. X is returned as text.
var forceTarget = `
SELECT least(pg_snapshot_xmin(pg_current_snapshot()),
             (SELECT u.xid FROM (` + unseenRows("o.xid, o.id", "o.topic = @topic AND o.created_at >= @before", "p.position", "'0'::xid8", "-1", "1") + `) AS u
              ORDER BY u.xid, u.id LIMIT 1))::text
FROM {{schema}}.outbox_subscription_offsets AS p WHERE p.subscription_id = @sub`

// forceAdvance moves subscription @sub's read position to see every xid
// below @target (forceTarget's), when it can without reading anything
// twice: no batch open, no snapshot pair in progress, and @target past
// the position's xmax (so the new position sees all the old one saw).
const forceAdvance = `
UPDATE {{schema}}.outbox_subscription_offsets AS f
SET position = (@target || ':' || @target || ':')::pg_snapshot, updated_at = now()
WHERE f.subscription_id = @sub AND f.pair_cur IS NULL AND @target::xid8 > pg_snapshot_xmax(f.position)
      AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_group_batches AS b WHERE b.subscription_id = @sub)`

// inconsistencies reads every stored PUB_SUB message (up to @limit per topic
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
SELECT topic, kind, count(*), min(id) FROM ranked WHERE n <= @limit GROUP BY topic, kind ORDER BY topic, kind`

// subscriptionStatus reads the id and state of the subscription of group
// @group_name of topic @topic (see bySubscriptionName).
const subscriptionStatus = `
SELECT id, subscription_status FROM {{schema}}.outbox_topic_subscriptions
` + bySubscriptionName

// groupHealthHead reads what the health of group @group_name of topic
// @topic starts from: its subscription, as streamFor needs it, and its
// liveness.
const groupHealthHead = `
SELECT id, subscription_status, coalesce(bit, -1), start_position, start_from_timestamp, start_from_message_id,
       last_heartbeat_at, extract(epoch FROM heartbeat_timeout)::float8, subscribed_at
FROM {{schema}}.outbox_topic_subscriptions
` + bySubscriptionName

// scheduledRetry is true for a retry row that waits for its message to be
// due (Delay, NotBefore: see parkRows), having never failed, at
// groupHealth's clock.
const scheduledRetry = `(status = 'RETRY' AND failing_since IS NULL AND available_at > ` + healthNow + `)`

// healthNow is groupHealth's clock: the time its first use was evaluated,
// after the statement's snapshot was taken. now() is when the server
// received the statement, before it planned it (tens of milliseconds for
// this one on a busy server): a message committed meanwhile is in the
// snapshot, due at its commit, which is later than now(), and would count
// as not due yet.
const healthNow = `(SELECT now FROM clock)`

// groupHealth measures subscription @sub of @topic (its stream: see
// streamFilter; what it completed: see notCompleted), each count at most
// @limit: the committed rows it has not read (see healthUnread) or are in
// its open batches (see healthBatched), and it has not completed, due now (their count, read in no
// order so the count stops early, and the created_at of the first in
// commit order), its batches and retry deliveries under lease, its waiting
// retries (messages that failed: failing_since is set), its queued
// messages (due for a delivery that is not a retry: an ordered group's
// queue, replayed dead letters, messages a stopping instance handed back
// untried), the messages not due yet (parked until due, or unread and
// sent to be available later), the created_at of the oldest message it
// retries or queues (the lowest id: one probe), and its dead letters. The unread rows are read only when @read_unread is true:
// a DEAD group is in no new message's required set, so reading its
// stream would walk everything written since it died to find nothing.
var groupHealth = `
WITH clock AS MATERIALIZED (
    SELECT clock_timestamp() AS now
), f AS (
    SELECT position, pair_cur, resume_xid, resume_id FROM {{schema}}.outbox_subscription_offsets WHERE subscription_id = @sub
), unread AS (
    SELECT o.available_at > ` + healthNow + ` AS later
    FROM (` + unseenRows("o.available_at", healthUnread, "(SELECT position FROM f)", "'0'::xid8", "-1", "") + `) AS o
    WHERE @read_unread::bool
    LIMIT @limit
), oldest_unread AS (
    SELECT o.created_at FROM (` + unseenRows("o.created_at, o.xid, o.id", healthUnread+` AND o.available_at <= `+healthNow,
	"(SELECT position FROM f)", "'0'::xid8", "-1", "1") + `) AS o
    WHERE @read_unread::bool
    ORDER BY o.xid, o.id LIMIT 1
), batched AS (` + healthBatched + `
), oldest_retry AS (
    SELECT min(message_id) AS id FROM {{schema}}.outbox_group_retries
    WHERE subscription_id = @sub AND status <> 'DEAD_LETTER' AND NOT ` + scheduledRetry + `
)
SELECT least((SELECT count(*) FILTER (WHERE NOT later) FROM unread) + (SELECT count(*) FROM batched), @limit),
       least((SELECT created_at FROM oldest_unread), (SELECT min(created_at) FROM batched)),
       (SELECT count(*) FROM {{schema}}.outbox_group_batches WHERE subscription_id = @sub),
       (SELECT count(*) FROM (SELECT 1 FROM {{schema}}.outbox_group_retries
                              WHERE subscription_id = @sub AND status = 'PROCESSING' LIMIT @limit) AS r),
       (SELECT count(*) FROM (SELECT 1 FROM {{schema}}.outbox_group_retries
                              WHERE subscription_id = @sub AND status = 'RETRY' AND failing_since IS NOT NULL
                              LIMIT @limit) AS r),
       (SELECT count(*) FROM (SELECT 1 FROM {{schema}}.outbox_group_retries
                              WHERE subscription_id = @sub AND status = 'RETRY' AND failing_since IS NULL
                                    AND available_at <= ` + healthNow + ` LIMIT @limit) AS r),
       least((SELECT count(*) FROM (SELECT 1 FROM {{schema}}.outbox_group_retries
                                    WHERE subscription_id = @sub AND ` + scheduledRetry + ` LIMIT @limit) AS r)
             + (SELECT count(*) FILTER (WHERE later) FROM unread), @limit),
       (SELECT o.created_at FROM {{schema}}.outbox_published AS o, oldest_retry WHERE o.topic = @topic AND o.id = oldest_retry.id),
       (SELECT count(*) FROM (SELECT 1 FROM {{schema}}.outbox_group_retries
                              WHERE subscription_id = @sub AND status = 'DEAD_LETTER' LIMIT @limit) AS r),
       ` + healthNow

// healthUnread is what groupHealth counts as unread: committed rows of
// the group's stream it has not read (the pair in progress read those up
// to its resume point: in open batches, counted from the batches, done,
// or in the retry table), nor completed, nor set aside (those are counted
// from its retry table).
var healthUnread = `o.topic = @topic AND pg_visible_in_snapshot(o.xid, pg_current_snapshot())
      AND NOT coalesce((SELECT pg_visible_in_snapshot(o.xid, f.pair_cur) AND (o.xid, o.id) <= (f.resume_xid, f.resume_id) FROM f), false)` +
	streamFilter("o") + notCompleted("o") + notSetAside("o", "@sub")

// healthBatched selects the created_at of the rows in the group's open
// batches it has not completed, at most @limit: they count as unread
// (the pair they came from may be finished, its rows behind the position).
var healthBatched = `
    SELECT o.created_at FROM {{schema}}.outbox_group_batches AS b
    CROSS JOIN LATERAL (
        SELECT o.created_at FROM {{schema}}.outbox_published AS o
        WHERE o.topic = @topic AND (o.xid, o.id) > (b.after_xid, b.after_id) AND (o.xid, o.id) <= (b.last_xid, b.last_id)
              AND pg_visible_in_snapshot(o.xid, b.cur) AND NOT pg_visible_in_snapshot(o.xid, b.prev)` +
	streamFilter("o") + notCompleted("o") + notSetAside("o", "@sub") + `) AS o
    WHERE b.subscription_id = @sub AND @read_unread::bool
    LIMIT @limit`

// heartbeat records a heartbeat of subscription @sub, in database time
// only, and its heartbeat timeout in microseconds (@heartbeat_timeout_us).
// It reports the status, so a DEAD group's instance can resurrect it; no
// row: the subscription is gone.
const heartbeat = `
UPDATE {{schema}}.outbox_topic_subscriptions
SET last_heartbeat_at = now(), heartbeat_timeout = @heartbeat_timeout_us * interval '1 microsecond'
WHERE id = @sub
RETURNING subscription_status`

// anyDeadCandidate is deadCandidates' cheap, lock-free pre-check (topic
// @topic).
const anyDeadCandidate = `
SELECT EXISTS (SELECT 1 FROM {{schema}}.outbox_topic_subscriptions
               WHERE topic = @topic AND ` + heartbeatsStopped + `)`

// deadCandidates: ACTIVE groups of topic @topic whose heartbeats stopped.
const deadCandidates = `
SELECT id, group_name, coalesce(bit, -1) FROM {{schema}}.outbox_topic_subscriptions
WHERE topic = @topic AND ` + heartbeatsStopped + `
FOR UPDATE SKIP LOCKED`

// heartbeatsStopped is true for an ACTIVE subscription whose instances'
// heartbeats stopped, but not for a QUEUE topic's group: its messages
// wait for its consumers however long they are away, as a queue's do.
const heartbeatsStopped = `subscription_status = 'ACTIVE' AND last_heartbeat_at < now() - heartbeat_timeout
      AND group_name <> '` + QueueGroup + `'`

// lockOffsetsSkipLocked locks the offsets rows of subscriptions @subs (an
// array of ids) that no fetch holds: a group fetching right now is not
// dead.
const lockOffsetsSkipLocked = `
SELECT subscription_id FROM {{schema}}.outbox_subscription_offsets
WHERE subscription_id = ANY(@subs::bigint[])
FOR UPDATE SKIP LOCKED`

// pendingForgets: groups of topic @topic that left and may still be referred
// to: CANCELLED ones, and DEAD ones whose ZombieTTL ran out.
const pendingForgets = `
SELECT id FROM {{schema}}.outbox_topic_subscriptions AS s
WHERE topic = @topic AND forget_pending AND NOT ` + holdsClaims

// lockForget: a forget pass holds subscription @sub's row, so a
// resurrection waits for the pass in progress and later passes see it
// came back. The last column says whether the group still holds its
// claims (a DEAD group within its ZombieTTL).
const lockForget = `
SELECT subscription_status, coalesce(bit, -1), forget_pending, ` + holdsClaims + `
FROM {{schema}}.outbox_topic_subscriptions AS s WHERE id = @sub FOR UPDATE`

// forgetDone: nothing refers to subscription @sub any more. A CANCELLED
// group's bit is free again; a backfill the group had pending ends (its
// rows are no longer kept for it).
const forgetDone = `
WITH catchup AS (
    UPDATE {{schema}}.outbox_subscription_offsets
    SET backfill_from = NULL, backfill_upto = NULL, backfill_lower = NULL, backfill_next = NULL, backfill_left = 0,
        backfill_ended_at = now(), backfill_outcome = 'FORGOTTEN'
    WHERE subscription_id = @sub AND backfill_from IS NOT NULL
)
UPDATE {{schema}}.outbox_topic_subscriptions
SET forget_pending = false,
    bit = CASE WHEN subscription_status = 'CANCELLED' THEN NULL ELSE bit END
WHERE id = @sub`

// deleteGroupState drops cancelled subscription @sub's batches, retries
// and records of messages set aside.
const deleteGroupState = `
WITH b AS (DELETE FROM {{schema}}.outbox_group_batches WHERE subscription_id = @sub),
     t AS (DELETE FROM {{schema}}.outbox_group_set_aside WHERE subscription_id = @sub)
DELETE FROM {{schema}}.outbox_group_retries WHERE subscription_id = @sub`

// committedPosition is, for each ACTIVE or PAUSED group of topic @topic,
// what it has finished (see committedOf). A DEAD group within its
// ZombieTTL holds only what it owes (see deadClaims).
var committedPosition = `
SELECT s.id, ` + committedOf("s", "o") + `::text
FROM {{schema}}.outbox_topic_subscriptions AS s
JOIN {{schema}}.outbox_subscription_offsets AS o ON o.subscription_id = s.id
WHERE s.topic = @topic AND s.subscription_status IN ('ACTIVE', 'PAUSED')`

// deadClaims lists the claims of topic @topic's DEAD groups within their
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
WHERE s.topic = @topic AND s.subscription_status = 'DEAD' AND ` + holdsClaims

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
