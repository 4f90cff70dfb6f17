-- A QUEUE message's row carries only what claiming and delivering it need.
-- Every column and every index of outbox is paid for by every send (the
-- executor builds and stores a value for each column, NULL or not, and
-- opens every index), so state that only some messages ever have moves out:
--
--   * dead letters go to outbox_dead_letters (with when and why they were
--     parked), so the claim index needs no status: a row of outbox is
--     pending while lease_owner is NULL and leased while it is not;
--   * a leased row's lease end is its available_at: an expired lease is
--     available again and the next claim takes it back;
--   * idempotency keys, of both kinds of topic, go to
--     outbox_idempotency_keys, where they are kept for the topic's
--     idempotency window whether or not the message is still there.
--
-- outbox is rebuilt (a dropped column still costs every insert a NULL);
-- this takes an exclusive lock on it while its rows are copied.

ALTER TABLE outbox_topics ADD COLUMN idempotency_window interval NOT NULL DEFAULT interval '24 hours';

CREATE TABLE outbox_idempotency_keys (
    topic           text        NOT NULL,
    idempotency_key text        NOT NULL,
    message_id      bigint      NOT NULL,
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (topic, idempotency_key)
);
CREATE INDEX outbox_idempotency_keys_expiry_idx ON outbox_idempotency_keys (expires_at);

-- Keys of the messages there are now are kept for a day from the upgrade.
INSERT INTO outbox_idempotency_keys (topic, idempotency_key, message_id, expires_at)
SELECT topic, idempotency_key, id, now() + interval '24 hours' FROM outbox WHERE idempotency_key IS NOT NULL
UNION ALL
SELECT topic, idempotency_key, id, now() + interval '24 hours' FROM outbox_published WHERE idempotency_key IS NOT NULL;

DROP INDEX outbox_published_idempotency_idx;
ALTER TABLE outbox_published DROP COLUMN idempotency_key;

CREATE TABLE outbox_dead_letters (
    id               bigint      PRIMARY KEY,
    topic            text        NOT NULL,
    payload          jsonb       NOT NULL,
    headers          jsonb,
    correlation_id   text        NOT NULL,
    message_group    text,
    priority         smallint    NOT NULL,
    attempts         integer     NOT NULL,
    last_error       text,
    created_at       timestamptz NOT NULL,
    dead_lettered_at timestamptz NOT NULL,
    xid              xid8        NOT NULL
);
CREATE INDEX outbox_dead_letters_topic_idx ON outbox_dead_letters (topic, id);

INSERT INTO outbox_dead_letters
    (id, topic, payload, headers, correlation_id, message_group, priority, attempts, last_error, created_at,
     dead_lettered_at, xid)
SELECT id, topic, payload, headers, correlation_id, message_group, priority, attempts, last_error, created_at,
       coalesce(dead_lettered_at, now()), xid
FROM outbox WHERE status = 'DEAD_LETTER';

CREATE TABLE outbox_queued (
    id             bigint      PRIMARY KEY DEFAULT nextval('outbox_id_seq'),
    topic          text        NOT NULL,
    payload        jsonb       NOT NULL,
    headers        jsonb,      -- NULL when a message has none
    correlation_id text        NOT NULL,
    message_group  text,
    priority       smallint    NOT NULL DEFAULT 0,
    attempts       integer     NOT NULL DEFAULT 0,
    -- Pending: when the message may be claimed. Leased: when the lease ends.
    available_at   timestamptz NOT NULL DEFAULT now(),
    lease_owner    text,       -- NULL while pending
    last_error     text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    xid            xid8        NOT NULL DEFAULT pg_current_xact_id()
);

INSERT INTO outbox_queued
    (id, topic, payload, headers, correlation_id, message_group, priority, attempts, available_at, lease_owner,
     last_error, created_at, xid)
SELECT id, topic, payload, headers, correlation_id, message_group, priority, attempts,
       CASE WHEN status = 'PROCESSING' THEN coalesce(lease_until, now()) ELSE available_at END,
       CASE WHEN status = 'PROCESSING' THEN coalesce(lease_owner, '?') END,
       last_error, created_at, xid
FROM outbox WHERE status <> 'DEAD_LETTER';

DROP TABLE outbox;
ALTER TABLE outbox_queued RENAME TO outbox;
ALTER INDEX outbox_queued_pkey RENAME TO outbox_pkey;
-- Claiming: a topic's messages by priority (highest first), then by when
-- they became available. Leased rows sort at their lease end.
CREATE INDEX outbox_claim_idx ON outbox (topic, priority DESC, available_at, id);
