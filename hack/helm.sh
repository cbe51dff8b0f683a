#!/usr/bin/env bash
# Builds helm from the Go module proxy (no other download is possible here)
# and caches it outside the checkout, keyed by version, so every clone and CI
# run on this machine reuses it. Returns at once when it is already built.
#
#   hack/helm.sh            # prints the helm binary's path on its last line
#
# `make chart-check` and test/envtest (through HELM) use the printed path.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v3.22.0}
CACHE=${CATENA_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/catena/helm-${HELM_VERSION}}
HELM="$CACHE/helm"

if [ ! -x "$HELM" ]; then
  mkdir -p "$CACHE"
  # A scratch module outside the checkout, so that neither Catena's go.mod
  # nor its go.sum sees helm's dependencies.
  work=$(mktemp -d "${TMPDIR:-/tmp}/catena-helm-build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  echo "building helm $HELM_VERSION into $CACHE (a few minutes cold)" >&2
  (cd "$work" && go mod init catena-helm-build >/dev/null 2>&1)
  (cd "$work" && CGO_ENABLED=0 GOBIN="$work/bin" GOFLAGS=-trimpath \
    go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
  # Rename into place, so that an interrupted build never leaves a
  # half-written binary that a later run would trust.
  mv "$work/bin/helm" "$HELM.tmp" && mv "$HELM.tmp" "$HELM"
fi

echo "$HELM"
