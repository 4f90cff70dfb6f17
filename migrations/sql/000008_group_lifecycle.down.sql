ALTER TABLE outbox_group_retries DROP COLUMN lease_expiries;
ALTER TABLE outbox_topic_subscriptions DROP COLUMN forget_pending;
ALTER TABLE outbox_subscription_offsets
    DROP COLUMN backfill_from,
    DROP COLUMN backfill_left;
