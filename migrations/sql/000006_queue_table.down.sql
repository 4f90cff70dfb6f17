INSERT INTO outbox_published
    (id, topic, payload, headers, correlation_id, message_group, priority, idempotency_key, status,
     attempts, available_at, lease_owner, lease_until, last_error, created_at, dead_lettered_at, xid)
OVERRIDING SYSTEM VALUE
SELECT id, topic, payload, headers, correlation_id, message_group, priority, idempotency_key, status,
       attempts, available_at, lease_owner, lease_until, last_error, created_at, dead_lettered_at, xid
FROM outbox;
DROP TABLE outbox;
DROP INDEX outbox_published_xid_idx;
ALTER TABLE outbox_published RENAME TO outbox;
ALTER INDEX outbox_published_pkey RENAME TO outbox_pkey;
ALTER INDEX outbox_published_idempotency_idx RENAME TO outbox_idempotency_idx;
CREATE INDEX outbox_claim_idx ON outbox (topic, priority DESC, available_at, id)
    WHERE status = 'PENDING';
CREATE INDEX outbox_parked_idx ON outbox (topic, status, id)
    WHERE status IN ('PROCESSING', 'DEAD_LETTER');
CREATE INDEX outbox_pubsub_xid_idx ON outbox (topic, xid, id) WHERE status = 'PUBLISHED';
