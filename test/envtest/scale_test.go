package envtest_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// The scale subresource: `kubectl scale` and a HorizontalPodAutoscaler
// change a ReplicaPool's replicas and an Aggregation's workers through it,
// within the same bounds as an edit of the spec.
var _ = Describe("The scale subresource", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	scaleTo := func(obj client.Object, n int32) error {
		var s autoscalingv1.Scale
		Expect(k8s.SubResource("scale").Get(ctx, obj, &s)).To(Succeed())
		s.Spec.Replicas = n
		return k8s.SubResource("scale").Update(ctx, obj, client.WithSubResourceBody(&s))
	}

	It("scales a ReplicaPool's replicas, and refuses what the spec refuses", func() {
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "scaled", "replicas: 3"))).To(Succeed())
		pool := &streamsv1alpha1.ReplicaPool{}
		Expect(k8s.Get(ctx, key(ns, "scaled"), pool)).To(Succeed())
		var s autoscalingv1.Scale
		Expect(k8s.SubResource("scale").Get(ctx, pool, &s)).To(Succeed())
		Expect(s.Spec.Replicas).To(Equal(int32(3)))

		Expect(scaleTo(pool, 5)).To(Succeed())
		Expect(k8s.Get(ctx, key(ns, "scaled"), pool)).To(Succeed())
		Expect(pool.Spec.Replicas).To(Equal(int32(5)))
		expectRejected(scaleTo(pool, 65), "spec.replicas")
		Expect(k8s.Get(ctx, key(ns, "scaled"), pool)).To(Succeed())
		Expect(pool.Spec.Replicas).To(Equal(int32(5)), "a refused scale changed nothing")
	})

	It("scales an Aggregation's workers", func() {
		Expect(k8s.Create(ctx, manifest(ns, "Aggregation", "counts", "source: orders\naggregates:\n- name: orders\n  function: Count"))).To(Succeed())
		agg := &streamsv1alpha1.Aggregation{}
		Expect(k8s.Get(ctx, key(ns, "counts"), agg)).To(Succeed())
		Expect(scaleTo(agg, 4)).To(Succeed())
		Expect(k8s.Get(ctx, key(ns, "counts"), agg)).To(Succeed())
		Expect(agg.Spec.Workers).To(Equal(int32(4)))
		expectRejected(scaleTo(agg, 0), "spec.workers")
	})
})
