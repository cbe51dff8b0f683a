package envtest_test

import (
	"context"
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/controllers"
)

// The Stream's ingestion tier and volume reclaim policy, against a manager
// of their own watching only the namespaces made for them. It runs the
// Stream and ReplicaPool reconcilers only: these specs stand in for the
// data plane by writing the status of StatefulSets, Deployments and
// Partitions themselves, which a chain controller would contend with.
var _ = Describe("Stream ingestion and volumes", Ordered, func() {
	var ingestNS, volumesNS string
	var operatorCache cache.Cache

	BeforeAll(func() {
		ingestNS, volumesNS = newNamespace(), newNamespace()
		mgr := startManager(func(mgrCtx context.Context, mgr ctrl.Manager) error {
			pools := &controllers.ReplicaPoolReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Image: testImage}
			if err := pools.SetupWithManager(mgr); err != nil {
				return err
			}
			streams := &controllers.StreamReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Image: testImage}
			return streams.SetupWithManager(mgrCtx, mgr)
		}, ingestNS, volumesNS)
		operatorCache = mgr.GetCache()
	})

	It("runs a Stream's ingestion Deployment and Service and reports them", func() {
		ns := ingestNS
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "ingested", `
partitions: 2
ingestion:
  replicas: 3
  resources: {requests: {cpu: 100m}}`))).To(Succeed())
		var stream streamsv1alpha1.Stream
		Expect(k8s.Get(ctx, key(ns, "ingested"), &stream)).To(Succeed())

		By("creating the ingestion Deployment, pointed at every pod of the Stream's pool")
		var deploy appsv1.Deployment
		Eventually(func(g Gomega) { g.Expect(k8s.Get(ctx, key(ns, "ingested-ingest"), &deploy)).To(Succeed()) }).Should(Succeed())
		expectControlledBy(&deploy, &stream)
		Expect(deploy.Spec.Replicas).To(HaveValue(Equal(int32(3))))
		Expect(deploy.Spec.Template.Spec.Containers).To(HaveLen(1))
		c := deploy.Spec.Template.Spec.Containers[0]
		Expect(c.Image).To(Equal(testImage))
		Expect(c.Args).To(Equal([]string{"ingest", "--listen=:7070", "--replicas=" + replicaList(ns, "ingested-pool", 3), "--metrics-listen=:9090"}))
		Expect(c.Resources.Requests.Cpu().Cmp(resource.MustParse("100m"))).To(Equal(0))
		Expect(c.Ports).To(ConsistOf(And(HaveField("Name", "grpc"), HaveField("ContainerPort", int32(7070))),
			And(HaveField("Name", "metrics"), HaveField("ContainerPort", int32(9090)))))
		Expect(c.ReadinessProbe.TCPSocket.Port).To(Equal(intstr.FromString("grpc")))
		Expect(c.LivenessProbe.TCPSocket.Port).To(Equal(intstr.FromString("grpc")))
		Expect(c.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
		Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
		Expect(c.SecurityContext.AllowPrivilegeEscalation).To(HaveValue(BeFalse()))
		Expect(c.SecurityContext.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")))
		pod := deploy.Spec.Template.Spec
		Expect(pod.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
		Expect(pod.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
		Expect(pod.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution).To(ConsistOf(
			HaveField("PodAffinityTerm.TopologyKey", corev1.LabelHostname)))
		Expect(pod.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution).To(BeEmpty())

		By("creating the ClusterIP Service selecting the ingestion pods, and their PodDisruptionBudget")
		var svc corev1.Service
		Eventually(func(g Gomega) { g.Expect(k8s.Get(ctx, key(ns, "ingested"), &svc)).To(Succeed()) }).Should(Succeed())
		expectControlledBy(&svc, &stream)
		Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeClusterIP))
		Expect(svc.Spec.ClusterIP).NotTo(Equal(corev1.ClusterIPNone))
		Expect(svc.Spec.Ports).To(ConsistOf(And(HaveField("Name", "grpc"), HaveField("Port", int32(7070)),
			HaveField("TargetPort", intstr.FromString("grpc")))))
		Expect(labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(deploy.Spec.Template.Labels))).To(BeTrue(),
			"Service selector %v, pod labels %v", svc.Spec.Selector, deploy.Spec.Template.Labels)
		var pdb policyv1.PodDisruptionBudget
		Eventually(func(g Gomega) { g.Expect(k8s.Get(ctx, key(ns, "ingested-ingest"), &pdb)).To(Succeed()) }).Should(Succeed())
		expectControlledBy(&pdb, &stream)
		Expect(pdb.Spec.MaxUnavailable).To(HaveValue(Equal(intstr.FromInt32(1))))

		By("reporting the endpoints, with every child present")
		endpoint := fmt.Sprintf("ingested.%s.svc:7070", ns)
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "ingested"), &stream)).To(Succeed())
			g.Expect(stream.Status.Endpoints.Producers).To(Equal(endpoint))
			g.Expect(stream.Status.Endpoints.Consumers).To(Equal(endpoint))
			g.Expect(meta.FindStatusCondition(stream.Status.Conditions, streamsv1alpha1.StreamProgressingCondition)).To(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", streamsv1alpha1.StreamUpToDateReason)))
		}).Should(Succeed())

		By("holding Ready back on the ingestion once the pool and partitions are ready")
		markStatefulSetReady(ns, "ingested-pool")
		for i := range int32(2) {
			markPartitionReady(ns, streamsv1alpha1.PartitionName("ingested", i))
		}
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "ingested"), &stream)).To(Succeed())
			g.Expect(meta.FindStatusCondition(stream.Status.Conditions, streamsv1alpha1.StreamReadyCondition)).To(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", streamsv1alpha1.StreamIngestionNotReadyReason)))
		}).Should(Succeed())

		By("reporting Ready once an ingestion pod is available")
		// No kube-controller-manager runs here: write what the Deployment
		// controller would.
		markDeploymentAvailable(ns, "ingested-ingest", 1)
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "ingested"), &stream)).To(Succeed())
			g.Expect(stream.IsReady()).To(BeTrue(), "conditions: %+v", stream.Status.Conditions)
		}).Should(Succeed())

		By("following the pool when the Stream's own pool grows")
		patch := client.MergeFrom(stream.DeepCopy())
		stream.Spec.Replicas = ptr.To[int32](4)
		Expect(k8s.Patch(ctx, &stream, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "ingested-ingest"), &deploy)).To(Succeed())
			g.Expect(deploy.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--replicas=" + replicaList(ns, "ingested-pool", 4)))
		}).Should(Succeed())
	})

	It("exposes ingestion outside the cluster on a node port, reports the address, and takes it away", func() {
		ns := ingestNS
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "outside", `
partitions: 1
ingestion:
  external: {type: NodePort, advertisedHost: ingest.example.com, annotations: {team: shop}}`))).To(Succeed())
		var stream streamsv1alpha1.Stream
		Expect(k8s.Get(ctx, key(ns, "outside"), &stream)).To(Succeed())

		By("creating a NodePort Service in front of the ingestion pods")
		var svc corev1.Service
		Eventually(func(g Gomega) { g.Expect(k8s.Get(ctx, key(ns, "outside-external"), &svc)).To(Succeed()) }).Should(Succeed())
		expectControlledBy(&svc, &stream)
		Expect(svc.Spec.Type).To(Equal(corev1.ServiceTypeNodePort))
		Expect(svc.Annotations).To(HaveKeyWithValue("team", "shop"))
		Expect(svc.Spec.Ports).To(HaveLen(1))
		nodePort := svc.Spec.Ports[0].NodePort
		Expect(nodePort).To(BeNumerically(">=", 30000), "the API server gives a node port")
		var deploy appsv1.Deployment
		Eventually(func(g Gomega) { g.Expect(k8s.Get(ctx, key(ns, "outside-ingest"), &deploy)).To(Succeed()) }).Should(Succeed())
		Expect(labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(deploy.Spec.Template.Labels))).To(BeTrue())

		By("reporting the advertised host with that port")
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "outside"), &stream)).To(Succeed())
			g.Expect(stream.Status.Endpoints.External).To(Equal(fmt.Sprintf("ingest.example.com:%d", nodePort)))
		}).Should(Succeed())

		By("reporting the node of a ready ingestion pod when no host is advertised")
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "outside-ingest-0", Labels: deploy.Spec.Template.Labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "ingest", Image: testImage}}},
		}
		Expect(k8s.Create(ctx, pod)).To(Succeed())
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "10.1.2.3", Conditions: []corev1.PodCondition{{
			Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now(),
		}}}
		Expect(k8s.Status().Update(ctx, pod)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "outside"), &stream)).To(Succeed())
			stream.Spec.Ingestion.External.AdvertisedHost = ""
			g.Expect(k8s.Update(ctx, &stream)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "outside"), &stream)).To(Succeed())
			g.Expect(stream.Status.Endpoints.External).To(Equal(fmt.Sprintf("10.1.2.3:%d", nodePort)))
		}).Should(Succeed())

		By("deleting the Service once the listener is removed")
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "outside"), &stream)).To(Succeed())
			stream.Spec.Ingestion.External = nil
			g.Expect(k8s.Update(ctx, &stream)).To(Succeed())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			err := k8s.Get(ctx, key(ns, "outside-external"), &svc)
			g.Expect(apierrors.IsNotFound(err) || !svc.DeletionTimestamp.IsZero()).To(BeTrue(), "the external Service: %v", err)
			g.Expect(k8s.Get(ctx, key(ns, "outside"), &stream)).To(Succeed())
			g.Expect(stream.Status.Endpoints.External).To(BeEmpty())
		}).Should(Succeed())
	})

	It("deletes the volumes of a Stream whose volumeReclaimPolicy is Delete, then lets it go", func() {
		ns := volumesNS
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "doomed", "partitions: 1\nvolumeReclaimPolicy: Delete"))).To(Succeed())
		var stream streamsv1alpha1.Stream
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "doomed"), &stream)).To(Succeed())
			g.Expect(stream.Finalizers).To(ContainElement(streamsv1alpha1.VolumesFinalizer))
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			var pool streamsv1alpha1.ReplicaPool
			g.Expect(k8s.Get(ctx, key(ns, "doomed-pool"), &pool)).To(Succeed())
		}).Should(Succeed())

		// What the StatefulSet controller would make from the pool's
		// volumeClaimTemplates, and a claim of another pool beside them.
		claims := []*corev1.PersistentVolumeClaim{
			replicaClaim(ns, "doomed-pool", 0), replicaClaim(ns, "doomed-pool", 1),
		}
		bystander := replicaClaim(ns, "other-pool", 0)
		for _, pvc := range append(claims, bystander) {
			Expect(k8s.Create(ctx, pvc)).To(Succeed())
		}
		waitForCachedClaims(operatorCache, ns, 3)

		Expect(k8s.Delete(ctx, &stream)).To(Succeed())
		Eventually(func(g Gomega) {
			err := k8s.Get(ctx, key(ns, "doomed"), &stream)
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the Stream is still there: %v, finalizers %v", err, stream.Finalizers)
		}).Should(Succeed())
		for _, pvc := range claims {
			// The API server's pvc-protection admission holds every claim
			// with a finalizer that only kube-controller-manager removes:
			// here a deleted claim keeps its deletionTimestamp for ever.
			var got corev1.PersistentVolumeClaim
			err := k8s.Get(ctx, client.ObjectKeyFromObject(pvc), &got)
			if !apierrors.IsNotFound(err) {
				Expect(err).NotTo(HaveOccurred())
				Expect(got.DeletionTimestamp).NotTo(BeNil(), "claim %s was not deleted", pvc.Name)
			}
		}
		var other corev1.PersistentVolumeClaim
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(bystander), &other)).To(Succeed())
		Expect(other.DeletionTimestamp).To(BeNil(), "the claim of another pool was deleted")
	})

	It("keeps the volumes of a Stream whose volumeReclaimPolicy is Retain", func() {
		ns := volumesNS
		By("dropping the finalizer when the policy changes from Delete to Retain")
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "kept", "partitions: 1\nvolumeReclaimPolicy: Delete"))).To(Succeed())
		var stream streamsv1alpha1.Stream
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "kept"), &stream)).To(Succeed())
			g.Expect(stream.Finalizers).To(ContainElement(streamsv1alpha1.VolumesFinalizer))
		}).Should(Succeed())
		patch := client.MergeFrom(stream.DeepCopy())
		stream.Spec.VolumeReclaimPolicy = streamsv1alpha1.VolumeReclaimRetain
		Expect(k8s.Patch(ctx, &stream, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "kept"), &stream)).To(Succeed())
			g.Expect(stream.Finalizers).NotTo(ContainElement(streamsv1alpha1.VolumesFinalizer))
			g.Expect(stream.Status.ObservedGeneration).To(Equal(stream.Generation))
		}).Should(Succeed())

		By("leaving the claims behind when the Stream is deleted")
		claims := []*corev1.PersistentVolumeClaim{replicaClaim(ns, "kept-pool", 0), replicaClaim(ns, "kept-pool", 1)}
		for _, pvc := range claims {
			Expect(k8s.Create(ctx, pvc)).To(Succeed())
		}
		Expect(k8s.Delete(ctx, &stream)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(apierrors.IsNotFound(k8s.Get(ctx, key(ns, "kept"), &stream))).To(BeTrue())
		}).Should(Succeed())
		for _, pvc := range claims {
			var got corev1.PersistentVolumeClaim
			Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pvc), &got)).To(Succeed())
			Expect(got.DeletionTimestamp).To(BeNil(), "claim %s was deleted", pvc.Name)
		}
	})
})

var _ = Describe("Stream volumeReclaimPolicy", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("defaults to Retain", func() {
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "plain", "partitions: 1"))).To(Succeed())
		var s streamsv1alpha1.Stream
		Expect(k8s.Get(ctx, key(ns, "plain"), &s)).To(Succeed())
		Expect(s.Spec.VolumeReclaimPolicy).To(Equal(streamsv1alpha1.DefaultVolumeReclaimPolicy))
	})

	It("accepts either policy with its own pool or a shared one", func() {
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "own", "partitions: 1\nvolumeReclaimPolicy: Delete"))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "shared", "pool: common\npartitions: 1\nvolumeReclaimPolicy: Retain"))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "tidy", "pool: common\npartitions: 1\nvolumeReclaimPolicy: Delete"))).To(Succeed())
	})

	It("refuses an unknown policy", func() {
		s := manifest(ns, "Stream", "odd", "partitions: 1\nvolumeReclaimPolicy: Recycle")
		expectRejected(k8s.Create(ctx, s), `spec.volumeReclaimPolicy: Unsupported value: "Recycle"`)
		expectAbsent(s)
	})
})

// replicaList is the --replicas value of ingestion pods on a pool of n pods.
func replicaList(ns, pool string, n int) string {
	var out string
	for i := range n {
		if i > 0 {
			out += ","
		}
		out += fmt.Sprintf("%s-%d.%s.%s.svc:7071", pool, i, pool, ns)
	}
	return out
}

// replicaClaim is the claim the StatefulSet controller makes for the pod
// with the given ordinal from the pool's volumeClaimTemplates: named
// data-<statefulset>-<ordinal> and labelled with the pool's selector.
func replicaClaim(ns, pool string, ordinal int) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns,
			Name:      fmt.Sprintf("data-%s-%d", pool, ordinal),
			Labels: map[string]string{
				"app.kubernetes.io/name":      "catena",
				"app.kubernetes.io/component": "replica",
				"app.kubernetes.io/instance":  pool,
			},
		},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
}

// waitForCachedClaims waits until the operator's cache holds n claims in
// ns. In a cluster the claims exist long before their Stream is deleted;
// here they are created just before, and the operator lists them from its
// cache.
func waitForCachedClaims(c cache.Cache, ns string, n int) {
	EventuallyWithOffset(1, func(g Gomega) {
		var list corev1.PersistentVolumeClaimList
		g.Expect(c.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		g.Expect(list.Items).To(HaveLen(n))
	}).Should(Succeed())
}

// markStatefulSetReady writes the status the StatefulSet controller would
// once every pod of the StatefulSet runs its current spec and is ready.
func markStatefulSetReady(ns, name string) {
	var sts appsv1.StatefulSet
	EventuallyWithOffset(1, func(g Gomega) {
		g.Expect(k8s.Get(ctx, key(ns, name), &sts)).To(Succeed())
		n := *sts.Spec.Replicas
		sts.Status = appsv1.StatefulSetStatus{
			ObservedGeneration: sts.Generation, Replicas: n, ReadyReplicas: n, AvailableReplicas: n,
			CurrentReplicas: n, UpdatedReplicas: n, CurrentRevision: name + "-1", UpdateRevision: name + "-1",
		}
		g.Expect(k8s.Status().Update(ctx, &sts)).To(Succeed())
	}).Should(Succeed())
}

// markDeploymentAvailable writes the status the Deployment controller would
// with available of its pods ready.
func markDeploymentAvailable(ns, name string, available int32) {
	EventuallyWithOffset(1, func(g Gomega) {
		var deploy appsv1.Deployment
		g.Expect(k8s.Get(ctx, key(ns, name), &deploy)).To(Succeed())
		n := *deploy.Spec.Replicas
		deploy.Status = appsv1.DeploymentStatus{
			ObservedGeneration: deploy.Generation, Replicas: n, UpdatedReplicas: n, ReadyReplicas: available, AvailableReplicas: available, UnavailableReplicas: n - available,
		}
		g.Expect(k8s.Status().Update(ctx, &deploy)).To(Succeed())
	}).Should(Succeed())
}

// markPartitionReady writes the Ready condition the chain controller would
// once the partition's chain is complete.
func markPartitionReady(ns, name string) {
	EventuallyWithOffset(1, func(g Gomega) {
		var p streamsv1alpha1.Partition
		g.Expect(k8s.Get(ctx, key(ns, name), &p)).To(Succeed())
		meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{
			Type: streamsv1alpha1.PartitionReadyCondition, Status: metav1.ConditionTrue, Reason: streamsv1alpha1.PartitionChainReadyReason,
			Message: "Marked ready by the test", ObservedGeneration: p.Generation,
		})
		g.Expect(k8s.Status().Update(ctx, &p)).To(Succeed())
	}).Should(Succeed())
}
