package sqlq

// The SQL of topic configuration and tracking mode changes.

// lockTopicExclusive is what ConfigureTopic takes before upsertTopic:
// topic @topic's lock, exclusively, until the transaction ends. It waits
// for producers and subscription changes in flight, so the upsert (a
// later statement, with a fresh snapshot) sees their messages and
// subscriptions when it decides whether the tracking mode may change. In
// one statement, the upsert would decide on what it saw before it waited.
const lockTopicExclusive = `SELECT pg_advisory_xact_lock(` + topicLockClass + `, hashtext(@topic))`

// upsertTopic configures topic @topic: its @semantics, @tracking_mode,
// @max_attempts, @block_writes_on_zero_subscriptions, @ordered and
// @ordered_dead_letters, and its durations in microseconds
// (@retention_us, @backoff_initial_us, @backoff_max_us,
// @lease_duration_us, @zero_subscription_retention_us,
// @idempotency_window_us, @max_retention_us, @zombie_ttl_us).
const upsertTopic = `
INSERT INTO {{schema}}.outbox_topics
    (topic, semantics, tracking_mode, retention, max_attempts, backoff_initial, backoff_max, lease_duration,
     zero_subscription_retention, block_writes_on_zero_subscriptions, idempotency_window, max_retention, zombie_ttl,
     ordered, ordered_dead_letters)
VALUES (@topic, @semantics, @tracking_mode, @retention_us * interval '1 microsecond', @max_attempts,
        @backoff_initial_us * interval '1 microsecond', @backoff_max_us * interval '1 microsecond',
        @lease_duration_us * interval '1 microsecond', @zero_subscription_retention_us * interval '1 microsecond',
        @block_writes_on_zero_subscriptions, @idempotency_window_us * interval '1 microsecond',
        @max_retention_us * interval '1 microsecond', @zombie_ttl_us * interval '1 microsecond',
        @ordered, @ordered_dead_letters)
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
    -- A QUEUE topic on the log stays there.
    tracking_mode = CASE WHEN excluded.semantics = 'QUEUE' THEN outbox_topics.tracking_mode ELSE excluded.tracking_mode END,
    updated_at = now()
-- Semantics and ordering never change (producers rely on them, see
-- insertQueued and insertOrdered).
WHERE outbox_topics.semantics = excluded.semantics AND outbox_topics.ordered = excluded.ordered`

// lockTopicRow follows lockTopicExclusive in a change of tracking mode:
// it reads topic @topic's semantics and mode and locks its row, so that a
// producer statement that waited for the topic's lock re-reads the row
// (and writes the new mode's columns), as for a change of the subscribed
// set (see insertPublished).
const lockTopicRow = `
SELECT semantics, coalesce(tracking_mode, '') FROM {{schema}}.outbox_topics WHERE topic = @topic FOR UPDATE`

// trackingInUse reads topic @topic's mode and whether the topic is in use: a
// group subscribed (not CANCELLED) or a message stored. (After
// lockTopicExclusive: nothing in flight.)
const trackingInUse = `
SELECT coalesce(t.tracking_mode, ''),
       EXISTS (SELECT 1 FROM {{schema}}.outbox_topic_subscriptions AS s
               WHERE s.topic = t.topic AND s.subscription_status <> 'CANCELLED')
       OR EXISTS (SELECT 1 FROM {{schema}}.outbox_published AS p WHERE p.topic = t.topic)
FROM {{schema}}.outbox_topics AS t WHERE t.topic = @topic`

// changeTracking sets topic @topic's mode to @tracking_mode (after
// lockTopicRow): every message written under the old one has an xid below
// the current snapshot's xmax (the producers that read the old mode held
// the topic's lock, which the change waited for), which
// mode_changed_below keeps until cleanup finds none left.
const changeTracking = `
UPDATE {{schema}}.outbox_topics
SET tracking_mode = @tracking_mode, updated_at = now(),
    mode_changed_below = greatest(mode_changed_below, pg_snapshot_xmax(pg_current_snapshot()))
WHERE topic = @topic`

// assignBits gives every subscription of topic @topic that may still read
// (not CANCELLED) and has no bit one of the free bits, lowest first, and
// returns how many it could not give one (none free).
const assignBits = `
WITH free AS (
    SELECT b, row_number() OVER (ORDER BY b) AS n FROM generate_series(0, 63) AS b
    WHERE b NOT IN (SELECT bit FROM {{schema}}.outbox_topic_subscriptions WHERE topic = @topic AND bit IS NOT NULL)
), need AS (
    SELECT id, row_number() OVER (ORDER BY id) AS n FROM {{schema}}.outbox_topic_subscriptions
    WHERE topic = @topic AND bit IS NULL AND subscription_status <> 'CANCELLED'
), assigned AS (
    UPDATE {{schema}}.outbox_topic_subscriptions AS s SET bit = free.b
    FROM need JOIN free USING (n) WHERE s.id = need.id
    RETURNING s.id
)
SELECT (SELECT count(*) FROM need) - (SELECT count(*) FROM assigned)`

// resetSubscribedBits recomputes the bits of topic @topic's subscribed set
// (after assignBits).
const resetSubscribedBits = `
UPDATE {{schema}}.outbox_topics AS t
SET subscribed_bits = coalesce((SELECT bit_or(1::bigint << s.bit) FROM {{schema}}.outbox_topic_subscriptions AS s
                                WHERE s.topic = t.topic AND s.id = ANY(t.subscribed_ids) AND s.bit IS NOT NULL), 0)
WHERE t.topic = @topic`

// selectTopic reads topic @topic's configuration (durations in
// microseconds) and whether a change of its tracking mode is under way.
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
FROM {{schema}}.outbox_topics WHERE topic = @topic`
