#!/usr/bin/env bash
# Brings up a single-node Kubernetes on this machine: containerd (its own
# config, root and socket), etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy (iptables), the bridge CNI, CoreDNS,
# and StorageClass catena-local with static local PersistentVolumes. Writes
# $STATE/admin.kubeconfig and records the PID of every process it starts in
# $STATE/pids/ (hack/knode/down.sh stops exactly those).
#
# Idempotent: when the node is already up it only prints the kubeconfig; a
# half-started node is torn down first. Prints the kubeconfig path on its
# last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

require_root
[ -n "$NODE_IP" ] || die "found no global IPv4 address for the node: set CATENA_KNODE_NODE_IP"
"$here/packages.sh"
"$here/binaries.sh" >/dev/null

components=(containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
running=0
for c in "${components[@]}"; do pid_alive "$STATE/pids/$c" && running=$((running + 1)); done
if [ "$running" = "${#components[@]}" ] && ctl get --raw /readyz >/dev/null 2>&1; then
  log "already up (state $STATE)"
  echo "$KUBECONFIG_FILE"
  exit 0
fi
if [ "$running" -gt 0 ] || [ -d "$STATE/pids" ]; then
  log "a previous node is partly up or was not torn down: tearing it down first"
  "$here/down.sh"
fi

# Ports another cluster on this machine may hold: fail clearly rather than
# start half a node.
busy=$(ss -Htln 2>/dev/null | awk '{print $4}' | grep -E ':(6443|2379|2380|10248|10249|10250|10256|10257|10259)$' || true)
[ -z "$busy" ] || die "ports in use (another Kubernetes on this machine?): $(echo "$busy" | tr '\n' ' ')"

T0_NS=$(date +%s%N)
mkdir -p "$STATE"/{pids,logs,etcd,containerd,cni/net.d,cni/ipam,kubelet,kubelet-podlogs,kubelet-plugins/volume/exec,local-pv}
"$here/gen-certs.sh"

# What down.sh must leave as it found: the iptables chains that exist
# before the node (it removes only KUBE-* and CNI-* chains that did not),
# and whether the cni0 bridge existed.
for ipt in iptables ip6tables; do
  [ -f "$STATE/$ipt-chains.orig" ] || { "$ipt-save" 2>/dev/null || true; } | awk '/^\*/ {t=substr($0,2)} /^:/ {print t, substr($1,2)}' >"$STATE/$ipt-chains.orig"
done
[ -f "$STATE/cni0.orig" ] || { ip link show cni0 >/dev/null 2>&1 && echo present || echo absent; } >"$STATE/cni0.orig"

# ip_forward lets pods reach each other and services through the bridge;
# its old value is put back by down.sh.
[ -f "$STATE/ip_forward.orig" ] || cat /proc/sys/net/ipv4/ip_forward >"$STATE/ip_forward.orig"
echo 1 >/proc/sys/net/ipv4/ip_forward
modprobe br_netfilter 2>/dev/null || true
[ ! -f /proc/sys/net/bridge/bridge-nf-call-iptables ] || echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables

# A ClusterIP that kube-proxy has not programmed yet (a Service created a
# moment ago, while kube-proxy is busy with a namespace being deleted) is
# routed out of the node like any other address. Here the default route
# leads to an egress proxy that accepts every TCP connection and answers
# HTTP/2 with 404, so a gRPC client saw a healthy connection answering
# Unimplemented, and kept it. In a real cluster such packets go nowhere.
# Refuse them instead: kube-proxy's DNAT runs before the filter table, so
# only addresses it does not know reach this rule. down.sh removes the
# chain with the other KUBE-* chains.
iptables -N "$SERVICE_GUARD_CHAIN" 2>/dev/null || iptables -F "$SERVICE_GUARD_CHAIN"
iptables -A "$SERVICE_GUARD_CHAIN" -d "$SERVICE_CIDR" -j REJECT --reject-with icmp-port-unreachable
for hook in FORWARD OUTPUT; do
  iptables -C "$hook" -j "$SERVICE_GUARD_CHAIN" 2>/dev/null || iptables -I "$hook" 1 -j "$SERVICE_GUARD_CHAIN"
done

# containerd 1.6 (Debian 12). restrict_oom_score_adj is required where the
# process lacks CAP_SYS_RESOURCE (VMs and containers): without it every
# sandbox fails with "can't get final child's PID from pipe: EOF".
cat >"$STATE/containerd/config.toml" <<EOT
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  sandbox_image = "$PAUSE_IMAGE"
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  tolerate_missing_hugetlb_controller = true
  disable_hugetlb_controller = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$STATE/containerd/runc"
        SystemdCgroup = false
EOT

cat >"$STATE/cni/net.d/10-catena-knode.conflist" <<EOT
{
  "cniVersion": "1.0.0",
  "name": "catena-knode",
  "plugins": [
    {
      "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
      "ipam": {"type": "host-local", "dataDir": "$STATE/cni/ipam", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOT

cat >"$STATE/kubelet-config.yaml" <<EOT
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$SOCK
podLogsDir: $STATE/kubelet-podlogs
volumePluginDir: $STATE/kubelet-plugins/volume/exec
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
clusterDomain: cluster.local
clusterDNS: [$DNS_IP]
resolvConf: /etc/resolv.conf
failSwapOn: false
evictionHard: {memory.available: "100Mi", nodefs.available: "2%", imagefs.available: "2%"}
# Imported images cannot be pulled again: keep them.
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
serializeImagePulls: false
EOT

cat >"$STATE/kube-proxy-config.yaml" <<EOT
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $CLUSTER_CIDR
hostnameOverride: $NODE_NAME
conntrack: {maxPerCore: 0}
EOT

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
# wait_for WHAT SECONDS COMMAND...: poll COMMAND every 0.2 s.
wait_for() {
  local what=$1 secs=$2
  shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "timed out after ${secs}s waiting for $what (logs in $STATE/logs)"
    sleep 0.2
  done
  log "[+$(elapsed)s] $what"
}

start containerd containerd --config "$STATE/containerd/config.toml"
wait_for "containerd answers" 30 ctrd version
for img in "$CACHE/images/pause.tar" "$CACHE/images/coredns-$COREDNS_VERSION.tar"; do
  ctrd -n k8s.io images import "$img" >/dev/null
done
log "[+$(elapsed)s] pause and coredns images imported"

start etcd "$CACHE/etcd" --name knode --data-dir "$STATE/etcd/data" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster knode=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
  --quota-backend-bytes=2147483648

start kube-apiserver "$CACHE/kube-apiserver" \
  --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=0.0.0.0 --secure-port=$APISERVER_PORT --advertise-address="$NODE_IP" \
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
  --flex-volume-plugin-dir="$STATE/kubelet-plugins/volume/exec" \
  --service-cluster-ip-range=$SERVICE_CIDR
start kube-scheduler "$CACHE/kube-scheduler" \
  --kubeconfig="$STATE/scheduler.kubeconfig" \
  --authentication-kubeconfig="$STATE/scheduler.kubeconfig" \
  --authorization-kubeconfig="$STATE/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false
start kubelet "$CACHE/kubelet" \
  --config="$STATE/kubelet-config.yaml" \
  --kubeconfig="$STATE/kubelet.kubeconfig" \
  --root-dir="$STATE/kubelet" \
  --hostname-override="$NODE_NAME" --node-ip="$NODE_IP"
start kube-proxy "$CACHE/kube-proxy" --config="$STATE/kube-proxy-config.yaml"

node_ready() { [ "$(ctl get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
wait_for "node $NODE_NAME Ready" 180 node_ready
# Pods cannot be created in a namespace before its default ServiceAccount.
wait_for "default ServiceAccount" 120 ctl get serviceaccount default -n default

"$here/addons.sh"
wait_for "CoreDNS ready" 180 ctl -n kube-system rollout status deployment/coredns --timeout=2s
log "[+$(elapsed)s] up: export KUBECONFIG=$KUBECONFIG_FILE"
echo "$KUBECONFIG_FILE"
