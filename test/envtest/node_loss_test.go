package envtest_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/controllers"
)

// The API server alone runs no scheduler, kubelet or StatefulSet
// controller: the spec makes by hand what they would (nodes, local
// volumes, the pool's claims bound to them, pods on the nodes), then takes
// a node away and checks what the operator does to the pool's objects.
var _ = Describe("A replica lost with its node", func() {
	var ns string
	BeforeEach(func() {
		ns = newNamespace()
		startOperator(controllers.Options{Image: testImage, NodeLoss: &controllers.NodeLossOptions{Grace: time.Minute}}, ns)
	})

	It("gets a new volume: its volume is kept, its claim and pod deleted, and the pool says so", func() {
		nodes := replicasOnNodes(ns, "lossy", corev1.PersistentVolumeReclaimDelete)

		By("deleting the node of lossy-1")
		Expect(k8s.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[1]}})).To(Succeed())
		podNotReady(ns, "lossy-1")

		Eventually(func(g Gomega) {
			var pv corev1.PersistentVolume
			g.Expect(k8s.Get(ctx, key("", nodes[1]+"-pv"), &pv)).To(Succeed())
			g.Expect(pv.Spec.PersistentVolumeReclaimPolicy).To(Equal(corev1.PersistentVolumeReclaimRetain), "the volume is kept")
			var claim corev1.PersistentVolumeClaim
			err := k8s.Get(ctx, key(ns, "data-lossy-1"), &claim)
			if err == nil {
				// pvc-protection holds it; no controller manager here to let go.
				g.Expect(claim.DeletionTimestamp).NotTo(BeNil(), "the claim is being deleted")
			} else {
				g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%v", err)
			}
			g.Expect(apierrors.IsNotFound(k8s.Get(ctx, key(ns, "lossy-1"), &corev1.Pod{}))).To(BeTrue(), "the pod is deleted at once: its kubelet is gone")
			var pool streamsv1alpha1.ReplicaPool
			g.Expect(k8s.Get(ctx, key(ns, "lossy"), &pool)).To(Succeed())
			c := meta.FindStatusCondition(pool.Status.Conditions, streamsv1alpha1.ReplicaPoolNodeLossCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(BeElementOf(streamsv1alpha1.ReplicaPoolReplacingReason, streamsv1alpha1.ReplicaPoolReplacedReason))
			g.Expect(c.Message).To(ContainSubstring("Replica lossy-1 was lost with node %s (deleted)", nodes[1]))
			g.Expect(poolEvents(g, ns, "lossy", "LostReplicaReplaced")).To(ContainElement(ContainSubstring("PersistentVolume %s-pv kept", nodes[1])))
		}).Should(Succeed())

		By("leaving the replica on the live node alone")
		Consistently(func(g Gomega) {
			var claim corev1.PersistentVolumeClaim
			g.Expect(k8s.Get(ctx, key(ns, "data-lossy-0"), &claim)).To(Succeed())
			g.Expect(claim.DeletionTimestamp).To(BeNil())
			g.Expect(k8s.Get(ctx, key(ns, "lossy-0"), &corev1.Pod{})).To(Succeed())
		}).WithTimeout(2 * time.Second).Should(Succeed())
	})

	It("is left alone when the pool's annotation turns replacement off, and the pool says why", func() {
		nodes := replicasOnNodes(ns, "kept", corev1.PersistentVolumeReclaimRetain)
		var pool streamsv1alpha1.ReplicaPool
		Expect(k8s.Get(ctx, key(ns, "kept"), &pool)).To(Succeed())
		pool.Annotations = map[string]string{controllers.ReplaceLostReplicasAnnotation: "false"}
		Expect(k8s.Update(ctx, &pool)).To(Succeed())

		By("deleting the node of kept-1")
		Expect(k8s.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodes[1]}})).To(Succeed())
		podNotReady(ns, "kept-1")
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, key(ns, "kept"), &pool)).To(Succeed())
			c := meta.FindStatusCondition(pool.Status.Conditions, streamsv1alpha1.ReplicaPoolNodeLossCondition)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(streamsv1alpha1.ReplicaPoolReplacementOffReason))
			g.Expect(c.Message).To(ContainSubstring("kept-1 (node %s deleted): replacement is off", nodes[1]))
		}).Should(Succeed())
		Consistently(func(g Gomega) {
			var claim corev1.PersistentVolumeClaim
			g.Expect(k8s.Get(ctx, key(ns, "data-kept-1"), &claim)).To(Succeed())
			g.Expect(claim.DeletionTimestamp).To(BeNil(), "the claim stays")
			g.Expect(k8s.Get(ctx, key(ns, "kept-1"), &corev1.Pod{})).To(Succeed())
		}).WithTimeout(2 * time.Second).Should(Succeed())
	})
})

// replicasOnNodes makes a ReplicaPool of two replicas and what the cluster
// would have made for it: per replica a Ready node, a local volume pinned
// to it (reclaim policy as given), the replica's claim bound to that
// volume, and its pod on the node (not Ready). It returns the node names.
func replicasOnNodes(ns, pool string, reclaim corev1.PersistentVolumeReclaimPolicy) []string {
	Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", pool, "replicas: 2\nplacement: {nodeSpread: None}"))).To(Succeed())
	labels := map[string]string{"app.kubernetes.io/name": "catena", "app.kubernetes.io/component": "replica", "app.kubernetes.io/instance": pool}
	var nodes []string
	for i := range 2 {
		node := fmt.Sprintf("%s-%s-n%d", ns, pool, i)
		nodes = append(nodes, node)
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{corev1.LabelHostname: node}}}
		Expect(k8s.Create(ctx, n)).To(Succeed())
		DeferCleanup(func() { _ = client.IgnoreNotFound(k8s.Delete(ctx, n)) })
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		Expect(k8s.Status().Update(ctx, n)).To(Succeed())

		pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: node + "-pv"}, Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: reclaim,
			StorageClassName:              "local",
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/mnt/" + node}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		}}
		Expect(k8s.Create(ctx, pv)).To(Succeed())
		DeferCleanup(func() { _ = client.IgnoreNotFound(k8s.Delete(ctx, pv)) })

		name := fmt.Sprintf("%s-%d", pool, i)
		claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "data-" + name, Labels: labels},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: &pv.Spec.StorageClassName,
				VolumeName:       pv.Name,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			}}
		Expect(k8s.Create(ctx, claim)).To(Succeed())

		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "replica", Image: testImage}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim.Name}}}},
		}}
		Expect(k8s.Create(ctx, pod)).To(Succeed())
		setPodReady(ns, name, corev1.ConditionTrue)
	}
	return nodes
}

// podNotReady is what the node lifecycle controller does to the pods of a
// node that stopped answering.
func podNotReady(ns, name string) { setPodReady(ns, name, corev1.ConditionFalse) }

func setPodReady(ns, name string, status corev1.ConditionStatus) {
	var pod corev1.Pod
	Expect(k8s.Get(ctx, key(ns, name), &pod)).To(Succeed())
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
	Expect(k8s.Status().Update(ctx, &pod)).To(Succeed())
}

// poolEvents are the notes of a pool's Events with reason.
func poolEvents(g Gomega, ns, pool, reason string) []string {
	return objectEvents(g, ns, "ReplicaPool", pool, reason)
}

// objectEvents are the notes of the Events with reason about the object of
// kind and name.
func objectEvents(g Gomega, ns, kind, name, reason string) []string {
	var evs eventsv1.EventList
	g.Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
	var notes []string
	for _, e := range evs.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name && e.Reason == reason {
			notes = append(notes, e.Note)
		}
	}
	return notes
}
