// Package envtest holds the tests that run against a real kube-apiserver
// and etcd (controller-runtime's envtest) with Catena's CRDs installed: the
// API server accepts valid ReplicaPools and Streams, applies their defaults,
// and rejects invalid ones with the message of the rule they break.
//
// The binaries come from KUBEBUILDER_ASSETS or, when it is unset, from
// hack/k8s-binaries.sh, which builds them once into a cache outside the
// checkout (minutes cold, instant after).
//
// Run with: go test ./test/envtest/...
package envtest
