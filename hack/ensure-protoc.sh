#!/usr/bin/env bash
# Makes sure protoc is installed: Debian's protobuf-compiler, installed with
# apt when missing and this user may (root). Called by make generate.
set -euo pipefail
command -v protoc >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "protoc not found; installing Debian's protobuf-compiler" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >&2
  exit 0
fi
echo "protoc not found: install it (Debian: apt-get install -y protobuf-compiler)" >&2
exit 1
