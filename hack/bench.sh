#!/usr/bin/env bash
# Benchmarks the produce path end to end: a fresh `catena dev` (3 replica
# processes, replication 3, fsync on every member before the ack) and
# `catenactl bench` against it, in two workloads: full speed (throughput)
# and a fixed 50k records/s (latency at load). Prints one JSON line each.
#
#   RECORDS=2000000 PRODUCERS=4 RATES="0 50000" hack/bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."

RECORDS=${RECORDS:-1000000}
RECORD_SIZE=${RECORD_SIZE:-1024}
PRODUCERS=${PRODUCERS:-4}
RATES=${RATES:-0 50000}
PARTITIONS=${PARTITIONS:-4}
EXTRA=${EXTRA:-}

work=$(mktemp -d "${TMPDIR:-/tmp}/catena-bench.XXXXXX")
dev_pid=""
cleanup() {
  if [ -n "$dev_pid" ] && kill -0 "$dev_pid" 2>/dev/null; then
    kill -TERM "$dev_pid" 2>/dev/null || true
    wait "$dev_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

bin/catena dev --data-dir "$work/data" --listen 127.0.0.1:0 --partitions "$PARTITIONS" >"$work/dev.out" 2>"$work/dev.err" &
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
for rate in $RATES; do
  echo "# catena dev at $addr; $RECORDS records of $RECORD_SIZE bytes, $PRODUCERS producers, rate ${rate}/s (0: full speed)" >&2
  bin/catenactl --server "$addr" bench --stream demo --record-size "$RECORD_SIZE" --records "$RECORDS" \
    --producers "$PRODUCERS" --rate "$rate" $EXTRA
done
