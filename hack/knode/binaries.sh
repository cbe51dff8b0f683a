#!/usr/bin/env bash
# Builds, once, everything the local node runs that is not a Debian package,
# from the Go module proxy, into the version-keyed cache that
# hack/k8s-binaries.sh also fills for envtest:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
#   kubectl, kube-proxy, etcd     (hack/k8s-binaries.sh all)
#   crictl                        (removes pod sandboxes on `down`)
#   coredns                       (a minimal build: the plugins kube-dns needs)
#   pause                         (a tiny static sandbox process)
#   images/pause.tar, images/coredns.tar (single-layer images, hack/imgbuild)
# A piece already in the cache is not rebuilt. Prints the cache directory on
# its last line. Cold: 8-10 minutes on 2 cores; warm: about a second.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

"$root/hack/k8s-binaries.sh" all >/dev/null

work=$(mktemp -d "${TMPDIR:-/tmp}/catena-knode-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# build_module NAME GO.MOD-REQUIRE MAIN.GO: a scratch module outside the
# checkout, so Catena's go.mod never sees these dependencies.
build_module() {
  local name=$1 require=$2 main=$3 dir=$work/$1
  mkdir -p "$dir"
  printf 'module catena-knode-%s\ngo 1.26.0\n%s\n' "$name" "$require" >"$dir/go.mod"
  printf '%s\n' "$main" >"$dir/main.go"
  (cd "$dir" && { go mod tidy >/dev/null 2>&1 || go mod tidy; } &&
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$CACHE/$name.tmp" .)
  mv "$CACHE/$name.tmp" "$CACHE/$name"
}

if [ ! -x "$CACHE/pause" ]; then
  log "building pause into $CACHE"
  build_module pause "" '// pause: the sandbox process of every pod. Blocks until SIGINT or
// SIGTERM and reaps orphaned children.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 4)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range c {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}'
fi

if [ ! -x "$CACHE/coredns" ]; then
  log "building coredns $COREDNS_VERSION into $CACHE (about a minute cold)"
  build_module coredns "require github.com/coredns/coredns $COREDNS_VERSION" '// A minimal CoreDNS: only the plugins a kube-dns replacement needs.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"errors", "log", "health", "ready", "kubernetes", "cache", "loadbalance", "forward"}
}

func main() { coremain.Run() }'
fi

if [ ! -x "$CACHE/crictl" ]; then
  log "building crictl $CRICTL_VERSION into $CACHE"
  (cd "$work" && CGO_ENABLED=0 GOBIN="$work/bin" GOFLAGS=-trimpath GOWORK=off \
    go install -ldflags "-s -w" "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION")
  mv "$work/bin/crictl" "$CACHE/crictl.tmp" && mv "$CACHE/crictl.tmp" "$CACHE/crictl"
fi

imgbuild=$("$here/imgbuild.sh")
mkdir -p "$CACHE/images"
if [ ! -f "$CACHE/images/pause.tar" ]; then
  "$imgbuild" -o "$CACHE/images/pause.tar" -t "$PAUSE_IMAGE" -f "$CACHE/pause:/pause" \
    -entrypoint /pause -user 65535:65535 >/dev/null
fi
if [ ! -f "$CACHE/images/coredns-$COREDNS_VERSION.tar" ]; then
  "$imgbuild" -o "$CACHE/images/coredns-$COREDNS_VERSION.tar" -t "$COREDNS_IMAGE" \
    -f "$CACHE/coredns:/coredns" -entrypoint /coredns -user 65532:65532 >/dev/null
fi

echo "$CACHE"
