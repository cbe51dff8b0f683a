#!/usr/bin/env bash
# Tears the local cluster down completely and removes its state folder:
# each node (node.sh remove: its pod sandboxes through the CRI, which runs
# each one's CNI teardown and unmounts its netns and shm; every process in
# its cgroup; its mounts, network namespace, veth, routes and cgroups), then
# the control plane by the PIDs up.sh recorded (never by name), the bridge,
# and ip_forward as it was. Safe to run twice, and on a cluster that never
# came up.
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

for i in $(node_indexes); do "$here/node.sh" remove "$i" || log "node $(node_name "$i") not removed cleanly"; done

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

stop kube-scheduler
stop kube-controller-manager
stop kube-apiserver 5
stop etcd

while iptables -D FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null; do :; done
if ip link show "$BRIDGE" >/dev/null 2>&1; then
  ip link delete "$BRIDGE" && log "removed bridge $BRIDGE"
fi
if [ -f "$STATE/ip_forward.orig" ]; then
  cat "$STATE/ip_forward.orig" >/proc/sys/net/ipv4/ip_forward
fi

left=$(awk -v s="$STATE/" 'index($2, s) == 1' /proc/mounts | wc -l)
[ "$left" = 0 ] || die "$left mounts remain under $STATE: not removing it"
rm -rf "$STATE"
log "[+$(elapsed)s] down: $STATE removed"
