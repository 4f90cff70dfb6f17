-- A consumer group takes a message of a priority above 0 ahead of its
-- stream: it reads it beyond its position, puts it in its retry table as a
-- retry that never ran, and records here that it did, so that its stream,
-- reaching the message later (or a batch read again after a takeover, or a
-- backfill), skips it. An entry goes once no read of the group can reach
-- the message any more (its position has passed it and no open batch or
-- pending backfill spans it). The table holds the prioritized messages
-- between the two: it follows the work in flight, not the backlog.
CREATE TABLE outbox_group_taken_ahead (
    subscription_id bigint NOT NULL REFERENCES outbox_topic_subscriptions (id) ON DELETE CASCADE,
    message_id      bigint NOT NULL,
    xid             xid8   NOT NULL,
    PRIMARY KEY (subscription_id, message_id)
);

-- Finds the prioritized messages a group's position has not passed; sends
-- of priority 0, most of them, do not enter it.
CREATE INDEX outbox_published_priority_idx ON outbox_published (topic, xid, id) WHERE priority > 0;
