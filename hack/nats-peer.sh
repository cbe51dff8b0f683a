#!/usr/bin/env bash
# Builds the benchmark peer from the Go module proxy once, caches it outside
# the checkout keyed by version, and prints its path as the last line.
# `make bench-compare` uses both:
#
#   hack/nats-peer.sh server   NATS JetStream's server (nats-server)
#   hack/nats-peer.sh cli      NATS's own command-line tool, for `nats bench`
set -euo pipefail

case "${1:-}" in
server) name="nats-server" module="github.com/nats-io/nats-server/v2" version="v2.15.2" ;;
cli) name="nats" module="github.com/nats-io/natscli/nats" version="v0.5.0" ;;
*) echo "usage: $0 server|cli" >&2; exit 2 ;;
esac
cache="${XDG_CACHE_HOME:-$HOME/.cache}/catena/${name}-${version}"
bin="$cache/$name"
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$cache"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "building ${name} ${version} from the Go module proxy (about a minute, once)" >&2
(cd "$work" && GOBIN="$cache" GOFLAGS=-mod=mod go install "${module}@${version}") >&2
"$bin" --version >&2
echo "$bin"
