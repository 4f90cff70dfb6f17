#!/bin/bash
# WAL written per W1 transaction, by statement: pgbench, one client, N
# transactions of one statement each (default 2000), the WAL position
# read before and after. Bytes, not seconds: the same on a slow machine,
# but the position counts every session's WAL, so run it on a server
# nothing else writes to.
# Run rawpg's W1 (schema bench_rawpg) and pgoutbox's (`(cd bench && go run
# ./cmd/pgoutbox -workload W1)`, schema bench_pgoutbox) once first.
#   rawpg.sql      rawpg's send: INSERT INTO outbox (topic, payload)
#   queue_log.sql  a QUEUE send as the producer writes it (sqlq.insertLogged)
set -eu
cd "$(dirname "$0")"
DB=${DB:-"-h 127.0.0.1 -U postgres bench"}
N=${N:-2000}
for f in rawpg.sql queue_log.sql; do
  before=$(psql -qtA $DB -c "SELECT pg_current_wal_insert_lsn()")
  pgbench -n -c 1 -t "$N" -M prepared -f "$f" $DB >/dev/null 2>&1
  after=$(psql -qtA $DB -c "SELECT pg_current_wal_insert_lsn()")
  psql -qtA $DB -c "SELECT format('%-14s %s bytes of WAL per transaction', '$f', round(pg_wal_lsn_diff('$after', '$before') / $N))"
done
