#!/usr/bin/env bash
# Makes the node's PKI with openssl, once: a CA, the API server's serving
# certificate, client certificates for the admin, the controller manager,
# the scheduler, kube-proxy and the kubelet, the kubelet's serving
# certificate and the service-account key pair; and a kubeconfig for each
# client. Kept in $STATE/pki until `down` removes the state.
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
  "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,DNS:$NODE_NAME,IP:127.0.0.1,IP:$NODE_IP,IP:$SERVICE_IP"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
cert admin "/O=system:masters/CN=kubernetes-admin" clientAuth
cert controller-manager "/CN=system:kube-controller-manager" clientAuth
cert scheduler "/CN=system:kube-scheduler" clientAuth
cert kube-proxy "/CN=system:kube-proxy" clientAuth
cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
cert kubelet-serving "/O=system:nodes/CN=system:node:$NODE_NAME" serverAuth \
  "DNS:$NODE_NAME,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP"

# kubeconfig NAME CERT: embedded certificates, so the file works on its own.
kubeconfig() {
  cat >"$STATE/$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: catena-knode
  cluster:
    certificate-authority-data: $(base64 -w0 ca.crt)
    server: https://127.0.0.1:$APISERVER_PORT
users:
- name: $1
  user:
    client-certificate-data: $(base64 -w0 "$2.crt")
    client-key-data: $(base64 -w0 "$2.key")
contexts:
- name: catena-knode
  context: {cluster: catena-knode, user: $1}
current-context: catena-knode
KC
  chmod 600 "$STATE/$1.kubeconfig"
}
kubeconfig admin admin
kubeconfig controller-manager controller-manager
kubeconfig scheduler scheduler
kubeconfig kube-proxy kube-proxy
kubeconfig kubelet kubelet
