package sqlq

// The SQL producers write messages with, on every kind of topic.

// insertQueued writes one message (@topic, @payload, @headers,
// @correlation_id, @message_group, @priority) of a topic configured as
// QUEUE by an earlier release (see QueueOnLog): a plain single-row INSERT
// into outbox, whose trigger moves it to the log. Such a row needs nothing from the topic
// row (a topic's semantics never change once configured); it is available
// at once (the column default now()).
const insertQueued = `
INSERT INTO {{schema}}.outbox (topic, payload, headers, correlation_id, message_group, priority)
VALUES (@topic, @payload, @headers, @correlation_id, @message_group, @priority)
RETURNING id`

// insertQueuedAt is insertQueued with a delivery time (see availableAt).
const insertQueuedAt = `
INSERT INTO {{schema}}.outbox ` + queuedAtColumns + `
VALUES (@topic, @payload, @headers, @correlation_id, @message_group, @priority, ` + availableAt + `)
RETURNING id`

// queuedAtColumns are the columns insertQueuedAt and insertUnconfigured write.
const queuedAtColumns = `(topic, payload, headers, correlation_id, message_group, priority, available_at)`

// availableAt is when a message may first be delivered: @not_before, or
// @delay_us microseconds after @now (the injected clock) or the database's
// now().
const availableAt = `coalesce(@not_before::timestamptz, coalesce(@now::timestamptz, now()) + @delay_us * interval '1 microsecond')`

// configuringDefaults begins a statement that configures @topic, when
// it has no configuration yet, as a QUEUE topic with the defaults
// (outbox.TopicConfig{}.WithDefaults(): a test holds the two together),
// on the log with its one group. It takes the topic's lock in shared mode
// until the transaction ends, as every send does, so that a configuration
// waits for it; a configuration committed meanwhile wins (ON CONFLICT DO
// NOTHING waits for it).
const configuringDefaults = `
WITH configured AS (
    INSERT INTO {{schema}}.outbox_topics (` + defaultTopicColumns + `)
    SELECT @topic, ` + defaultTopicValues + `
    WHERE pg_advisory_xact_lock_shared(` + topicLockClass + `, hashtext(@topic)) IS NOT NULL
    ON CONFLICT (topic) DO NOTHING
    RETURNING topic` + queueGroupsOfConfigured + `)`

// defaultTopicColumns and defaultTopicValues configure a QUEUE topic with
// the defaults (after the topic's name).
const (
	defaultTopicColumns = `topic, semantics, tracking_mode, retention, max_attempts, backoff_initial, backoff_max, lease_duration`
	defaultTopicValues  = `'QUEUE', 'OFFSET', interval '0', 10, interval '1 second', interval '10 minutes', interval '30 seconds'`
)

// queueGroupsOfConfigured continues a WITH whose CTE configured returns
// the topics it configured: it makes each one's group, reading from the
// first message.
const queueGroupsOfConfigured = `
), queue_group AS (
    INSERT INTO {{schema}}.outbox_topic_subscriptions (topic, group_name, start_position, heartbeat_timeout)
    SELECT topic, '` + QueueGroup + `', 'BEGINNING', interval '5 minutes' FROM configured
    RETURNING id
), queue_position AS (
    INSERT INTO {{schema}}.outbox_subscription_offsets (subscription_id, position)
    SELECT id, '1:1:'::pg_snapshot FROM queue_group`

// insertUnconfigured writes a message of a topic the producer has not
// seen configured (the parameters of insertLoggedAt): it configures the topic
// with the defaults (see configuringDefaults) and writes the message to
// the log, unless the topic has been configured as PUB_SUB or ordered
// since: then it writes nothing and returns no row, and the producer
// reads the configuration and sends with the statement it calls for.
const insertUnconfigured = configuringDefaults + unconfiguredInsert + `
SELECT id FROM inserted`

// insertUnconfiguredNotify is insertUnconfigured that also notifies
// @channel with the topic when the transaction commits.
const insertUnconfiguredNotify = configuringDefaults + unconfiguredInsert + `
SELECT inserted.id FROM inserted, (SELECT pg_notify(@channel, @topic)) AS n`

// unconfiguredInsert is the CTE inserted of insertUnconfigured.
const unconfiguredInsert = `, inserted AS (
    INSERT INTO {{schema}}.outbox_published
        (topic, payload, headers, correlation_id, message_group, priority, available_at, status)
    SELECT @topic, @payload, @headers, @correlation_id, @message_group, @priority, ` + availableAt + `, 'PUBLISHED'
    WHERE NOT EXISTS (SELECT FROM {{schema}}.outbox_topics WHERE topic = @topic AND (semantics = 'PUB_SUB' OR ordered))
    RETURNING id
)`

// insertLogged writes one message of a QUEUE topic whose messages live on
// the log (see QueueOnLog), available at once (the parameters of insertQueued): a
// plain single-row INSERT, like insertQueued. It needs nothing from the
// topic row, so it takes no topic lock: the topic's one group reads every
// message ever written to it and never leaves, so there is no subscribed
// set to agree with.
const insertLogged = `
INSERT INTO {{schema}}.outbox_published (topic, payload, headers, correlation_id, message_group, priority, status)
VALUES (@topic, @payload, @headers, @correlation_id, @message_group, @priority, 'PUBLISHED')
RETURNING id`

// insertLoggedAt is insertLogged with a delivery time (see availableAt).
const insertLoggedAt = `
INSERT INTO {{schema}}.outbox_published ` + loggedAtColumns + `
VALUES (@topic, @payload, @headers, @correlation_id, @message_group, @priority, ` + availableAt + `, 'PUBLISHED')
RETURNING id`

// loggedAtColumns are the columns insertLoggedAt and insertLoggedOrdered
// write.
const loggedAtColumns = `(topic, payload, headers, correlation_id, message_group, priority, available_at, status)`

// insertLoggedOrdered is insertLoggedAt for an ordered topic: a message
// with a group takes its group's lock first, as insertOrdered does.
const insertLoggedOrdered = `
INSERT INTO {{schema}}.outbox_published ` + loggedAtColumns + `
SELECT @topic, @payload, @headers, @correlation_id, @message_group, @priority, ` + availableAt + `, 'PUBLISHED'
WHERE ` + groupLock + `
RETURNING id`

// orderedLockClass is the first key of the advisory lock a send to an
// ordered topic takes per (topic, message group) ("pgoo"); the second is
// hashtext of topic/group (a topic name has no '/', so no two pairs
// share the text; two pairs sharing a hash only wait for each other).
const orderedLockClass = `1885826927`

// insertOrdered writes one message of a configured ordered QUEUE topic
// (the parameters of insertQueuedAt). A message with a group first takes its
// group's lock until the transaction ends, and only then draws its id
// (the filter runs before the row is formed): a second transaction
// sending to the group waits for the first to commit or roll back, so
// the group's ids follow commit order, which is the order the ordered
// claim delivers them in.
const insertOrdered = `
INSERT INTO {{schema}}.outbox (topic, payload, headers, correlation_id, message_group, priority, available_at, ordered)
SELECT @topic, @payload, @headers, @correlation_id, @message_group, @priority, ` + availableAt + `, true
WHERE ` + groupLock + `
RETURNING id`

// groupLock takes the lock of @message_group of @topic until the
// transaction ends (see insertOrdered); true.
const groupLock = `(@message_group::text IS NULL OR pg_advisory_xact_lock(` + orderedLockClass + `, hashtext(@topic || '/' || @message_group::text)) IS NOT NULL)`

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
SELECT @topic, @payload, @headers, @correlation_id, @message_group, @priority, ` + availableAt + `,
       ` + publishedStatus + `,
       ` + requiredGroups + `
FROM {{schema}}.outbox_topics AS t
WHERE ` + first + `t.topic = @topic AND ` + topicLockShared + `
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
// @channel with @topic when the transaction commits.
func notifying(insert string) string {
	return "WITH inserted AS (" + insert + "\n)\nSELECT inserted.id FROM inserted, (SELECT pg_notify(@channel, @topic)) AS n"
}

// selectSemantics reads a topic's semantics, whether it is ordered and
// whether its messages live on the log (no row: never configured).
var selectSemantics = `SELECT semantics, ordered, ` + onLog("t") + ` FROM {{schema}}.outbox_topics AS t WHERE topic = @topic`

// onLog is true for topic row alias whose messages live on the log
// (outbox_published): every PUB_SUB topic, and a QUEUE topic that has a
// tracking mode (see QueueOnLog).
func onLog(alias string) string {
	return `(` + alias + `.semantics = 'PUB_SUB' OR ` + alias + `.tracking_mode IS NOT NULL)`
}

// insertRows writes SendBatch's messages, given as parallel arrays, each
// into the table of its topic's semantics, and returns (position, id) for
// every row written. Ids are drawn in input order from the sequence both
// tables share. A message with an idempotency key is written only if it
// records the key first: a key of the topic that has not expired yet (an
// earlier send, or an earlier message of the batch) skips it. @now is now,
// @idempotency_window_us the idempotency window (microseconds) of topics
// never configured; the messages' fields are the arrays @topics, @payloads,
// @headers, @correlation_ids, @message_groups, @priorities,
// @idempotency_keys, @not_befores and @delays_us.
//
// Topics never configured are configured with the defaults, on the log
// (see configuringDefaults), and their messages take their topics' locks
// in shared mode, as insertUnconfigured does (configured ones take it in
// the join).
// Messages with a group on ordered topics first take their groups' locks
// (as insertOrdered does), all of them, in key order (so that two batches
// never deadlock), before any id is drawn: the filter is an initplan, a
// one-time filter run before any row reaches nextval.
var insertRows = `
WITH configured AS (
    INSERT INTO {{schema}}.outbox_topics (` + defaultTopicColumns + `)
    SELECT DISTINCT u.topic, ` + defaultTopicValues + `
    FROM unnest(@topics::text[]) AS u(topic)
    ORDER BY u.topic
    ON CONFLICT (topic) DO NOTHING
    RETURNING topic` + queueGroupsOfConfigured + `
), m AS MATERIALIZED (
    SELECT nextval('{{schema}}.outbox_id_seq') AS id, r.*
    FROM (SELECT m.*,
                 CASE WHEN t.ordered THEN true END AS ordered,
                 coalesce(m.not_before, coalesce(@now::timestamptz, now()) + m.delay_us * interval '1 microsecond')
                     AS available_at,
                 coalesce(` + onLog("t") + `, true) AS published,
                 coalesce(t.idempotency_window, @idempotency_window_us * interval '1 microsecond') AS idempotency_window,
                 ` + publishedStatus + ` AS status,
                 ` + requiredGroups + `
          FROM unnest(@topics::text[], @payloads::jsonb[], @headers::jsonb[], @correlation_ids::text[], @message_groups::text[], @priorities::smallint[],
                      @idempotency_keys::text[], @not_befores::timestamptz[], @delays_us::bigint[])
               WITH ORDINALITY AS m(topic, payload, headers, correlation_id, message_group, priority,
                                    idempotency_key, not_before, delay_us, ord)
          LEFT JOIN (SELECT * FROM {{schema}}.outbox_topics AS t
                     WHERE t.topic = ANY(@topics::text[]) AND ` + topicLockShared + `
                     FOR KEY SHARE) AS t
                 ON t.topic = m.topic -- held until commit, as in insertPublished
          WHERE (SELECT count(pg_advisory_xact_lock(` + orderedLockClass + `, g.key))
                 FROM (SELECT DISTINCT hashtext(u.topic || '/' || u.grp) AS key
                       FROM unnest(@topics::text[], @message_groups::text[]) AS u(topic, grp)
                       JOIN {{schema}}.outbox_topics AS ot ON ot.topic = u.topic AND ot.ordered
                       WHERE u.grp IS NOT NULL
                       ORDER BY 1) AS g) >= 0
            AND (SELECT count(pg_advisory_xact_lock_shared(` + topicLockClass + `, hashtext(u.topic)))
                 FROM (SELECT DISTINCT topic FROM unnest(@topics::text[]) AS u(topic)
                       WHERE NOT EXISTS (SELECT FROM {{schema}}.outbox_topics AS ct WHERE ct.topic = u.topic)) AS u) >= 0
          ORDER BY m.ord) AS r
), keyed AS (
    INSERT INTO {{schema}}.outbox_idempotency_keys AS k (topic, idempotency_key, message_id, expires_at)
    SELECT DISTINCT ON (topic, idempotency_key)
           topic, idempotency_key, id, coalesce(@now::timestamptz, now()) + idempotency_window
    FROM m WHERE idempotency_key IS NOT NULL
    ORDER BY topic, idempotency_key, ord
    ON CONFLICT (topic, idempotency_key) DO UPDATE
        SET message_id = excluded.message_id, expires_at = excluded.expires_at
        WHERE k.expires_at <= coalesce(@now::timestamptz, now())
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
var insert = insertRows + `
SELECT m.ord, m.id FROM m JOIN written USING (id)`

// insertNotify is insert that also wakes listening consumers of the topics
// in @notify_topics, on @channel, when the producer's transaction commits (NOTIFY
// is transactional: a rollback notifies nobody).
var insertNotify = insertRows + `, notified AS (
    SELECT pg_notify(@channel, t) FROM unnest(@notify_topics::text[]) AS t
)
SELECT m.ord, m.id FROM m JOIN written USING (id), (SELECT count(*) FROM notified) AS n -- the join makes notified run`

// selectIdempotent finds the messages an idempotent send collided with.
const selectIdempotent = `
SELECT idempotency_key, message_id FROM {{schema}}.outbox_idempotency_keys
WHERE topic = @topic AND idempotency_key = ANY(@keys::text[])`

// expireIdempotencyKeys deletes up to @batch_size keys that expired
// before @now.
const expireIdempotencyKeys = `
DELETE FROM {{schema}}.outbox_idempotency_keys AS k
USING (SELECT topic, idempotency_key FROM {{schema}}.outbox_idempotency_keys
       WHERE expires_at <= coalesce(@now::timestamptz, now())
       ORDER BY expires_at
       LIMIT @batch_size
       FOR UPDATE SKIP LOCKED) AS e
WHERE k.topic = e.topic AND k.idempotency_key = e.idempotency_key`
