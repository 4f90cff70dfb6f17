-- Ordered consumer groups: a group of an ordered PUB_SUB topic queues the
-- messages it reads in outbox_group_retries (as retries that never ran)
-- and takes from there, per message group, only the oldest. The claim
-- finds each message group's oldest row by walking this index from one
-- message group to the next. Groups sort by their bytes (COLLATE "C"),
-- whatever the database's collation, the order the walk compares them in.
CREATE INDEX outbox_group_retries_group_idx
    ON outbox_group_retries (subscription_id, message_group COLLATE "C", message_id)
    WHERE message_group IS NOT NULL;

-- An ordered group's queued messages are retry rows, thousands of them
-- at a time: finding the leased ones (those whose lease ran out, and
-- whether one suspected of crashing its process is out) and the due
-- retries of messages without a group must not read them all.
CREATE INDEX outbox_group_retries_leased_idx ON outbox_group_retries (subscription_id, lease_until)
    WHERE status = 'PROCESSING';
CREATE INDEX outbox_group_retries_ungrouped_idx ON outbox_group_retries (subscription_id, available_at)
    WHERE status = 'RETRY' AND message_group IS NULL;

-- When a retry first failed (NULL while it never has, as for the queued
-- messages of an ordered group): an ordered group's blocked message
-- groups are the groups of such retries, and the index finds them without
-- reading the queue.
ALTER TABLE outbox_group_retries ADD COLUMN failing_since timestamptz;
CREATE INDEX outbox_group_retries_failing_idx ON outbox_group_retries (subscription_id, failing_since)
    WHERE failing_since IS NOT NULL;
