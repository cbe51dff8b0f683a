#!/usr/bin/env bash
# Makes the cluster's PKI with openssl, once: a CA, the API server's serving
# certificate, client certificates for the admin, the controller manager,
# the scheduler and kube-proxy, and the service-account key pair; and a
# kubeconfig for each client. Kept in $STATE/pki until `down` removes the
# state.
#
#   gen-certs.sh          the control plane's
#   gen-certs.sh node N   node N's: the kubelet's client and serving
#                         certificates, and its kubeconfig
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"

mkdir -p "$PKI"
cd "$PKI"
if [ ! -f ca.crt ]; then
  openssl genrsa -out ca.key 2048 2>/dev/null
  openssl req -x509 -new -nodes -key ca.key -subj "/CN=catena-knode-ca" -days 3650 -out ca.crt 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
fi

# cert FILE SUBJECT EXTENDED-KEY-USAGE [SUBJECT-ALT-NAMES]
cert() {
  [ -f "$1.crt" ] && return 0
  openssl genrsa -out "$1.key" 2048 2>/dev/null
  openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$3"
    if [ -n "${4:-}" ]; then echo "subjectAltName=$4"; fi
  } >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
cert apiserver "/CN=kube-apiserver" serverAuth \
  "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$BRIDGE_IP,IP:$SERVICE_IP"

# kubeconfig FILE CERT [SERVER]: embedded certificates, so the file works on
# its own. Processes on this machine's own network reach the API server on
# loopback; those in a node's namespace reach it on the bridge.
kubeconfig() {
  cat >"$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: catena-knode
  cluster:
    certificate-authority-data: $(base64 -w0 ca.crt)
    server: https://${3:-127.0.0.1}:$APISERVER_PORT
users:
- name: ${2##*/}
  user:
    client-certificate-data: $(base64 -w0 "$2.crt")
    client-key-data: $(base64 -w0 "$2.key")
contexts:
- name: catena-knode
  context: {cluster: catena-knode, user: ${2##*/}}
current-context: catena-knode
KC
  chmod 600 "$1"
}

if [ "${1:-}" = node ]; then
  i=${2:?usage: gen-certs.sh node N}
  name=$(node_name "$i") ip=$(node_ip "$i")
  mkdir -p "$PKI/$name"
  cert "$name/kubelet" "/O=system:nodes/CN=system:node:$name" clientAuth
  cert "$name/kubelet-serving" "/O=system:nodes/CN=system:node:$name" serverAuth \
    "DNS:$name,DNS:localhost,IP:127.0.0.1,IP:$ip"
  kubeconfig "$(node_dir "$i")/kubelet.kubeconfig" "$name/kubelet" "$BRIDGE_IP"
  exit 0
fi

cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
cert admin "/O=system:masters/CN=kubernetes-admin" clientAuth
cert controller-manager "/CN=system:kube-controller-manager" clientAuth
cert scheduler "/CN=system:kube-scheduler" clientAuth
cert kube-proxy "/CN=system:kube-proxy" clientAuth
kubeconfig "$STATE/admin.kubeconfig" admin
kubeconfig "$STATE/controller-manager.kubeconfig" controller-manager
kubeconfig "$STATE/scheduler.kubeconfig" scheduler
kubeconfig "$STATE/kube-proxy.kubeconfig" kube-proxy "$BRIDGE_IP"
