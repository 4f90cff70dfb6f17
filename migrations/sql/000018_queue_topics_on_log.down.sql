-- QUEUE topics go back to outbox: every message of theirs still stored
-- (some may be delivered again: at least once), and their group's dead
-- letters to outbox_dead_letters.
DROP TRIGGER outbox_to_log ON outbox;
DROP FUNCTION outbox_to_log();

LOCK TABLE outbox_published, outbox_topics IN EXCLUSIVE MODE;

INSERT INTO outbox (id, topic, payload, headers, correlation_id, message_group, priority, available_at, created_at, attempts)
SELECT o.id, o.topic, o.payload, o.headers, o.correlation_id, o.message_group, o.priority, o.available_at, o.created_at,
       coalesce(r.attempts, 0)
FROM outbox_published AS o
JOIN outbox_topics AS t ON t.topic = o.topic AND t.semantics = 'QUEUE'
LEFT JOIN outbox_topic_subscriptions AS s ON s.topic = o.topic AND s.group_name = '(queue)'
LEFT JOIN outbox_group_retries AS r ON r.subscription_id = s.id AND r.message_id = o.id AND r.payload IS NULL
ON CONFLICT DO NOTHING;

UPDATE outbox SET ordered = true
WHERE topic IN (SELECT topic FROM outbox_topics WHERE semantics = 'QUEUE' AND ordered);

INSERT INTO outbox_dead_letters
    (id, topic, payload, headers, correlation_id, message_group, priority, attempts, last_error, created_at, dead_lettered_at, xid)
SELECT r.message_id, s.topic, coalesce(r.payload, o.payload), coalesce(r.headers, o.headers),
       coalesce(r.correlation_id, o.correlation_id), coalesce(r.message_group, o.message_group),
       coalesce(r.priority, o.priority, 0), r.attempts, r.last_error, coalesce(r.created_at, o.created_at, now()),
       r.dead_lettered_at, coalesce(r.xid, o.xid, pg_current_xact_id())
FROM outbox_group_retries AS r
JOIN outbox_topic_subscriptions AS s ON s.id = r.subscription_id AND s.group_name = '(queue)'
LEFT JOIN outbox_published AS o ON o.id = r.message_id
WHERE r.status = 'DEAD_LETTER'
ON CONFLICT DO NOTHING;

DELETE FROM outbox_published WHERE topic IN (SELECT topic FROM outbox_topics WHERE semantics = 'QUEUE');
DELETE FROM outbox_topic_subscriptions WHERE group_name = '(queue)';
UPDATE outbox_topics SET tracking_mode = NULL WHERE semantics = 'QUEUE';
