-- A DEAD group keeps its claim only on what it had not finished when it
-- died. dead_upto is the snapshot taken when it was declared DEAD, under
-- the topic's lock (after every producer that read the old subscribed set
-- committed): in Offset mode, where messages record no required groups,
-- the messages not visible in it were written after it died and are not
-- its claim. NULL unless DEAD; the groups DEAD now claim what is stored.
ALTER TABLE outbox_topic_subscriptions ADD COLUMN dead_upto pg_snapshot;
UPDATE outbox_topic_subscriptions SET dead_upto = pg_current_snapshot() WHERE subscription_status = 'DEAD';

-- A backfill reads one snapshot pair after another: its current pair is
-- (backfill_lower, or backfill_from when NULL, backfill_upto) after
-- (backfill_xid, backfill_id), and backfill_next queues the pairs that
-- follow, each {"lower", "upto", "xid", "id"} (a group of an Offset topic
-- that comes back from DEAD reads the rest of what it was reading, then
-- what it has not read). backfill_from stays what cleanup keeps for it.
ALTER TABLE outbox_subscription_offsets ADD COLUMN backfill_lower pg_snapshot, ADD COLUMN backfill_next jsonb;
