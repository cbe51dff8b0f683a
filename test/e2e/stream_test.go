//go:build e2e

package e2e_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// The Stream of config/samples/stream-single-node.yaml: 4 partitions,
// replication 3, a pool of its own of 3 replica pods on local volumes.
const (
	sampleStream     = "quickstart"
	samplePool       = "quickstart-pool"
	samplePartitions = 4
	// sampleUser may produce and consume; sampleReader may only consume
	// (the sample's spec.access).
	sampleUser, sampleReader = "app", "reader"
	// checkerRate is the produce load during faults, records/s.
	checkerRate = 100
)

// failureReasons are the reconfigurations that take a failed member out.
var failureReasons = []string{
	string(streamsv1alpha1.ReconfigurationHeadFailed),
	string(streamsv1alpha1.ReconfigurationMiddleFailed),
	string(streamsv1alpha1.ReconfigurationTailFailed),
}

var _ = Describe("A Stream on a real node", Ordered, func() {
	var ns string

	BeforeAll(func() {
		ns = newNamespace("e2e-stream")
		kubectl("apply", "-n", ns, "-f", filepath.Join(repoRoot, "config", "samples", "stream-single-node.yaml"))
	})

	It("becomes Ready: its own pool on local volumes, a chain of 3 per partition", func() {
		start := time.Now()
		expectStreamReady(ns, sampleStream, samplePartitions, 5*time.Minute)
		GinkgoWriter.Printf("timing: Stream Ready %s after it was applied\n", since(start))
		out := kubectl("get", "streams,partitions,replicationchains", "-n", ns, "-o", "wide")
		Expect(out).To(ContainSubstring(sampleStream + "-0"))
		Eventually(func(g Gomega) {
			cs := chains(g, ns, sampleStream)
			g.Expect(cs).To(HaveLen(samplePartitions))
			for _, c := range cs {
				g.Expect(c.Status.Members).To(HaveLen(3))
			}
		}).Should(Succeed())
		kubectl("get", "pods,pvc", "-n", ns, "-o", "wide")
	})

	It("takes a producer on the node's host network through an external NodePort listener", func() {
		kubectl("patch", "stream", sampleStream, "-n", ns, "--type=merge", "-p", `{"spec":{"ingestion":{"external":{"type":"NodePort"}}}}`)
		// The address status reports: it stays on one node while a ready
		// ingestion pod runs there, but may move (with the certificates
		// issued for it) while the pods come up; each attempt reads it anew.
		external := func(g Gomega) string {
			var s streamsv1alpha1.Stream
			g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: sampleStream}, &s)).To(Succeed())
			g.Expect(s.Status.Endpoints.External).NotTo(BeEmpty(), "status.endpoints: %+v", s.Status.Endpoints)
			return s.Status.Endpoints.External
		}
		var addr string
		Eventually(func(g Gomega) { addr = external(g) }).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())
		GinkgoWriter.Printf("external endpoint: %s\n", addr)
		kubectl("get", "service", sampleStream+"-external", "-n", ns, "-o", "wide")

		// This test process runs on the node's host network, outside the
		// cluster's pod network: what a client outside the cluster is. It
		// uses the app user's certificate, which names the external
		// address once status reports it.
		tlsArgs := userTLSFiles(ns, sampleStream, sampleUser)
		catenactl := filepath.Join(repoRoot, "bin", "catenactl")
		value := fmt.Sprintf("from the host %d", time.Now().UnixNano())
		var out string
		Eventually(func(g Gomega) {
			addr = external(g)
			var err error
			out, err = run(catenactl, append(tlsArgs, "produce", "--server", addr, "--stream", sampleStream, "--key", "outside", "--value", value, "--retry-timeout", "10s")...)
			g.Expect(err).NotTo(HaveOccurred(), "produce through %s: %s", addr, out)
		}).WithTimeout(3 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
		// The other ingestion pod may still serve the certificate from
		// before the external address was known: kubelet refreshes a
		// Secret volume within a minute or so.
		Eventually(func(g Gomega) {
			addr = external(g)
			var err error
			out, err = run(catenactl, append(tlsArgs, "consume", "--server", addr, "--stream", sampleStream, "--from", "earliest", "--no-follow")...)
			g.Expect(err).NotTo(HaveOccurred(), "consume through %s: %s", addr, out)
		}).WithTimeout(3 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
		Expect(out).To(ContainSubstring(value))
	})

	It("refuses a client the Stream does not allow, and a caller of a replica's admin API without the operator's certificate", func() {
		expectAccessEnforced(ns, sampleStream, samplePool, sampleUser, sampleReader)
	})

	It("reorders its chains when a replica pod is deleted under load, and takes the pod back on its volume", func() {
		victim := samplePool + "-1"
		c := startChecker(ns, sampleStream, sampleUser, "check-delete", 60*time.Second, checkerRate)
		repair := expectRepair(ns, victim, "pod deleted", func(p corev1.Pod) {
			Expect(k8s.Delete(ctx, &p)).To(Succeed())
		}, func(before, after corev1.Pod) {
			Expect(after.UID).NotTo(Equal(before.UID), "a new pod")
		})
		// What the checker found is worth knowing whether or not the
		// chains were repaired as expected: report both.
		c.finish(5 * time.Minute)
		Expect(repair).NotTo(HaveOccurred())
	})

	It("survives a replica process killed with SIGKILL under load, and reorders its chains when it stays down", func() {
		victim := samplePool + "-0"
		c := startChecker(ns, sampleStream, sampleUser, "check-kill", 90*time.Second, checkerRate)

		// A first SIGKILL: the kubelet restarts the container at once, and
		// the replica may be back (from its volume) before the operator's
		// next probe, a second later. Either way every chain takes it out
		// and back in at the tail (two epochs: a replica that reopened its
		// log waits for a new epoch), ends converged with the victim in it,
		// and the checker finds every acknowledged record.
		By("SIGKILL on " + victim + " (restarted at once)")
		var before corev1.Pod
		epochs := map[string]int64{}
		Eventually(func(g Gomega) {
			before = replicaPods(g, ns, samplePool)[victim]
			for name, c := range chains(g, ns, sampleStream) {
				epochs[name] = c.Status.TargetEpoch
			}
		}).Should(Succeed())
		faultAt := time.Now()
		killContainer(before, "replica")
		Eventually(func(g Gomega) {
			var p corev1.Pod
			g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: victim}, &p)).To(Succeed())
			g.Expect(restarts(p)).To(BeNumerically(">", restarts(before)))
			g.Expect(podReady(p)).To(BeTrue())
		}).WithTimeout(2 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
		GinkgoWriter.Printf("timing: SIGKILL on %s: container restarted and ready %s after the fault\n", victim, since(faultAt))
		Eventually(func(g Gomega) {
			for name, c := range chains(g, ns, sampleStream) {
				g.Expect(c.Status.TargetEpoch).To(BeNumerically(">=", epochs[name]+2), "chain %s: out and back in are two epochs", name)
				g.Expect(chainConverged(c)).To(BeTrue(), "chain %s: members %v", name, memberNames(c))
				g.Expect(memberNames(c)).To(ContainElement(victim + "(" + string(streamsv1alpha1.MemberInChain) + ")"))
			}
		}).WithTimeout(3 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
		note := fmt.Sprintf("SIGKILL on %s with an immediate restart: all %d chains took it out and back, converged %s after the fault",
			victim, len(epochs), since(faultAt))
		GinkgoWriter.Println(note)
		AddReportEntry("sigkill-immediate-restart", note)

		// A second SIGKILL right away: the kubelet now holds the restart
		// back (CrashLoopBackOff, 10 s), so the operator must take the
		// replica out of every chain and take it back at the tail.
		repair := expectRepair(ns, victim, "SIGKILL again (restart held back)", func(p corev1.Pod) {
			killContainer(p, "replica")
		}, func(before, after corev1.Pod) {
			Expect(after.UID).To(Equal(before.UID), "the same pod, its container restarted")
			Expect(restarts(after)).To(BeNumerically(">", restarts(before)))
		})
		c.finish(5 * time.Minute)
		Expect(repair).NotTo(HaveOccurred())
	})

	It("loses no acknowledged record through a helm upgrade of the operator and a rolling restart of the replicas", func() {
		c := startChecker(ns, sampleStream, sampleUser, "check-rolling", 3*time.Minute, checkerRate)
		w := watchDisruption(ns, samplePool, sampleStream)

		By("upgrading the operator with helm (a new pod template rolls it)")
		start := time.Now()
		out, err := run(env.helm, "upgrade", "catena", filepath.Join(repoRoot, "charts", "catena"),
			"--namespace", env.releaseNamespace, "--reuse-values", "--wait", "--timeout", "5m",
			"--set-string", "podAnnotations.e2e\\.catena\\.io/upgraded="+strconv.FormatInt(time.Now().Unix(), 10))
		Expect(err).NotTo(HaveOccurred(), "helm upgrade: %s", out)
		kubectl("rollout", "status", "deployment", "-n", env.releaseNamespace, "-l", "app.kubernetes.io/component=operator", "--timeout", "3m")
		GinkgoWriter.Printf("timing: helm upgrade of the operator %s\n", since(start))

		By("restarting the replica StatefulSet, one pod at a time")
		start = time.Now()
		kubectl("rollout", "restart", "statefulset/"+samplePool, "-n", ns)
		kubectl("rollout", "status", "statefulset/"+samplePool, "-n", ns, "--timeout", "5m")
		expectStreamReady(ns, sampleStream, samplePartitions, 5*time.Minute)
		GinkgoWriter.Printf("timing: rolling restart of the replicas, chains converged, %s\n", since(start))

		maxDown, minInChain, worst := w.stop()
		GinkgoWriter.Printf("during the upgrade and restart: at most %d replica pods down at once, at least %d members in chain (%s)\n", maxDown, minInChain, worst)
		Expect(time.Since(c.started)).To(BeNumerically("<", 3*time.Minute), "the restart outlasted the load: raise the checker's duration")
		c.finish(6 * time.Minute)
		Expect(maxDown).To(BeNumerically("<=", 1), "two replica pods were down at once")
		Expect(minInChain).To(BeNumerically(">=", 2), "a chain lost two members at once: %s", worst)
	})
})

func restarts(p corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

// expectRepair injects a fault into the victim replica pod and waits for
// every chain to take it out under a new epoch (an Event per chain), then
// back in at the tail on the same volume, converged. samePod checks the
// pod before and after. A failed expectation after the fault is returned
// rather than failing the spec at once, so that the caller can still read
// its checker's report.
func expectRepair(ns, victim, what string, fault func(corev1.Pod), samePod func(before, after corev1.Pod)) error {
	var before corev1.Pod
	var epochs = map[string]int64{}
	Eventually(func(g Gomega) {
		pods := replicaPods(g, ns, samplePool)
		g.Expect(pods).To(HaveKey(victim))
		before = pods[victim]
		for name, c := range chains(g, ns, sampleStream) {
			epochs[name] = c.Status.TargetEpoch
		}
	}).Should(Succeed())
	claim := claimOf(before)
	var pvcBefore corev1.PersistentVolumeClaim
	Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: claim}, &pvcBefore)).To(Succeed())

	// A replica returns with what its volume holds; a partition still
	// empty when it went (the checker had only begun) is copied in new
	// (MemberReplaced), not returned. Fail it only once every partition
	// has committed records.
	By("waiting for every partition of " + sampleStream + " to hold committed records")
	Eventually(func(g Gomega) {
		for i := range samplePartitions {
			var p streamsv1alpha1.Partition
			g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: streamsv1alpha1.PartitionName(sampleStream, int32(i))}, &p)).To(Succeed())
			g.Expect(p.Status.CommittedOffset).To(BeNumerically(">", 0), "partition %s", p.Name)
		}
	}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())

	By(what + " on " + victim)
	faultAt := time.Now()
	fault(before)
	return InterceptGomegaFailure(func() { expectRepaired(ns, victim, what, faultAt, before, epochs, claim, pvcBefore, samePod) })
}

func expectRepaired(ns, victim, what string, faultAt time.Time, before corev1.Pod, epochs map[string]int64,
	claim string, pvcBefore corev1.PersistentVolumeClaim, samePod func(before, after corev1.Pod)) {
	By("waiting for every chain to take " + victim + " out under a new epoch")
	Eventually(func(g Gomega) {
		for name, c := range chains(g, ns, sampleStream) {
			g.Expect(failureEvent(g, ns, name, faultAt)).To(BeTrue(),
				"no HeadFailed/MiddleFailed/TailFailed Event for chain %s since the fault (epoch %d then, %d now, members %v)",
				name, epochs[name], c.Status.TargetEpoch, memberNames(c))
		}
	}).WithTimeout(time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	GinkgoWriter.Printf("timing: %s on %s: every chain reordered without it %s after the fault\n", what, victim, since(faultAt))

	Eventually(func(g Gomega) {
		var p corev1.Pod
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: victim}, &p)).To(Succeed())
		g.Expect(p.UID != before.UID || restarts(p) > restarts(before)).To(BeTrue(), "%s not restarted yet", victim)
		g.Expect(podReady(p)).To(BeTrue(), "%s not ready yet", victim)
	}).WithTimeout(3 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	GinkgoWriter.Printf("timing: %s on %s: pod ready again %s after the fault\n", what, victim, since(faultAt))

	By("waiting for " + victim + " to return on its volume and rejoin every chain at the tail")
	Eventually(func(g Gomega) {
		for name, c := range chains(g, ns, sampleStream) {
			g.Expect(c.Status.TargetEpoch).To(BeNumerically(">=", epochs[name]+2), "chain %s: out and back in are two epochs", name)
			g.Expect(chainConverged(c)).To(BeTrue(), "chain %s: members %v", name, memberNames(c))
			g.Expect(c.Status.LastReconfiguration).NotTo(BeNil())
			g.Expect(c.Status.LastReconfiguration.Reason).To(Equal(streamsv1alpha1.ReconfigurationMemberReturned), "chain %s", name)
			g.Expect(c.Status.LastReconfiguration.Time.Time).To(BeTemporally(">=", faultAt.Truncate(time.Second)))
			g.Expect(c.Status.Members[len(c.Status.Members)-1].Name).To(Equal(victim), "chain %s: %s back at the tail", name, victim)
		}
	}).WithTimeout(3 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	GinkgoWriter.Printf("timing: %s on %s: back at the tail of every chain %s after the fault\n", what, victim, since(faultAt))

	var after corev1.Pod
	Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: victim}, &after)).To(Succeed())
	samePod(before, after)
	Expect(claimOf(after)).To(Equal(claim))
	var pvcAfter corev1.PersistentVolumeClaim
	Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: claim}, &pvcAfter)).To(Succeed())
	Expect(pvcAfter.UID).To(Equal(pvcBefore.UID), "the same PersistentVolumeClaim")
	Expect(pvcAfter.Spec.VolumeName).To(Equal(pvcBefore.Spec.VolumeName), "the same local volume")
	kubectl("get", "replicationchains", "-n", ns, "-o", "wide")
	kubectl("get", "events", "-n", ns, "--field-selector", "involvedObject.kind=ReplicationChain", "--sort-by", ".metadata.creationTimestamp")
}

// failureEvent: the chain has an Event, since t, for a member taken out.
func failureEvent(g Gomega, ns, chain string, t time.Time) bool {
	var list eventsv1.EventList
	g.Expect(k8s.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	for _, e := range list.Items {
		if e.Regarding.Kind != "ReplicationChain" || e.Regarding.Name != chain || !slices.Contains(failureReasons, e.Reason) {
			continue
		}
		at := e.EventTime.Time
		if e.Series != nil {
			at = e.Series.LastObservedTime.Time
		}
		if !at.Before(t.Add(-time.Second)) {
			return true
		}
	}
	return false
}

// disruptionWatch samples a pool's replica pods and a Stream's chains
// while a disruption (an upgrade and restart, a drain) runs.
type disruptionWatch struct {
	stopCh     chan struct{}
	done       sync.WaitGroup
	maxDown    int
	minInChain int
	// worst describes the moment of minInChain, for the failure message.
	worst string
}

func watchDisruption(ns, pool, stream string) *disruptionWatch {
	w := &disruptionWatch{stopCh: make(chan struct{}), minInChain: 1 << 30}
	start := time.Now()
	w.done.Add(1)
	go func() {
		defer GinkgoRecover()
		defer w.done.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stopCh:
				return
			case <-tick.C:
			}
			var pods corev1.PodList
			if err := k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app.kubernetes.io/instance": pool}); err != nil {
				continue
			}
			down := 3 - len(pods.Items)
			var notReady []string
			for _, p := range pods.Items {
				if !replicaUp(p) {
					down++
					notReady = append(notReady, p.Name)
				}
			}
			w.maxDown = max(w.maxDown, down)
			var list streamsv1alpha1.ReplicationChainList
			if err := k8s.List(ctx, &list, client.InNamespace(ns)); err != nil {
				continue
			}
			for _, c := range list.Items {
				if c.Spec.Stream == stream && inChain(c) < w.minInChain {
					w.minInChain = inChain(c)
					w.worst = fmt.Sprintf("%s after the disruption began: chain %s epoch %d members %v; replica pods not ready %v",
						since(start), c.Name, c.Status.TargetEpoch, memberNames(c), notReady)
				}
			}
		}
	}()
	return w
}

func (w *disruptionWatch) stop() (maxDown, minInChain int, worst string) {
	close(w.stopCh)
	w.done.Wait()
	return w.maxDown, w.minInChain, w.worst
}
