#!/usr/bin/env bash
# make demo: Catena on a real Kubernetes, end to end, in a few minutes.
#   1. a cluster: the one $KUBECONFIG points at when it is set and answers,
#      otherwise the local test node (hack/knode/cluster.sh up)
#   2. the image built from this checkout, imported into the node
#   3. the operator, installed with Helm from charts/catena
#   4. the Stream of config/samples/stream-single-node.yaml
#   5. records produced and consumed through its ingestion Service, from a
#      pod running catenactl
#   6. a replica pod deleted, its chains reordered and the pod taken back
# and leaves it all running. `hack/knode/demo.sh down` (make demo-down)
# removes it, and the cluster too when the demo brought it up.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

DEMO_NS=${DEMO_NS:-catena-demo}
CATENA_NS=${CATENA_NS:-catena-system}
STREAM=quickstart
POOL=$STREAM-pool
marker=${XDG_CACHE_HOME:-$HOME/.cache}/catena/demo-started-cluster
helm=$("$root/hack/helm.sh" | tail -1)

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

if [ "${1:-}" = down ]; then
  if [ -f "$marker" ]; then
    export KUBECONFIG=$(cat "$marker")
  fi
  if [ -n "${KUBECONFIG:-}" ] && kubectl_bin=$("$here/cluster.sh" kubectl) && "$kubectl_bin" get --raw /readyz >/dev/null 2>&1; then
    "$kubectl_bin" delete namespace "$DEMO_NS" --ignore-not-found --wait=false
    "$helm" uninstall catena --namespace "$CATENA_NS" --ignore-not-found 2>/dev/null || true
  fi
  if [ -f "$marker" ]; then
    "$here/cluster.sh" down
    rm -f "$marker"
  fi
  exit 0
fi

: "${IMAGE_REPO:=catena}" "${IMAGE_TAG:?IMAGE_TAG is set by make demo}"
IMAGE=$IMAGE_REPO:$IMAGE_TAG
kubectl_bin=$("$here/cluster.sh" kubectl)
k() { "$kubectl_bin" "$@"; }

step "A cluster"
own=$("$here/cluster.sh" kubeconfig)
if [ -n "${KUBECONFIG:-}" ] && [ "$KUBECONFIG" != "$own" ] && k get --raw /readyz >/dev/null 2>&1; then
  echo "using the cluster of KUBECONFIG=$KUBECONFIG (the image $IMAGE must be pullable there)"
  load_image=false
else
  export KUBECONFIG=$own
  "$here/cluster.sh" up >/dev/null
  mkdir -p "$(dirname "$marker")"
  echo "$KUBECONFIG" >"$marker"
  load_image=true
fi
k get nodes -o wide

step "The image $IMAGE, built from this checkout without Docker"
if $load_image; then "$here/cluster.sh" image "$IMAGE"; fi

step "The operator, from charts/catena"
"$helm" upgrade --install catena "$root/charts/catena" --namespace "$CATENA_NS" --create-namespace \
  --wait --timeout 5m --set "image.repository=$IMAGE_REPO,image.pullPolicy=IfNotPresent" --set-string "image.tag=$IMAGE_TAG"
k get deployments -n "$CATENA_NS"

step "A Stream: 4 partitions, 3 copies each, a pool of 3 replica pods on local volumes"
k create namespace "$DEMO_NS" --dry-run=client -o yaml | k apply -f - >/dev/null
k apply -n "$DEMO_NS" -f "$root/config/samples/stream-single-node.yaml"
k wait -n "$DEMO_NS" --for=condition=Ready "stream/$STREAM" --timeout=5m
k get -n "$DEMO_NS" streams,partitions,replicationchains,pods,pvc
server=$(k get -n "$DEMO_NS" "stream/$STREAM" -o 'jsonpath={.status.endpoints.producers}')

# The Stream's access lets its user app produce and consume: catenactl pods
# mount app's client certificate, which the operator issued in the Secret
# $STREAM-user-app, and find it through CATENA_TLS_*. kubectl run merges
# this into the pod it makes (its container is named after the pod).
overrides() {
  cat <<EOT | tr -d '\n'
{"spec": {"containers": [{"name": "$1",
  "env": [{"name": "CATENA_TLS_CA", "value": "/tls/ca.crt"}, {"name": "CATENA_TLS_CERT", "value": "/tls/tls.crt"}, {"name": "CATENA_TLS_KEY", "value": "/tls/tls.key"}],
  "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": true}]}],
  "volumes": [{"name": "tls", "secret": {"secretName": "$STREAM-user-app"}}]}}
EOT
}

# catenactl NAME ARGS...: one catenactl run in a pod, its output printed.
catenactl() {
  local name=$1
  shift
  k delete pod -n "$DEMO_NS" "$name" --ignore-not-found --wait=true >/dev/null
  k run -n "$DEMO_NS" "$name" --image="$IMAGE" --image-pull-policy=IfNotPresent --restart=Never \
    --override-type=strategic --overrides="$(overrides "$name")" --command -- /usr/local/bin/catenactl --server "$server" "$@" >/dev/null
  k wait -n "$DEMO_NS" --for=jsonpath='{.status.phase}'=Succeeded "pod/$name" --timeout=2m >/dev/null
  echo "\$ catenactl $*"
  k logs -n "$DEMO_NS" "$name"
}

step "Produce and consume through the Stream's ingestion Service ($server)"
catenactl demo-produce produce --stream "$STREAM" --key user-1 --value hello --value world
catenactl demo-consume consume --stream "$STREAM" --from earliest --no-follow
catenactl demo-describe describe --stream "$STREAM"

step "An Aggregation: records per key of $STREAM, checkpointed into the Stream $STREAM-count-checkpoints"
k apply -n "$DEMO_NS" -f - <<EOT
apiVersion: streams.catena.io/v1alpha1
kind: Aggregation
metadata: {name: $STREAM-count}
spec:
  source: $STREAM
  aggregates: [{name: records, function: Count}]
  checkpointInterval: 5s
EOT
k wait -n "$DEMO_NS" --for=condition=Ready "aggregation/$STREAM-count" --timeout=5m
k get -n "$DEMO_NS" aggregations
aggregator=$(k get -n "$DEMO_NS" "aggregation/$STREAM-count" -o 'jsonpath={.status.endpoint}')
catenactl demo-agg agg --aggregator "$aggregator" get user-1

step "Delete replica pod $POOL-1: its chains are reordered without it, then it returns at the tail"
k get -n "$DEMO_NS" replicationchains
# chain EPOCH READY per chain
chain_states() {
  k get -n "$DEMO_NS" replicationchains -o 'jsonpath={range .items[*]}{.metadata.name}{" "}{.status.targetEpoch}{" "}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}'
}
before=$(chain_states)
k delete pod -n "$DEMO_NS" "$POOL-1" --wait=false
T0_NS=$(date +%s%N)
# Converged: every chain Ready again, two epochs on (out, and back in).
converged() {
  local now
  now=$(chain_states)
  [ "$(join <(echo "$before" | sort) <(echo "$now" | sort) | awk '$4 >= $2 + 2 && $5 == "True"' | wc -l)" = "$(echo "$before" | wc -l)" ]
}
last=""
for _ in $(seq 600); do
  now=$(k get -n "$DEMO_NS" replicationchains --no-headers 2>/dev/null | awk '{print $1, "epoch", $4, "head", $5, $6}' | tr '\n' ';')
  if [ "$now" != "$last" ]; then
    echo "[+$(elapsed)s]"
    k get -n "$DEMO_NS" replicationchains -o wide
    last=$now
  fi
  converged && break
  sleep 0.5
done
converged || die "the chains did not converge within 5 minutes: kubectl get replicationchains -n $DEMO_NS"
echo "[+$(elapsed)s] $POOL-1 is back in every chain, at the tail, on its own volume:"
k get -n "$DEMO_NS" pods,pvc
k get events -n "$DEMO_NS" --field-selector involvedObject.kind=ReplicationChain --sort-by .metadata.creationTimestamp | tail -n 12

step "Try next (the demo keeps running until make demo-down)"
cat <<EOT
export KUBECONFIG=$KUBECONFIG
$kubectl_bin get -n $DEMO_NS streams,replicationchains -o wide
# as the Stream's user app (its certificate, from the Secret $STREAM-user-app):
$kubectl_bin run -n $DEMO_NS -it --rm bench --image=$IMAGE --restart=Never --override-type=strategic \\
    --overrides='$(overrides bench)' --command -- \\
    /usr/local/bin/catenactl --server $server bench --stream $STREAM --records 20000
$kubectl_bin run -n $DEMO_NS -it --rm check --image=$IMAGE --restart=Never --override-type=strategic \\
    --overrides='$(overrides check)' --command -- \\
    /usr/local/bin/catenactl --server $server check --stream $STREAM --duration 60s
    # and, meanwhile in another terminal, delete a replica pod and watch
    # kubectl get replicationchains -n $DEMO_NS -w
$kubectl_bin rollout restart statefulset/$POOL -n $DEMO_NS
$kubectl_bin delete pod -n $DEMO_NS $STREAM-count-aggregator-0     # restored from its checkpoint:
$kubectl_bin get aggregation -n $DEMO_NS $STREAM-count -o jsonpath='{.status.restorations}'
make demo-down
EOT
