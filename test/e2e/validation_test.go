//go:build e2e

package e2e_test

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// What a user applying a bad manifest sees: kubectl's error carrying the
// API server's message for the rule the object breaks. The same rules are
// tested in depth by test/envtest; here it is the installed chart's CRDs on
// a real cluster, through kubectl.
var _ = Describe("kubectl apply of an invalid resource", Ordered, func() {
	var ns string
	BeforeAll(func() { ns = newNamespace("e2e-invalid") })

	DescribeTable("is rejected by the API server with a clear message",
		func(kind, name, spec, message string) {
			manifest := fmt.Sprintf("apiVersion: streams.catena.io/v1alpha1\nkind: %s\nmetadata:\n  name: %s\nspec:\n%s\n", kind, name, spec)
			out, err := kubectlApply(ns, manifest)
			Expect(err).To(HaveOccurred(), "kubectl apply accepted:\n%s", manifest)
			Expect(out).To(ContainSubstring(message))
		},
		Entry("a Stream with replicationFactor 0", "Stream", "rf-zero",
			"  partitions: 3\n  replicationFactor: 0",
			"spec.replicationFactor in body should be greater than or equal to 1"),
		Entry("a Stream whose minChainLength exceeds its replicationFactor", "Stream", "minlen",
			"  partitions: 3\n  replicationFactor: 2\n  minChainLength: 3",
			"minChainLength must not exceed replicationFactor"),
		Entry("a Stream whose replicationFactor exceeds its own pool", "Stream", "rf-pool",
			"  partitions: 3\n  replicationFactor: 4\n  replicas: 3",
			"replicationFactor must not exceed replicas"),
		Entry("a Stream without partitions", "Stream", "no-partitions",
			"  replicationFactor: 3",
			"spec.partitions: Required value"),
		Entry("a ReplicaPool with a volume below 1Gi", "ReplicaPool", "tiny",
			"  storage:\n    size: 100Mi",
			"size must be a quantity of at least 1Gi"),
	)
})
