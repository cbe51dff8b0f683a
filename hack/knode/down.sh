#!/usr/bin/env bash
# Tears the local node down completely and removes its state folder:
# stops the processes up.sh started, by the PIDs it recorded (never by
# name), removes every pod sandbox through the CRI (which tears down its
# network namespace and CNI rules), stops containerd and the shims it
# started, removes the iptables chains and the cni0 bridge the node created,
# unmounts what is left under the state folder and restores ip_forward.
# Safe to run twice, and on a node that never came up.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

require_root
case "$STATE" in "" | / | "$HOME" | "$HOME/" | /root | /tmp | /var | /var/lib) die "refusing state folder '$STATE'" ;; esac
if [ ! -d "$STATE" ]; then
  log "nothing to tear down ($STATE does not exist)"
  exit 0
fi
T0_NS=$(date +%s%N)

# stop NAME [GRACE-SECONDS]: SIGTERM the recorded PID, SIGKILL after the
# grace period (kube-apiserver ignores SIGTERM for a while).
stop() {
  local f=$STATE/pids/$1 grace=${2:-30} pid exe
  if pid_alive "$f"; then
    read -r pid exe <"$f"
    kill "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + grace))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    log "[+$(elapsed)s] stopped $1 (pid $pid)"
  fi
  rm -f "$f"
}

stop kube-proxy
stop kubelet
stop kube-scheduler
stop kube-controller-manager
stop kube-apiserver 5
stop etcd

if pid_alive "$STATE/pids/containerd"; then
  # Removing the sandboxes through the CRI runs the CNI DEL of each (its
  # veth, IP and iptables rules) and unmounts its shm and netns.
  printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 30\n' "$SOCK" "$SOCK" >"$STATE/crictl.yaml"
  if "$CACHE/crictl" --config "$STATE/crictl.yaml" rmp -fa >/dev/null 2>&1; then
    log "[+$(elapsed)s] pod sandboxes removed"
  else
    log "crictl rmp -fa failed: stopping the containers with containerd"
  fi
fi
# The shims containerd started, by the PIDs they wrote in its state folder.
shims=()
for f in "$STATE"/containerd/state/io.containerd.runtime.v2.task/*/*/shim.pid; do
  [ -f "$f" ] && shims+=("$(cat "$f")")
done
stop containerd
for pid in "${shims[@]}"; do
  case "$(readlink "/proc/$pid/exe" 2>/dev/null)" in
  *containerd-shim*) kill -9 "$pid" 2>/dev/null && log "stopped shim $pid" ;;
  esac
done
# Containers of sandboxes the CRI could not remove: their processes are in
# the runc state folder of this containerd only.
if [ -d "$STATE/containerd/runc" ]; then
  for st in "$STATE"/containerd/runc/*/*/state.json; do
    [ -f "$st" ] || continue
    pid=$(sed -n 's/.*"init_process_pid":\([0-9]*\).*/\1/p' "$st")
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null && log "stopped container process $pid"
  done
fi

# iptables: kube-proxy's own cleanup, then every KUBE-* or CNI-* chain that
# did not exist before up.sh (kubelet's canaries, portmap's chains).
[ ! -x "$CACHE/kube-proxy" ] || "$CACHE/kube-proxy" --cleanup >/dev/null 2>&1 || true
for ipt in iptables ip6tables; do
  command -v "$ipt-save" >/dev/null 2>&1 || continue
  orig=$STATE/$ipt-chains.orig
  [ -f "$orig" ] || continue
  new=$("$ipt-save" 2>/dev/null | awk '/^\*/ {t=substr($0,2)} /^:(KUBE-|CNI-)/ {print t, substr($1,2)}' | grep -vxFf "$orig" || true)
  [ -n "$new" ] || continue
  # Rules that jump to a chain go first, then the chains are flushed and deleted.
  while read -r table chain; do
    "$ipt-save" -t "$table" 2>/dev/null | grep -E "^-A .* -j $chain( |$)" | sed 's/^-A/-D/' |
      while read -r rule; do eval "$ipt -t $table $rule" 2>/dev/null || true; done
  done <<<"$new"
  while read -r table chain; do "$ipt" -t "$table" -F "$chain" 2>/dev/null || true; done <<<"$new"
  while read -r table chain; do "$ipt" -t "$table" -X "$chain" 2>/dev/null || true; done <<<"$new"
  log "[+$(elapsed)s] removed $(echo "$new" | wc -l) $ipt chains"
done
if [ "$(cat "$STATE/cni0.orig" 2>/dev/null)" = absent ] && ip link show cni0 >/dev/null 2>&1; then
  ip link delete cni0 && log "removed bridge cni0"
fi
if [ -f "$STATE/ip_forward.orig" ]; then
  cat "$STATE/ip_forward.orig" >/proc/sys/net/ipv4/ip_forward
fi

# What is still mounted under the state folder (volumes of pods the kubelet
# had no time to unmount, overlay roots), deepest first.
awk -v s="$STATE/" 'index($2, s) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
  umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
done
left=$(awk -v s="$STATE/" 'index($2, s) == 1' /proc/mounts | wc -l)
[ "$left" = 0 ] || die "$left mounts remain under $STATE: not removing it"
rm -rf "$STATE"
log "[+$(elapsed)s] down: $STATE removed"
