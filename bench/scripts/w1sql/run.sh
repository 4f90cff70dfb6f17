#!/bin/bash
# W1's send statements alone, at the database: pgbench, 8 clients, one
# statement per transaction, ROUNDS rounds of the four in turn (default 6),
# DURATION seconds each (default 8); prints each round and the medians. Run the
# benchmark program once first (`(cd bench && go run ./cmd/pgoutbox -workload W1 -mode
# offset)`): it creates the schema bench_pgoutbox and the PUB_SUB topic w1.
#   queue.sql            a QUEUE send (the outbox table)
#   pubsub.sql           a PUB_SUB send as the producer writes it: the topic
#                        row read for the required set, under the topic's
#                        shared lock and FOR KEY SHARE
#   pubsub_unlocked.sql  the same without the two locks
#   log_values.sql       a plain INSERT … VALUES into the log (no topic row)
set -eu
cd "$(dirname "$0")"
DB=${DB:-"-h 127.0.0.1 -U postgres bench"}
ROUNDS=${ROUNDS:-6}
SECONDS_EACH=${DURATION:-8}
out=$(mktemp)
for r in $(seq 1 "$ROUNDS"); do
  for f in queue.sql pubsub.sql pubsub_unlocked.sql log_values.sql; do
    psql -q $DB -c "TRUNCATE bench_pgoutbox.outbox_published, bench_pgoutbox.outbox" >/dev/null
    pgbench -n -c 8 -j 2 -T "$SECONDS_EACH" -M prepared -f "$f" $DB 2>/dev/null |
      awk -v f="$f" '/^tps/ {print f, $3}' | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f, v = line.split()
    d[f].append(float(v))
base = statistics.median(d["queue.sql"])
for f, v in d.items():
    m = statistics.median(v)
    print(f"{f:22} median {m:8.0f} tps  {m / base:.2f}x queue.sql")
PY
rm -f "$out"
