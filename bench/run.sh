#!/usr/bin/env bash
# Runs the benchmark's workloads on pgoutbox and its peers (raw pgx, River,
# Watermill-SQL), REPS times each with the order of the systems rotated,
# and prints a Markdown table of medians and ratios to rawpg.
# See bench/README.md. Knobs, all optional:
#   DSN          postgres://postgres@127.0.0.1:5432/bench?sslmode=disable
#   REPS         3
#   SYSTEMS      "rawpg river river-fc1ms watermill pgoutbox"; also
#                pgoutbox-bitmap, pgoutbox-counter, pgoutbox-offset (-mode)
#   WORKLOADS    "W1 W2 W3 W4" (W5 runs only when named)
#   RIVER_W2_N   1000: River at its defaults drains about 80 jobs a second
#   RIVER_W5_RATE 50: the same cap, for W5 of `river` (river-fc1ms runs 500)
#   W5_DURATION  the programs' default (60s)
#   OUT          results/<UTC time> under this folder
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DSN=${DSN:-postgres://postgres@127.0.0.1:5432/bench?sslmode=disable}
REPS=${REPS:-3}
read -r -a SYSTEMS <<<"${SYSTEMS:-rawpg river river-fc1ms watermill pgoutbox}"
read -r -a WORKLOADS <<<"${WORKLOADS:-W1 W2 W3 W4}"
RIVER_W2_N=${RIVER_W2_N:-1000}
RIVER_W5_RATE=${RIVER_W5_RATE:-50}
W5_DURATION=${W5_DURATION:-}
OUT=${OUT:-$HERE/results/$(date -u +%Y%m%dT%H%M%SZ)}
command -v go >/dev/null || export PATH=$PATH:/usr/local/go/bin

mkdir -p "$OUT"
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
t0=$(date +%s)
echo "# building into $BIN" >&2
(cd "$HERE" && go build -o "$BIN/" ./cmd/...)

# The programs create the database if it is missing; the table of the
# environment below wants it at once.
"$BIN/rawpg" -dsn "$DSN" -workload W1 -n 1 >/dev/null 2>&1 || true

# command SYSTEM WORKLOAD: sets CMD to the program's command line.
command_for() {
  local sys=$1 w=$2
  case $sys in
    rawpg | watermill | pgoutbox) CMD=("$BIN/$sys") ;;
    river)
      CMD=("$BIN/river")
      if [[ $w == W2 ]]; then CMD+=(-n "$RIVER_W2_N"); fi
      if [[ $w == W5 ]]; then CMD+=(-rate "$RIVER_W5_RATE"); fi
      ;;
    river-fc1ms) CMD=("$BIN/river" -fetch-cooldown 1ms) ;;
    pgoutbox-*) CMD=("$BIN/pgoutbox" -mode "${sys#pgoutbox-}") ;;
    *) echo "unknown system $sys" >&2; return 1 ;;
  esac
  CMD+=(-dsn "$DSN" -workload "$w")
  if [[ $w == W5 && -n $W5_DURATION ]]; then CMD+=(-duration "$W5_DURATION"); fi
}

runs=$OUT/runs.jsonl
log=$OUT/stderr.log
: >"$runs"
: >"$log"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB"
  echo "go: $(go version)"
  echo "pgoutbox: $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "postgres: $(psql "$DSN" -tAc 'SHOW server_version' 2>/dev/null || echo '?'), autovacuum $(psql "$DSN" -tAc 'SHOW autovacuum' 2>/dev/null || echo '?')"
  echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd "$HERE" && go list -m github.com/riverqueue/river github.com/ThreeDotsLabs/watermill github.com/ThreeDotsLabs/watermill-sql/v4 github.com/jackc/pgx/v5)
} >"$OUT/env.txt"

n=${#SYSTEMS[@]}
for ((rep = 0; rep < REPS; rep++)); do
  for w in "${WORKLOADS[@]}"; do
    for ((k = 0; k < n; k++)); do
      sys=${SYSTEMS[$(((k + rep) % n))]} # no system always runs first
      command_for "$sys" "$w"
      echo "== rep $((rep + 1)) $sys $w: ${CMD[*]}" >>"$log"
      start=$(date +%s.%N)
      line=$("${CMD[@]}" 2>>"$log" | tail -n 1) || true
      [[ -n $line ]] || line="{\"system\":\"$sys\",\"workload\":\"$w\",\"error\":\"no output\"}"
      printf '%s\n' "$line" >>"$runs"
      printf '%-18s %s rep %d %6.1fs  %s\n' "$sys" "$w" $((rep + 1)) "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{print b-a}')" "$line" >&2
    done
  done
done

echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/env.txt"
"$BIN/table" <"$runs" | tee "$OUT/table.md"
echo "# $(($(date +%s) - t0)) s; results in $OUT" >&2
