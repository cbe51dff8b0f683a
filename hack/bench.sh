#!/usr/bin/env bash
# Benchmarks the produce path end to end: a fresh `catena dev` (3 replica
# processes, replication 3, fsync on every member before the ack) and
# `catenactl bench` against it, in two workloads: full speed (throughput)
# and a fixed 50k records/s (latency at load). Then the same keyed
# workload at full speed on a fresh `catena dev` of WIDE_PARTITIONS
# partitions (many partitions: each partition gets a small share of every
# producer's records), and the ratio of the two full-speed rows. Prints one
# JSON line per workload, then the ratio.
#
#   RECORDS=2000000 PRODUCERS=4 RATES="0 50000" WIDE_PARTITIONS=256 hack/bench.sh
#   DEV_ARGS=--journal hack/bench.sh   # replicas with one journal each
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS=${RECORDS:-1000000}
RECORD_SIZE=${RECORD_SIZE:-1024}
PRODUCERS=${PRODUCERS:-4}
RATES=${RATES:-0 50000}
PARTITIONS=${PARTITIONS:-4}
WIDE_PARTITIONS=${WIDE_PARTITIONS:-256} # 0: skip the many-partition row
WIDE_RECORDS=${WIDE_RECORDS:-$((RECORDS / 2))}
EXTRA=${EXTRA:-}
DEV_ARGS=${DEV_ARGS:-}

work=$(mktemp -d "${TMPDIR:-/tmp}/catena-bench.XXXXXX")
dev_pid=""
stop_dev() {
  if [ -n "$dev_pid" ] && kill -0 "$dev_pid" 2>/dev/null; then
    kill -TERM "$dev_pid" 2>/dev/null || true
    wait "$dev_pid" 2>/dev/null || true
  fi
  dev_pid=""
}
cleanup() { stop_dev; rm -rf "$work"; }
trap cleanup EXIT

# start_dev PARTITIONS: a fresh catena dev; sets addr.
start_dev() {
  rm -rf "$work/data"
  # shellcheck disable=SC2086
  bin/catena dev --data-dir "$work/data" --listen 127.0.0.1:0 --partitions "$1" $DEV_ARGS >"$work/dev.out" 2>"$work/dev.err" &
  dev_pid=$!
  for _ in $(seq 1 300); do
    [ -f "$work/data/dev.json" ] && break
    if ! kill -0 "$dev_pid" 2>/dev/null; then
      echo "catena dev exited during start-up:" >&2; cat "$work/dev.err" >&2; exit 1
    fi
    sleep 0.1
  done
  [ -f "$work/data/dev.json" ] || { echo "catena dev did not become ready" >&2; cat "$work/dev.err" >&2; exit 1; }
  addr=$(sed -n 's/.*"ingest": *"\([^"]*\)".*/\1/p' "$work/data/dev.json")
}

# run PARTITIONS RECORDS RATE: one workload; prints its JSON line, and
# keeps it in $work/last.json.
run() {
  echo "# catena dev at $addr, $1 partitions; $2 records of $RECORD_SIZE bytes, $PRODUCERS producers, rate ${3}/s (0: full speed)" >&2
  # shellcheck disable=SC2086
  bin/catenactl --server "$addr" bench --stream demo --record-size "$RECORD_SIZE" --records "$2" \
    --producers "$PRODUCERS" --rate "$3" $EXTRA | tee "$work/last.json"
}

rate_of() { sed -n 's/.*"records_per_sec":\([0-9.]*\).*/\1/p' "$1"; }

start_dev "$PARTITIONS"
for rate in $RATES; do
  run "$PARTITIONS" "$RECORDS" "$rate"
  [ "$rate" = 0 ] && cp "$work/last.json" "$work/narrow.json"
done
stop_dev

if [ "$WIDE_PARTITIONS" != 0 ]; then
  start_dev "$WIDE_PARTITIONS"
  run "$WIDE_PARTITIONS" "$WIDE_RECORDS" 0
  stop_dev
  if [ -f "$work/narrow.json" ]; then
    awk -v w="$(rate_of "$work/last.json")" -v n="$(rate_of "$work/narrow.json")" -v wp="$WIDE_PARTITIONS" -v np="$PARTITIONS" \
      'BEGIN { printf "# full speed over %d partitions is %.0f%% of over %d (%.0f vs %.0f records/s)\n", wp, 100*w/n, np, w, n }'
  fi
fi
