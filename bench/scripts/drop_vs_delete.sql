-- Dropping a partition of 100,000 messages against deleting them (and vacuuming
-- after the delete): time and WAL bytes of each. Needs a table shaped like
-- outbox_published: run any PUB_SUB workload of internal/bench first. Usage:
--   psql postgres://postgres@127.0.0.1:5432/bench -f internal/bench/drop_vs_delete.sql
\set ON_ERROR_STOP on
DROP SCHEMA IF EXISTS pdrop CASCADE;
CREATE SCHEMA pdrop;
SET search_path = pdrop;
CREATE TABLE pub (LIKE bench_pgoutbox.outbox_published INCLUDING DEFAULTS) PARTITION BY RANGE (xid);
CREATE TABLE pub_p1 PARTITION OF pub FOR VALUES FROM ('0') TO ('100000000000');
CREATE TABLE flat (LIKE bench_pgoutbox.outbox_published INCLUDING DEFAULTS);
ALTER TABLE flat ADD PRIMARY KEY (id);
CREATE INDEX ON flat (topic, xid, id);
ALTER TABLE pub ADD PRIMARY KEY (id, xid);
CREATE INDEX ON pub (topic, xid, id);
INSERT INTO flat (id, topic, payload, correlation_id) SELECT g, 't', ('{"seq":' || g || ',"body":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}')::jsonb, 'c' FROM generate_series(1,100000) g;
INSERT INTO pub SELECT * FROM flat;
CHECKPOINT;
\timing on
SELECT pg_current_wal_lsn() AS l0 \gset
DELETE FROM flat;
SELECT pg_current_wal_lsn() AS l1 \gset
VACUUM flat;
SELECT pg_current_wal_lsn() AS l1v \gset
DROP TABLE pub_p1;
SELECT pg_current_wal_lsn() AS l2 \gset
\timing off
SELECT pg_wal_lsn_diff(:'l1', :'l0') AS delete_wal_bytes, pg_wal_lsn_diff(:'l1v', :'l1') AS vacuum_wal_bytes, pg_wal_lsn_diff(:'l2', :'l1v') AS drop_wal_bytes;
DROP SCHEMA pdrop CASCADE;
