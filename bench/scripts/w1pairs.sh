#!/bin/bash
# W1 on a PUB_SUB topic (bitmap, 4 groups), alternating two builds of the
# benchmark program, N pairs (default 20); one JSON line per run. Build
# them first, e.g. for the change that partitioned outbox_published:
#   git worktree add /tmp/before 45c11c9 && (cd /tmp/before && go build -o /tmp/bench-before ./internal/bench)  # where it was then
#   (cd bench && go build -o /tmp/bench-after ./cmd/pgoutbox)
#   bash bench/scripts/w1pairs.sh 20 > pairs.jsonl
N=${1:-20}
BEFORE=${BEFORE:-/tmp/bench-before}
AFTER=${AFTER:-/tmp/bench-after}
for i in $(seq 1 "$N"); do
  for v in before after; do
    bin=$BEFORE
    [ "$v" = after ] && bin=$AFTER
    "$bin" -workload W1 -mode bitmap 2>/dev/null | sed "s/^{/{\"version\":\"$v\",\"pair\":$i,/"
  done
done
