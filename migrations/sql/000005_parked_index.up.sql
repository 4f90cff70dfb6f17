-- Every insert pays for every index on outbox, even a partial index it does
-- not enter (PostgreSQL opens it and evaluates its predicate). One index now
-- serves both kinds of parked message: leased ones, which the reaper scans
-- for expired leases (a topic has only as many as its consumers hold), and
-- dead letters, listed and replayed in id order.
DROP INDEX IF EXISTS outbox_lease_idx;
DROP INDEX IF EXISTS outbox_dead_letter_idx;
CREATE INDEX IF NOT EXISTS outbox_parked_idx ON outbox (topic, status, id)
    WHERE status IN ('PROCESSING', 'DEAD_LETTER');
