#!/usr/bin/env bash
# Builds hack/imgbuild (a nested module, so Catena's go.mod does not depend
# on go-containerregistry) into bin/tools and prints its path.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/bin/tools/imgbuild
(cd "$root/hack/imgbuild" && CGO_ENABLED=0 GOWORK=off go build -trimpath -o "$out" .)
echo "$out"
