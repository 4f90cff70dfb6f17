-- PUB_SUB topics: consumer groups, their positions, batches, retries, and
-- the per-mode completion columns.

-- What an insert needs to fix a PUB_SUB message's required groups, in the
-- topic row it already reads (one primary-key lookup). Subscription changes
-- update it in the same transaction, under the row's lock.
ALTER TABLE outbox_topics
    ADD COLUMN zero_subscription_retention interval NOT NULL DEFAULT '24 hours',
    ADD COLUMN block_writes_on_zero_subscriptions boolean NOT NULL DEFAULT false,
    ADD COLUMN subscribed_bits bigint NOT NULL DEFAULT 0,   -- BITMAP: bits of subscribed groups
    ADD COLUMN subscribed_ids bigint[] NOT NULL DEFAULT '{}'; -- subscription ids of subscribed groups

-- PUB_SUB rows have status PUBLISHED; they are never claimed as QUEUE rows.
ALTER TABLE outbox DROP CONSTRAINT outbox_status_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_status_check
    CHECK (status IN ('PENDING', 'PROCESSING', 'DEAD_LETTER', 'PUBLISHED'));
-- All NULL on QUEUE rows (no bytes stored); set by the insert for its mode.
ALTER TABLE outbox
    ADD COLUMN required_bits   bigint,    -- BITMAP: groups that must complete
    ADD COLUMN done_bits       bigint,    -- BITMAP: groups that completed
    ADD COLUMN required_ids    bigint[],  -- COUNTER: subscriptions that must complete
    ADD COLUMN required_count  integer,   -- COUNTER
    ADD COLUMN completed_count integer;   -- COUNTER

-- Snapshot-pair fetches: a topic's rows by writing transaction.
CREATE INDEX outbox_pubsub_xid_idx ON outbox (topic, xid, id) WHERE status = 'PUBLISHED';

CREATE TABLE outbox_topic_subscriptions (
    id                   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic                text        NOT NULL REFERENCES outbox_topics (topic),
    group_name           text        NOT NULL,
    subscription_status  text        NOT NULL DEFAULT 'ACTIVE'
                                     CHECK (subscription_status IN ('ACTIVE', 'PAUSED', 'DEAD', 'CANCELLED')),
    bit                  smallint    CHECK (bit BETWEEN 0 AND 63),  -- BITMAP mode only
    start_position       text        NOT NULL CHECK (start_position IN ('NOW', 'BEGINNING', 'TIMESTAMP', 'MESSAGE_ID')),
    start_from_timestamp timestamptz,
    start_from_message_id bigint,
    subscribed_at        timestamptz NOT NULL DEFAULT now(),
    last_active_at       timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_timeout    interval    NOT NULL DEFAULT '5 minutes',
    released_at          timestamptz,  -- when the group left the required sets (DEAD, CANCELLED)
    UNIQUE (topic, group_name)
);
CREATE INDEX outbox_subscriptions_active_idx ON outbox_topic_subscriptions (topic)
    WHERE subscription_status = 'ACTIVE';

-- A group's read position: the snapshot its next batch starts after. While
-- a snapshot pair holds more rows than one batch, pair_cur and the resume
-- point (resume_xid, resume_id) say where the pair continues. Members lock
-- this row (FOR UPDATE SKIP LOCKED) to fetch; nobody holds it while handling.
CREATE TABLE outbox_subscription_offsets (
    subscription_id bigint      PRIMARY KEY REFERENCES outbox_topic_subscriptions (id) ON DELETE CASCADE,
    position        pg_snapshot NOT NULL,
    pair_cur        pg_snapshot,
    resume_xid      xid8,
    resume_id       bigint,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Batches handed to members: the rows of snapshot pair (prev, cur) with
-- (xid, id) in (after, last]. A crashed member's batch is re-read, exactly,
-- by another member once its lease expires.
CREATE TABLE outbox_group_batches (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subscription_id bigint      NOT NULL REFERENCES outbox_topic_subscriptions (id) ON DELETE CASCADE,
    prev            pg_snapshot NOT NULL,
    cur             pg_snapshot NOT NULL,
    after_xid       xid8        NOT NULL,
    after_id        bigint      NOT NULL,
    last_xid        xid8        NOT NULL,
    last_id         bigint      NOT NULL,
    member          text        NOT NULL,
    lease_until     timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_group_batches_sub_idx ON outbox_group_batches (subscription_id, lease_until);

-- Per-group retries and dead letters of PUB_SUB messages: a failed message
-- waits here so its batch can finish.
CREATE TABLE outbox_group_retries (
    subscription_id  bigint      NOT NULL REFERENCES outbox_topic_subscriptions (id) ON DELETE CASCADE,
    message_id       bigint      NOT NULL,
    status           text        NOT NULL CHECK (status IN ('RETRY', 'PROCESSING', 'DEAD_LETTER')),
    attempts         integer     NOT NULL,
    available_at     timestamptz NOT NULL,
    lease_owner      text,
    lease_until      timestamptz,
    last_error       text,
    dead_lettered_at timestamptz,
    PRIMARY KEY (subscription_id, message_id)
);
CREATE INDEX outbox_group_retries_due_idx ON outbox_group_retries (subscription_id, available_at)
    WHERE status = 'RETRY';
CREATE INDEX outbox_group_retries_message_idx ON outbox_group_retries (message_id);

-- COUNTER mode: which group completed which message (dedupe).
CREATE TABLE outbox_consumer_groups (
    message_id      bigint      NOT NULL,
    subscription_id bigint      NOT NULL,
    processed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (message_id, subscription_id)
);

-- OFFSET mode: the least committed position of a topic's ACTIVE groups.
CREATE TABLE outbox_topic_watermarks (
    topic      text        PRIMARY KEY REFERENCES outbox_topics (topic),
    watermark  pg_snapshot NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- A bit belongs to one group of a topic at a time.
CREATE UNIQUE INDEX outbox_subscriptions_bit_idx ON outbox_topic_subscriptions (topic, bit)
    WHERE bit IS NOT NULL;
