DROP TABLE IF EXISTS outbox_topic_watermarks;
DROP TABLE IF EXISTS outbox_consumer_groups;
DROP TABLE IF EXISTS outbox_group_retries;
DROP TABLE IF EXISTS outbox_group_batches;
DROP TABLE IF EXISTS outbox_subscription_offsets;
DROP TABLE IF EXISTS outbox_topic_subscriptions;
DROP INDEX IF EXISTS outbox_pubsub_xid_idx;
ALTER TABLE outbox
    DROP COLUMN IF EXISTS required_bits,
    DROP COLUMN IF EXISTS done_bits,
    DROP COLUMN IF EXISTS required_ids,
    DROP COLUMN IF EXISTS required_count,
    DROP COLUMN IF EXISTS completed_count;
DELETE FROM outbox WHERE status = 'PUBLISHED';
ALTER TABLE outbox DROP CONSTRAINT outbox_status_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_status_check
    CHECK (status IN ('PENDING', 'PROCESSING', 'DEAD_LETTER'));
ALTER TABLE outbox_topics
    DROP COLUMN IF EXISTS zero_subscription_retention,
    DROP COLUMN IF EXISTS block_writes_on_zero_subscriptions,
    DROP COLUMN IF EXISTS subscribed_bits,
    DROP COLUMN IF EXISTS subscribed_ids;
