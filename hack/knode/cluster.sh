#!/usr/bin/env bash
# The Makefile's one entry to a test cluster. Uses kind when it is on PATH
# (cluster $KIND_CLUSTER, the node's own containerd), otherwise the local
# node of hack/knode (this machine as the node).
#
#   hack/knode/cluster.sh up            # prints the kubeconfig path last
#   hack/knode/cluster.sh down
#   hack/knode/cluster.sh image IMAGE   # builds IMAGE from bin/ and loads it into the node
#   hack/knode/cluster.sh kubeconfig    # prints the kubeconfig path
#   hack/knode/cluster.sh ctr           # prints the ctr command that reaches the node's containerd
#   hack/knode/cluster.sh kubectl       # prints the kubectl to use
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

KIND_CLUSTER=${KIND_CLUSTER:-catena-e2e}
KIND_KUBECONFIG=${XDG_CACHE_HOME:-$HOME/.cache}/catena/kind-$KIND_CLUSTER.kubeconfig
use_kind() { [ -z "${CATENA_NO_KIND:-}" ] && command -v kind >/dev/null 2>&1; }

kubeconfig() { if use_kind; then echo "$KIND_KUBECONFIG"; else echo "$KUBECONFIG_FILE"; fi; }

up() {
  if ! use_kind; then
    "$here/up.sh"
    return
  fi
  mkdir -p "$(dirname "$KIND_KUBECONFIG")"
  if ! kind get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; then
    kind create cluster --name "$KIND_CLUSTER" --kubeconfig "$KIND_KUBECONFIG" --wait 120s >&2
  fi
  kind export kubeconfig --name "$KIND_CLUSTER" --kubeconfig "$KIND_KUBECONFIG" >&2
  # kind provisions local volumes itself (local-path); catena-local is the
  # same provisioner under the name the e2e samples use.
  kubectl --kubeconfig "$KIND_KUBECONFIG" apply -f - >&2 <<EOT
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $LOCAL_STORAGE_CLASS}
provisioner: rancher.io/local-path
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
EOT
  echo "$KIND_KUBECONFIG"
}

down() {
  if use_kind; then
    kind delete cluster --name "$KIND_CLUSTER" >&2
    rm -f "$KIND_KUBECONFIG"
  else
    "$here/down.sh"
  fi
}

image() {
  local ref=${1:?usage: cluster.sh image IMAGE}
  local tar=$root/bin/catena-image.tar imgbuild
  [ -x "$root/bin/catena" ] && [ -x "$root/bin/catenactl" ] || die "bin/catena and bin/catenactl are missing: run make build"
  imgbuild=$("$here/imgbuild.sh")
  # The Dockerfile's image without Docker: both static binaries, the
  # distroless nonroot user, catena as the entrypoint.
  "$imgbuild" -o "$tar" -t "$ref" \
    -f "$root/bin/catena:/usr/local/bin/catena" -f "$root/bin/catenactl:/usr/local/bin/catenactl" \
    -d /tmp -user 65532:65532 -entrypoint /usr/local/bin/catena \
    -label "org.opencontainers.image.source=https://github.com/catena-streams/catena" >&2
  T0_NS=$(date +%s%N)
  if use_kind; then
    kind load image-archive "$tar" --name "$KIND_CLUSTER" >&2
  else
    [ -S "$SOCK" ] || die "the local node is not up ($SOCK missing): run make cluster-up"
    ctrd -n k8s.io images import "$tar" >/dev/null
  fi
  log "image $ref imported in $(elapsed)s"
}

kubectl_path() {
  if use_kind; then command -v kubectl || die "kind needs kubectl on PATH"; else echo "$KUBECTL"; fi
}

ctr_cmd() {
  if use_kind; then echo "docker exec $KIND_CLUSTER-control-plane ctr"; else echo "ctr -a $SOCK"; fi
}

case "${1:-}" in
up) up ;;
down) down ;;
image) image "${2:-}" ;;
kubeconfig) kubeconfig ;;
ctr) ctr_cmd ;;
kubectl) kubectl_path ;;
*) die "usage: $0 up|down|image IMAGE|kubeconfig|ctr|kubectl" ;;
esac
