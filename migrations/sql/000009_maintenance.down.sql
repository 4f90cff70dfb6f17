ALTER TABLE outbox_group_batches DROP COLUMN catchup;
-- A catch-up in progress is lost (the previous release cannot read it).
UPDATE outbox_subscription_offsets SET backfill_from = NULL, backfill_left = 0 WHERE backfill_upto IS NOT NULL;
ALTER TABLE outbox_subscription_offsets
    DROP COLUMN backfill_upto,
    DROP COLUMN backfill_xid,
    DROP COLUMN backfill_id,
    DROP COLUMN backfill_total,
    DROP COLUMN backfill_done,
    DROP COLUMN backfill_started_at,
    DROP COLUMN backfill_ended_at,
    DROP COLUMN backfill_outcome;
DROP INDEX outbox_dead_letters_age_idx;
DROP TABLE outbox_deleted_subscriptions;
DROP INDEX outbox_subscriptions_group_idx;
DROP INDEX outbox_subscriptions_name_idx;
-- Names reused after a cancel: the cancelled subscriptions go.
DELETE FROM outbox_topic_subscriptions AS c
WHERE c.subscription_status = 'CANCELLED'
      AND EXISTS (SELECT 1 FROM outbox_topic_subscriptions AS s
                  WHERE s.topic = c.topic AND s.group_name = c.group_name AND s.id > c.id);
ALTER TABLE outbox_topic_subscriptions ADD CONSTRAINT outbox_topic_subscriptions_topic_group_name_key UNIQUE (topic, group_name);
DROP INDEX outbox_group_retries_dead_idx;
ALTER TABLE outbox_group_retries
    DROP COLUMN payload,
    DROP COLUMN headers,
    DROP COLUMN correlation_id,
    DROP COLUMN message_group,
    DROP COLUMN priority,
    DROP COLUMN created_at,
    DROP COLUMN xid;
ALTER TABLE outbox_topics
    DROP COLUMN max_retention,
    DROP COLUMN zombie_ttl;
