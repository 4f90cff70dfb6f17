-- QUEUE and PUB_SUB messages get a table each. They share nothing on the
-- way out: a QUEUE message is claimed by priority and deleted when acked, a
-- PUB_SUB message is read by writing transaction by every subscribed group
-- and kept until they all completed it. In one table every insert paid for
-- both kinds' indexes and columns (PostgreSQL opens every index of a table
-- and evaluates every partial index's predicate on each insert), which was
-- most of what a send cost beyond a bare INSERT.
--
-- The PUB_SUB rows keep the table they are in, renamed; the QUEUE rows move
-- to a new, narrower `outbox` that draws its ids from the same sequence, so
-- a message id is unique across both tables. This migration copies every
-- QUEUE row and holds an exclusive lock on the old table while it does.

ALTER TABLE outbox RENAME TO outbox_published;
ALTER INDEX outbox_pkey RENAME TO outbox_published_pkey;
ALTER INDEX outbox_idempotency_idx RENAME TO outbox_published_idempotency_idx;
DROP INDEX outbox_claim_idx;
DROP INDEX outbox_parked_idx;
-- Every row left is PUBLISHED: the fetch index needs no predicate (which
-- every insert would evaluate).
DROP INDEX outbox_pubsub_xid_idx;

CREATE TABLE outbox (
    id               bigint      PRIMARY KEY DEFAULT nextval('outbox_id_seq'),
    topic            text        NOT NULL,
    payload          jsonb       NOT NULL,
    headers          jsonb,      -- NULL when a message has none
    correlation_id   text        NOT NULL,
    message_group    text,
    priority         smallint    NOT NULL DEFAULT 0,
    idempotency_key  text,
    status           text        NOT NULL DEFAULT 'PENDING', -- PENDING, PROCESSING or DEAD_LETTER
    attempts         integer     NOT NULL DEFAULT 0,
    available_at     timestamptz NOT NULL DEFAULT now(),
    lease_owner      text,
    lease_until      timestamptz,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    dead_lettered_at timestamptz,
    xid              xid8        NOT NULL DEFAULT pg_current_xact_id()
);
-- One index for every state a topic's messages are read in: claiming
-- (PENDING: highest priority first, then the longest available), expired
-- leases (PROCESSING, as many as the topic's consumers hold) and dead
-- letters (DEAD_LETTER). It is not partial, so inserts evaluate no predicate.
CREATE INDEX outbox_claim_idx ON outbox (topic, status, priority DESC, available_at, id);
-- Idempotent sends: one live message per (topic, key).
CREATE UNIQUE INDEX outbox_idempotency_idx ON outbox (topic, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

INSERT INTO outbox
    (id, topic, payload, headers, correlation_id, message_group, priority, idempotency_key, status,
     attempts, available_at, lease_owner, lease_until, last_error, created_at, dead_lettered_at, xid)
SELECT id, topic, payload, headers, correlation_id, message_group, priority, idempotency_key, status,
       attempts, available_at, lease_owner, lease_until, last_error, created_at, dead_lettered_at, xid
FROM outbox_published
WHERE status <> 'PUBLISHED';
DELETE FROM outbox_published WHERE status <> 'PUBLISHED';
-- Snapshot-pair fetches: a topic's messages by writing transaction.
CREATE INDEX outbox_published_xid_idx ON outbox_published (topic, xid, id);
