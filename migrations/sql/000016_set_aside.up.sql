-- The messages a consumer group set aside from its stream, to deliver them
-- from its retry table: a message of a priority above 0 taken ahead of the
-- backlog in front of it, and a message sent to be available later, parked
-- there until it is due. The group's stream, a batch read again after a
-- takeover and a backfill skip what is recorded here (the message may be
-- handled, and its retry gone, long before they reach it). An entry goes
-- once no read of the group can reach the message any more (its position
-- has passed it and no open batch or pending backfill spans it): the table
-- follows the work in flight, not the backlog.
CREATE TABLE outbox_group_set_aside (
    subscription_id bigint NOT NULL REFERENCES outbox_topic_subscriptions (id) ON DELETE CASCADE,
    message_id      bigint NOT NULL,
    xid             xid8   NOT NULL,
    PRIMARY KEY (subscription_id, message_id)
);

-- Finds the prioritized messages a group's position has not passed; sends
-- of priority 0, most of them, do not enter it.
CREATE INDEX outbox_published_priority_idx ON outbox_published (topic, xid, id) WHERE priority > 0;
