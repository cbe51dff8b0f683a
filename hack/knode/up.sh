#!/usr/bin/env bash
# Brings up a Kubernetes of $NODES nodes (CATENA_KNODE_NODES, default 3) on
# this machine. The control plane runs in the machine's own namespace:
# etcd, kube-apiserver (on the bridge address $BRIDGE_IP), the controller
# manager and the scheduler. Each node (hack/knode/node.sh) is a network
# namespace on the bridge $BRIDGE with its own containerd, kubelet,
# kube-proxy, pod CIDR and local volumes; then CoreDNS and StorageClass
# catena-local. Writes $STATE/admin.kubeconfig and records the PID of every
# process it starts (hack/knode/down.sh stops exactly those).
#
# Idempotent: when the cluster is already up it only prints the kubeconfig;
# a half-started one is torn down first. Prints the kubeconfig path on its
# last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

require_root
[[ $NODES =~ ^[0-9]+$ ]] && [ "$NODES" -ge 1 ] && [ "$NODES" -le 20 ] || die "CATENA_KNODE_NODES must be 1 to 20, not '$NODES'"
"$here/packages.sh"
"$here/binaries.sh" >/dev/null

components=(etcd kube-apiserver kube-controller-manager kube-scheduler)
running=0
for c in "${components[@]}"; do pid_alive "$STATE/pids/$c" && running=$((running + 1)); done
if [ "$running" = "${#components[@]}" ] && ctl get --raw /readyz >/dev/null 2>&1 &&
  [ "$("$here/node.sh" list | grep -c ' running ')" = "$NODES" ]; then
  log "already up (state $STATE): $("$here/node.sh" list | tr '\n' ';')"
  echo "$KUBECONFIG_FILE"
  exit 0
fi
if [ "$running" -gt 0 ] || [ -d "$STATE/pids" ] || [ -d "$STATE/nodes" ]; then
  log "a previous cluster is partly up or was not torn down: tearing it down first"
  "$here/down.sh"
fi

# Ports another cluster on this machine may hold: fail clearly rather than
# start half a cluster.
busy=$(ss -Htln 2>/dev/null | awk '{print $4}' | grep -E ':(6443|2379|2380|2381|10257|10259)$' || true)
[ -z "$busy" ] || die "ports in use (another Kubernetes on this machine?): $(echo "$busy" | tr '\n' ' ')"
holder=$(ip -4 -o addr show | awk -v a="$BRIDGE_IP" -v b="$BRIDGE" '$2 != b && index($4, a "/") == 1 {print $2}')
[ -z "$holder" ] || die "$BRIDGE_IP is already an address of $holder: the bridge $BRIDGE needs it"

T0_NS=$(date +%s%N)
mkdir -p "$STATE"/{pids,logs,etcd,nodes,controller-plugins}
"$here/gen-certs.sh"

# The bridge every node's veth is on; this machine is its gateway
# ($BRIDGE_IP) and routes each node's pod CIDR to the node. ip_forward and
# bridge-nf-call-iptables (kube-proxy's rules see bridged packets) are put
# back or left by down.sh.
[ -f "$STATE/ip_forward.orig" ] || cat /proc/sys/net/ipv4/ip_forward >"$STATE/ip_forward.orig"
echo 1 >/proc/sys/net/ipv4/ip_forward
modprobe br_netfilter 2>/dev/null || true
[ ! -f /proc/sys/net/bridge/bridge-nf-call-iptables ] || echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
# With bridge-nf-call-iptables, traffic between nodes crosses this
# machine's FORWARD chain, whose policy may be DROP (Docker, ufw).
iptables -C FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null || iptables -I FORWARD 1 -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
ip addr replace "$BRIDGE_IP/24" dev "$BRIDGE"
ip link set "$BRIDGE" up

# start NAME COMMAND ARGS...: a new session, so the process outlives this
# script; its PID and binary are recorded for down.sh.
start() {
  local n=$1
  shift
  local bin
  bin=$(command -v "$1") || die "$1 not found"
  setsid nohup "$@" >"$STATE/logs/$n.log" 2>&1 </dev/null &
  echo "$! $(readlink -f "$bin")" >"$STATE/pids/$n"
  log "[+$(elapsed)s] started $n (pid $!)"
}
start etcd "$CACHE/etcd" --name knode --data-dir "$STATE/etcd/data" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster knode=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
  --quota-backend-bytes=2147483648

start kube-apiserver "$CACHE/kube-apiserver" \
  --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=0.0.0.0 --secure-port=$APISERVER_PORT --advertise-address="$BRIDGE_IP" \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=$SERVICE_CIDR \
  --authorization-mode=Node,RBAC \
  --enable-admission-plugins=NodeRestriction \
  --allow-privileged=true \
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types=InternalIP,Hostname
wait_for "kube-apiserver /readyz" 120 ctl get --raw /readyz

start kube-controller-manager "$CACHE/kube-controller-manager" \
  --kubeconfig="$STATE/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$STATE/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$STATE/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false \
  --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --use-service-account-credentials=true \
  --flex-volume-plugin-dir="$STATE/controller-plugins" \
  --service-cluster-ip-range=$SERVICE_CIDR
start kube-scheduler "$CACHE/kube-scheduler" \
  --kubeconfig="$STATE/scheduler.kubeconfig" \
  --authentication-kubeconfig="$STATE/scheduler.kubeconfig" \
  --authorization-kubeconfig="$STATE/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false
# Pods cannot be created in a namespace before its default ServiceAccount.
wait_for "default ServiceAccount" 120 ctl get serviceaccount default -n default

for i in $(seq 1 "$NODES"); do "$here/node.sh" add "$i" >/dev/null; done
for i in $(seq 1 "$NODES"); do wait_for "node $(node_name "$i") Ready" 180 "$here/node.sh" ready "$(node_name "$i")"; done

"$here/addons.sh"
wait_for "CoreDNS ready" 180 ctl -n kube-system rollout status deployment/coredns --timeout=2s
log "[+$(elapsed)s] up: export KUBECONFIG=$KUBECONFIG_FILE"
echo "$KUBECONFIG_FILE"
