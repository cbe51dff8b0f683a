#!/usr/bin/env bash
# Builds Kubernetes and etcd binaries from the Go module proxy (no other
# download is possible here) and caches them outside the checkout, keyed by
# version, so every clone and CI run on this machine reuses them. Idempotent:
# a component already in the cache is not rebuilt.
#
#   hack/k8s-binaries.sh                          # kube-apiserver, kubectl, etcd (envtest)
#   hack/k8s-binaries.sh all                      # plus controller-manager, scheduler, kubelet, kube-proxy
#
# Prints the cache directory on its last line. KUBEBUILDER_ASSETS can point at it.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.7.3}
CACHE=${CATENA_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/catena/k8s-${K8S_VERSION}}
STAGING_VERSION="v0.${K8S_VERSION#v1.}"

components=(kube-apiserver kubectl)
if [ "${1:-}" = all ]; then
  components+=(kube-controller-manager kube-scheduler kubelet kube-proxy)
fi

mkdir -p "$CACHE"
missing=()
for c in "${components[@]}"; do
  [ -x "$CACHE/$c" ] || missing+=("$c")
done

if [ ${#missing[@]} -gt 0 ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/catena-k8s-build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  echo "building ${missing[*]} $K8S_VERSION into $CACHE (about 5-8 minutes cold)" >&2
  {
    echo "module catena-k8s-build"
    echo "go 1.26.0"
    echo "require k8s.io/kubernetes $K8S_VERSION"
    for m in api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider \
      cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api \
      cri-client csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms \
      kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics \
      mount-utils pod-security-admission sample-apiserver sample-cli-plugin sample-controller \
      streaming cri-streaming; do
      echo "replace k8s.io/$m => k8s.io/$m $STAGING_VERSION"
    done
  } >"$work/go.mod"
  {
    echo "//go:build tools"
    echo "package build"
    echo "import ("
    for c in "${missing[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
    echo ")"
  } >"$work/tools.go"
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=2026-01-01T00:00:00Z"
  done
  (cd "$work" && go mod tidy >/dev/null 2>&1 || go mod tidy)
  pkgs=()
  for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  (cd "$work" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$work/out/" "${pkgs[@]}")
  for c in "${missing[@]}"; do mv "$work/out/$c" "$CACHE/$c.tmp" && mv "$CACHE/$c.tmp" "$CACHE/$c"; done
fi

if [ ! -x "$CACHE/etcd" ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/catena-etcd-build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  echo "building etcd $ETCD_VERSION into $CACHE" >&2
  cat >"$work/go.mod" <<GOMOD
module catena-etcd-build
go 1.26.0
require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
  cat >"$work/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  (cd "$work" && go mod tidy >/dev/null 2>&1 || go mod tidy)
  (cd "$work" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$CACHE/etcd.tmp" .)
  mv "$CACHE/etcd.tmp" "$CACHE/etcd"
fi

echo "$CACHE"
