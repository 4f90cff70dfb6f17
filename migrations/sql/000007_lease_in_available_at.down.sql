-- Back to version 6's table: the lease's end and the dead-lettering time
-- return to columns of their own.

ALTER TABLE outbox RENAME TO outbox_v7;
ALTER INDEX outbox_pkey RENAME TO outbox_v7_pkey;
ALTER INDEX outbox_claim_idx RENAME TO outbox_v7_claim_idx;
ALTER INDEX outbox_idempotency_idx RENAME TO outbox_v7_idempotency_idx;

CREATE TABLE outbox (
    id               bigint      PRIMARY KEY DEFAULT nextval('outbox_id_seq'),
    topic            text        NOT NULL,
    payload          jsonb       NOT NULL,
    headers          jsonb,
    correlation_id   text        NOT NULL,
    message_group    text,
    priority         smallint    NOT NULL DEFAULT 0,
    idempotency_key  text,
    status           text        NOT NULL DEFAULT 'PENDING',
    attempts         integer     NOT NULL DEFAULT 0,
    available_at     timestamptz NOT NULL DEFAULT now(),
    lease_owner      text,
    lease_until      timestamptz,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    dead_lettered_at timestamptz,
    xid              xid8        NOT NULL DEFAULT pg_current_xact_id()
);
CREATE INDEX outbox_claim_idx ON outbox (topic, status, priority DESC, available_at, id);
CREATE UNIQUE INDEX outbox_idempotency_idx ON outbox (topic, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

INSERT INTO outbox
    (id, topic, payload, headers, correlation_id, message_group, priority, idempotency_key, status,
     attempts, available_at, lease_owner, lease_until, last_error, created_at, dead_lettered_at, xid)
SELECT id, topic, payload, headers, correlation_id, message_group, priority, idempotency_key, status,
       attempts, available_at, lease_owner,
       CASE WHEN status = 'PROCESSING' THEN available_at END,
       last_error, created_at,
       CASE WHEN status = 'DEAD_LETTER' THEN available_at END,
       xid
FROM outbox_v7;
DROP TABLE outbox_v7;
