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

# The node is this machine: its host name and first global IPv4 address.
NODE_NAME=${CATENA_KNODE_NODE_NAME:-$(hostname | tr '[:upper:]' '[:lower:]')}
NODE_IP=${CATENA_KNODE_NODE_IP:-$(ip -4 -o addr show scope global 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')}

SERVICE_CIDR=10.96.0.0/12
SERVICE_IP=10.96.0.1
DNS_IP=10.96.0.10
POD_CIDR=10.244.0.0/24
CLUSTER_CIDR=10.244.0.0/16
APISERVER_PORT=6443
# The filter chain that refuses service addresses kube-proxy has not
# programmed (up.sh says why); a KUBE-* name, so down.sh removes it.
SERVICE_GUARD_CHAIN=KUBE-KNODE-SVC-GUARD

SOCK=$STATE/containerd/containerd.sock
KUBECONFIG_FILE=$STATE/admin.kubeconfig
PKI=$STATE/pki
KUBECTL=$CACHE/kubectl

# The local PersistentVolumes `up` creates for StorageClass catena-local:
# enough for the e2e suite's and the demo's replica pods, with headroom.
LOCAL_PV_COUNT=${CATENA_KNODE_PVS:-12}
LOCAL_PV_SIZE=${CATENA_KNODE_PV_SIZE:-10Gi}
LOCAL_STORAGE_CLASS=catena-local

die() { echo "knode: $*" >&2; exit 1; }
log() { echo "knode: $*" >&2; }

# ctl runs kubectl against the node.
ctl() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

# ctrd runs ctr against the node's own containerd.
ctrd() { ctr -a "$SOCK" "$@"; }

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
elapsed() { awk -v a="$T0_NS" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }

require_root() { [ "$(id -u)" = 0 ] || die "needs root (containerd, kubelet, iptables and mounts): run as root"; }
