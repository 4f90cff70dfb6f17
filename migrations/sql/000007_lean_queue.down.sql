CREATE TABLE outbox_wide (
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

INSERT INTO outbox_wide
    (id, topic, payload, headers, correlation_id, message_group, priority, idempotency_key, status, attempts,
     available_at, lease_owner, lease_until, last_error, created_at, dead_lettered_at, xid)
SELECT o.id, o.topic, o.payload, o.headers, o.correlation_id, o.message_group, o.priority, k.idempotency_key,
       CASE WHEN o.lease_owner IS NULL THEN 'PENDING' ELSE 'PROCESSING' END, o.attempts,
       CASE WHEN o.lease_owner IS NULL THEN o.available_at ELSE o.created_at END,
       o.lease_owner, CASE WHEN o.lease_owner IS NOT NULL THEN o.available_at END,
       o.last_error, o.created_at, NULL, o.xid
FROM outbox AS o
LEFT JOIN outbox_idempotency_keys AS k ON k.message_id = o.id AND k.topic = o.topic
UNION ALL
SELECT d.id, d.topic, d.payload, d.headers, d.correlation_id, d.message_group, d.priority, k.idempotency_key,
       'DEAD_LETTER', d.attempts, d.dead_lettered_at, NULL, NULL, d.last_error, d.created_at, d.dead_lettered_at,
       d.xid
FROM outbox_dead_letters AS d
LEFT JOIN outbox_idempotency_keys AS k ON k.message_id = d.id AND k.topic = d.topic;

DROP TABLE outbox;
DROP TABLE outbox_dead_letters;
ALTER TABLE outbox_wide RENAME TO outbox;
ALTER INDEX outbox_wide_pkey RENAME TO outbox_pkey;
CREATE INDEX outbox_claim_idx ON outbox (topic, status, priority DESC, available_at, id);
CREATE UNIQUE INDEX outbox_idempotency_idx ON outbox (topic, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

ALTER TABLE outbox_published ADD COLUMN idempotency_key text;
UPDATE outbox_published AS o SET idempotency_key = k.idempotency_key
FROM outbox_idempotency_keys AS k WHERE k.message_id = o.id AND k.topic = o.topic;
CREATE UNIQUE INDEX outbox_published_idempotency_idx ON outbox_published (topic, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

DROP TABLE outbox_idempotency_keys;
ALTER TABLE outbox_topics DROP COLUMN idempotency_window;
