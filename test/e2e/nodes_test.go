//go:build e2e

package e2e_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// lossStream is a Stream whose own pool spreads its three replicas over
// three nodes (nodeSpread Required): losing a node takes out one member of
// every chain, and the replacement needs a node of its own.
const lossStream = `apiVersion: streams.catena.io/v1alpha1
kind: Stream
metadata:
  name: spread
spec:
  partitions: 2
  replicationFactor: 3
  replicas: 3
  storage: {size: 1Gi, storageClassName: catena-local}
  placement: {nodeSpread: Required, zoneSpread: None}
  ingestion: {replicas: 2}
  access:
    users:
    - {name: app, operations: [Produce, Consume]}
`

var _ = Describe("Nodes of a real cluster", Ordered, func() {
	var ns string
	var nodes []string // the node command: hack/knode/cluster.sh node

	BeforeAll(func() {
		nodes = strings.Fields(os.Getenv("CATENA_E2E_NODES"))
		// make test-e2e sets it: "none" on a kind cluster, whose nodes
		// cannot be faulted here; an empty one is a harness that failed
		// to list its nodes, which a skip would pass by silently.
		if len(nodes) == 1 && nodes[0] == "none" {
			Skip("CATENA_E2E_NODES is none: this cluster's nodes (kind) cannot be faulted")
		}
		Expect(nodes).NotTo(BeEmpty(), "CATENA_E2E_NODES is empty: node faults need hack/knode's nodes (make test-e2e sets it, none on kind)")
		ns = newNamespace("e2e-nodes")
		out, err := kubectlApply(ns, lossStream)
		Expect(err).NotTo(HaveOccurred(), out)
	})

	It("spreads a chain's members over nodes, and each chain names its members' nodes", func() {
		expectStreamReady(ns, "spread", 2, 5*time.Minute)
		Eventually(func(g Gomega) {
			pods := replicaPods(g, ns, "spread-pool")
			g.Expect(pods).To(HaveLen(3))
			seen := map[string]bool{}
			for _, p := range pods {
				g.Expect(p.Spec.NodeName).NotTo(BeEmpty())
				seen[p.Spec.NodeName] = true
			}
			g.Expect(seen).To(HaveLen(3), "one replica per node")
			for name, c := range chains(g, ns, "spread") {
				g.Expect(chainConverged(c)).To(BeTrue(), "chain %s: %v", name, memberNames(c))
				for _, m := range c.Status.Members {
					g.Expect(m.Node).To(Equal(pods[m.Name].Spec.NodeName), "chain %s member %s", name, m.Name)
				}
			}
		}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
		kubectl("get", "pods", "-n", ns, "-o", "wide")
	})

	It("gives a replica lost with its node a new volume on a new node, under load, and loses no acknowledged record", func() {
		victim, victimNode, checkerNode := pickVictim(ns, "spread-pool")
		pods := map[string]corev1.Pod{}
		Eventually(func(g Gomega) { pods = replicaPods(g, ns, "spread-pool") }).Should(Succeed())
		claim := claimOf(pods[victim])
		var pvcBefore corev1.PersistentVolumeClaim
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: claim}, &pvcBefore)).To(Succeed())
		epochs := map[string]int64{}
		Eventually(func(g Gomega) {
			for name, c := range chains(g, ns, "spread") {
				epochs[name] = c.Status.TargetEpoch
			}
		}).Should(Succeed())

		c := startCheckerOn(checkerNode, ns, "spread", "app", "check-node-loss", 3*time.Minute, checkerRate)

		By("deleting node " + victimNode + " with " + victim + " and its local volume")
		faultAt := time.Now()
		out, err := run(nodes[0], append(nodes[1:], "delete", victimNode)...)
		Expect(err).NotTo(HaveOccurred(), out)

		By("waiting for every chain to take " + victim + " out, and the operator to replace it")
		Eventually(func(g Gomega) {
			for name, ch := range chains(g, ns, "spread") {
				g.Expect(failureEvent(g, ns, name, faultAt)).To(BeTrue(), "chain %s not reordered (members %v)", name, memberNames(ch))
			}
		}).WithTimeout(time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
		GinkgoWriter.Printf("timing: node %s deleted: every chain reordered without %s %s after the fault\n", victimNode, victim, since(faultAt))
		Eventually(func(g Gomega) {
			var pool streamsv1alpha1.ReplicaPool
			g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "spread-pool"}, &pool)).To(Succeed())
			cond := meta.FindStatusCondition(pool.Status.Conditions, streamsv1alpha1.ReplicaPoolNodeLossCondition)
			g.Expect(cond).NotTo(BeNil())
			g.Expect(cond.Message).To(ContainSubstring("Replica %s was lost with node %s (deleted)", victim, victimNode))
			var pvc corev1.PersistentVolumeClaim
			g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: claim}, &pvc)).To(Succeed())
			g.Expect(pvc.UID).NotTo(Equal(pvcBefore.UID), "a new claim")
		}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
		GinkgoWriter.Printf("timing: node %s deleted: %s's claim replaced %s after the fault\n", victimNode, victim, since(faultAt))
		var evs eventsv1.EventList
		Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
		Expect(slices.ContainsFunc(evs.Items, func(e eventsv1.Event) bool {
			return e.Regarding.Kind == "ReplicaPool" && e.Reason == "LostReplicaReplaced" && strings.Contains(e.Note, victim)
		})).To(BeTrue(), "a LostReplicaReplaced Event on the pool")

		By("a new node joins; the replacement lands on it and its chains copy it in")
		out, err = run(nodes[0], append(nodes[1:], "add")...)
		Expect(err).NotTo(HaveOccurred(), out)
		newNode := lastLine(out)
		Eventually(func(g Gomega) {
			pods := replicaPods(g, ns, "spread-pool")
			g.Expect(pods).To(HaveKey(victim))
			g.Expect(pods[victim].Spec.NodeName).To(Equal(newNode), "%s on the new node", victim)
			g.Expect(podReady(pods[victim])).To(BeTrue(), "%s ready (back in every chain)", victim)
			for name, ch := range chains(g, ns, "spread") {
				g.Expect(chainConverged(ch)).To(BeTrue(), "chain %s: %v", name, memberNames(ch))
				g.Expect(memberNames(ch)).To(ContainElement(ContainSubstring(victim)), "chain %s takes %s back", name, victim)
				g.Expect(ch.Status.Members).To(HaveLen(3), "chain %s at its replication factor", name)
			}
		}).WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(Succeed())
		GinkgoWriter.Printf("timing: node %s deleted: %s copied in on %s, every chain at 3 members %s after the fault\n", victimNode, victim, newNode, since(faultAt))

		By("keeping the lost volume's PersistentVolume for a person to recover")
		var old corev1.PersistentVolume
		Expect(k8s.Get(ctx, types.NamespacedName{Name: pvcBefore.Spec.VolumeName}, &old)).To(Succeed())
		Expect(old.Spec.PersistentVolumeReclaimPolicy).To(Equal(corev1.PersistentVolumeReclaimRetain))
		kubectl("get", "pods,pvc", "-n", ns, "-o", "wide")
		kubectl("get", "replicationchains", "-n", ns, "-o", "wide")
		rep := c.finish(5 * time.Minute)
		GinkgoWriter.Printf("node loss: %d records acknowledged, all read back once and in order\n", rep.Acked)
	})

	It("drains a node under load: its replica moves to a free node, one member of a chain at a time", func() {
		free := addNode(nodes)
		victim, victimNode, checkerNode := pickVictim(ns, "spread-pool")
		c := startCheckerOn(checkerNode, ns, "spread", "app", "check-drain", 3*time.Minute, checkerRate)
		w := watchDisruption(ns, "spread-pool", "spread")

		By("kubectl drain " + victimNode + ", which holds " + victim)
		start := time.Now()
		DeferCleanup(func() { _, _ = run(env.kubectl, "uncordon", victimNode) })
		kubectl("drain", victimNode, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout", "5m")
		GinkgoWriter.Printf("timing: kubectl drain %s returned after %s\n", victimNode, since(start))
		Eventually(func(g Gomega) {
			pods := replicaPods(g, ns, "spread-pool")
			g.Expect(pods).To(HaveKey(victim))
			g.Expect(pods[victim].Spec.NodeName).To(Equal(free), "%s moved to the free node", victim)
			g.Expect(podReady(pods[victim])).To(BeTrue(), "%s back in every chain", victim)
			expectFullChains(g, ns, "spread", 3)
			var pool streamsv1alpha1.ReplicaPool
			g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "spread-pool"}, &pool)).To(Succeed())
			cond := meta.FindStatusCondition(pool.Status.Conditions, streamsv1alpha1.ReplicaPoolNodeLossCondition)
			g.Expect(cond).NotTo(BeNil())
			g.Expect(cond.Message).To(ContainSubstring("Replica %s was lost with node %s (cordoned, its pod unscheduled since", victim, victimNode))
		}).WithTimeout(5 * time.Minute).WithPolling(time.Second).Should(Succeed())
		GinkgoWriter.Printf("timing: drain of %s: %s copied in on %s, every chain at 3 members %s after the drain began\n", victimNode, victim, free, since(start))
		maxDown, minInChain, worst := w.stop()
		GinkgoWriter.Printf("during the drain: at most %d replica pods down at once, at least %d members in chain (%s)\n", maxDown, minInChain, worst)
		c.finish(5 * time.Minute)
		Expect(maxDown).To(BeNumerically("<=", 1), "two replica pods were down at once")
		Expect(minInChain).To(BeNumerically(">=", 2), "a chain lost two members at once: %s", worst)
	})

	It("takes a replica cut off the network for 30 s out of its chains, and back from its volume when the link heals", func() {
		victim, victimNode, checkerNode := pickVictim(ns, "spread-pool")
		var before corev1.Pod
		Eventually(func(g Gomega) { before = replicaPods(g, ns, "spread-pool")[victim] }).Should(Succeed())
		var pvcBefore corev1.PersistentVolumeClaim
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: claimOf(before)}, &pvcBefore)).To(Succeed())
		c := startCheckerOn(checkerNode, ns, "spread", "app", "check-cut", 2*time.Minute, checkerRate)

		By("cutting " + victimNode + " (with " + victim + ") off the network for 30 s")
		faultAt := time.Now()
		out, err := run(nodes[0], append(nodes[1:], "cut", victimNode)...)
		Expect(err).NotTo(HaveOccurred(), out)
		healed := false
		heal := func() {
			if !healed {
				healed = true
				out, err := run(nodes[0], append(nodes[1:], "heal", victimNode)...)
				Expect(err).NotTo(HaveOccurred(), out)
			}
		}
		DeferCleanup(heal)
		Eventually(func(g Gomega) {
			for name, ch := range chains(g, ns, "spread") {
				g.Expect(failureEvent(g, ns, name, faultAt)).To(BeTrue(), "chain %s not reordered (members %v)", name, memberNames(ch))
			}
		}).WithTimeout(25 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
		GinkgoWriter.Printf("timing: %s cut off: every chain reordered without %s %s after the cut\n", victimNode, victim, since(faultAt))
		time.Sleep(time.Until(faultAt.Add(30 * time.Second)))
		heal()
		healAt := time.Now()

		Eventually(func(g Gomega) {
			for name, ch := range chains(g, ns, "spread") {
				g.Expect(chainConverged(ch)).To(BeTrue(), "chain %s: %v", name, memberNames(ch))
				g.Expect(memberNames(ch)).To(ContainElement(ContainSubstring(victim)), "chain %s takes %s back", name, victim)
				g.Expect(ch.Status.Members).To(HaveLen(3))
			}
		}).WithTimeout(3 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
		GinkgoWriter.Printf("timing: %s healed: %s back in every chain %s after the heal\n", victimNode, victim, since(healAt))
		var pvc corev1.PersistentVolumeClaim
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: claimOf(before)}, &pvc)).To(Succeed())
		Expect(pvc.UID).To(Equal(pvcBefore.UID), "back from its own volume, not replaced")
		c.finish(5 * time.Minute)
	})
})

// pickVictim chooses a replica of pool, and its node, to fail: one on a
// node with neither the operator nor CoreDNS (losing those is a test of
// its own). checkerNode is the operator's node, where a checker is safe.
func pickVictim(ns, pool string) (victim, victimNode, checkerNode string) {
	var pods map[string]corev1.Pod
	Eventually(func(g Gomega) { pods = replicaPods(g, ns, pool) }).Should(Succeed())
	spared := map[string]bool{}
	for _, sel := range []struct{ ns, label string }{
		{env.releaseNamespace, "app.kubernetes.io/component=operator"},
		{"kube-system", "k8s-app=kube-dns"},
	} {
		var l corev1.PodList
		Expect(k8s.List(ctx, &l, client.InNamespace(sel.ns), client.MatchingLabelsSelector{Selector: mustSelector(sel.label)})).To(Succeed())
		for _, p := range l.Items {
			spared[p.Spec.NodeName] = true
			if sel.ns == env.releaseNamespace {
				checkerNode = p.Spec.NodeName
			}
		}
	}
	names := make([]string, 0, len(pods))
	for name := range pods {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if n := pods[name].Spec.NodeName; n != "" && !spared[n] {
			return name, n, checkerNode
		}
	}
	Fail(fmt.Sprintf("every replica of %s shares a node with the operator or CoreDNS: %v", pool, spared))
	return "", "", ""
}

// addNode brings a new node into the cluster (node.sh add) and waits until
// it is Ready; it returns its name.
func addNode(nodes []string) string {
	out, err := run(nodes[0], append(nodes[1:], "add")...)
	Expect(err).NotTo(HaveOccurred(), out)
	name := lastLine(out)
	Eventually(func(g Gomega) {
		var n corev1.Node
		g.Expect(k8s.Get(ctx, types.NamespacedName{Name: name}, &n)).To(Succeed())
		g.Expect(slices.ContainsFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool {
			return c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
		})).To(BeTrue(), "node %s Ready", name)
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	return name
}

// expectFullChains: every chain of stream converged, at rf members.
func expectFullChains(g Gomega, ns, stream string, rf int) {
	for name, ch := range chains(g, ns, stream) {
		g.Expect(chainConverged(ch)).To(BeTrue(), "chain %s: %v", name, memberNames(ch))
		g.Expect(ch.Status.Members).To(HaveLen(rf), "chain %s at its replication factor", name)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func mustSelector(s string) labels.Selector {
	sel, err := labels.Parse(s)
	Expect(err).NotTo(HaveOccurred(), "selector %q", s)
	return sel
}
