package envtest_test

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/controllers"
)

// testImage is the replica image the operator under test puts in pods;
// envtest runs no pods, so it is never pulled.
const testImage = "catena:envtest"

// operatorTimeout bounds how long a spec waits for the operator to act.
const operatorTimeout = 30 * time.Second

// The operator's specs run a manager of their own, watching only the
// namespaces created for them: the API validation specs elsewhere in the
// suite create Streams and pools that no controller should touch.
var _ = Describe("Operator", Ordered, func() {
	var standaloneNS, sharedNS string

	BeforeAll(func() {
		standaloneNS, sharedNS = newNamespace(), newNamespace()
		startOperator(controllers.Options{Image: testImage, ImagePullSecrets: []string{"regcred"}}, standaloneNS, sharedNS)
	})

	It("gives a Stream applied alone its own pool, StatefulSet, Service, PDB, Partitions and chains", func() {
		ns := standaloneNS
		createSamples(ns, "stream-standalone.yaml")
		var stream streamsv1alpha1.Stream
		Expect(k8s.Get(ctx, key(ns, "events"), &stream)).To(Succeed())

		By("creating the Stream's own pool, owned by it, from its fields")
		var pool streamsv1alpha1.ReplicaPool
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "events-pool"), &pool)).To(Succeed())
		}).Should(Succeed())
		expectControlledBy(&pool, &stream)
		Expect(pool.Spec.Replicas).To(Equal(int32(3)))
		Expect(pool.Spec.Storage.Size.Cmp(resource.MustParse("50Gi"))).To(Equal(0), "storage %s", pool.Spec.Storage.Size.String())
		Expect(pool.Spec.Placement.NodeSpread).To(Equal(streamsv1alpha1.SpreadRequired))

		By("creating the pool's StatefulSet")
		var sts appsv1.StatefulSet
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "events-pool"), &sts)).To(Succeed())
		}).Should(Succeed())
		expectControlledBy(&sts, &pool)
		Expect(sts.Spec.Replicas).To(HaveValue(Equal(int32(3))))
		Expect(sts.Spec.ServiceName).To(Equal("events-pool"))
		Expect(sts.Spec.VolumeClaimTemplates).To(HaveLen(1))
		vct := sts.Spec.VolumeClaimTemplates[0]
		Expect(vct.Name).To(Equal("data"))
		Expect(vct.Spec.Resources.Requests.Storage().Cmp(resource.MustParse("50Gi"))).To(Equal(0))
		Expect(vct.Spec.StorageClassName).To(BeNil(), "no class: the cluster's default")

		pod := sts.Spec.Template.Spec
		Expect(pod.Affinity).NotTo(BeNil())
		Expect(pod.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution).To(HaveLen(1))
		Expect(pod.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey).To(Equal(corev1.LabelHostname))
		Expect(pod.TopologySpreadConstraints).To(HaveLen(1))
		Expect(pod.TopologySpreadConstraints[0].WhenUnsatisfiable).To(Equal(corev1.ScheduleAnyway))
		Expect(pod.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
		Expect(pod.ImagePullSecrets).To(Equal([]corev1.LocalObjectReference{{Name: "regcred"}}), "the operator's --image-pull-secrets")
		Expect(pod.Containers).To(HaveLen(1))
		c := pod.Containers[0]
		Expect(c.Image).To(Equal(testImage))
		Expect(c.Args).To(Equal([]string{"replica", "--id", "$(POD_NAME)", "--listen", ":7071", "--data-dir", "/data", "--metrics-listen", ":9090"}))
		Expect(c.Env).To(ContainElement(HaveField("ValueFrom.FieldRef.FieldPath", "metadata.name")))
		Expect(c.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
		Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
		Expect(c.SecurityContext.AllowPrivilegeEscalation).To(HaveValue(BeFalse()))
		Expect(c.SecurityContext.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")))
		Expect(c.ReadinessProbe.TCPSocket.Port).To(Equal(intstr.FromString("replica")))

		By("creating the headless Service and the PodDisruptionBudget")
		var svc corev1.Service
		Eventually(func(g Gomega) { g.Expect(k8s.Get(ctx, key(ns, "events-pool"), &svc)).To(Succeed()) }).Should(Succeed())
		expectControlledBy(&svc, &pool)
		Expect(svc.Spec.ClusterIP).To(Equal(corev1.ClusterIPNone))
		Expect(svc.Spec.PublishNotReadyAddresses).To(BeTrue())
		Expect(svc.Spec.Ports).To(ConsistOf(HaveField("Port", int32(7071))))
		var pdb policyv1.PodDisruptionBudget
		Eventually(func(g Gomega) { g.Expect(k8s.Get(ctx, key(ns, "events-pool"), &pdb)).To(Succeed()) }).Should(Succeed())
		expectControlledBy(&pdb, &pool)
		Expect(pdb.Spec.MaxUnavailable).To(HaveValue(Equal(intstr.FromInt32(1))))

		By("creating one Partition and one ReplicationChain per partition, owned by the Stream")
		for i := range int32(6) {
			name := streamsv1alpha1.PartitionName("events", i)
			var p streamsv1alpha1.Partition
			var chain streamsv1alpha1.ReplicationChain
			Eventually(func(g Gomega) {
				g.Expect(k8s.Get(ctx, key(ns, name), &p)).To(Succeed())
				g.Expect(k8s.Get(ctx, key(ns, name), &chain)).To(Succeed())
			}).Should(Succeed())
			expectControlledBy(&p, &stream)
			expectControlledBy(&chain, &stream)
			Expect(p.Spec.Index).To(HaveValue(Equal(i)))
			Expect(chain.Spec.Pool).To(Equal("events-pool"))
			Expect(chain.Spec.ReplicationFactor).To(Equal(int32(3)))
		}

		By("reporting status: the Stream has all its children, the pool is being created")
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "events"), &stream)).To(Succeed())
			g.Expect(stream.Status.ObservedGeneration).To(Equal(stream.Generation))
			g.Expect(stream.Status.Pool).To(Equal("events-pool"))
			// No replica answers here (the "Chain controller" specs run
			// real ones): the chains are placed, never confirmed.
			g.Expect(meta.FindStatusCondition(stream.Status.Conditions, streamsv1alpha1.StreamProgressingCondition)).To(And(
				HaveField("Status", metav1.ConditionTrue), HaveField("Reason", streamsv1alpha1.StreamReconfiguringReason)))
			// No pods run in envtest, so the pool never becomes ready.
			g.Expect(meta.FindStatusCondition(stream.Status.Conditions, streamsv1alpha1.StreamReadyCondition)).To(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", streamsv1alpha1.StreamPoolNotReadyReason)))
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "events-pool"), &pool)).To(Succeed())
			g.Expect(pool.Status.ObservedGeneration).To(Equal(pool.Generation))
			g.Expect(meta.FindStatusCondition(pool.Status.Conditions, streamsv1alpha1.ReplicaPoolProgressingCondition)).To(And(
				HaveField("Status", metav1.ConditionTrue), HaveField("Reason", streamsv1alpha1.ReplicaPoolCreatingReason)))
			g.Expect(meta.FindStatusCondition(pool.Status.Conditions, streamsv1alpha1.ReplicaPoolReadyCondition)).To(
				HaveField("Status", metav1.ConditionFalse))
		}).Should(Succeed())
	})

	It("applies a pool's storage class and takes back fields changed by hand", func() {
		ns := standaloneNS
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "classy", `
replicas: 2
storage:
  size: 20Gi
  storageClassName: local-nvme
placement:
  nodeSpread: Preferred
  zoneSpread: None`))).To(Succeed())
		var sts appsv1.StatefulSet
		Eventually(func(g Gomega) { g.Expect(k8s.Get(ctx, key(ns, "classy"), &sts)).To(Succeed()) }).Should(Succeed())
		Expect(sts.Spec.Replicas).To(HaveValue(Equal(int32(2))))
		Expect(sts.Spec.VolumeClaimTemplates[0].Spec.StorageClassName).To(HaveValue(Equal("local-nvme")))
		Expect(sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().Cmp(resource.MustParse("20Gi"))).To(Equal(0))
		Expect(sts.Spec.Template.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution).To(BeEmpty())
		Expect(sts.Spec.Template.Spec.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution).To(HaveLen(1))
		Expect(sts.Spec.Template.Spec.TopologySpreadConstraints).To(BeEmpty())

		By("scaling the StatefulSet by hand, which the operator undoes")
		patch := client.MergeFrom(sts.DeepCopy())
		sts.Spec.Replicas = ptr.To[int32](7)
		Expect(k8s.Patch(ctx, &sts, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "classy"), &sts)).To(Succeed())
			g.Expect(sts.Spec.Replicas).To(HaveValue(Equal(int32(2))))
		}).Should(Succeed())

		By("scaling the pool, which the StatefulSet follows")
		var pool streamsv1alpha1.ReplicaPool
		Expect(k8s.Get(ctx, key(ns, "classy"), &pool)).To(Succeed())
		poolPatch := client.MergeFrom(pool.DeepCopy())
		pool.Spec.Replicas = 4
		Expect(k8s.Patch(ctx, &pool, poolPatch)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "classy"), &sts)).To(Succeed())
			g.Expect(sts.Spec.Replicas).To(HaveValue(Equal(int32(4))))
		}).Should(Succeed())
	})

	It("hosts two Streams on one shared ReplicaPool with one StatefulSet", func() {
		ns := sharedNS
		createSamples(ns, "shared-pool.yaml")

		for _, s := range []struct {
			name       string
			partitions int32
		}{{"orders", 12}, {"clicks", 24}} {
			var stream streamsv1alpha1.Stream
			Expect(k8s.Get(ctx, key(ns, s.name), &stream)).To(Succeed())
			Eventually(func(g Gomega) {
				var chains streamsv1alpha1.ReplicationChainList
				g.Expect(k8s.List(ctx, &chains, client.InNamespace(ns))).To(Succeed())
				var mine []streamsv1alpha1.ReplicationChain
				for _, c := range chains.Items {
					if c.Spec.Stream == s.name {
						mine = append(mine, c)
					}
				}
				g.Expect(mine).To(HaveLen(int(s.partitions)))
				for i := range mine {
					g.Expect(mine[i].Spec.Pool).To(Equal("shared"))
					g.Expect(metav1.IsControlledBy(&mine[i], &stream)).To(BeTrue(), "chain %s", mine[i].Name)
				}
			}).Should(Succeed())
			Eventually(func(g Gomega) {
				var parts streamsv1alpha1.PartitionList
				g.Expect(k8s.List(ctx, &parts, client.InNamespace(ns))).To(Succeed())
				n := 0
				for i := range parts.Items {
					if parts.Items[i].Spec.Stream == s.name {
						g.Expect(metav1.IsControlledBy(&parts.Items[i], &stream)).To(BeTrue())
						n++
					}
				}
				g.Expect(n).To(Equal(int(s.partitions)))
			}).Should(Succeed())
			Eventually(func(g Gomega) {
				g.Expect(k8s.Get(ctx, key(ns, s.name), &stream)).To(Succeed())
				g.Expect(stream.Status.Pool).To(Equal("shared"))
				g.Expect(stream.Status.ObservedGeneration).To(Equal(stream.Generation))
				// Every child exists; no replica answers here, so the
				// chains are placed and wait for confirmation.
				g.Expect(meta.FindStatusCondition(stream.Status.Conditions, streamsv1alpha1.StreamProgressingCondition)).To(
					HaveField("Reason", streamsv1alpha1.StreamReconfiguringReason))
			}).Should(Succeed())
		}

		By("creating exactly one StatefulSet and no pool of either Stream's own")
		Eventually(func(g Gomega) {
			var list appsv1.StatefulSetList
			g.Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
			g.Expect(list.Items).To(ConsistOf(HaveField("ObjectMeta.Name", "shared")))
			g.Expect(list.Items[0].Spec.Replicas).To(HaveValue(Equal(int32(5))))
		}).Should(Succeed())
		var pools streamsv1alpha1.ReplicaPoolList
		Expect(k8s.List(ctx, &pools, client.InNamespace(ns))).To(Succeed())
		Expect(pools.Items).To(ConsistOf(HaveField("ObjectMeta.Name", "shared")))
		Expect(pools.Items[0].OwnerReferences).To(BeEmpty(), "a shared pool belongs to its user, not to a Stream")

		By("counting the Streams and chains on the pool")
		Eventually(func(g Gomega) {
			var pool streamsv1alpha1.ReplicaPool
			g.Expect(k8s.Get(ctx, key(ns, "shared"), &pool)).To(Succeed())
			g.Expect(pool.Status.Streams).To(Equal(int32(2)))
			g.Expect(pool.Status.Chains).To(Equal(int32(12 + 24)))
			g.Expect(meta.FindStatusCondition(pool.Status.Conditions, streamsv1alpha1.ReplicaPoolDegradedCondition)).To(BeNil())
		}).Should(Succeed())
	})

	It("reports a Stream whose shared pool does not exist, and recovers when it appears", func() {
		ns := sharedNS
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "orphan", "pool: later\npartitions: 1"))).To(Succeed())
		var stream streamsv1alpha1.Stream
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "orphan"), &stream)).To(Succeed())
			g.Expect(meta.FindStatusCondition(stream.Status.Conditions, streamsv1alpha1.StreamDegradedCondition)).To(And(
				HaveField("Status", metav1.ConditionTrue), HaveField("Reason", streamsv1alpha1.StreamPoolNotFoundReason)))
		}).Should(Succeed())

		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "later", "replicas: 3"))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "orphan"), &stream)).To(Succeed())
			g.Expect(meta.FindStatusCondition(stream.Status.Conditions, streamsv1alpha1.StreamDegradedCondition)).To(BeNil())
			g.Expect(meta.FindStatusCondition(stream.Status.Conditions, streamsv1alpha1.StreamReadyCondition)).To(
				HaveField("Reason", streamsv1alpha1.StreamPoolNotReadyReason))
		}).Should(Succeed())
	})

	It("reports a Stream with longer chains than its shared pool has pods, on both", func() {
		ns := sharedNS
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "small", "replicas: 1"))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "wide", "pool: small\npartitions: 2\nreplicationFactor: 2"))).To(Succeed())
		Eventually(func(g Gomega) {
			var stream streamsv1alpha1.Stream
			g.Expect(k8s.Get(ctx, key(ns, "wide"), &stream)).To(Succeed())
			g.Expect(meta.FindStatusCondition(stream.Status.Conditions, streamsv1alpha1.StreamDegradedCondition)).To(And(
				HaveField("Status", metav1.ConditionTrue), HaveField("Reason", streamsv1alpha1.StreamReplicationFactorExceedsPoolReason)))
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			var pool streamsv1alpha1.ReplicaPool
			g.Expect(k8s.Get(ctx, key(ns, "small"), &pool)).To(Succeed())
			g.Expect(meta.FindStatusCondition(pool.Status.Conditions, streamsv1alpha1.ReplicaPoolDegradedCondition)).To(And(
				HaveField("Status", metav1.ConditionTrue), HaveField("Reason", streamsv1alpha1.ReplicaPoolReplicationFactorExceedsReplicasReason),
				HaveField("Message", ContainSubstring("wide"))))
		}).Should(Succeed())
	})
})

// createSamples creates every object of a file in config/samples in ns.
func createSamples(ns, file string) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "config", "samples", file))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	for _, doc := range strings.Split(string(data), "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		obj := fromYAML(doc)
		obj.SetNamespace(ns)
		ExpectWithOffset(1, k8s.Create(ctx, obj)).To(Succeed(), "%s: %s %s", file, obj.GetKind(), obj.GetName())
	}
}

func key(ns, name string) types.NamespacedName {
	return types.NamespacedName{Namespace: ns, Name: name}
}

// expectControlledBy asserts that owner is obj's controller, so that
// deleting owner deletes obj.
func expectControlledBy(obj, owner metav1.Object) {
	ExpectWithOffset(1, metav1.IsControlledBy(obj, owner)).To(BeTrue(),
		"%s is not controlled by %s; owners: %v", obj.GetName(), owner.GetName(), obj.GetOwnerReferences())
}
