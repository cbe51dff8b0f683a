#!/usr/bin/env bash
# Builds the cert-manager controller (main.go beside this script, wiring
# github.com/cert-manager/cert-manager's own controllers) into a cache
# outside the checkout, keyed by cert-manager's version, so every clone and
# CI run on this machine reuses it. Builds only when the binary is missing
# (about 6-7 minutes cold on 2 cores, instant after). The cache is keyed by
# version only: after editing main.go, delete the binary to rebuild it.
#
#   hack/cert-manager/build.sh        # prints the binary's path on its last line
#   $(hack/cert-manager/build.sh) --kubeconfig=PATH --cluster-resource-namespace=cert-manager
set -euo pipefail

# Keep in step with the require line in go.mod.
CM_VERSION=v1.21.2
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/catena/cert-manager-${CM_VERSION}
BIN=$CACHE/cert-manager-controller

if [ ! -x "$BIN" ]; then
  mkdir -p "$CACHE"
  echo "building cert-manager controller $CM_VERSION into $CACHE" >&2
  # -mod=readonly (overriding any -mod in GOFLAGS): go.sum is complete, so
  # the build needs only the module proxy or cache and never edits go.mod.
  (cd "$(dirname "$0")" &&
    CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$BIN.tmp" .)
  mv "$BIN.tmp" "$BIN"
fi

echo "$BIN"
