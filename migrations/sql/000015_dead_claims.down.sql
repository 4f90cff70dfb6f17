ALTER TABLE outbox_subscription_offsets DROP COLUMN IF EXISTS backfill_next, DROP COLUMN IF EXISTS backfill_lower;
ALTER TABLE outbox_topic_subscriptions DROP COLUMN IF EXISTS dead_upto;
