-- Maintenance: retention caps per topic, group dead letters that outlive
-- their message row, names of cancelled groups that can be used again,
-- and backfills that run beside the group's stream (catch-up reading).

-- MaxRetention: no PUB_SUB row is kept longer, whatever group holds it
-- (paused, stuck, dead-lettering). ZombieTTL: how long a DEAD group keeps
-- its claim on what it had not finished before it is forgotten.
ALTER TABLE outbox_topics
    ADD COLUMN max_retention interval NOT NULL DEFAULT '30 days',
    ADD COLUMN zombie_ttl interval NOT NULL DEFAULT '7 days';

-- A group dead letter keeps a copy of its message, so it survives the
-- message row (cleanup, the retention cap) and no longer pins it. A retry
-- with a copy is delivered from the copy when the row is gone.
ALTER TABLE outbox_group_retries
    ADD COLUMN payload        jsonb,
    ADD COLUMN headers        jsonb,
    ADD COLUMN correlation_id text,
    ADD COLUMN message_group  text,
    ADD COLUMN priority       smallint,
    ADD COLUMN created_at     timestamptz,
    ADD COLUMN xid            xid8;
UPDATE outbox_group_retries AS r
SET payload = o.payload, headers = o.headers, correlation_id = o.correlation_id,
    message_group = o.message_group, priority = o.priority, created_at = o.created_at, xid = o.xid
FROM outbox_published AS o
WHERE o.id = r.message_id AND r.status = 'DEAD_LETTER';
CREATE INDEX outbox_group_retries_dead_idx ON outbox_group_retries (dead_lettered_at)
    WHERE status = 'DEAD_LETTER';

-- A cancelled group's name can be subscribed again at once, as a new
-- group: the name is unique among the subscriptions that are not
-- CANCELLED. Deleted subscriptions leave a tombstone, so an instance that
-- comes back can say it starts as a new group.
ALTER TABLE outbox_topic_subscriptions DROP CONSTRAINT outbox_topic_subscriptions_topic_group_name_key;
CREATE UNIQUE INDEX outbox_subscriptions_name_idx ON outbox_topic_subscriptions (topic, group_name)
    WHERE subscription_status <> 'CANCELLED';
CREATE INDEX outbox_subscriptions_group_idx ON outbox_topic_subscriptions (topic, group_name, id);
CREATE TABLE outbox_deleted_subscriptions (
    topic       text        NOT NULL,
    group_name  text        NOT NULL,
    last_status text        NOT NULL,
    deleted_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, group_name)
);

-- QUEUE dead letters expire after the maintenance service's retention.
CREATE INDEX outbox_dead_letters_age_idx ON outbox_dead_letters (dead_lettered_at);

-- Backfill as a catch-up read beside the stream: the rows visible in
-- backfill_upto and not in backfill_from, in (xid, id) order after the
-- cursor (backfill_xid, backfill_id), at most backfill_left more of them.
-- A backfill pending when this migration runs (backfill_from set, the old
-- "raise first" kind) is finished by raising, as before.
ALTER TABLE outbox_subscription_offsets
    ADD COLUMN backfill_upto       pg_snapshot,
    ADD COLUMN backfill_xid        xid8,
    ADD COLUMN backfill_id         bigint,
    ADD COLUMN backfill_total      bigint NOT NULL DEFAULT 0,
    ADD COLUMN backfill_done       bigint NOT NULL DEFAULT 0,
    ADD COLUMN backfill_started_at timestamptz,
    ADD COLUMN backfill_ended_at   timestamptz,
    ADD COLUMN backfill_outcome    text;
ALTER TABLE outbox_group_batches
    ADD COLUMN catchup boolean NOT NULL DEFAULT false;

-- Backfills pending under the previous release (which raised rows before
-- the group fetched again) become catch-ups up to now, and the stream
-- continues from now. Offset mode's raised nothing: they end.
UPDATE outbox_subscription_offsets AS o
SET backfill_from = NULL, backfill_left = 0
FROM outbox_topic_subscriptions AS s JOIN outbox_topics AS t ON t.topic = s.topic
WHERE s.id = o.subscription_id AND t.tracking_mode = 'OFFSET' AND o.backfill_from IS NOT NULL;
UPDATE outbox_subscription_offsets
SET backfill_upto = pg_current_snapshot(), backfill_total = backfill_left, backfill_started_at = now(),
    position = pg_current_snapshot(), pair_cur = NULL, resume_xid = NULL, resume_id = NULL
WHERE backfill_from IS NOT NULL;
