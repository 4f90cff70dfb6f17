DROP INDEX IF EXISTS outbox_parked_idx;
CREATE INDEX IF NOT EXISTS outbox_lease_idx ON outbox (topic, lease_until)
    WHERE status = 'PROCESSING';
CREATE INDEX IF NOT EXISTS outbox_dead_letter_idx ON outbox (topic, id)
    WHERE status = 'DEAD_LETTER';
