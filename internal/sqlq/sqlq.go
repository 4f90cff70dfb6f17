// Package sqlq holds every SQL statement pgoutbox runs against its tables,
// in one place, so it can be read and reviewed together.
//
// Statements name tables as {{schema}}.outbox; For replaces {{schema}} with
// the caller's schema, quoted, once per client. Nothing else is ever spliced
// into SQL: every value is a bind parameter.
//
// A parameter named now (coalesce($n::timestamptz, now())) carries an
// injected test clock; production code passes NULL and database time is used.
package sqlq

import (
	"strconv"
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
	SelectSemantics                                string
	Insert, InsertNotify, SelectIdempotent         string
	LockTopic, AnyQueued, UpsertTopic, SelectTopic string
	LockTopicRow, AssignBits, ResetSubscribedBits  string
	TrackingInUse, ChangeTracking                  string
	Claim, ClaimOrdered                            string
	Ack, Settle, ExtendLease, ExtendLeases         string
	ListDeadLetters, ReplayDeadLetters             string
	DiscardDeadLetters                             string
	BlockedGroups, BlockedSummary                  string
	TopicConfigured, MarkOrdered                   string
	ExpireIdempotencyKeys                          string
}

// For returns the statements for schema (already validated).
func For(schema string) *Outbox {
	r := strings.NewReplacer("{{schema}}", ident.Quote(schema))
	return &Outbox{
		InsertUnconfigured:           r.Replace(insertUnconfigured),
		InsertUnconfiguredNotify:     r.Replace(notifying(insertUnconfigured, 10)),
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
		SelectSemantics:              r.Replace(selectSemantics),
		Insert:                       r.Replace(insert),
		InsertNotify:                 r.Replace(insertNotify),
		SelectIdempotent:             r.Replace(selectIdempotent),
		LockTopic:                    r.Replace(lockTopicExclusive),
		AnyQueued:                    r.Replace(anyQueued),
		UpsertTopic:                  r.Replace(upsertTopic),
		LockTopicRow:                 r.Replace(lockTopicRow),
		TrackingInUse:                r.Replace(trackingInUse),
		ChangeTracking:               r.Replace(changeTracking),
		AssignBits:                   r.Replace(assignBits),
		ResetSubscribedBits:          r.Replace(resetSubscribedBits),
		SelectTopic:                  r.Replace(selectTopic),
		Claim:                        r.Replace(claim),
		ClaimOrdered:                 r.Replace(claimOrdered),
		Ack:                          r.Replace(ack),
		Settle:                       r.Replace(settle),
		ExtendLease:                  r.Replace(extendLease),
		ExtendLeases:                 r.Replace(extendLeases),
		ListDeadLetters:              r.Replace(listDeadLetters),
		ReplayDeadLetters:            r.Replace(replayDeadLetters),
		DiscardDeadLetters:           r.Replace(discardDeadLetters),
		BlockedGroups:                r.Replace(blockedGroups),
		BlockedSummary:               r.Replace(blockedSummary),
		TopicConfigured:              r.Replace(topicConfigured),
		MarkOrdered:                  r.Replace(markOrdered),
		ExpireIdempotencyKeys:        r.Replace(expireIdempotencyKeys),
	}
}

// insertQueued writes one message of a topic configured as QUEUE: a plain
// single-row INSERT into outbox. Such a row needs nothing from the topic
// row (a topic's semantics never change once configured); it is available
// at once (the column default now()).
const insertQueued = `
INSERT INTO {{schema}}.outbox (topic, payload, headers, correlation_id, message_group, priority)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING id`

// insertQueuedAt is insertQueued with a delivery time: $7 not-before, $8
// delay in microseconds, $9 now.
const insertQueuedAt = `
INSERT INTO {{schema}}.outbox ` + queuedAtColumns + `
VALUES ($1, $2, $3, $4, $5, $6, ` + availableAt + `)
RETURNING id`

// queuedAtColumns are the columns insertQueuedAt and insertUnconfigured write.
const queuedAtColumns = `(topic, payload, headers, correlation_id, message_group, priority, available_at)`

// availableAt is when a message may first be delivered: $7 (not-before), or
// $8 microseconds after $9 (the injected clock) or the database's now().
const availableAt = `coalesce($7::timestamptz, coalesce($9::timestamptz, now()) + $8 * interval '1 microsecond')`

// insertUnconfigured is insertQueuedAt for a topic the producer has not
// seen configured, which is a QUEUE topic with the defaults, unless it has
// been configured as PUB_SUB or ordered since: then it writes nothing and
// returns no row, and the producer reads the configuration and sends with
// the statement it calls for. It holds the topic's lock in shared mode
// until the transaction ends, so that a configuration waits for it (see
// ConfigureTopic and markOrdered).
const insertUnconfigured = `
INSERT INTO {{schema}}.outbox ` + queuedAtColumns + `
SELECT $1, $2, $3, $4, $5, $6, ` + availableAt + `
WHERE pg_advisory_xact_lock_shared(` + topicLockClass + `, hashtext($1)) IS NOT NULL
  AND NOT EXISTS (SELECT FROM {{schema}}.outbox_topics WHERE topic = $1 AND (semantics = 'PUB_SUB' OR ordered))
RETURNING id`

// topicConfigured: topic $1 has a configuration.
const topicConfigured = `SELECT EXISTS (SELECT 1 FROM {{schema}}.outbox_topics WHERE topic = $1)`

// markOrdered marks the unmarked messages of ordered topic $1.
const markOrdered = `UPDATE {{schema}}.outbox SET ordered = true WHERE topic = $1 AND ordered IS NULL`

// orderedLockClass is the first key of the advisory lock a send to an
// ordered topic takes per (topic, message group) ("pgoo"); the second is
// hashtext of topic/group (a topic name has no '/', so no two pairs
// share the text; two pairs sharing a hash only wait for each other).
const orderedLockClass = `1885826927`

// insertOrdered writes one message of a configured ordered QUEUE topic
// ($1..$9 as insertQueuedAt). A message with a group first takes its
// group's lock until the transaction ends, and only then draws its id
// (the filter runs before the row is formed): a second transaction
// sending to the group waits for the first to commit or roll back, so
// the group's ids follow commit order, which is the order the ordered
// claim delivers them in.
const insertOrdered = `
INSERT INTO {{schema}}.outbox (topic, payload, headers, correlation_id, message_group, priority, available_at, ordered)
SELECT $1, $2, $3, $4, $5, $6, ` + availableAt + `, true
WHERE ` + groupLock + `
RETURNING id`

// groupLock takes the lock of message group $5 of topic $1 until the
// transaction ends (see insertOrdered); true.
const groupLock = `($5::text IS NULL OR pg_advisory_xact_lock(` + orderedLockClass + `, hashtext($1 || '/' || $5::text)) IS NOT NULL)`

// insertPublished writes one message of a topic configured as PUB_SUB,
// with the groups it needs from the topic row (the "snapshot at insert").
//
// It holds the topic's lock (see TopicLock) in shared mode, and the topic
// row FOR KEY SHARE (the lock a foreign key takes), until the transaction
// ends. A change of the subscribed set (a group registering, dying, coming
// back or cancelled) takes the topic's lock exclusively: it waits for the
// producer transactions that read the old set, and producers arriving
// meanwhile queue behind it (the lock manager is fair, so a steady stream
// of producers cannot starve it), then read the new set (the row lock makes
// a statement that waited re-read the row). So a message's required groups
// and the groups' read positions always agree, in every isolation level (a
// REPEATABLE READ producer that raced a change gets a serialization error).
var insertPublished = insertPublishedWhere("")

// insertPublishedWhere is insertPublished with first ahead of its filter
// (empty, or a condition followed by AND).
func insertPublishedWhere(first string) string {
	return `
INSERT INTO {{schema}}.outbox_published
    (topic, payload, headers, correlation_id, message_group, priority, available_at,
     status, ` + requiredGroupColumns + `)
SELECT $1, $2, $3, $4, $5, $6, ` + availableAt + `,
       ` + publishedStatus + `,
       ` + requiredGroups + `
FROM {{schema}}.outbox_topics AS t
WHERE ` + first + `t.topic = $1 AND ` + topicLockShared + `
FOR KEY SHARE OF t
RETURNING id`
}

// insertPublishedOrdered is insertPublished for an ordered PUB_SUB topic:
// a message with a group first takes its group's lock, as insertOrdered
// does (a filter without columns, so it runs before the topic row is
// read, as in insertRows: group locks before the topic's), and only then
// draws its id.
var insertPublishedOrdered = insertPublishedWhere(groupLock + " AND ")

// topicLockClass is the first key of the advisory lock pgoutbox takes per
// topic ("pgob"); the second is hashtext of the topic's name.
const topicLockClass = `1885826914`

// topicLockShared takes the lock of topic row t's topic in shared mode,
// until the transaction ends (a filter that is always true).
const topicLockShared = `pg_advisory_xact_lock_shared(` + topicLockClass + `, hashtext(t.topic)) IS NOT NULL`

// requiredGroupColumns are the columns requiredGroups fills.
const requiredGroupColumns = `required_bits, required_ids, required_count, done_bits, completed_count`

// requiredGroups are the groups a PUB_SUB message of topic row t must be
// completed by, per the topic's tracking mode (see requiredGroupColumns).
const requiredGroups = `CASE WHEN t.tracking_mode = 'BITMAP' THEN t.subscribed_bits END AS required_bits,
       CASE WHEN t.tracking_mode = 'COUNTER' THEN t.subscribed_ids END AS required_ids,
       CASE WHEN t.tracking_mode = 'COUNTER' THEN cardinality(t.subscribed_ids) END AS required_count,
       CASE WHEN t.tracking_mode = 'BITMAP' THEN 0 END AS done_bits,
       CASE WHEN t.tracking_mode = 'COUNTER' THEN 0 END AS completed_count`

// blocked is true for a topic that blocks writes while nobody subscribes.
// Such a row fails the whole statement (so a batch is never half-written):
// casting the marker text to integer raises invalid_text_representation
// (22P02) with the marker in its message; the producer maps it to
// outbox.ErrNoSubscriptions.
const blocked = `coalesce(t.block_writes_on_zero_subscriptions AND cardinality(t.subscribed_ids) = 0, false)`

// publishedStatus is a PUB_SUB message's status, PUBLISHED, unless its
// topic row t blocks the write: then it fails the statement with the
// marker and the topic's name.
const publishedStatus = `CASE WHEN ` + blocked + ` THEN (` + NoSubscriptionsMarker + ` || t.topic)::integer::text ELSE 'PUBLISHED' END`

// NoSubscriptionsMarker starts the error message of a blocked write.
const NoSubscriptionsMarker = `'pgoutbox: no subscriptions on topic '`

// notifying wraps a single-row insert returning id so that it also notifies
// channel $channelParam with the topic ($1) when the transaction commits.
func notifying(insert string, channelParam int) string {
	return "WITH inserted AS (" + insert + "\n)\nSELECT inserted.id FROM inserted, (SELECT pg_notify($" +
		strconv.Itoa(channelParam) + ", $1)) AS n"
}

// selectSemantics reads a topic's semantics and whether it is ordered
// (no row: never configured).
const selectSemantics = `SELECT semantics, ordered FROM {{schema}}.outbox_topics WHERE topic = $1`

// insertRows writes SendBatch's messages, given as parallel arrays, each
// into the table of its topic's semantics, and returns (position, id) for
// every row written. Ids are drawn in input order from the sequence both
// tables share. A message with an idempotency key is written only if it
// records the key first: a key of the topic that has not expired yet (an
// earlier send, or an earlier message of the batch) skips it. $10 is now,
// $11 the idempotency window (microseconds) of topics never configured.
//
// Messages of topics never configured take their topics' locks in shared
// mode, as insertUnconfigured does (configured ones take it in the join).
// Messages with a group on ordered topics first take their groups' locks
// (as insertOrdered does), all of them, in key order (so that two batches
// never deadlock), before any id is drawn: the filter is an initplan, a
// one-time filter run before any row reaches nextval.
const insertRows = `
WITH m AS MATERIALIZED (
    SELECT nextval('{{schema}}.outbox_id_seq') AS id, r.*
    FROM (SELECT m.*,
                 CASE WHEN t.ordered THEN true END AS ordered,
                 coalesce(m.not_before, coalesce($10::timestamptz, now()) + m.delay_us * interval '1 microsecond')
                     AS available_at,
                 t.semantics IS NOT DISTINCT FROM 'PUB_SUB' AS published,
                 coalesce(t.idempotency_window, $11 * interval '1 microsecond') AS idempotency_window,
                 ` + publishedStatus + ` AS status,
                 ` + requiredGroups + `
          FROM unnest($1::text[], $2::jsonb[], $3::jsonb[], $4::text[], $5::text[], $6::smallint[],
                      $7::text[], $8::timestamptz[], $9::bigint[])
               WITH ORDINALITY AS m(topic, payload, headers, correlation_id, message_group, priority,
                                    idempotency_key, not_before, delay_us, ord)
          LEFT JOIN (SELECT * FROM {{schema}}.outbox_topics AS t
                     WHERE t.topic = ANY($1::text[]) AND ` + topicLockShared + `
                     FOR KEY SHARE) AS t
                 ON t.topic = m.topic -- held until commit, as in insertPublished
          WHERE (SELECT count(pg_advisory_xact_lock(` + orderedLockClass + `, g.key))
                 FROM (SELECT DISTINCT hashtext(u.topic || '/' || u.grp) AS key
                       FROM unnest($1::text[], $5::text[]) AS u(topic, grp)
                       JOIN {{schema}}.outbox_topics AS ot ON ot.topic = u.topic AND ot.ordered
                       WHERE u.grp IS NOT NULL
                       ORDER BY 1) AS g) >= 0
            AND (SELECT count(pg_advisory_xact_lock_shared(` + topicLockClass + `, hashtext(u.topic)))
                 FROM (SELECT DISTINCT topic FROM unnest($1::text[]) AS u(topic)
                       WHERE NOT EXISTS (SELECT FROM {{schema}}.outbox_topics AS ct WHERE ct.topic = u.topic)) AS u) >= 0
          ORDER BY m.ord) AS r
), keyed AS (
    INSERT INTO {{schema}}.outbox_idempotency_keys AS k (topic, idempotency_key, message_id, expires_at)
    SELECT DISTINCT ON (topic, idempotency_key)
           topic, idempotency_key, id, coalesce($10::timestamptz, now()) + idempotency_window
    FROM m WHERE idempotency_key IS NOT NULL
    ORDER BY topic, idempotency_key, ord
    ON CONFLICT (topic, idempotency_key) DO UPDATE
        SET message_id = excluded.message_id, expires_at = excluded.expires_at
        WHERE k.expires_at <= coalesce($10::timestamptz, now())
    RETURNING message_id
), fresh AS (
    SELECT * FROM m WHERE idempotency_key IS NULL OR id IN (SELECT message_id FROM keyed)
), queued AS (
    INSERT INTO {{schema}}.outbox
        (id, topic, payload, headers, correlation_id, message_group, priority, available_at, ordered)
    SELECT id, topic, payload, headers, correlation_id, message_group, priority, available_at, ordered
    FROM fresh WHERE NOT published
    RETURNING id
), published AS (
    INSERT INTO {{schema}}.outbox_published
        (id, topic, payload, headers, correlation_id, message_group, priority, available_at,
         status, ` + requiredGroupColumns + `)
    OVERRIDING SYSTEM VALUE
    SELECT id, topic, payload, headers, correlation_id, message_group, priority, available_at,
           status, ` + requiredGroupColumns + `
    FROM fresh WHERE published
    RETURNING id
), written AS (
    SELECT id FROM queued UNION ALL SELECT id FROM published
)`

// insert is insertRows' result: positions (1-based) and ids.
const insert = insertRows + `
SELECT m.ord, m.id FROM m JOIN written USING (id)`

// insertNotify is insert that also wakes listening consumers of the topics
// in $13, on channel $12, when the producer's transaction commits (NOTIFY
// is transactional: a rollback notifies nobody).
const insertNotify = insertRows + `, notified AS (
    SELECT pg_notify($12, t) FROM unnest($13::text[]) AS t
)
SELECT m.ord, m.id FROM m JOIN written USING (id), (SELECT count(*) FROM notified) AS n -- the join makes notified run`

// selectIdempotent finds the messages an idempotent send collided with.
const selectIdempotent = `
SELECT idempotency_key, message_id FROM {{schema}}.outbox_idempotency_keys
WHERE topic = $1 AND idempotency_key = ANY($2::text[])`

// expireIdempotencyKeys deletes up to $2 keys that expired before $1 (now).
const expireIdempotencyKeys = `
DELETE FROM {{schema}}.outbox_idempotency_keys AS k
USING (SELECT topic, idempotency_key FROM {{schema}}.outbox_idempotency_keys
       WHERE expires_at <= coalesce($1::timestamptz, now())
       ORDER BY expires_at
       LIMIT $2
       FOR UPDATE SKIP LOCKED) AS e
WHERE k.topic = e.topic AND k.idempotency_key = e.idempotency_key`

// lockTopicExclusive is what ConfigureTopic takes before upsertTopic:
// the topic's lock, exclusively, until the transaction ends. It waits for
// producers and subscription changes in flight, so the upsert (a later
// statement, with a fresh snapshot) sees their messages and subscriptions
// when it decides whether the tracking mode may change. In one statement,
// the upsert would decide on what it saw before it waited.
const lockTopicExclusive = `SELECT pg_advisory_xact_lock(` + topicLockClass + `, hashtext($1))`

// anyQueued: topic $1 was never configured and has QUEUE messages,
// pending or dead-lettered (an unconfigured topic's sends are QUEUE
// messages).
const anyQueued = `
SELECT NOT EXISTS (SELECT 1 FROM {{schema}}.outbox_topics WHERE topic = $1)
   AND (EXISTS (SELECT 1 FROM {{schema}}.outbox WHERE topic = $1)
        OR EXISTS (SELECT 1 FROM {{schema}}.outbox_dead_letters WHERE topic = $1))`

const upsertTopic = `
INSERT INTO {{schema}}.outbox_topics
    (topic, semantics, tracking_mode, retention, max_attempts, backoff_initial, backoff_max, lease_duration,
     zero_subscription_retention, block_writes_on_zero_subscriptions, idempotency_window, max_retention, zombie_ttl,
     ordered, ordered_dead_letters)
VALUES ($1, $2, $3, $4 * interval '1 microsecond', $5, $6 * interval '1 microsecond',
        $7 * interval '1 microsecond', $8 * interval '1 microsecond', $9 * interval '1 microsecond', $10,
        $11 * interval '1 microsecond', $12 * interval '1 microsecond', $13 * interval '1 microsecond',
        $14, $15)
ON CONFLICT (topic) DO UPDATE SET
    semantics = excluded.semantics,
    retention = excluded.retention,
    max_attempts = excluded.max_attempts,
    backoff_initial = excluded.backoff_initial,
    backoff_max = excluded.backoff_max,
    lease_duration = excluded.lease_duration,
    zero_subscription_retention = excluded.zero_subscription_retention,
    block_writes_on_zero_subscriptions = excluded.block_writes_on_zero_subscriptions,
    idempotency_window = excluded.idempotency_window,
    max_retention = excluded.max_retention,
    zombie_ttl = excluded.zombie_ttl,
    ordered_dead_letters = excluded.ordered_dead_letters,
    -- A topic in use keeps its mode (ConfigureTopic passes it): only an
    -- unused one changes here, and a change of mode of a topic in use is
    -- changeTracking's.
    tracking_mode = excluded.tracking_mode,
    updated_at = now()
-- Semantics and ordering never change (producers rely on them, see
-- insertQueued and insertOrdered).
WHERE outbox_topics.semantics = excluded.semantics AND outbox_topics.ordered = excluded.ordered`

// lockTopicRow follows lockTopicExclusive in a change of tracking mode:
// it reads the topic's semantics and mode and locks its row, so that a
// producer statement that waited for the topic's lock re-reads the row
// (and writes the new mode's columns), as for a change of the subscribed
// set (see insertPublished).
const lockTopicRow = `
SELECT semantics, coalesce(tracking_mode, '') FROM {{schema}}.outbox_topics WHERE topic = $1 FOR UPDATE`

// trackingInUse reads topic $1's mode and whether the topic is in use: a
// group subscribed (not CANCELLED) or a message stored. (After
// lockTopicExclusive: nothing in flight.)
const trackingInUse = `
SELECT coalesce(t.tracking_mode, ''),
       EXISTS (SELECT 1 FROM {{schema}}.outbox_topic_subscriptions AS s
               WHERE s.topic = t.topic AND s.subscription_status <> 'CANCELLED')
       OR EXISTS (SELECT 1 FROM {{schema}}.outbox_published AS p WHERE p.topic = t.topic)
FROM {{schema}}.outbox_topics AS t WHERE t.topic = $1`

// changeTracking sets topic $1's mode to $2 (after lockTopicRow): every
// message written under the old one has an xid below the current
// snapshot's xmax (the producers that read the old mode held the topic's
// lock, which the change waited for), which mode_changed_below keeps
// until cleanup finds none left.
const changeTracking = `
UPDATE {{schema}}.outbox_topics
SET tracking_mode = $2, updated_at = now(),
    mode_changed_below = greatest(mode_changed_below, pg_snapshot_xmax(pg_current_snapshot()))
WHERE topic = $1`

// assignBits gives every subscription of topic $1 that may still read
// (not CANCELLED) and has no bit one of the free bits, lowest first, and
// returns how many it could not give one (none free).
const assignBits = `
WITH free AS (
    SELECT b, row_number() OVER (ORDER BY b) AS n FROM generate_series(0, 63) AS b
    WHERE b NOT IN (SELECT bit FROM {{schema}}.outbox_topic_subscriptions WHERE topic = $1 AND bit IS NOT NULL)
), need AS (
    SELECT id, row_number() OVER (ORDER BY id) AS n FROM {{schema}}.outbox_topic_subscriptions
    WHERE topic = $1 AND bit IS NULL AND subscription_status <> 'CANCELLED'
), assigned AS (
    UPDATE {{schema}}.outbox_topic_subscriptions AS s SET bit = free.b
    FROM need JOIN free USING (n) WHERE s.id = need.id
    RETURNING s.id
)
SELECT (SELECT count(*) FROM need) - (SELECT count(*) FROM assigned)`

// resetSubscribedBits recomputes the bits of topic $1's subscribed set
// (after assignBits).
const resetSubscribedBits = `
UPDATE {{schema}}.outbox_topics AS t
SET subscribed_bits = coalesce((SELECT bit_or(1::bigint << s.bit) FROM {{schema}}.outbox_topic_subscriptions AS s
                                WHERE s.topic = t.topic AND s.id = ANY(t.subscribed_ids) AND s.bit IS NOT NULL), 0)
WHERE t.topic = $1`

const selectTopic = `
SELECT semantics, coalesce(tracking_mode, ''),
       (extract(epoch FROM retention) * 1e6)::bigint, max_attempts,
       (extract(epoch FROM backoff_initial) * 1e6)::bigint,
       (extract(epoch FROM backoff_max) * 1e6)::bigint,
       (extract(epoch FROM lease_duration) * 1e6)::bigint,
       (extract(epoch FROM zero_subscription_retention) * 1e6)::bigint,
       block_writes_on_zero_subscriptions,
       (extract(epoch FROM idempotency_window) * 1e6)::bigint,
       (extract(epoch FROM max_retention) * 1e6)::bigint,
       (extract(epoch FROM zombie_ttl) * 1e6)::bigint,
       ordered, coalesce(ordered_dead_letters, ''), mode_changed_below IS NOT NULL
FROM {{schema}}.outbox_topics WHERE topic = $1`

// A QUEUE message is pending while lease_owner is NULL and leased while it
// is not; a leased row's available_at is its lease end, so a lease that
// expired makes the message available again to the next claim.

// claim leases up to $2 available messages of topic $1, highest priority
// first, skipping rows other consumers are claiming right now: pending
// ones and ones whose lease expired (recording that as the last error).
// $3 now, $4 lease owner, $5 lease in microseconds. It returns each
// message, its lease end, when it had become available and its previous
// lease owner (NULL unless its lease had expired).
//
// It never takes a message of an ordered topic (a consumer that read the
// topic's configuration before the topic was configured ordered), which
// only claimOrdered hands out.
const claim = `
WITH picked AS (
    SELECT id, available_at, lease_owner FROM {{schema}}.outbox
    WHERE topic = $1 AND available_at <= coalesce($3::timestamptz, now()) AND ordered IS NOT TRUE
    ORDER BY priority DESC, available_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)` + claimPicked

// claimPicked leases the rows of picked (see claim).
const claimPicked = `
UPDATE {{schema}}.outbox AS o
SET attempts = o.attempts + 1,
    lease_owner = $4,
    available_at = coalesce($3::timestamptz, now()) + $5 * interval '1 microsecond',
    last_error = CASE WHEN picked.lease_owner IS NULL THEN o.last_error
                      ELSE 'lease expired (consumer ' || picked.lease_owner || ')' END
FROM picked
WHERE o.id = picked.id
RETURNING o.id, o.payload, o.headers, o.correlation_id, coalesce(o.message_group, ''),
          o.priority, o.attempts, o.created_at, o.available_at, picked.available_at, picked.lease_owner`

// claimOrdered is claim for an ordered topic ($1..$5 as claim; $6: a
// group with a dead letter is blocked; $7: the message group to start
// after, the empty string for the first; $8: the longest run). Its
// candidates are the head of each message group, the group's oldest
// message, which only the head's own lease or retry delay can make
// unavailable, each with a run of the group's next messages right behind
// it (up to $8 in all, as long as they are available); and the available
// ungrouped messages. A group's head and run go to one claim together, so
// a group never has messages out to two consumers; the consumer handles
// a run in id order and hands back what follows a message that did not
// succeed.
//
// The heads are found in two ways. The walk (heads) goes from one group
// to the next through outbox_ordered_idx, one index probe per group and
// one more for the run behind a free head, whatever the number of
// messages behind each head: from the group after $7 to the last, then
// from the first, until the walk is back at $7 or has met $2 messages in
// free heads and their runs (a head a concurrent claim locks is skipped,
// with its run, and this claim returns fewer). Groups compare by their
// bytes (COLLATE "C", as the index sorts them). Callers start each walk
// where the previous claim's turn ended, so every group's turn comes,
// and a claim takes at most one run per group, so a group with a long
// backlog never crowds out the others.
//
// The walk does not know the heads' priorities: prioritized does. It
// reads the topic's oldest available messages of priority above 0,
// highest first, through outbox_claim_idx (no index of its own, so sends
// pay nothing for it), as many as the claim has room for and
// priorityLookahead more. Of each group it meets there it keeps the first
// message if that is the group's head, and free (one probe per group, not
// per message), and it keeps the messages without a group; lane takes
// them, highest priority first and in walk order from $7 within one,
// with the runs behind the heads (one probe each), until it has met $2
// messages. A message behind its group's head is passed over: priority
// chooses between groups, never within one. How much it reads is bounded
// so that a long prioritized backlog (behind a head of a lower priority,
// or one that is leased) cannot make every claim read all of it; a head
// it does not reach still comes in its group's turn, and is read once
// the older messages before it are gone.
//
// The claim then takes, up to $2 messages, the candidates of the highest
// priority first. Among candidates of one priority, the heads the walk
// met and the ungrouped messages come first, oldest first, except that
// the walk's heads keep the walk's order among themselves (a head's age
// is the oldest of its own and those of the heads the walk met after it:
// dropping the newest would skip a fresh group's turn in favour of groups
// with a backlog); then the heads only lane found, in walk order from
// $7. So heads of one priority take turns, whatever their priority, and
// a higher priority goes first. A head's priority is its own: the run
// behind it goes with it whatever the priorities of its messages. The
// caller starts the next walk after the last group the claim took at its
// lowest priority, the groups that had their turn.
//
// A head counts, and is a candidate, only if it is free: available, and
// not held back by a dead letter of its group ($6). Counting blocked heads
// would let as many blocked groups as the claim has room for, right after
// the starting point, stop every claim short of the groups behind them.
//
// The heads are locked first (FOR UPDATE SKIP LOCKED); a run is taken
// only behind a head this claim locked, so two claims never split a
// group. A head taken by a concurrent claim is skipped or, if that claim
// committed meanwhile, no longer passes available_at; a head settled
// meanwhile is re-read. A message behind a head is never taken alone,
// even when this statement's snapshot no longer saw the head: a head
// leaves the queue only by its ack or its dead-lettering, after which
// its successor is the group's head. The claim returns at most $2
// messages: the last run may be cut short, never a run's beginning.
var claimOrdered = `
WITH RECURSIVE heads AS (
    SELECT f.*, r.behind, CASE WHEN f.free THEN 1 + r.behind ELSE 0 END AS found, 1 AS step
    FROM (SELECT * FROM (
            (SELECT message_group, id, available_at, ` + headFree + ` AS free, false AS wrapped
             FROM {{schema}}.outbox
             WHERE topic = $1 AND ordered AND message_group COLLATE "C" > $7::text
             ORDER BY message_group COLLATE "C", id LIMIT 1)
            UNION ALL
            (SELECT message_group, id, available_at, ` + headFree + `, true
             FROM {{schema}}.outbox
             WHERE topic = $1 AND ordered AND message_group IS NOT NULL
             ORDER BY message_group COLLATE "C", id LIMIT 1)) AS first
          LIMIT 1) AS f
    CROSS JOIN LATERAL (` + runBehind("f") + `) AS r
    UNION ALL
    SELECT n.*, r.behind, h.found + CASE WHEN n.free THEN 1 + r.behind ELSE 0 END, h.step + 1
    FROM heads AS h
    CROSS JOIN LATERAL (
        SELECT * FROM (
            (SELECT message_group, id, available_at, ` + headFree + ` AS free, h.wrapped AS wrapped
             FROM {{schema}}.outbox
             WHERE topic = $1 AND ordered AND message_group COLLATE "C" > h.message_group
             ORDER BY message_group COLLATE "C", id LIMIT 1)
            UNION ALL
            (SELECT message_group, id, available_at, ` + headFree + `, true
             FROM {{schema}}.outbox
             WHERE topic = $1 AND ordered AND message_group IS NOT NULL AND NOT h.wrapped
             ORDER BY message_group COLLATE "C", id LIMIT 1)) AS next
        LIMIT 1) AS n
    CROSS JOIN LATERAL (` + runBehind("n") + `) AS r
    WHERE h.found < $2 AND NOT (n.wrapped AND n.message_group COLLATE "C" > $7::text)
), prioritized AS (
    SELECT row_number() OVER (ORDER BY priority DESC, message_group IS NOT NULL, wrapped,
                                       message_group COLLATE "C", available_at, id) AS rank,
           message_group, id, available_at, true AS free, wrapped
    FROM (SELECT *, message_group COLLATE "C" <= $7::text AS wrapped
          FROM (SELECT DISTINCT ON (message_group, CASE WHEN message_group IS NULL THEN id END) *
                FROM (SELECT id, message_group, priority, available_at FROM {{schema}}.outbox
                      WHERE topic = $1 AND priority > 0 AND available_at <= coalesce($3::timestamptz, now())
                        AND ordered
                      ORDER BY priority DESC, available_at, id
                      LIMIT $2 + ` + priorityLookahead + `) AS w
                ORDER BY message_group, CASE WHEN message_group IS NULL THEN id END, id) AS outbox
          WHERE message_group IS NULL
             OR (NOT ` + groupBlocked + `
                 AND NOT EXISTS (SELECT 1 FROM {{schema}}.outbox AS e
                                 WHERE e.topic = $1 AND e.ordered AND e.id < outbox.id
                                   AND e.message_group COLLATE "C" = outbox.message_group))) AS p
), lane AS (
    SELECT p.*, r.behind, 1 + r.behind AS found
    FROM prioritized AS p CROSS JOIN LATERAL (` + runBehind("p") + `) AS r
    WHERE p.rank = 1
    UNION ALL
    SELECT p.*, r.behind, l.found + 1 + r.behind
    FROM lane AS l
    CROSS JOIN LATERAL (SELECT * FROM prioritized WHERE rank = l.rank + 1 LIMIT 1) AS p
    CROSS JOIN LATERAL (` + runBehind("p") + `) AS r
    WHERE l.found < $2
), candidates AS (
    SELECT DISTINCT ON (id) * FROM (
        SELECT id, available_at, behind, step, false AS late, wrapped FROM heads WHERE free
        UNION ALL
        (SELECT id, available_at, 0, NULL::int, false, NULL::bool FROM {{schema}}.outbox
         WHERE topic = $1 AND ordered AND message_group IS NULL AND available_at <= coalesce($3::timestamptz, now())
         ORDER BY id
         LIMIT $2)
        UNION ALL
        SELECT id, available_at, behind, NULL, message_group IS NOT NULL, wrapped FROM lane) AS c
    ORDER BY id, late, step -- a head the walk met goes in its turn
), keyed AS (
    SELECT id, behind, late, wrapped,
           CASE WHEN late THEN NULL
                WHEN step IS NULL THEN available_at
                ELSE min(available_at) OVER (PARTITION BY step IS NULL ORDER BY step DESC)
           END AS age
    FROM candidates
), locked AS (
    SELECT o.id, o.available_at, o.lease_owner, o.message_group, o.priority, k.behind, k.late, k.age, k.wrapped
    FROM {{schema}}.outbox AS o JOIN keyed AS k USING (id)
    WHERE o.available_at <= coalesce($3::timestamptz, now())
    ORDER BY ` + candidateOrder("o", "k") + `
    LIMIT $2
    FOR UPDATE OF o SKIP LOCKED
), ranked AS (
    SELECT row_number() OVER (ORDER BY ` + candidateOrder("o", "o") + `) AS rank, o.*
    FROM locked AS o
), picked AS (
    SELECT id, available_at, lease_owner FROM (
        SELECT rank, id, available_at, lease_owner FROM ranked
        UNION ALL
        SELECT h.rank, m.id, m.available_at, m.lease_owner
        FROM ranked AS h
        CROSS JOIN LATERAL (
            SELECT id, available_at, lease_owner FROM {{schema}}.outbox
            WHERE topic = $1 AND ordered AND message_group COLLATE "C" = h.message_group AND id > h.id
            ORDER BY message_group COLLATE "C", id
            LIMIT h.behind
            FOR UPDATE) AS m
        WHERE h.behind > 0
        ORDER BY 1, 2
        LIMIT $2) AS p
)` + claimPicked

// candidateOrder is the order claimOrdered takes its candidates in (see
// there): by the priority, message group and id of outbox row o, and by
// key k's late (a head only lane found), age and wrapped.
func candidateOrder(o, k string) string {
	return o + `.priority DESC, ` + k + `.late, ` + k + `.age, ` + k + `.wrapped, ` +
		o + `.message_group COLLATE "C", ` + o + `.id`
}

// priorityLookahead is how many available messages of priority above 0
// claimOrdered reads beyond the claim's room, looking for heads.
const priorityLookahead = `100`

// runBehind counts the messages right behind the head at alias (a
// claimOrdered walk's step) that may go with it in a run: for a free
// head, its group's next messages up to $8 in all, as long as each is
// available.
func runBehind(alias string) string {
	return `
        SELECT count(*)::int AS behind FROM (
            SELECT bool_and(available_at <= coalesce($3::timestamptz, now())) OVER (ORDER BY id) AS ok
            FROM (SELECT id, available_at FROM {{schema}}.outbox
                  WHERE ` + alias + `.free AND topic = $1 AND ordered
                    AND message_group COLLATE "C" = ` + alias + `.message_group AND id > ` + alias + `.id
                  ORDER BY message_group COLLATE "C", id
                  LIMIT $8::int - 1) AS b) AS w
        WHERE ok`
}

// headFree is whether the outbox row a claimOrdered walk is at, a group's
// head, may be claimed: it is available, and not blocked (groupBlocked).
const headFree = `(available_at <= coalesce($3::timestamptz, now()) AND NOT ` + groupBlocked + `)`

// groupBlocked: the group of outbox row outbox has a dead letter, and the
// topic blocks groups on them ($6).
const groupBlocked = `($6::bool AND EXISTS (SELECT 1 FROM {{schema}}.outbox_dead_letters AS d
                                 WHERE d.topic = $1 AND d.message_group = outbox.message_group))`

// ack deletes handled messages. A delivery is (id, attempts): an ack whose
// lease expired and was claimed again since matches nothing.
const ack = `
DELETE FROM {{schema}}.outbox AS o
USING unnest($1::bigint[], $2::int[]) AS a(id, attempts)
WHERE o.id = a.id AND o.attempts = a.attempts AND o.lease_owner IS NOT NULL`

// settle ends leases: retry later (nack), release (delay 0, and uncount=1
// gives back an attempt that never started), or dead-letter (the row moves
// to outbox_dead_letters). It returns how many leases it ended.
const settle = `
WITH s AS (
    SELECT * FROM unnest($1::bigint[], $2::int[], $3::bigint[], $4::bool[], $5::text[], $6::int[])
        AS s(id, attempts, delay_us, dead, err, uncount)
), parked AS (
    DELETE FROM {{schema}}.outbox AS o
    USING s
    WHERE o.id = s.id AND o.attempts = s.attempts AND o.lease_owner IS NOT NULL AND s.dead
    RETURNING o.id, o.topic, o.payload, o.headers, o.correlation_id, o.message_group, o.priority,
              o.attempts - s.uncount AS attempts, coalesce(s.err, o.last_error) AS last_error, o.created_at, o.xid
), moved AS (
    INSERT INTO {{schema}}.outbox_dead_letters
        (id, topic, payload, headers, correlation_id, message_group, priority, attempts, last_error, created_at,
         dead_lettered_at, xid)
    SELECT id, topic, payload, headers, correlation_id, message_group, priority, attempts, last_error, created_at,
           coalesce($7::timestamptz, now()), xid
    FROM parked
    RETURNING id
), retried AS (
    UPDATE {{schema}}.outbox AS o
    SET attempts = o.attempts - s.uncount,
        available_at = coalesce($7::timestamptz, now()) + s.delay_us * interval '1 microsecond',
        last_error = coalesce(s.err, o.last_error),
        lease_owner = NULL,
        failing_since = CASE WHEN s.uncount = 0 THEN coalesce(o.failing_since, $7::timestamptz, now())
                             ELSE o.failing_since END
    FROM s
    WHERE o.id = s.id AND o.attempts = s.attempts AND o.lease_owner IS NOT NULL AND NOT s.dead
    RETURNING o.id
)
SELECT (SELECT count(*) FROM moved) + (SELECT count(*) FROM retried)`

// extendLease pushes a held lease out to $3 + $4 microseconds.
const extendLease = `
UPDATE {{schema}}.outbox SET available_at = coalesce($3::timestamptz, now()) + $4 * interval '1 microsecond'
WHERE id = $1 AND attempts = $2 AND lease_owner IS NOT NULL
RETURNING available_at`

// extendLeases pushes many held leases ($1 ids, $2 attempts) out to $3 +
// $4 microseconds in one statement and returns the ones it extended; a
// lease that ended (settled, or claimed again as a new attempt) is left
// alone and missing from the result.
const extendLeases = `
UPDATE {{schema}}.outbox AS o
SET available_at = coalesce($3::timestamptz, now()) + $4 * interval '1 microsecond'
FROM unnest($1::bigint[], $2::int[]) AS l(id, attempts)
WHERE o.id = l.id AND o.attempts = l.attempts AND o.lease_owner IS NOT NULL
RETURNING o.id, o.attempts, o.available_at`

const listDeadLetters = `
SELECT id, payload, headers, correlation_id, coalesce(message_group, ''), priority, attempts,
       created_at, dead_lettered_at, coalesce(last_error, '')
FROM {{schema}}.outbox_dead_letters
WHERE topic = $1 AND id > $2
ORDER BY id
LIMIT $3`

// replayDeadLetters moves dead letters of topic $1 (all of them when $2 is
// NULL) back to the queue, deliverable at once with a fresh attempt budget,
// keeping their ids: on an ordered topic each is its group's oldest
// message again. Except where its group has moved on, on an ordered topic
// that skips dead letters or (the policy was changed since) one with a
// later message of the group leased: then a replayed message goes to the
// back of its group, as a new send would, under the group's lock and with
// a new id (see insertOrdered), so the group never has two out at once.
const replayDeadLetters = `
WITH t AS (
    SELECT coalesce((SELECT ordered FROM {{schema}}.outbox_topics WHERE topic = $1), false) AS ordered,
           coalesce((SELECT ordered AND ordered_dead_letters = 'SKIP'
                     FROM {{schema}}.outbox_topics WHERE topic = $1), false) AS skips
), replayed AS (
    DELETE FROM {{schema}}.outbox_dead_letters
    WHERE topic = $1 AND ($2::bigint[] IS NULL OR id = ANY($2::bigint[]))
    RETURNING *
)
INSERT INTO {{schema}}.outbox
    (id, topic, payload, headers, correlation_id, message_group, priority, attempts, available_at, last_error,
     created_at, xid, ordered)
SELECT CASE WHEN t.ordered AND r.message_group IS NOT NULL
                 AND (t.skips OR EXISTS (SELECT 1 FROM {{schema}}.outbox AS o
                                         WHERE o.topic = $1 AND o.ordered AND o.message_group = r.message_group
                                           AND o.id > r.id AND o.lease_owner IS NOT NULL))
            THEN nextval('{{schema}}.outbox_id_seq') ELSE r.id END,
       r.topic, r.payload, r.headers, r.correlation_id, r.message_group, r.priority, 0, now(), r.last_error,
       r.created_at, r.xid, CASE WHEN t.ordered THEN true END
FROM (SELECT * FROM replayed ORDER BY id) AS r, t
WHERE (SELECT count(pg_advisory_xact_lock(` + orderedLockClass + `, g.key))
       FROM (SELECT DISTINCT hashtext($1 || '/' || message_group) AS key
             FROM replayed, t WHERE t.ordered AND message_group IS NOT NULL
             ORDER BY 1) AS g) >= 0
RETURNING id`

// blockedHeads are the messages that hold an ordered topic's ($1) groups
// back: queued ones that failed (only a group's head is ever delivered,
// so each is its group's head, one per group), and, when $2 (the topic
// blocks groups on dead letters), each group's oldest dead letter.
const blockedHeads = `
blocked AS (
    SELECT message_group, id, attempts, coalesce(last_error, '') AS last_error, failing_since AS since, false AS dead
    FROM {{schema}}.outbox
    WHERE topic = $1 AND failing_since IS NOT NULL AND ordered AND message_group IS NOT NULL
    UNION ALL
    (SELECT DISTINCT ON (message_group) message_group, id, attempts, coalesce(last_error, ''), dead_lettered_at, true
     FROM {{schema}}.outbox_dead_letters
     WHERE $2 AND topic = $1 AND message_group IS NOT NULL
     ORDER BY message_group, id)
)`

// blockedGroups lists up to $3 blocked groups of topic $1, longest
// blocked first: the head, and how many messages wait behind it.
const blockedGroups = `
WITH ` + blockedHeads + `
SELECT message_group, id, attempts, last_error, since, dead,
       (SELECT count(*) FROM {{schema}}.outbox AS o
        WHERE o.topic = $1 AND o.ordered AND o.message_group = b.message_group AND o.id <> b.id)
FROM (SELECT DISTINCT ON (message_group) * FROM blocked ORDER BY message_group, dead DESC, since) AS b
ORDER BY since, message_group
LIMIT $3`

// blockedSummary counts topic $1's blocked groups and finds when the
// longest blocked one was first held back.
const blockedSummary = `
WITH ` + blockedHeads + `
SELECT count(DISTINCT message_group), min(since) FROM blocked`

// discardDeadLetters deletes dead letters of topic $1 (all of them when
// $2 is NULL).
const discardDeadLetters = `
DELETE FROM {{schema}}.outbox_dead_letters
WHERE topic = $1 AND ($2::bigint[] IS NULL OR id = ANY($2::bigint[]))`
