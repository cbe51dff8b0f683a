package envtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	catena "github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/controllers"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// The API server refuses Aggregations that cannot run, with a message that
// says why; nothing is stored.
var _ = Describe("Aggregation validation", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	const valid = "source: orders\naggregates:\n- name: orders\n  function: Count"
	DescribeTable("rejects",
		func(name, spec, message string) {
			u := manifest(ns, "Aggregation", name, spec)
			expectRejected(k8s.Create(ctx, u), message)
			expectAbsent(u)
		},
		Entry("no aggregates", "a", "source: orders\naggregates: []", "spec.aggregates: Invalid value"),
		Entry("aggregates omitted", "a", "source: orders", "spec.aggregates: Required value"),
		Entry("Sum without a field", "a", "source: orders\naggregates:\n- name: total\n  function: Sum", "every aggregate other than Count needs a field"),
		Entry("duplicate names", "a", "source: orders\naggregates:\n- name: orders\n  function: Count\n- name: orders\n  function: Max\n  field: x", "aggregate names must be unique"),
		Entry("an unknown function", "a", "source: orders\naggregates:\n- name: orders\n  function: Average\n  field: x", `supported values: "Count", "Sum", "Min", "Max", "DistinctCount"`),
		Entry("a bad source name", "a", "source: Orders_1\naggregates:\n- name: orders\n  function: Count", "spec.source: Invalid value"),
		Entry("checkpointInterval 0s", "a", valid+"\ncheckpointInterval: 0s", "checkpointInterval must be between 1s and 1h"),
		Entry("window 0s", "a", valid+"\nwindow:\n  tumbling: 0s", "window.tumbling must be between 1s and 8760h"),
		Entry("failureTimeout under 1s", "a", valid+"\nfailureTimeout: 500ms", "failureTimeout must be at least 1s"),
		Entry("no workers", "a", valid+"\nworkers: 0", "spec.workers: Invalid value"),
		Entry("a name too long for its checkpoint Stream", strings.Repeat("a", 36), valid, "Aggregation names must be at most 35 characters"),
	)

	It("keeps source immutable", func() {
		u := manifest(ns, "Aggregation", "a", valid)
		Expect(k8s.Create(ctx, u)).To(Succeed())
		u = get(u)
		set(u, "spec.source", "clicks")
		expectRejected(k8s.Update(ctx, u), "source is immutable")
	})

	It("fills the defaults", func() {
		u := manifest(ns, "Aggregation", "a", valid)
		Expect(k8s.Create(ctx, u)).To(Succeed())
		u = get(u)
		expectField(u, "spec.checkpointInterval", "10s")
		expectField(u, "spec.failureTimeout", "10s")
		expectField(u, "spec.workers", int64(1))
		expectField(u, "spec.snapshotEvery", int64(10))
	})
})

// A source with a pool of its own shares it with the checkpoint Stream:
// the Stream controller lets a Stream name a pool another Stream owns.
var _ = Describe("Aggregation of a Stream with a pool of its own", func() {
	It("puts the checkpoint Stream on the source's own pool, which the Stream controller accepts", func() {
		ns := newNamespace()
		startOperator(controllers.Options{Image: testImage}, ns)
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "solo", "partitions: 2\nreplicationFactor: 1\nreplicas: 1"))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Aggregation", "per-key", "source: solo\naggregates:\n- name: orders\n  function: Count"))).To(Succeed())
		Eventually(func(g Gomega) {
			var cp streamsv1alpha1.Stream
			g.Expect(k8s.Get(ctx, key(ns, "per-key-checkpoints"), &cp)).To(Succeed())
			g.Expect(cp.Spec.Pool).To(Equal("solo-pool"))
			g.Expect(cp.Spec.Partitions).To(Equal(int32(2)))
			g.Expect(cp.Status.Pool).To(Equal("solo-pool"))
			g.Expect(cp.Status.ObservedGeneration).To(Equal(cp.Generation))
			d := meta.FindStatusCondition(cp.Status.Conditions, streamsv1alpha1.StreamDegradedCondition)
			if d != nil {
				g.Expect(d.Reason).NotTo(BeElementOf(streamsv1alpha1.StreamPoolConflictReason, streamsv1alpha1.StreamPoolNotFoundReason), d.Message)
			}
			// One pool: the checkpoint Stream did not get one of its own.
			var pools streamsv1alpha1.ReplicaPoolList
			g.Expect(k8s.List(ctx, &pools, client.InNamespace(ns))).To(Succeed())
			g.Expect(pools.Items).To(HaveLen(1))
			var a streamsv1alpha1.Aggregation
			g.Expect(k8s.Get(ctx, key(ns, "per-key"), &a)).To(Succeed())
			g.Expect(meta.FindStatusCondition(a.Status.Conditions, streamsv1alpha1.AggregationProgressingCondition)).To(And(
				HaveField("Status", metav1.ConditionTrue), HaveField("Reason", streamsv1alpha1.AggregationProvisioningReason)))
		}).Should(Succeed())
	})
})

// The Aggregation controller against real replica, ingestion and
// aggregator processes: what it assigns is what the workers run, a dead
// worker's shards are restored on the survivor from their checkpoints,
// and the results stay those of a reference computed here.
var _ = Describe("Aggregation controller", Ordered, func() {
	const (
		agg            = "totals"
		partitions     = 4
		failureTimeout = 2 * time.Second
	)
	var (
		ns       string
		replicas *replicaSet
		workers  *workerSet
		ingest   string
		producer *catena.Producer
		op       *operatorSupervisor
		// reference: count and sum of amount by key, over everything
		// produced.
		refCount = map[string]int64{}
		refSum   = map[string]float64{}
		produced = make([]int64, partitions) // records per partition
	)
	workerPods := []string{agg + "-aggregator-0", agg + "-aggregator-1"}

	BeforeAll(func() {
		ns = newNamespace()
		replicas = newReplicaSet()
		workers = newWorkerSet()
		var addrs []string
		for i := range 2 {
			addrs = append(addrs, replicas.start(ns, fmt.Sprintf("aggpool-%d", i)).addr)
		}
		ingest = startIngest(addrs)
		op = superviseOperator(controllers.Options{
			Image: testImage, ReplicaAddr: replicas.addr, FailureTimeout: failureTimeout,
			WorkerAddr:            workers.addr,
			AggregationIngestAddr: func(*streamsv1alpha1.Stream) string { return ingest },
		}, false, 1, ns)
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "aggpool", "replicas: 2"))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "sales", fmt.Sprintf("pool: aggpool\npartitions: %d\nreplicationFactor: 2", partitions)))).To(Succeed())
		Eventually(func(g Gomega) {
			var s streamsv1alpha1.Stream
			g.Expect(k8s.Get(ctx, key(ns, "sales"), &s)).To(Succeed())
			g.Expect(s.Status.PartitionsReady).To(Equal(int32(partitions)))
		}).WithTimeout(time.Minute).Should(Succeed())

		c, err := catena.Dial(ctx, ingest)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		producer = catena.NewProducer(c, "sales", catena.ProducerOptions{RetryTimeout: time.Minute})
		DeferCleanup(producer.Close)
	})

	// produce writes n records with keys k0..k6 over every partition (a
	// key's partials live on several shards) and adds them to the
	// reference.
	produce := func(n int, from int) {
		for i := from; i < from+n; i++ {
			k := fmt.Sprintf("k%d", i%7)
			p := uint32(i % partitions)
			amount := float64(i%13) + 0.5
			v, _ := json.Marshal(map[string]any{"amount": amount, "seq": i})
			pctx, cancelSend := context.WithTimeout(ctx, 30*time.Second)
			_, err := producer.SendSync(pctx, catena.Record{Key: []byte(k), Value: v, Partition: catena.PartitionOf(p)})
			cancelSend()
			ExpectWithOffset(1, err).NotTo(HaveOccurred(), "record %d", i)
			refCount[k]++
			refSum[k] += amount
			produced[p]++
		}
	}
	// expectResults asserts that every key's aggregates, asked of worker
	// w (which asks its peers for the shards it does not own), equal the
	// reference.
	expectResults := func(g Gomega, w *workerProcess) {
		for k, n := range refCount {
			cctx, cancelGet := context.WithTimeout(ctx, 2*time.Second)
			resp, err := w.client().Get(cctx, &catenapb.AggGetRequest{Key: k})
			cancelGet()
			g.Expect(err).NotTo(HaveOccurred(), "Get %s from %s", k, w.id)
			g.Expect(resp.GetShards()).To(HaveLen(partitions), "shards answering for %s", k)
			g.Expect(resp.GetRows()).To(HaveLen(1), "rows of %s", k)
			got := map[string]*catenapb.AggValue{}
			for _, v := range resp.GetRows()[0].GetValues() {
				got[v.GetName()] = v
			}
			g.Expect(got).To(HaveKey("orders"))
			g.Expect(got).To(HaveKey("total"))
			g.Expect(got["orders"].GetIntValue()).To(Equal(n), "count of %s", k)
			g.Expect(got["total"].GetFloatValue()).To(BeNumerically("~", refSum[k], 1e-6), "sum of %s", k)
		}
	}
	readAgg := func(g Gomega) *streamsv1alpha1.Aggregation {
		var a streamsv1alpha1.Aggregation
		g.Expect(k8s.Get(ctx, key(ns, agg), &a)).To(Succeed())
		return &a
	}
	describeAgg := func(a *streamsv1alpha1.Aggregation) string {
		b, _ := json.MarshalIndent(a.Status, "", " ")
		return string(b)
	}

	// expectRestored asserts that status records the restoration of each
	// moved shard, from a worker killed at killed to the one given, from
	// a checkpoint, that none is still awaited and that the Aggregation
	// is Ready; it returns the restorations by shard.
	expectRestored := func(g Gomega, a *streamsv1alpha1.Aggregation, moved []int32, from, to string, killed time.Time) map[int32]streamsv1alpha1.AggregationRestoration {
		restored := map[int32]streamsv1alpha1.AggregationRestoration{}
		for _, r := range a.Status.Restorations {
			if !r.Time.Time.Before(killed.Add(-time.Second)) {
				restored[r.Partition] = r
			}
		}
		out := map[int32]streamsv1alpha1.AggregationRestoration{}
		for _, p := range moved {
			r, ok := restored[p]
			g.Expect(ok).To(BeTrue(), "no restoration of shard %d since the kill: %s", p, describeAgg(a))
			g.Expect(r.FromWorker).To(Equal(from))
			g.Expect(r.ToWorker).To(Equal(to))
			g.Expect(r.Reason).To(Equal(streamsv1alpha1.RestorationWorkerFailed))
			g.Expect(r.Checkpoint).NotTo(BeNil(), "shard %d restored without a checkpoint: %s", p, describeAgg(a))
			out[p] = r
		}
		g.Expect(a.Status.Restoring).To(BeEmpty(), describeAgg(a))
		g.Expect(meta.IsStatusConditionTrue(a.Status.Conditions, streamsv1alpha1.AggregationReadyCondition)).To(BeTrue(), describeAgg(a))
		return out
	}

	It("creates the checkpoint Stream and the workers, assigns every shard and matches the reference", func() {
		produce(40, 0)
		for _, pod := range workerPods {
			workers.start(ns, pod, ingest)
			createWorkerPod(ns, agg, pod)
		}
		Expect(k8s.Create(ctx, manifest(ns, "Aggregation", agg, `source: sales
aggregates:
- name: orders
  function: Count
- name: total
  function: Sum
  field: amount
checkpointInterval: 1s
workers: 2
failureTimeout: 2s`))).To(Succeed())

		By("creating its objects, owned by it")
		var a streamsv1alpha1.Aggregation
		Expect(k8s.Get(ctx, key(ns, agg), &a)).To(Succeed())
		Eventually(func(g Gomega) {
			var cp streamsv1alpha1.Stream
			g.Expect(k8s.Get(ctx, key(ns, agg+"-checkpoints"), &cp)).To(Succeed())
			g.Expect(cp.Spec.Pool).To(Equal("aggpool"))
			g.Expect(cp.Spec.Partitions).To(Equal(int32(partitions)))
			g.Expect(cp.Spec.ReplicationFactor).To(Equal(int32(2)))
			expectControlledBy(&cp, &a)
			var sts appsv1.StatefulSet
			g.Expect(k8s.Get(ctx, key(ns, agg+"-aggregator"), &sts)).To(Succeed())
			g.Expect(*sts.Spec.Replicas).To(Equal(int32(2)))
			g.Expect(sts.Spec.Template.Spec.Containers[0].Args).To(Equal([]string{"aggregator", "--listen=:7080", "--id=$(POD_NAME)", "--metrics-listen=:9090"}))
			expectControlledBy(&sts, &a)
			for _, name := range []string{agg + "-aggregator", agg + "-aggregator-api"} {
				var svc corev1.Service
				g.Expect(k8s.Get(ctx, key(ns, name), &svc)).To(Succeed())
				expectControlledBy(&svc, &a)
			}
			var pdb policyv1.PodDisruptionBudget
			g.Expect(k8s.Get(ctx, key(ns, agg+"-aggregator"), &pdb)).To(Succeed())
			expectControlledBy(&pdb, &a)
		}).Should(Succeed())

		By("making the checkpoint Stream Ready once its pods run (written here: no kubelet or kube-controller-manager)")
		markStatefulSetReady(ns, "aggpool")
		markDeploymentAvailable(ns, agg+"-checkpoints-ingest", 1)
		Eventually(func(g Gomega) {
			var cp streamsv1alpha1.Stream
			g.Expect(k8s.Get(ctx, key(ns, agg+"-checkpoints"), &cp)).To(Succeed())
			g.Expect(cp.IsReady()).To(BeTrue(), "conditions: %+v", cp.Status.Conditions)
		}).WithTimeout(time.Minute).Should(Succeed())

		By("assigning two shards to each worker and becoming Ready")
		Eventually(func(g Gomega) {
			a := readAgg(g)
			g.Expect(meta.IsStatusConditionTrue(a.Status.Conditions, streamsv1alpha1.AggregationReadyCondition)).To(BeTrue(), describeAgg(a))
			g.Expect(a.Status.Assignments).To(HaveLen(2), describeAgg(a))
			for _, as := range a.Status.Assignments {
				g.Expect(as.Partitions).To(HaveLen(2), describeAgg(a))
			}
			g.Expect(a.Status.AssignmentGeneration).To(BeNumerically(">=", 1))
			g.Expect(a.Status.Endpoint).To(Equal(agg + "-aggregator-api." + ns + ".svc:7080"))
			g.Expect(a.Status.CheckpointStream).To(Equal(agg + "-checkpoints"))
			g.Expect(a.Finalizers).To(ContainElement(controllers.AggregationFinalizer))
		}).WithTimeout(time.Minute).Should(Succeed())

		By("giving results equal to the reference, from either worker")
		for _, pod := range workerPods {
			Eventually(func(g Gomega) { expectResults(g, workers.get(ns, pod)) }).WithTimeout(time.Minute).Should(Succeed())
		}

		By("checkpointing every shard past what was produced, and recording the stable checkpoint")
		Eventually(func(g Gomega) {
			a := readAgg(g)
			g.Expect(a.Status.Shards).To(HaveLen(partitions), describeAgg(a))
			for _, s := range a.Status.Shards {
				g.Expect(s.Phase).To(Equal("Running"), describeAgg(a))
				g.Expect(s.ConsumedOffset).To(Equal(produced[s.Partition]), describeAgg(a))
				g.Expect(s.Lag).To(BeZero(), describeAgg(a))
				g.Expect(s.Checkpoint).NotTo(BeNil(), describeAgg(a))
				g.Expect(s.Checkpoint.SourceOffset).To(Equal(produced[s.Partition]), describeAgg(a))
			}
			g.Expect(a.Status.StableCheckpoint).NotTo(BeNil(), describeAgg(a))
			g.Expect(a.Status.StableCheckpoint.SourceOffsets).To(Equal(produced), describeAgg(a))
			g.Expect(meta.FindStatusCondition(a.Status.Conditions, streamsv1alpha1.AggregationProgressingCondition)).To(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", streamsv1alpha1.AggregationUpToDateReason)), describeAgg(a))
			g.Expect(meta.FindStatusCondition(a.Status.Conditions, streamsv1alpha1.AggregationDegradedCondition)).To(
				HaveField("Status", metav1.ConditionFalse), describeAgg(a))
		}).WithTimeout(time.Minute).Should(Succeed())
	})

	It("restores a dead worker's shards on the survivor from their checkpoints, and the results stay right", func() {
		var before *streamsv1alpha1.Aggregation
		Eventually(func(g Gomega) { before = readAgg(g) }).Should(Succeed())
		const victim, survivor = agg + "-aggregator-1", agg + "-aggregator-0"
		var moved []int32
		for _, as := range before.Status.Assignments {
			if as.Worker == victim {
				moved = as.Partitions
			}
		}
		Expect(moved).NotTo(BeEmpty(), describeAgg(before))
		checkpoints := map[int32]int64{}
		for _, s := range before.Status.Shards {
			checkpoints[s.Partition] = s.Checkpoint.SourceOffset
		}

		killed := time.Now()
		workers.get(ns, victim).kill()
		Expect(k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: victim}})).To(Succeed())

		By("moving every shard to the survivor under a new generation")
		Eventually(func(g Gomega) {
			a := readAgg(g)
			g.Expect(a.Status.AssignmentGeneration).To(BeNumerically(">", before.Status.AssignmentGeneration), describeAgg(a))
			g.Expect(a.Status.Assignments).To(HaveLen(1), describeAgg(a))
			g.Expect(a.Status.Assignments[0].Worker).To(Equal(survivor))
			g.Expect(a.Status.Assignments[0].Partitions).To(ConsistOf(int32(0), int32(1), int32(2), int32(3)))
		}).Should(Succeed())

		By("recording each restoration with the checkpoint it loaded")
		Eventually(func(g Gomega) {
			a := readAgg(g)
			for p, r := range expectRestored(g, a, moved, victim, survivor, killed) {
				g.Expect(r.Checkpoint.SourceOffset).To(Equal(checkpoints[p]), "shard %d", p)
				g.Expect(r.CheckpointsLoaded).To(BeNumerically(">=", 1))
			}
		}).WithTimeout(time.Minute).Should(Succeed())
		GinkgoWriter.Printf("restored on %s within %v of the kill\n", survivor, time.Since(killed).Round(time.Millisecond))

		By("saying so in Events")
		Eventually(func(g Gomega) {
			var evs eventsv1.EventList
			g.Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			reasons := map[string]int{}
			for _, e := range evs.Items {
				if e.Regarding.Kind == "Aggregation" && e.Regarding.Name == agg {
					reasons[e.Reason]++
				}
			}
			g.Expect(reasons).To(HaveKey(streamsv1alpha1.RestorationWorkerFailed))
			g.Expect(reasons).To(HaveKey("ShardRestored"))
		}).Should(Succeed())

		By("folding what is produced afterwards into results equal to the reference")
		produce(40, 40)
		Eventually(func(g Gomega) { expectResults(g, workers.get(ns, survivor)) }).WithTimeout(time.Minute).Should(Succeed())
	})

	It("records a restoration it was killed in the middle of, once restarted", func() {
		const back, next = agg + "-aggregator-1", agg + "-aggregator-0"
		By("taking the dead worker back, and balancing the shards over both again")
		workers.start(ns, back, ingest)
		createWorkerPod(ns, agg, back)
		var before *streamsv1alpha1.Aggregation
		Eventually(func(g Gomega) {
			a := readAgg(g)
			g.Expect(a.Status.Assignments).To(HaveLen(2), describeAgg(a))
			for _, as := range a.Status.Assignments {
				g.Expect(as.Partitions).To(HaveLen(2), describeAgg(a))
			}
			g.Expect(a.Status.Restoring).To(BeEmpty(), describeAgg(a))
			for _, sh := range a.Status.Shards {
				g.Expect(sh.Phase).To(Equal("Running"), describeAgg(a))
				g.Expect(sh.Checkpoint).NotTo(BeNil(), describeAgg(a))
			}
			before = a
		}).WithTimeout(time.Minute).Should(Succeed())
		var moved []int32
		for _, as := range before.Status.Assignments {
			if as.Worker == next {
				moved = as.Partitions
			}
		}

		By("killing the operator right after it records the move of the dead worker's shards")
		kills := op.killed()
		op.killAfter(func(obj client.Object) bool {
			a, ok := obj.(*streamsv1alpha1.Aggregation)
			return ok && a.Namespace == ns && a.Status.AssignmentGeneration > before.Status.AssignmentGeneration &&
				len(a.Status.Assignments) == 1 && a.Status.Assignments[0].Worker == back
		})
		killed := time.Now()
		workers.get(ns, next).kill()
		Expect(k8s.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: next}})).To(Succeed())
		Eventually(op.killed).Should(Equal(kills+1), "the move was not recorded")

		By("having the restarted operator push the move and record each restoration")
		Eventually(func(g Gomega) {
			expectRestored(g, readAgg(g), moved, next, back, killed)
		}).WithTimeout(time.Minute).Should(Succeed())
		produce(20, 80)
		Eventually(func(g Gomega) { expectResults(g, workers.get(ns, back)) }).WithTimeout(time.Minute).Should(Succeed())
	})

	It("releases the Aggregation's retention holds when it is deleted, then lets it go", func() {
		consumer := "aggregation." + ns + "." + agg
		// holders lists, over both replicas, the consumers at or under the
		// Aggregation's name holding partitions of stream.
		holders := func(g Gomega, stream string) []string {
			var out []string
			for i := range 2 {
				hosted, err := replicas.get(ns, fmt.Sprintf("aggpool-%d", i)).hosted(stream)
				g.Expect(err).NotTo(HaveOccurred())
				for p, ps := range hosted {
					for _, h := range ps.GetHolds() {
						if c := h.GetConsumer(); c == consumer || strings.HasPrefix(c, consumer+".") {
							out = append(out, fmt.Sprintf("%s/%d:%s@%d", stream, p, c, h.GetOffset()))
						}
					}
				}
			}
			return out
		}
		By("holding retention on the source and the checkpoints while it runs")
		Eventually(func(g Gomega) {
			g.Expect(holders(g, "sales")).NotTo(BeEmpty())
			g.Expect(holders(g, agg+"-checkpoints")).NotTo(BeEmpty())
		}).Should(Succeed())

		Expect(k8s.Delete(ctx, &streamsv1alpha1.Aggregation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: agg}})).To(Succeed())
		By("removing its finalizer once every hold is released")
		Eventually(func(g Gomega) {
			err := k8s.Get(ctx, key(ns, agg), &streamsv1alpha1.Aggregation{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "Aggregation still there: %v", err)
		}).Should(Succeed())
		Expect(holders(Default, "sales")).To(BeEmpty())
		Expect(holders(Default, agg+"-checkpoints")).To(BeEmpty())
		Consistently(func(g Gomega) { g.Expect(holders(g, "sales")).To(BeEmpty()) }).WithTimeout(3*time.Second).Should(Succeed(),
			"a stopped worker renewed a hold")
	})
})
