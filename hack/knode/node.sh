#!/usr/bin/env bash
# One node of the local test cluster, and the faults a node can have.
#
#   node.sh add [N]      create node knode-N (without N: a new node, the
#                        next index never used) and start it (up.sh does
#                        this for each node); prints its name
#   node.sh stop NAME    power it off: SIGKILL to its kubelet, containerd,
#                        kube-proxy and every container (its volumes stay)
#   node.sh start NAME   power it on again after stop
#   node.sh pause NAME   freeze every process of the node (its cgroup)
#   node.sh resume NAME  thaw it
#   node.sh cut NAME     cut it off the network: its link to the bridge goes
#                        down (API server, other nodes and this machine)
#   node.sh heal NAME    bring the link back up
#   node.sh delete NAME  lose it for good: stopped, its Node object deleted,
#                        its folder (local volumes included) removed; its
#                        PersistentVolume objects stay, pointing at a node
#                        that no longer exists
#   node.sh remove N     tear it down cleanly (down.sh): pod sandboxes
#                        through the CRI, processes, mounts, netns, cgroups
#   node.sh list         NAME STATE IP, one line per node
#   node.sh exec N CMD   run CMD as part of node N: in its cgroup and its
#                        network namespace (how every daemon of a node runs)
#
# A node is a network namespace (knode-N) with a veth to the bridge $BRIDGE
# on this machine, its own address, pod CIDR (10.244.N.0/24) and routes to
# every other node's pods; its processes live in the cgroup /knode-N of
# every hierarchy, the containers under /knode-N/kubepods (the kubelet's
# cgroupRoot) and the daemons under /knode-N/system. They share this
# machine's mount namespace and file system, so its folder $STATE/nodes/NAME
# holds its containerd root, kubelet root, local volumes and logs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

require_root

# ns N ARGS...: run a command in node N's network namespace only.
ns() { local i=$1; shift; nsenter --net="/var/run/netns/$(node_netns "$i")" -- "$@"; }

daemon_alive() { pid_alive "$(node_dir "$1")/pids/$2"; }
node_running() {
  local d
  for d in containerd kubelet kube-proxy; do daemon_alive "$1" "$d" || return 1; done
}

# cgroups_make N: /knode-N and /knode-N/system in every hierarchy.
cgroups_make() {
  local top root name
  name=$(node_name "$1")
  if cgroup_v2; then
    top=/sys/fs/cgroup
    for c in cpu cpuset memory pids io; do echo "+$c" >"$top/cgroup.subtree_control" 2>/dev/null || true; done
    mkdir -p "$top/$name/system"
    for c in cpu cpuset memory pids io; do echo "+$c" >"$top/$name/cgroup.subtree_control" 2>/dev/null || true; done
    return
  fi
  while read -r root; do
    mkdir -p "$root/$name/system"
    # A v1 cpuset cgroup takes no process until it has CPUs and memory nodes.
    if [ -f "$root/cpuset.cpus" ]; then
      for f in cpuset.cpus cpuset.mems; do
        cat "$root/$f" >"$root/$name/$f"
        cat "$root/$f" >"$root/$name/system/$f"
      done
    fi
  done < <(cgroup_roots)
}

# cgroups_join N: the calling shell joins node N's system cgroup.
cgroups_join() {
  local root name
  name=$(node_name "$1")
  while read -r root; do echo $$ >"$root/$name/system/cgroup.procs"; done < <(cgroup_roots)
}

# cgroups_remove N: every cgroup under /knode-N, deepest first (they are
# empty once the node's processes are gone).
cgroups_remove() {
  local root name
  name=$(node_name "$1")
  while read -r root; do
    [ -d "$root/$name" ] || continue
    find "$root/$name" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done < <(cgroup_roots)
}

freeze() {
  local name top
  name=$(node_name "$1") top=$(cgroup_freezer_root)
  if cgroup_v2; then echo "$2" >"$top/$name/cgroup.freeze"; else
    if [ "$2" = 1 ]; then echo FROZEN >"$top/$name/freezer.state"; else echo THAWED >"$top/$name/freezer.state"; fi
  fi
}

# kill_all N: SIGKILL every process of node N until none is left (a frozen
# node is thawed first: a frozen task does not die).
kill_all() {
  local i=$1 pids deadline=$((SECONDS + 30))
  [ -d "$(cgroup_freezer_root)/$(node_name "$i")" ] || return 0
  freeze "$i" 0 2>/dev/null || true
  rm -f "$(node_dir "$i")/paused"
  while pids=$(node_pids "$i") && [ -n "$pids" ]; do
    [ $SECONDS -lt $deadline ] || die "processes of $(node_name "$i") survive SIGKILL: $(echo "$pids" | tr '\n' ' ')"
    # shellcheck disable=SC2086
    kill -9 $pids 2>/dev/null || true
    sleep 0.1
  done
  rm -f "$(node_dir "$i")"/pids/*
}

# start_daemon N NAME COMMAND ARGS...: a new session, in the node; its PID
# and binary are recorded in the node's pids/.
start_daemon() {
  local i=$1 n=$2 dir bin
  shift 2
  dir=$(node_dir "$i")
  bin=$(command -v "$1") || die "$1 not found"
  setsid nohup "$here/node.sh" exec "$i" "$@" >"$dir/logs/$n.log" 2>&1 </dev/null &
  echo "$! $(readlink -f "$bin")" >"$dir/pids/$n"
  log "[+$(elapsed)s] $(node_name "$i"): started $n (pid $!)"
}

# network_make N: the namespace, its veth on the bridge, its address and
# routes (to the API server's bridge, and to every other node's pods), and
# the same routes from the other nodes and this machine to its pods.
network_make() {
  local i=$1 name veth ip j
  name=$(node_netns "$i") veth=$(node_veth "$i") ip=$(node_ip "$i")
  ip netns add "$name" 2>/dev/null || true
  if ! ip link show "$veth" >/dev/null 2>&1; then
    ip link add "$veth" type veth peer name eth0 netns "$name"
  fi
  ip link set "$veth" master "$BRIDGE" up
  ip -n "$name" link set lo up
  ip -n "$name" addr replace "$ip/24" dev eth0
  ip -n "$name" link set eth0 up
  ip -n "$name" route replace default via "$BRIDGE_IP"
  ns "$i" sysctl -qw net.ipv4.ip_forward=1
  ns "$i" sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
  ip route replace "$(node_pod_cidr "$i")" via "$ip"
  for j in $(node_indexes); do
    [ "$j" != "$i" ] || continue
    ip -n "$name" route replace "$(node_pod_cidr "$j")" via "$(node_ip "$j")"
    ip -n "$(node_netns "$j")" route replace "$(node_pod_cidr "$i")" via "$ip" 2>/dev/null || true
  done
  # A ClusterIP that kube-proxy has not programmed yet (a Service created a
  # moment ago, while kube-proxy is busy with a namespace being deleted)
  # would leave the node by its default route, and on this machine that
  # leads to an egress proxy that accepts every TCP connection and answers
  # HTTP/2 with 404: a gRPC client saw a healthy connection answering
  # Unimplemented, and kept it. In a real cluster such packets go nowhere.
  # Refuse them instead: kube-proxy's DNAT runs before the filter table, so
  # only addresses it does not know reach this rule.
  ns "$i" iptables -N "$SERVICE_GUARD_CHAIN" 2>/dev/null || ns "$i" iptables -F "$SERVICE_GUARD_CHAIN"
  ns "$i" iptables -A "$SERVICE_GUARD_CHAIN" -d "$SERVICE_CIDR" -j REJECT --reject-with icmp-port-unreachable
  for hook in FORWARD OUTPUT; do
    ns "$i" iptables -C "$hook" -j "$SERVICE_GUARD_CHAIN" 2>/dev/null || ns "$i" iptables -I "$hook" 1 -j "$SERVICE_GUARD_CHAIN"
  done
}

network_remove() {
  local i=$1 j
  ip route del "$(node_pod_cidr "$i")" 2>/dev/null || true
  for j in $(node_indexes); do
    [ "$j" != "$i" ] || continue
    ip -n "$(node_netns "$j")" route del "$(node_pod_cidr "$i")" 2>/dev/null || true
  done
  ip link del "$(node_veth "$i")" 2>/dev/null || true
  ip netns del "$(node_netns "$i")" 2>/dev/null || true
}

configs_write() {
  local i=$1 dir name sock
  dir=$(node_dir "$i") name=$(node_name "$i") sock=$(node_sock "$i")
  mkdir -p "$dir"/{pids,logs,containerd,cni/net.d,cni/ipam,kubelet,kubelet-podlogs,kubelet-plugins/volume/exec,local-pv}
  # containerd 1.6 (Debian 12). restrict_oom_score_adj is required where the
  # process lacks CAP_SYS_RESOURCE (VMs and containers): without it every
  # sandbox fails with "can't get final child's PID from pipe: EOF".
  cat >"$dir/containerd/config.toml" <<EOT
version = 2
root = "$dir/containerd/root"
state = "$dir/containerd/state"
[grpc]
  address = "$sock"
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
    conf_dir = "$dir/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$dir/containerd/runc"
        SystemdCgroup = false
EOT
  # Pods reach other nodes' pods by the node routes (no encapsulation, no
  # masquerade: a flat pod network, as a real CNI gives).
  cat >"$dir/cni/net.d/10-catena-knode.conflist" <<EOT
{
  "cniVersion": "1.0.0",
  "name": "catena-knode",
  "plugins": [
    {
      "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local", "dataDir": "$dir/cni/ipam", "ranges": [[{"subnet": "$(node_pod_cidr "$i")"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOT
  cat >"$dir/kubelet-config.yaml" <<EOT
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$name
containerRuntimeEndpoint: unix://$sock
podLogsDir: $dir/kubelet-podlogs
volumePluginDir: $dir/kubelet-plugins/volume/exec
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/$name/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/$name/kubelet-serving.key
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
  cat >"$dir/kube-proxy-config.yaml" <<EOT
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $CLUSTER_CIDR
hostnameOverride: $name
# The conntrack table's size and timeouts are the machine's, not a node's.
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOT
}

# daemons_start N: containerd, the kubelet and kube-proxy, each only when
# it is not already running.
daemons_start() {
  local i=$1 dir name
  dir=$(node_dir "$i") name=$(node_name "$i")
  if ! daemon_alive "$i" containerd; then
    start_daemon "$i" containerd containerd --config "$dir/containerd/config.toml"
    wait_for "$name: containerd answers" 30 ctrd "$i" version
  fi
  images_import "$i"
  if ! daemon_alive "$i" kubelet; then
    start_daemon "$i" kubelet "$CACHE/kubelet" \
      --config="$dir/kubelet-config.yaml" --kubeconfig="$dir/kubelet.kubeconfig" --root-dir="$dir/kubelet" \
      --hostname-override="$name" --node-ip="$(node_ip "$i")" \
      --node-labels="topology.kubernetes.io/zone=$(node_zone "$i")"
  fi
  if ! daemon_alive "$i" kube-proxy; then
    start_daemon "$i" kube-proxy "$CACHE/kube-proxy" --config="$dir/kube-proxy-config.yaml"
  fi
}

# images_import N: the base images, and those cluster.sh image loaded into
# the nodes while this one was not running (not yet added, or stopped).
images_import() {
  local img
  for img in "$CACHE/images/pause.tar" "$CACHE/images/coredns-$COREDNS_VERSION.tar" "$STATE"/images/*.tar; do
    [ -f "$img" ] || continue
    ctrd "$1" -n k8s.io images import "$img" >/dev/null
  done
}

# pvs_apply N: the node's local PersistentVolumes, directories in its folder.
pvs_apply() {
  local i=$1 name dir k pvs=""
  name=$(node_name "$i")
  for k in $(seq 0 $((LOCAL_PV_COUNT - 1))); do
    dir=$(node_dir "$i")/local-pv/pv$k
    mkdir -p "$dir"
    # Replica pods run as 65532 with that fsGroup; local volumes are not
    # chowned by the kubelet on every kind of node, so open the directory.
    chmod 0777 "$dir"
    pvs+="---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: catena-local-$name-pv$k
  labels: {catena.io/knode: local-pv, catena.io/knode-node: $name}
spec:
  capacity: {storage: $LOCAL_PV_SIZE}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: $LOCAL_STORAGE_CLASS
  local: {path: $dir}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: kubernetes.io/hostname, operator: In, values: [$name]}
"
  done
  echo "$pvs" | ctl apply -f - >/dev/null
}

node_ready() { [ "$(ctl get node "$(node_name "$1")" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]; }

add() {
  local i=$1 name
  name=$(node_name "$i")
  [ -d "$(node_dir "$i")" ] && node_running "$i" && { echo "$name"; return; }
  T0_NS=$(date +%s%N)
  configs_write "$i"
  "$here/gen-certs.sh" node "$i"
  cgroups_make "$i"
  network_make "$i"
  daemons_start "$i"
  echo "$i" >>"$STATE/nodes/used"
  pvs_apply "$i"
  echo "$name"
}

# sandboxes_remove N: every pod sandbox of the node through its CRI, which
# runs each one's CNI teardown and unmounts its netns and shm. containerd
# is started alone for it when the node is stopped.
sandboxes_remove() {
  local i=$1 dir cfg
  dir=$(node_dir "$i") cfg=$(node_dir "$i")/crictl.yaml
  [ -f "$dir/containerd/config.toml" ] && [ -e "/var/run/netns/$(node_netns "$i")" ] || return 0
  if ! daemon_alive "$i" containerd; then
    start_daemon "$i" containerd containerd --config "$dir/containerd/config.toml"
    if ! try_for "$(node_name "$i"): containerd answers" 30 ctrd "$i" version; then
      log "$(node_name "$i"): containerd did not start: its sandboxes' netns may stay in /var/run/netns"
      return 0
    fi
  fi
  printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 30\n' "$(node_sock "$i")" "$(node_sock "$i")" >"$cfg"
  "$CACHE/crictl" --config "$cfg" rmp -fa >/dev/null 2>&1 || log "$(node_name "$i"): crictl rmp -fa failed"
}

# unmount_under DIR: what is still mounted below DIR, deepest first.
unmount_under() {
  awk -v s="$1/" 'index($2, s) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  local left
  left=$(awk -v s="$1/" 'index($2, s) == 1' /proc/mounts | wc -l)
  [ "$left" = 0 ] || die "$left mounts remain under $1"
}

# teardown N: everything of the node on this machine, its folder last.
teardown() {
  local i=$1 dir
  dir=$(node_dir "$i")
  T0_NS=$(date +%s%N)
  # The kubelet first, so that it does not start what the CRI removes.
  if daemon_alive "$i" kubelet; then read -r pid _ <"$dir/pids/kubelet" && kill -9 "$pid" 2>/dev/null || true; fi
  sandboxes_remove "$i"
  kill_all "$i"
  unmount_under "$dir"
  network_remove "$i"
  cgroups_remove "$i"
  rm -rf "$dir"
  log "[+$(elapsed)s] $(node_name "$i") removed"
}

list() {
  local i dir state
  for i in $(node_indexes); do
    dir=$(node_dir "$i")
    if [ -f "$dir/paused" ]; then state=paused
    elif node_running "$i"; then state=running
    else state=stopped; fi
    [ ! -f "$dir/cut" ] || state+=",cut"
    printf '%s %s %s\n' "$(node_name "$i")" "$state" "$(node_ip "$i")"
  done
}

# index NAME: the node's index, for a node that exists.
index() {
  local i
  i=$(node_index "$1")
  [ -d "$(node_dir "$i")" ] || die "no node $1 (node.sh list shows the nodes)"
  echo "$i"
}

cmd=${1:-}
shift || true
case "$cmd" in
add)
  if [ -n "${1:-}" ]; then
    i=$1
    # A deleted node's PersistentVolume objects keep their names (and may
    # still be bound); a node under the same name would give them new,
    # empty directories.
    if [ ! -d "$(node_dir "$i")" ] && grep -qx "$i" "$STATE/nodes/used" 2>/dev/null; then
      die "$(node_name "$i") was deleted: add a new node (node.sh add, without an index)"
    fi
  else
    # Never an index used before: a new node is a new name, as a cloud's
    # replacement for a lost machine would be.
    i=$(( $( (cat "$STATE/nodes/used" 2>/dev/null; node_indexes; echo 0) | sort -n | tail -1) + 1 ))
  fi
  [[ $i =~ ^[0-9]+$ ]] && [ "$i" -ge 1 ] && [ "$i" -le 200 ] || die "not a node index: $i"
  add "$i"
  ;;
stop)
  i=$(index "${1:?usage: node.sh stop NAME}")
  T0_NS=$(date +%s%N)
  kill_all "$i"
  log "[+$(elapsed)s] $1 stopped: every process of the node killed"
  ;;
start)
  i=$(index "${1:?usage: node.sh start NAME}")
  T0_NS=$(date +%s%N)
  daemons_start "$i"
  ;;
pause)
  i=$(index "${1:?usage: node.sh pause NAME}")
  freeze "$i" 1
  touch "$(node_dir "$i")/paused"
  log "$1 paused"
  ;;
resume)
  i=$(index "${1:?usage: node.sh resume NAME}")
  freeze "$i" 0
  rm -f "$(node_dir "$i")/paused"
  log "$1 resumed"
  ;;
cut)
  i=$(index "${1:?usage: node.sh cut NAME}")
  ip link set "$(node_veth "$i")" down
  touch "$(node_dir "$i")/cut"
  log "$1 cut off the network"
  ;;
heal)
  i=$(index "${1:?usage: node.sh heal NAME}")
  ip link set "$(node_veth "$i")" up
  rm -f "$(node_dir "$i")/cut"
  log "$1 back on the network"
  ;;
delete)
  i=$(index "${1:?usage: node.sh delete NAME}")
  kill_all "$i"
  ctl delete node "$1" --ignore-not-found --wait=false >/dev/null
  teardown "$i"
  log "$1 deleted with its local volumes; its PersistentVolumes remain"
  ;;
remove) teardown "${1:?usage: node.sh remove N}" ;;
list) list ;;
ready) node_ready "$(index "${1:?usage: node.sh ready NAME}")" ;;
exec)
  i=${1:?usage: node.sh exec N COMMAND...}
  shift
  cgroups_join "$i"
  exec nsenter --net="/var/run/netns/$(node_netns "$i")" -- "$@"
  ;;
*) die "usage: $0 add N | stop|start|pause|resume|cut|heal|delete|ready NAME | remove N | list | exec N COMMAND..." ;;
esac
