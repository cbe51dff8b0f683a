# Sourced by the hack/knode scripts: versions, where things live, helpers.
# Nothing here starts or changes anything.
#
#   CACHE  built binaries and base images, keyed by the Kubernetes version,
#          shared with hack/k8s-binaries.sh (envtest) and kept across clones
#   STATE  one node's runtime state: PKI, kubeconfigs, etcd data, containerd
#          root, kubelet root, local volumes, logs and the PIDs of every
#          process `up` started. Never inside the git checkout.

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
COREDNS_VERSION=${COREDNS_VERSION:-v1.15.0}
CRICTL_VERSION=${CRICTL_VERSION:-v1.37.0}
# The pause image containerd runs as every pod's sandbox (its sandbox_image).
PAUSE_IMAGE=registry.k8s.io/pause:3.10.2
COREDNS_IMAGE=local/coredns:${COREDNS_VERSION}

CACHE=${CATENA_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/catena/k8s-${K8S_VERSION}}
STATE=${CATENA_KNODE_STATE:-${XDG_CACHE_HOME:-$HOME/.cache}/catena/knode-state}

# The nodes. Each node is a network namespace of this machine (knode-1,
# knode-2, ...) with its own address on the bridge $BRIDGE, its own
# containerd, kubelet and kube-proxy, its own pod CIDR and its own local
# volumes, so that a node can be stopped, frozen, cut off and deleted alone.
# The control plane (etcd, kube-apiserver, controller manager, scheduler)
# runs in this machine's own namespace and listens on $BRIDGE_IP.
NODES=${CATENA_KNODE_NODES:-3}
BRIDGE=knode0
BRIDGE_IP=10.250.0.1
BRIDGE_CIDR=10.250.0.0/24
NODE_PREFIX=knode-

SERVICE_CIDR=10.96.0.0/12
SERVICE_IP=10.96.0.1
DNS_IP=10.96.0.10
CLUSTER_CIDR=10.244.0.0/16
APISERVER_PORT=6443
# The filter chain that refuses service addresses kube-proxy has not
# programmed (node.sh says why); a KUBE-* name, so it goes with the node.
SERVICE_GUARD_CHAIN=KUBE-KNODE-SVC-GUARD

# Node N (1-based): its name, address, pod CIDR, network namespace, folder,
# containerd socket and the veth end on the bridge.
node_name() { echo "$NODE_PREFIX$1"; }
node_index() { local n=${1#"$NODE_PREFIX"}; [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "not a knode node name: $1"; echo "$n"; }
node_ip() { echo "10.250.0.$((10 + $1))"; }
node_pod_cidr() { echo "10.244.$1.0/24"; }
node_netns() { node_name "$1"; }
node_dir() { echo "$STATE/nodes/$(node_name "$1")"; }
node_sock() { echo "$(node_dir "$1")/containerd/containerd.sock"; }
node_veth() { echo "kn$1"; }
# The zone a node is in: one per node, so that zone spread can be seen.
node_zone() { echo "zone-$1"; }
# The nodes that exist (were added and not deleted), by index.
node_indexes() {
  local d
  for d in "$STATE"/nodes/"$NODE_PREFIX"*; do
    [ -d "$d" ] && node_index "${d##*/}"
  done | sort -n
}

KUBECONFIG_FILE=$STATE/admin.kubeconfig
PKI=$STATE/pki
KUBECTL=$CACHE/kubectl

# The local PersistentVolumes each node gets for StorageClass catena-local:
# enough for the e2e suite's and the demo's replica pods, with headroom.
LOCAL_PV_COUNT=${CATENA_KNODE_PVS:-8}
LOCAL_PV_SIZE=${CATENA_KNODE_PV_SIZE:-10Gi}
LOCAL_STORAGE_CLASS=catena-local

die() { echo "knode: $*" >&2; exit 1; }
log() { echo "knode: $*" >&2; }

# ctl runs kubectl against the node.
ctl() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

# ctrd N ARGS...: ctr against node N's own containerd.
ctrd() { local i=$1; shift; ctr -a "$(node_sock "$i")" "$@"; }

# The cgroup hierarchies (v1: one per mounted controller; v2: the one
# unified tree) in which a node's processes live under /knode-N.
cgroup_v2() { [ -f /sys/fs/cgroup/cgroup.controllers ]; }
cgroup_roots() {
  if cgroup_v2; then echo /sys/fs/cgroup; return; fi
  awk '$3 == "cgroup" {print $2}' /proc/mounts
}
# The hierarchy that holds every process of a node, to list and freeze
# them: freezer on v1, the unified tree on v2.
cgroup_freezer_root() { if cgroup_v2; then echo /sys/fs/cgroup; else echo /sys/fs/cgroup/freezer; fi; }
# node_pids N: every process in node N's cgroup, its containers included.
node_pids() {
  local top
  top=$(cgroup_freezer_root)/$(node_name "$1")
  [ -d "$top" ] || return 0
  # A cgroup may vanish during the walk (a container ending): what is
  # left is still listed.
  { find "$top" -name cgroup.procs -exec cat {} + 2>/dev/null || true; } | sort -un
}

# pid_alive PIDFILE: the PID recorded in PIDFILE still runs the binary it
# was started from (a reused PID is not ours).
pid_alive() {
  local f=$1 pid exe want
  [ -f "$f" ] || return 1
  read -r pid exe <"$f" || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  want=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  [ -z "$exe" ] || [ "$want" = "$exe" ] || [ "$want" = "$exe (deleted)" ]
}

# elapsed prints seconds since T0 (set by the caller with `T0=$SECONDS` or
# `T0_NS=$(date +%s%N)`).
elapsed() { awk -v a="${T0_NS:-0}" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }

# wait_for WHAT SECONDS COMMAND...: poll COMMAND every 0.2 s; exit when
# it does not succeed in time.
wait_for() {
  try_for "$@" || die "timed out after ${2}s waiting for $1 (logs in $STATE/logs and $STATE/nodes/*/logs)"
}

# try_for WHAT SECONDS COMMAND...: wait_for, but returns 1 on time out.
try_for() {
  local what=$1 secs=$2
  shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
  log "[+$(elapsed)s] $what"
}

require_root() { [ "$(id -u)" = 0 ] || die "needs root (containerd, kubelet, iptables and mounts): run as root"; }
