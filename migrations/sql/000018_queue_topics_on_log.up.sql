-- Every QUEUE topic moves to the log (outbox_published), where its
-- consumers are the members of its one consumer group, "(queue)", which
-- reads every message ever written to the topic and is never declared
-- DEAD. What outbox and outbox_dead_letters hold moves with it:
--
--   * every message, with its id: to the log, available when it was
--     (a leased one at once: its lease is taken back, and the attempt it
--     was in counts);
--   * the attempts of a message that failed or was leased: it waits as a
--     retry of the group, due when it was, and the group's stream skips
--     it (outbox_group_set_aside);
--   * every dead letter: a dead letter of the group, with its copy of the
--     message, its attempts, its error and when it was dead-lettered;
--   * topics that hold messages without a configuration get the defaults.
--
-- A rolling deploy: instances of an earlier release keep sending to
-- outbox; a trigger moves each such message to the log as it is written
-- (same id), so the new release's consumers receive it, and the earlier
-- release's consumers find nothing left to claim. A message one of them
-- held when this ran is delivered again by the new release (at least
-- once, as before). Sends of earlier releases wait while this runs.

LOCK TABLE outbox, outbox_dead_letters, outbox_topics IN EXCLUSIVE MODE;

INSERT INTO outbox_topics (topic, semantics, retention, max_attempts, backoff_initial, backoff_max, lease_duration)
SELECT DISTINCT topic, 'QUEUE', interval '0', 10, interval '1 second', interval '10 minutes', interval '30 seconds'
FROM (SELECT topic FROM outbox UNION ALL SELECT topic FROM outbox_dead_letters) AS t
ON CONFLICT (topic) DO NOTHING;

UPDATE outbox_topics SET tracking_mode = 'OFFSET' WHERE semantics = 'QUEUE' AND tracking_mode IS NULL;

INSERT INTO outbox_topic_subscriptions (topic, group_name, start_position, heartbeat_timeout)
SELECT t.topic, '(queue)', 'BEGINNING', interval '5 minutes'
FROM outbox_topics AS t
WHERE t.semantics = 'QUEUE'
  AND NOT EXISTS (SELECT 1 FROM outbox_topic_subscriptions AS s WHERE s.topic = t.topic AND s.group_name = '(queue)');

INSERT INTO outbox_subscription_offsets (subscription_id, position)
SELECT s.id, '1:1:'::pg_snapshot
FROM outbox_topic_subscriptions AS s
WHERE s.group_name = '(queue)'
  AND NOT EXISTS (SELECT 1 FROM outbox_subscription_offsets AS f WHERE f.subscription_id = s.id);

-- A message that ran is available after it was written, so that the
-- group's stream looks it up among what it set aside, and skips it.
INSERT INTO outbox_published
    (id, topic, payload, headers, correlation_id, message_group, priority, available_at, created_at, status)
SELECT id, topic, payload, headers, correlation_id, message_group, priority,
       CASE WHEN attempts = 0 THEN available_at
            ELSE greatest(CASE WHEN lease_owner IS NULL THEN available_at ELSE least(available_at, now()) END,
                          created_at + interval '1 microsecond') END,
       created_at, 'PUBLISHED'
FROM outbox;

-- Messages that ran: retries of the group, set aside from its stream.
INSERT INTO outbox_group_retries
    (subscription_id, message_id, status, attempts, available_at, last_error, message_group, failing_since)
SELECT s.id, o.id, 'RETRY', o.attempts,
       CASE WHEN o.lease_owner IS NULL THEN o.available_at ELSE least(o.available_at, now()) END,
       coalesce(o.last_error, CASE WHEN o.lease_owner IS NOT NULL THEN 'lease taken back by the upgrade' END),
       o.message_group, o.failing_since
FROM outbox AS o
JOIN outbox_topic_subscriptions AS s ON s.topic = o.topic AND s.group_name = '(queue)'
WHERE o.attempts > 0;

INSERT INTO outbox_group_set_aside (subscription_id, message_id, xid)
SELECT s.id, o.id, p.xid
FROM outbox AS o
JOIN outbox_topic_subscriptions AS s ON s.topic = o.topic AND s.group_name = '(queue)'
JOIN outbox_published AS p ON p.id = o.id
WHERE o.attempts > 0;

INSERT INTO outbox_group_retries
    (subscription_id, message_id, status, attempts, available_at, last_error, dead_lettered_at,
     payload, headers, correlation_id, message_group, priority, created_at, xid, failing_since)
SELECT s.id, d.id, 'DEAD_LETTER', d.attempts, d.dead_lettered_at, d.last_error, d.dead_lettered_at,
       d.payload, d.headers, d.correlation_id, d.message_group, d.priority, d.created_at,
       d.xid, CASE WHEN d.message_group IS NOT NULL THEN d.dead_lettered_at END
FROM outbox_dead_letters AS d
JOIN outbox_topic_subscriptions AS s ON s.topic = d.topic AND s.group_name = '(queue)';

DELETE FROM outbox;
DELETE FROM outbox_dead_letters;

-- Sends of an earlier release: moved to the log as they are written.
CREATE FUNCTION outbox_to_log() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO outbox_topics (topic, semantics, tracking_mode, retention, max_attempts, backoff_initial, backoff_max, lease_duration)
    VALUES (NEW.topic, 'QUEUE', 'OFFSET', interval '0', 10, interval '1 second', interval '10 minutes', interval '30 seconds')
    ON CONFLICT (topic) DO NOTHING;
    IF NOT EXISTS (SELECT 1 FROM outbox_topic_subscriptions WHERE topic = NEW.topic AND group_name = '(queue)') THEN
        WITH s AS (
            INSERT INTO outbox_topic_subscriptions (topic, group_name, start_position, heartbeat_timeout)
            VALUES (NEW.topic, '(queue)', 'BEGINNING', interval '5 minutes')
            ON CONFLICT DO NOTHING
            RETURNING id
        )
        INSERT INTO outbox_subscription_offsets (subscription_id, position) SELECT id, '1:1:'::pg_snapshot FROM s;
    END IF;
    INSERT INTO outbox_published
        (id, topic, payload, headers, correlation_id, message_group, priority, available_at, created_at, status)
    VALUES (NEW.id, NEW.topic, NEW.payload, NEW.headers, NEW.correlation_id, NEW.message_group, NEW.priority,
            NEW.available_at, NEW.created_at, 'PUBLISHED');
    DELETE FROM outbox WHERE id = NEW.id;
    RETURN NULL;
END
$$;
CREATE TRIGGER outbox_to_log AFTER INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION outbox_to_log();
