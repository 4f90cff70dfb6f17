-- Ordered QUEUE topics: the messages of one message group are delivered
-- one at a time, in commit order.
--
-- A topic is ordered from its first configuration on (the flag never
-- changes, so producers may trust what they read once). What a group does
-- after one of its messages is dead-lettered is the topic's policy:
-- BLOCK keeps the group's later messages until the dead letter is replayed
-- or discarded, SKIP moves on.
ALTER TABLE outbox_topics
    ADD COLUMN ordered boolean NOT NULL DEFAULT false,
    ADD COLUMN ordered_dead_letters text;

-- Every message of an ordered topic is marked (NULL elsewhere, which
-- costs unordered rows nothing), so that ordered rows have an index of
-- their own, by message group and id: a claim finds the head (the oldest
-- message) of each group, and whether it is available, by skipping from
-- one group to the next, and a topic's ungrouped messages at the end of
-- it (NULLs sort last). A lease changes available_at, which the claim
-- index holds already, so carrying it here adds no index write. Groups
-- sort by their bytes (COLLATE "C"), whatever the database's collation,
-- the order the claim's callers compare them in.
ALTER TABLE outbox ADD COLUMN ordered boolean;
CREATE INDEX outbox_ordered_idx ON outbox (topic, message_group COLLATE "C", id) INCLUDE (available_at) WHERE ordered;

-- A BLOCK topic's claim asks, per group head, whether the group has a
-- dead letter.
CREATE INDEX outbox_dead_letters_group_idx ON outbox_dead_letters (topic, message_group)
    WHERE message_group IS NOT NULL;

-- When a queued message first failed (a retry or a counted release; NULL
-- while it never has): an ordered topic's blocked groups are the groups of
-- such messages, and the index finds them without reading the queue.
ALTER TABLE outbox ADD COLUMN failing_since timestamptz;
CREATE INDEX outbox_failing_idx ON outbox (topic, failing_since) WHERE failing_since IS NOT NULL;
