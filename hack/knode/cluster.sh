#!/usr/bin/env bash
# The Makefile's one entry to a test cluster. Uses kind when it is on PATH
# (cluster $KIND_CLUSTER), otherwise the local nodes of hack/knode
# (CATENA_KNODE_NODES of them, default 3, network namespaces of this machine).
#
#   hack/knode/cluster.sh up            # prints the kubeconfig path last
#   hack/knode/cluster.sh down
#   hack/knode/cluster.sh image IMAGE   # builds IMAGE from bin/ and loads it into every node
#   hack/knode/cluster.sh kubeconfig    # prints the kubeconfig path
#   hack/knode/cluster.sh ctr           # prints the ctr command that reaches a node's containerd,
#                                       # with {node} where the node's name goes
#   hack/knode/cluster.sh kubectl       # prints the kubectl to use
#   hack/knode/cluster.sh node ARGS...  # hack/knode/node.sh: stop, start, pause, cut, delete a node
#   hack/knode/cluster.sh nodes-cmd     # prints the command for node faults ("none" on kind)
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
    local i n=0
    # A node that joins later (node.sh add) imports what is recorded here.
    mkdir -p "$STATE/images"
    cp "$tar" "$STATE/images/catena.tar"
    for i in $(node_indexes); do
      ctrd "$i" version >/dev/null 2>&1 || continue # stopped: node.sh start imports it
      ctrd "$i" -n k8s.io images import "$tar" >/dev/null
      n=$((n + 1))
    done
    [ "$n" -gt 0 ] || die "no node of the local cluster is up: run make cluster-up"
  fi
  log "image $ref imported in $(elapsed)s"
}

kubectl_path() {
  if use_kind; then command -v kubectl || die "kind needs kubectl on PATH"; else echo "$KUBECTL"; fi
}

ctr_cmd() {
  # kind's node containers are named after their nodes.
  if use_kind; then echo "docker exec {node} ctr"; else echo "ctr -a $STATE/nodes/{node}/containerd/containerd.sock"; fi
}

case "${1:-}" in
up) up ;;
down) down ;;
image) image "${2:-}" ;;
kubeconfig) kubeconfig ;;
ctr) ctr_cmd ;;
kubectl) kubectl_path ;;
# kind's nodes cannot be faulted here: "none" tells the suite to skip the
# node faults (an empty value is a harness that failed, and fails them).
nodes-cmd) if use_kind; then echo none; else echo "$here/cluster.sh node"; fi ;;
node)
  shift
  use_kind && die "node faults need the local nodes of hack/knode, not kind"
  exec "$here/node.sh" "$@"
  ;;
*) die "usage: $0 up|down|image IMAGE|kubeconfig|ctr|kubectl|node ARGS...|nodes-cmd" ;;
esac
