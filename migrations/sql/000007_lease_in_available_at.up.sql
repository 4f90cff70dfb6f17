-- A QUEUE message's available_at now also carries the times that only one
-- status needs, and the two columns that held them go:
--
--   PENDING      available_at: when it may be delivered (as before)
--   PROCESSING   available_at: when its lease ends (was lease_until)
--   DEAD_LETTER  available_at: when it was dead-lettered (was dead_lettered_at)
--
-- Claiming only reads PENDING rows, so the column is never read in two
-- meanings at once. Every send paid for the two columns, always NULL at
-- insert: PostgreSQL's executor builds, projects and checks every column of
-- the table on each INSERT, and these two cost about 6% of a send's
-- backend instructions (BENCHMARKS.md). Dropped columns cost as much as
-- present ones, so the table is built anew and the rows copied, under an
-- exclusive lock on the old one. Ids, and the sequence, stay.

ALTER TABLE outbox RENAME TO outbox_v6;
ALTER INDEX outbox_pkey RENAME TO outbox_v6_pkey;
ALTER INDEX outbox_claim_idx RENAME TO outbox_v6_claim_idx;
ALTER INDEX outbox_idempotency_idx RENAME TO outbox_v6_idempotency_idx;

CREATE TABLE outbox (
    id              bigint      PRIMARY KEY DEFAULT nextval('outbox_id_seq'),
    topic           text        NOT NULL,
    payload         jsonb       NOT NULL,
    headers         jsonb,      -- NULL when a message has none
    correlation_id  text        NOT NULL,
    message_group   text,
    priority        smallint    NOT NULL DEFAULT 0,
    idempotency_key text,
    status          text        NOT NULL DEFAULT 'PENDING', -- PENDING, PROCESSING or DEAD_LETTER
    attempts        integer     NOT NULL DEFAULT 0,
    available_at    timestamptz NOT NULL DEFAULT now(),     -- see above: its meaning follows status
    lease_owner     text,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    xid             xid8        NOT NULL DEFAULT pg_current_xact_id()
);
-- Claiming (PENDING by priority, then by availability), expired leases
-- (PROCESSING by lease end) and dead letters (DEAD_LETTER).
CREATE INDEX outbox_claim_idx ON outbox (topic, status, priority DESC, available_at, id);
-- Idempotent sends: one live message per (topic, key).
CREATE UNIQUE INDEX outbox_idempotency_idx ON outbox (topic, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

INSERT INTO outbox
    (id, topic, payload, headers, correlation_id, message_group, priority, idempotency_key, status,
     attempts, available_at, lease_owner, last_error, created_at, xid)
SELECT id, topic, payload, headers, correlation_id, message_group, priority, idempotency_key, status,
       attempts,
       CASE status WHEN 'PROCESSING' THEN coalesce(lease_until, available_at)
                   WHEN 'DEAD_LETTER' THEN coalesce(dead_lettered_at, available_at)
                   ELSE available_at END,
       lease_owner, last_error, created_at, xid
FROM outbox_v6;
DROP TABLE outbox_v6;
