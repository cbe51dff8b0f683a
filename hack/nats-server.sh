#!/usr/bin/env bash
# Builds the benchmark peer, NATS JetStream's server, from the Go module
# proxy once, caches it outside the checkout keyed by version, and prints its
# path as the last line. `make bench-compare` uses it.
set -euo pipefail

version="v2.15.2"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/catena/nats-server-${version}"
bin="$cache/nats-server"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$cache"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "building nats-server ${version} from the Go module proxy (about a minute, once)" >&2
(cd "$work" && GOBIN="$cache" GOFLAGS=-mod=mod go install "github.com/nats-io/nats-server/v2@${version}") >&2
"$bin" --version >&2
echo "$bin"
