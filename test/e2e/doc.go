// Package e2e holds the end-to-end suite: Catena's operator, installed
// with its Helm chart from the image built from this checkout, against a
// real Kubernetes node (hack/knode, or kind), with real replica pods on
// local persistent volumes. It kills and restarts replicas under produce
// load and checks, with `catenactl check` running in a pod, that no
// acknowledged record is lost, duplicated or reordered.
//
// The files are behind the e2e build tag, so `go test ./...` (make test)
// does not run them. One file per subject, e.g. stream_test.go (a Stream, its
// repairs, upgrades and restarts), validation_test.go (what the API server
// rejects); helpers_test.go and suite_test.go are shared.
//
// Run with `make test-e2e` (brings a cluster up and down), or against a
// running cluster:
//
//	KUBECONFIG=... CATENA_E2E_IMAGE=catena:TAG CATENA_E2E_CTR="ctr -a .../nodes/{node}/containerd/containerd.sock" \
//	  HELM=path/to/helm KUBECTL=path/to/kubectl go test -tags e2e ./test/e2e/ -ginkgo.v
package e2e
