//go:build e2e

package e2e_test

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// A Stream of its own (one replica pod: the node's CPUs are shared with the
// other specs) and an Aggregation counting its records per key with two
// worker pods.
const aggManifests = `
apiVersion: streams.catena.io/v1alpha1
kind: Stream
metadata: {name: clicks}
spec:
  partitions: 4
  replicationFactor: 1
  replicas: 1
  storage: {size: 1Gi, storageClassName: catena-local}
  placement: {nodeSpread: None, zoneSpread: None}
  ingestion: {replicas: 1}
---
apiVersion: streams.catena.io/v1alpha1
kind: Aggregation
metadata: {name: clicks-per-key}
spec:
  source: clicks
  aggregates:
    - {name: views, function: Count}
  checkpointInterval: 2s
  snapshotEvery: 3
  workers: 2
  failureTimeout: 5s
`

var _ = Describe("An Aggregation on a real node", Ordered, func() {
	var ns string

	BeforeAll(func() {
		ns = newNamespace("e2e-agg")
		out, err := kubectlApply(ns, aggManifests)
		Expect(err).NotTo(HaveOccurred(), out)
	})

	It("restores a deleted worker pod's shards from their checkpoints, and its results equal the log", func() {
		start := time.Now()
		expectStreamReady(ns, "clicks", 4, 5*time.Minute)
		aggReady(ns, "clicks-per-key", 5*time.Minute)
		GinkgoWriter.Printf("timing: Stream and Aggregation Ready %s after they were applied\n", since(start))

		load := startChecker(ns, "clicks", "", "agg-load", 90*time.Second, checkerRate)
		// Let both workers own shards and checkpoint some of the load, then
		// delete the one owning shard 0. Waiting for the assignment to settle
		// first matters: workers that came up at different times are
		// rebalanced, and such a move from the victim, made around the kill,
		// is a restoration too (reason Rebalanced), not the one under test.
		var victim string
		var victimShards []int32
		Eventually(func(g Gomega) {
			a := getAgg(g, ns, "clicks-per-key")
			g.Expect(a.Status.Assignments).To(HaveLen(2), "both workers must own shards: %v", a.Status.Assignments)
			owner := map[int32]string{}
			for _, w := range a.Status.Assignments {
				for _, p := range w.Partitions {
					owner[p] = w.Worker
				}
			}
			for _, s := range a.Status.Shards {
				g.Expect(s.Worker).To(Equal(owner[s.Partition]), "shard %d is still moving", s.Partition)
				g.Expect(s.Phase).To(Equal("Running"), "shard %d", s.Partition)
				g.Expect(s.Checkpoint).NotTo(BeNil(), "shard %d has no checkpoint yet", s.Partition)
				g.Expect(s.Checkpoint.SourceOffset).To(BeNumerically(">", 100), "shard %d checkpointed little", s.Partition)
			}
			victim = a.Status.Shards[0].Worker
			g.Expect(victim).NotTo(BeEmpty())
			victimShards = victimShards[:0]
			for _, w := range a.Status.Assignments {
				if w.Worker == victim {
					victimShards = append(victimShards, w.Partitions...)
				}
			}
		}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
		before := getAgg(Default, ns, "clicks-per-key")
		killedAt := time.Now()
		By("deleting worker pod " + victim)
		kubectl("delete", "pod", "-n", ns, victim, "--wait=false")

		// The restoration under test: one of the victim's shards, moved
		// because its worker failed, after the kill.
		var rest streamsv1alpha1.AggregationRestoration
		Eventually(func(g Gomega) {
			a := getAgg(g, ns, "clicks-per-key")
			g.Expect(a.Status.AssignmentGeneration).To(BeNumerically(">", before.Status.AssignmentGeneration))
			found := false
			for _, r := range a.Status.Restorations {
				if r.FromWorker == victim && r.Reason == streamsv1alpha1.RestorationWorkerFailed &&
					slices.Contains(victimShards, r.Partition) && !r.Time.Time.Before(killedAt.Add(-time.Second)) {
					rest, found = r, true
				}
			}
			g.Expect(found).To(BeTrue(), "no restoration of %s's shards %v yet: %v", victim, victimShards, a.Status.Restorations)
		}).WithTimeout(2 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
		GinkgoWriter.Printf("timing: shard %d of %s restored on %s %s after the pod was deleted (reason %s; checkpoint at source offset %d, %d checkpoints loaded in %s, %d records replayed in %s)\n",
			rest.Partition, victim, rest.ToWorker, since(killedAt), rest.Reason, checkpointOffset(rest.Checkpoint),
			rest.CheckpointsLoaded, rest.LoadDuration.Duration, rest.RecordsReplayed, rest.ReplayDuration.Duration)
		Expect(rest.Checkpoint).NotTo(BeNil(), "the new owner must load a checkpoint, not start from the beginning")

		rep := load.finish(5 * time.Minute)
		Expect(rep.Acked).To(BeNumerically(">", 0))

		By("waiting for every shard to fold the whole log")
		var a streamsv1alpha1.Aggregation
		Eventually(func(g Gomega) {
			a = getAgg(g, ns, "clicks-per-key")
			for _, s := range a.Status.Shards {
				g.Expect(s.Lag).To(BeZero(), "shard %d lags", s.Partition)
				g.Expect(s.Phase).To(Equal("Running"))
			}
		}).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Succeed())

		By("comparing every key's count with the log read back")
		var s streamsv1alpha1.Stream
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "clicks"}, &s)).To(Succeed())
		want := map[string]int64{}
		for _, line := range jsonLines(runPod(ns, "agg-reference", clientSecret("clicks", ""),
			"--server", s.Status.Endpoints.Consumers, "consume", "--stream", "clicks", "--from", "earliest", "--no-follow")) {
			var rec struct {
				Key string `json:"key"`
			}
			Expect(json.Unmarshal([]byte(line), &rec)).To(Succeed(), "consume line %q", line)
			want[rec.Key]++
		}
		Expect(want).NotTo(BeEmpty())
		keys := make([]string, 0, len(want))
		for k := range want {
			keys = append(keys, k)
		}
		got := map[string]int64{}
		args := append([]string{"agg", "--aggregator", a.Status.Endpoint, "-o", "json", "get"}, keys...)
		for _, line := range jsonLines(runPod(ns, "agg-results", clientSecret("clicks", ""), args...)) {
			var row struct {
				Key    string           `json:"key"`
				Values map[string]int64 `json:"values"`
			}
			Expect(json.Unmarshal([]byte(line), &row)).To(Succeed(), "agg get line %q", line)
			got[row.Key] = row.Values["views"]
		}
		Expect(got).To(Equal(want), "per-key counts after the restoration must equal the log")
		var total int64
		for _, n := range want {
			total += n
		}
		GinkgoWriter.Printf("aggregation: %d keys, %d records counted exactly once after a worker pod was deleted\n", len(want), total)
	})

	AfterAll(func() {
		if CurrentSpecReport().Failed() {
			_, _ = run(env.kubectl, "get", "-n", ns, "aggregations,streams,services,endpointslices,pods,events", "-o", "wide")
			_, _ = run(env.kubectl, "logs", "-n", ns, "-l", "app.kubernetes.io/component=aggregator", "--tail", "100")
			_, _ = run(env.kubectl, "logs", "-n", ns, "-l", "app.kubernetes.io/component=ingest", "--tail", "100")
			_, _ = run(env.kubectl, "logs", "-n", ns, "-l", "app.kubernetes.io/component=replica", "--tail", "50")
		}
	})
})

func getAgg(g Gomega, ns, name string) streamsv1alpha1.Aggregation {
	var a streamsv1alpha1.Aggregation
	g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &a)).To(Succeed())
	return a
}

func aggReady(ns, name string, timeout time.Duration) {
	Eventually(func(g Gomega) {
		a := getAgg(g, ns, name)
		ready := false
		for _, c := range a.Status.Conditions {
			if c.Type == streamsv1alpha1.AggregationReadyCondition {
				ready = c.Status == metav1.ConditionTrue
			}
		}
		g.Expect(ready).To(BeTrue(), "Aggregation %s: %v", name, a.Status.Conditions)
		g.Expect(a.Status.Endpoint).NotTo(BeEmpty())
	}).WithTimeout(timeout).WithPolling(time.Second).Should(Succeed())
}

func checkpointOffset(c *streamsv1alpha1.CheckpointReference) int64 {
	if c == nil {
		return -1
	}
	return c.SourceOffset
}

// runPod runs catenactl with args in a pod of the suite's image, with the
// TLS Secret tlsSecret (clientSecret), and returns its output once it has
// succeeded.
func runPod(ns, name, tlsSecret string, args ...string) string {
	out, phase := runPodToEnd(ns, name, tlsSecret, args...)
	Expect(phase).To(Equal(corev1.PodSucceeded), "pod %s (catenactl %s) failed:\n%s", name, strings.Join(args, " "), out)
	return out
}

// runPodToEnd runs catenactl as runPod does and returns its output and how
// it ended, succeeded or failed.
func runPodToEnd(ns, name, tlsSecret string, args ...string) (string, corev1.PodPhase) {
	pod := catenactlPod(ns, name, "catenactl", tlsSecret, args)
	Expect(k8s.Create(ctx, pod)).To(Succeed())
	var phase corev1.PodPhase
	Eventually(func(g Gomega) {
		var p corev1.Pod
		g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &p)).To(Succeed())
		phase = p.Status.Phase
		g.Expect(phase).To(BeElementOf(corev1.PodSucceeded, corev1.PodFailed))
	}).WithTimeout(2 * time.Minute).WithPolling(500 * time.Millisecond).Should(Succeed())
	out, err := run(env.kubectl, "logs", "-n", ns, name)
	Expect(err).NotTo(HaveOccurred())
	return out, phase
}

// jsonLines are the lines of a pod's log that hold JSON objects (its
// stderr shares the log).
func jsonLines(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "{") {
			lines = append(lines, l)
		}
	}
	return lines
}
