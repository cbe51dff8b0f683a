package envtest_test

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/controllers"
)

var _ = Describe("ReplicaPool", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("accepts an empty ReplicaPool and applies the defaults", func() {
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "defaults", `{}`))).To(Succeed())

		var p streamsv1alpha1.ReplicaPool
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "defaults"}, &p)).To(Succeed())
		Expect(p.Spec.Replicas).To(Equal(streamsv1alpha1.DefaultReplicas))
		Expect(p.Spec.Storage.Size.Equal(resource.MustParse(streamsv1alpha1.DefaultStorageSize))).To(BeTrue(),
			"storage.size defaulted to %s", p.Spec.Storage.Size.String())
		Expect(p.Spec.Placement.NodeSpread).To(Equal(streamsv1alpha1.DefaultNodeSpread))
		Expect(p.Spec.Placement.ZoneSpread).To(Equal(streamsv1alpha1.DefaultZoneSpread))

		// A Stream's own pool gets the same defaults from SetDefaults.
		var own streamsv1alpha1.ReplicaPoolSpec
		own.SetDefaults()
		Expect(own.Replicas).To(Equal(p.Spec.Replicas))
		Expect(own.Storage.Size.Equal(p.Spec.Storage.Size)).To(BeTrue())
		Expect(own.Placement).To(Equal(p.Spec.Placement))
	})

	It("keeps the journal on once it is on", func() {
		p := manifest(ns, "ReplicaPool", "journaled", `journal: false`)
		Expect(k8s.Create(ctx, p)).To(Succeed())
		var stored streamsv1alpha1.ReplicaPool
		key := types.NamespacedName{Namespace: ns, Name: "journaled"}
		Expect(k8s.Get(ctx, key, &stored)).To(Succeed())
		stored.Spec.Journal = true
		Expect(k8s.Update(ctx, &stored)).To(Succeed())
		Expect(k8s.Get(ctx, key, &stored)).To(Succeed())
		stored.Spec.Journal = false
		expectRejected(k8s.Update(ctx, &stored), "journal cannot be turned off once on")
		Expect(k8s.Get(ctx, key, &stored)).To(Succeed())
		Expect(stored.Spec.Journal).To(BeTrue())
	})

	It("accepts a ReplicaPool with the longest name", func() {
		name := "p" + strings.Repeat("x", streamsv1alpha1.MaxReplicaPoolNameLength-1)
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", name, `replicas: 5`))).To(Succeed())
	})

	DescribeTable("rejects an invalid ReplicaPool",
		func(name, spec, message string) {
			p := manifest(ns, "ReplicaPool", name, spec)
			expectRejected(k8s.Create(ctx, p), message)
			expectAbsent(p)
		},
		Entry("zero replicas", "zero", `replicas: 0`,
			"spec.replicas in body should be greater than or equal to 1"),
		Entry("too many replicas", "many", `replicas: 65`,
			"spec.replicas in body should be less than or equal to 64"),
		Entry("a storage size that is not a quantity", "bad-size", `storage: {size: 10 gigs}`,
			"size must be a quantity of at least 1Gi, such as 10Gi or 500Gi"),
		Entry("a storage size below the minimum", "small-size", `storage: {size: 512Mi}`,
			"size must be a quantity of at least 1Gi, such as 10Gi or 500Gi"),
		Entry("a name too long for its StatefulSet", "p"+strings.Repeat("x", streamsv1alpha1.MaxReplicaPoolNameLength), `{}`,
			"ReplicaPool names must be at most 52 characters"),
		Entry("a name that cannot name a Service", "9lives", `{}`,
			"ReplicaPool names must start with a letter"),
		Entry("an unknown spread policy", "bad-spread", `placement: {nodeSpread: Always}`,
			`spec.placement.nodeSpread: Unsupported value: "Always"`),
		Entry("a negative catch-up rate", "bad-rate", `catchUpMiBPerSecond: -1`,
			"spec.catchUpMiBPerSecond in body should be greater than or equal to 0"),
	)

	DescribeTable("rejects an invalid change to a ReplicaPool, keeping what was stored",
		func(spec, path, value, message string) {
			p := manifest(ns, "ReplicaPool", "changed", spec)
			Expect(k8s.Create(ctx, p)).To(Succeed())
			stored := get(p)
			before := field(stored, path)

			set(stored, path, value)
			expectRejected(k8s.Update(ctx, stored), message)
			expectField(get(p), path, before)
		},
		Entry("shrinking storage", `storage: {size: 100Gi}`, "spec.storage.size", "50Gi",
			"size may grow but not shrink"),
		Entry("changing the storage class", `storage: {storageClassName: fast}`, "spec.storage.storageClassName", "slow",
			"storageClassName is immutable"),
		Entry("setting a storage class", `{}`, "spec.storage.storageClassName", "slow",
			"storageClassName is immutable"),
	)
})

// With --network-policies the operator gives each pool a NetworkPolicy the
// API server accepts: the replica port for the pool's pods, ingestion and
// the operator; metrics for anyone.
var _ = Describe("ReplicaPool with network policies", func() {
	It("restricts who reaches the replica port", func() {
		ns := newNamespace()
		operatorLabels := map[string]string{"app.kubernetes.io/name": "catena", "app.kubernetes.io/component": "operator"}
		startOperator(controllers.Options{Image: testImage, NetworkPolicy: &controllers.NetworkPolicyOptions{
			OperatorNamespace: "catena-system", OperatorPodLabels: operatorLabels}}, ns)
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "guarded", `replicas: 3`))).To(Succeed())
		var np networkingv1.NetworkPolicy
		Eventually(func() error { return k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "guarded"}, &np) }).
			WithTimeout(operatorTimeout).Should(Succeed())
		var pool streamsv1alpha1.ReplicaPool
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "guarded"}, &pool)).To(Succeed())
		Expect(metav1.IsControlledBy(&np, &pool)).To(BeTrue())
		var sts appsv1.StatefulSet
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: pool.StatefulSetName()}, &sts)).To(Succeed())
		Expect(np.Spec.PodSelector.MatchLabels).To(Equal(sts.Spec.Selector.MatchLabels))
		Expect(np.Spec.PolicyTypes).To(Equal([]networkingv1.PolicyType{networkingv1.PolicyTypeIngress}))
		Expect(np.Spec.Ingress).To(HaveLen(2))
		Expect(np.Spec.Ingress[0].Ports[0].Port.IntValue()).To(Equal(7071))
		Expect(np.Spec.Ingress[0].From).To(ContainElement(networkingv1.NetworkPolicyPeer{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "catena-system"}},
			PodSelector:       &metav1.LabelSelector{MatchLabels: operatorLabels},
		}))
		Expect(np.Spec.Ingress[1].Ports[0].Port.IntValue()).To(Equal(9090))
		Expect(np.Spec.Ingress[1].From).To(BeEmpty())
	})
})
