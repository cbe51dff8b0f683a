package envtest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	catena "github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/controllers"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// The chain controller against real replica processes: what it writes in
// the API must be what the replicas run.
var _ = Describe("Chain controller", Ordered, func() {
	var (
		ns       string
		replicas *replicaSet
	)
	// failureTimeout is short so that a killed replica is replaced quickly.
	const failureTimeout = 2 * time.Second

	BeforeAll(func() {
		ns = newNamespace()
		replicas = newReplicaSet()
		startOperator(controllers.Options{Image: testImage, ReplicaAddr: replicas.addr, FailureTimeout: failureTimeout}, ns)
	})

	chains := func(g Gomega, stream string, n int) []streamsv1alpha1.ReplicationChain {
		return chainsOf(g, ns, stream, n)
	}
	expectInstalled := func(g Gomega, stream string, n, rf int) []streamsv1alpha1.ReplicationChain {
		return expectChainsInstalled(g, replicas, ns, stream, n, rf)
	}
	appendTo := func(c streamsv1alpha1.ReplicationChain, n int) {
		GinkgoHelper()
		appendRecords(replicas, ns, c, n, 0)
	}
	// roles counts heads, tails and memberships per pod.
	roles := func(cs []streamsv1alpha1.ReplicationChain) (heads, tails, members map[string]int) {
		heads, tails, members = map[string]int{}, map[string]int{}, map[string]int{}
		for _, c := range cs {
			heads[c.Head()]++
			tails[c.Tail()]++
			for _, m := range c.Status.Members {
				members[m.Name]++
			}
		}
		return heads, tails, members
	}
	// spread is the difference between the most and the fewest of counts
	// over pods.
	spread := func(counts map[string]int, pods []string) int {
		lo, hi := counts[pods[0]], counts[pods[0]]
		for _, p := range pods {
			lo, hi = min(lo, counts[p]), max(hi, counts[p])
		}
		return hi - lo
	}

	It("installs the standalone sample's chains on its replicas and makes the Stream Ready", func() {
		for i := range 3 {
			replicas.start(ns, fmt.Sprintf("events-pool-%d", i))
		}
		createSamples(ns, "stream-standalone.yaml")

		By("placing every chain on three pods and installing it at epoch 1")
		var cs []streamsv1alpha1.ReplicationChain
		Eventually(func(g Gomega) { cs = expectInstalled(g, "events", 6, 3) }).Should(Succeed())
		for _, c := range cs {
			Expect(c.Status.TargetEpoch).To(Equal(int64(1)))
			Expect(c.Status.LastReconfiguration).NotTo(BeNil())
			Expect(c.Status.LastReconfiguration.Reason).To(Equal(streamsv1alpha1.ReconfigurationCreated))
		}
		heads, tails, _ := roles(cs)
		Expect(heads).To(Equal(map[string]int{"events-pool-0": 2, "events-pool-1": 2, "events-pool-2": 2}))
		Expect(tails).To(Equal(map[string]int{"events-pool-0": 2, "events-pool-1": 2, "events-pool-2": 2}))

		By("sending the Stream's config with the membership")
		hosted, err := replicas.get(ns, "events-pool-0").hosted("events")
		Expect(err).NotTo(HaveOccurred())
		Expect(hosted).To(HaveLen(6))
		cfg := hosted[0].GetConfig()
		Expect(cfg.GetPartitions()).To(Equal(uint32(6)))
		Expect(cfg.GetRetentionMs()).To(Equal((168 * time.Hour).Milliseconds()))
		Expect(cfg.GetRetentionBytes()).To(Equal(int64(20 << 30)))
		Expect(cfg.GetDurability()).To(Equal(catenapb.Durability_DURABILITY_FSYNC))
		Expect(cfg.GetMinChainLength()).To(Equal(uint32(2)))

		By("reporting each Partition's head, tail, epoch and committed offset")
		appendTo(cs[0], 5)
		Eventually(func(g Gomega) {
			var p streamsv1alpha1.Partition
			g.Expect(k8s.Get(ctx, key(ns, "events-0"), &p)).To(Succeed())
			g.Expect(p.Status.Head).To(Equal(cs[0].Head()))
			g.Expect(p.Status.Tail).To(Equal(cs[0].Tail()))
			g.Expect(p.Status.ChainEpoch).To(Equal(int64(1)))
			g.Expect(p.Status.CommittedOffset).To(Equal(int64(5)))
			g.Expect(p.IsReady()).To(BeTrue())
		}).Should(Succeed())

		By("making the Stream Ready once its pods run (written here: no kubelet or kube-controller-manager)")
		markStatefulSetReady(ns, "events-pool")
		markDeploymentAvailable(ns, "events-ingest", 2)
		Eventually(func(g Gomega) {
			var s streamsv1alpha1.Stream
			g.Expect(k8s.Get(ctx, key(ns, "events"), &s)).To(Succeed())
			g.Expect(s.Status.PartitionsReady).To(Equal(int32(6)))
			g.Expect(s.IsReady()).To(BeTrue(), "conditions: %+v", s.Status.Conditions)
		}).Should(Succeed())

		By("recording the placement as Events")
		Eventually(func(g Gomega) {
			var evs eventsv1.EventList
			g.Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			var reasons []string
			for _, e := range evs.Items {
				if e.Regarding.Kind == "ReplicationChain" && e.Regarding.Name == "events-0" {
					reasons = append(reasons, e.Reason)
				}
			}
			g.Expect(reasons).To(ContainElement(string(streamsv1alpha1.ReconfigurationCreated)))
		}).Should(Succeed())

		By("installing a changed segment size on every member under the same epoch")
		var stream streamsv1alpha1.Stream
		Expect(k8s.Get(ctx, key(ns, "events"), &stream)).To(Succeed())
		patch := client.MergeFrom(stream.DeepCopy())
		stream.Spec.SegmentBytes = ptr.To(resource.MustParse("64Mi"))
		Expect(k8s.Patch(ctx, &stream, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			for i := range 3 {
				hosted, err := replicas.get(ns, fmt.Sprintf("events-pool-%d", i)).hosted("events")
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(hosted).To(HaveLen(6))
				for _, ps := range hosted {
					g.Expect(ps.GetConfig().GetSegmentBytes()).To(Equal(int64(64 << 20)))
					g.Expect(ps.GetEpoch()).To(Equal(uint64(1)))
				}
			}
		}).Should(Succeed())
	})

	sharedPods := []string{"shared-0", "shared-1", "shared-2", "shared-3", "shared-4"}

	It("spreads the chains of the shared-pool sample's two Streams over the same pods", func() {
		for _, pod := range sharedPods {
			replicas.start(ns, pod)
		}
		createSamples(ns, "shared-pool.yaml")

		var all []streamsv1alpha1.ReplicationChain
		Eventually(func(g Gomega) {
			all = append(expectInstalled(g, "orders", 12, 3), expectInstalled(g, "clicks", 24, 2)...)
		}).Should(Succeed())
		heads, tails, members := roles(all)
		Expect(spread(heads, sharedPods)).To(BeNumerically("<=", 2), "heads of both streams balanced over the pool: %v", heads)
		Expect(spread(tails, sharedPods)).To(BeNumerically("<=", 2), "tails of both streams balanced over the pool: %v", tails)
		Expect(spread(members, sharedPods)).To(BeNumerically("<=", 2), "memberships balanced over the pool: %v", members)
		for _, pod := range sharedPods {
			for _, stream := range []string{"orders", "clicks"} {
				hosted, err := replicas.get(ns, pod).hosted(stream)
				Expect(err).NotTo(HaveOccurred())
				Expect(hosted).NotTo(BeEmpty(), "%s hosts partitions of %s", pod, stream)
			}
		}
	})

	It("replaces a killed replica in every chain it served, and drops its old copies when it returns", func() {
		const victim = "shared-0"
		before := map[string]streamsv1alpha1.ReplicationChain{}
		Eventually(func(g Gomega) {
			for _, c := range append(chains(g, "orders", 12), chains(g, "clicks", 24)...) {
				before[c.Name] = c
			}
		}).Should(Succeed())
		for _, c := range before {
			appendTo(c, 3)
		}
		replicas.get(ns, victim).kill()

		By("reordering its chains without it and completing them from the free pods")
		Eventually(func(g Gomega) {
			for _, c := range append(expectInstalled(g, "orders", 12, 3), expectInstalled(g, "clicks", 24, 2)...) {
				prev := before[c.Name]
				var names []string
				for _, m := range c.Status.Members {
					names = append(names, m.Name)
				}
				g.Expect(names).NotTo(ContainElement(victim), describeChain(&c))
				if !slices.ContainsFunc(prev.Status.Members, func(m streamsv1alpha1.ChainMember) bool { return m.Name == victim }) {
					g.Expect(c.Status.TargetEpoch).To(Equal(prev.Status.TargetEpoch), "a chain without the victim is left alone: %s", describeChain(&c))
					continue
				}
				g.Expect(c.Status.TargetEpoch).To(BeNumerically(">=", prev.Status.TargetEpoch+2), "removal, then addition: %s", describeChain(&c))
				g.Expect(c.Status.LastReconfiguration.Reason).To(Equal(streamsv1alpha1.ReconfigurationMemberReplaced), describeChain(&c))
				// The survivors keep their order, and the replacement, a
				// full copy now, is at the tail.
				var survivors []string
				for _, m := range prev.Status.Members {
					if m.Name != victim {
						survivors = append(survivors, m.Name)
					}
				}
				g.Expect(names[:len(names)-1]).To(Equal(survivors), describeChain(&c))
				hosted, err := replicas.get(ns, c.Tail()).hosted(c.Spec.Stream)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(hosted[uint32(*c.Spec.Partition)].GetDurable()).To(BeNumerically(">=", 3), "the replacement copied the log")
			}
		}).Should(Succeed())

		By("recording why in Events")
		Eventually(func(g Gomega) {
			var evs eventsv1.EventList
			g.Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			reasons := map[string]bool{}
			for _, e := range evs.Items {
				reasons[e.Reason] = true
			}
			g.Expect(reasons).To(HaveKey(string(streamsv1alpha1.ReconfigurationMemberReplaced)))
			g.Expect(reasons[string(streamsv1alpha1.ReconfigurationHeadFailed)] || reasons[string(streamsv1alpha1.ReconfigurationMiddleFailed)] ||
				reasons[string(streamsv1alpha1.ReconfigurationTailFailed)]).To(BeTrue(), "%v", reasons)
		}).Should(Succeed())

		By("dropping the returning replica's copies that no chain needs any more")
		replicas.start(ns, victim)
		Eventually(func(g Gomega) {
			for _, stream := range []string{"orders", "clicks"} {
				hosted, err := replicas.get(ns, victim).hosted(stream)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(hosted).To(BeEmpty(), "%s still holds partitions of %s", victim, stream)
			}
		}).Should(Succeed())
	})

	It("reorders the chains of a killed replica under a new epoch and takes it back at the tail", func() {
		for i := range 3 {
			replicas.start(ns, fmt.Sprintf("trio-%d", i))
		}
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "trio", "replicas: 3"))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "views", "pool: trio\npartitions: 3"))).To(Succeed())
		before := map[string]streamsv1alpha1.ReplicationChain{}
		Eventually(func(g Gomega) {
			for _, c := range expectInstalled(g, "views", 3, 3) {
				before[c.Name] = c
			}
		}).Should(Succeed())
		for _, c := range before {
			appendTo(c, 3)
		}
		const victim = "trio-0"
		replicas.get(ns, victim).kill()

		By("removing it from every chain, with the role it had as the reason")
		Eventually(func(g Gomega) {
			for _, c := range chains(g, "views", 3) {
				prev := before[c.Name]
				g.Expect(c.Status.TargetEpoch).To(BeNumerically(">", prev.Status.TargetEpoch), describeChain(&c))
				var names []string
				for _, m := range c.Status.Members {
					names = append(names, m.Name)
					g.Expect(m.ConfirmedEpoch).To(Equal(c.Status.TargetEpoch), describeChain(&c))
				}
				g.Expect(names).NotTo(ContainElement(victim), describeChain(&c))
				want := streamsv1alpha1.ReconfigurationMiddleFailed
				switch victim {
				case prev.Head():
					want = streamsv1alpha1.ReconfigurationHeadFailed
				case prev.Tail():
					want = streamsv1alpha1.ReconfigurationTailFailed
				}
				g.Expect(c.Status.LastReconfiguration.Reason).To(Equal(want), describeChain(&c))
				g.Expect(meta.IsStatusConditionTrue(c.Status.Conditions, streamsv1alpha1.ReplicationChainDegradedCondition)).To(BeTrue(), describeChain(&c))
			}
		}).Should(Succeed())
		By("saying in the Stream which chains are short")
		Eventually(func(g Gomega) {
			var s streamsv1alpha1.Stream
			g.Expect(k8s.Get(ctx, key(ns, "views"), &s)).To(Succeed())
			d := meta.FindStatusCondition(s.Status.Conditions, streamsv1alpha1.StreamDegradedCondition)
			g.Expect(d).NotTo(BeNil())
			g.Expect(d.Reason).To(Equal(streamsv1alpha1.StreamUnderReplicatedReason))
			g.Expect(d.Message).To(ContainSubstring("3 chains have fewer than 3 members: views-0: 2 of 3 members in chain"))
		}).Should(Succeed())

		By("taking the returning replica back at the tail of every chain")
		replicas.start(ns, victim)
		Eventually(func(g Gomega) {
			for _, c := range expectInstalled(g, "views", 3, 3) {
				g.Expect(c.Tail()).To(Equal(victim), describeChain(&c))
				g.Expect(c.Status.LastReconfiguration.Reason).To(Equal(streamsv1alpha1.ReconfigurationMemberReturned), describeChain(&c))
				g.Expect(meta.IsStatusConditionTrue(c.Status.Conditions, streamsv1alpha1.ReplicationChainDegradedCondition)).To(BeFalse(), describeChain(&c))
				hosted, err := replicas.get(ns, victim).hosted(c.Spec.Stream)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(hosted[uint32(*c.Spec.Partition)].GetDurable()).To(BeNumerically(">=", 3), "%s's copy of %s", victim, c.Name)
			}
			var s streamsv1alpha1.Stream
			g.Expect(k8s.Get(ctx, key(ns, "views"), &s)).To(Succeed())
			g.Expect(meta.FindStatusCondition(s.Status.Conditions, streamsv1alpha1.StreamDegradedCondition)).To(BeNil())
		}).Should(Succeed())
	})

	It("replaces a paused replica whose pod failed, and once resumed it completes no write and serves nothing uncommitted", func() {
		var c0 streamsv1alpha1.ReplicationChain
		Eventually(func(g Gomega) { c0 = expectInstalled(g, "views", 3, 3)[0] }).Should(Succeed())
		victim := replicas.get(ns, c0.Head())
		committedBefore := func() uint64 {
			hosted, err := victim.hosted("views")
			Expect(err).NotTo(HaveOccurred())
			return hosted[0].GetCommitted()
		}()
		victim.pause()
		DeferCleanup(victim.resume) // if the spec fails half-way

		By("marking its pod Failed, as the kubelet would")
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: victim.id, Labels: map[string]string{
				"app.kubernetes.io/name": "catena", "app.kubernetes.io/component": "replica", "app.kubernetes.io/instance": "trio"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "replica", Image: testImage}}},
		}
		Expect(k8s.Create(ctx, pod)).To(Succeed())
		pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: memory."}
		Expect(k8s.Status().Update(ctx, pod)).To(Succeed())

		By("reordering its chains without it, installed on the members")
		// Installed, not only recorded: a deposed head whose successor has
		// not heard of the new epoch yet can still pass a write down its
		// old chain, which then commits it (its producer saw an error: an
		// unacknowledged write may or may not be stored).
		Eventually(func(g Gomega) {
			for _, c := range chains(g, "views", 3) {
				for _, m := range c.Status.Members {
					g.Expect(m.Name).NotTo(Equal(victim.id), describeChain(&c))
					g.Expect(m.ConfirmedEpoch).To(Equal(c.Status.TargetEpoch), describeChain(&c))
				}
				g.Expect(c.Status.TargetEpoch).To(BeNumerically(">", c0.Status.TargetEpoch))
			}
		}).Should(Succeed())

		By("resuming it: as the head it still believes it is, it cannot complete a write")
		victim.resume()
		actx, cancelAppend := context.WithTimeout(ctx, 3*time.Second)
		_, err := victim.client().Append(actx, &catenapb.AppendRequest{Stream: "views", Partition: 0, Epoch: uint64(c0.Status.TargetEpoch),
			Records: []*catenapb.AppendRecord{{Value: []byte("from a deposed head")}}})
		cancelAppend()
		Expect(err).To(HaveOccurred(), "a deposed head acknowledged a write")
		GinkgoWriter.Printf("deposed head's append: %v\n", err)

		By("and nothing it holds beyond what was committed is served, by it or by the chain")
		rctx, cancelRead := context.WithTimeout(ctx, 2*time.Second)
		resp, err := victim.client().Read(rctx, &catenapb.FetchRequest{Stream: "views", Partition: 0, Offset: committedBefore})
		cancelRead()
		if err == nil {
			for _, r := range resp.GetRecords() {
				Expect(string(r.GetValue())).NotTo(Equal("from a deposed head"))
			}
		}
		var after streamsv1alpha1.ReplicationChain
		Expect(k8s.Get(ctx, key(ns, "views-0"), &after)).To(Succeed())
		head := replicas.get(ns, after.Head())
		rctx, cancelRead = context.WithTimeout(ctx, 2*time.Second)
		resp, err = head.client().Read(rctx, &catenapb.FetchRequest{Stream: "views", Partition: 0, Offset: 0, MaxBytes: 1 << 20})
		cancelRead()
		Expect(err).NotTo(HaveOccurred())
		for _, r := range resp.GetRecords() {
			Expect(string(r.GetValue())).NotTo(Equal("from a deposed head"), "the chain serves a record its deposed head never committed")
		}

		By("taking it back at the tail once its pod is replaced and it answers")
		Expect(k8s.Delete(ctx, pod)).To(Succeed())
		Eventually(func(g Gomega) {
			for _, c := range expectInstalled(g, "views", 3, 3) {
				g.Expect(c.Tail()).To(Equal(victim.id), describeChain(&c))
			}
		}).Should(Succeed())
	})

	It("measures write unavailability through the operator after member kills", func() {
		pods := []string{"pace-0", "pace-1", "pace-2"}
		var addrs []string
		for _, pod := range pods {
			addrs = append(addrs, replicas.start(ns, pod).addr)
		}
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "pace", "replicas: 3"))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "load", "pool: pace\npartitions: 1"))).To(Succeed())
		Eventually(func(g Gomega) { expectInstalled(g, "load", 1, 3) }).Should(Succeed())

		c, err := catena.Dial(ctx, startIngest(addrs))
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		prod := catena.NewProducer(c, "load", catena.ProducerOptions{MaxInFlight: 1, RetryTimeout: time.Minute, MaxRetryBackoff: 100 * time.Millisecond})
		DeferCleanup(prod.Close)

		// One producer, one record at a time: every acknowledgement's time
		// and offset, in order.
		type ack struct {
			at     time.Time
			offset uint64
			value  string
		}
		var (
			mu   sync.Mutex
			acks []ack
		)
		loadCtx, stopLoad := context.WithCancel(ctx)
		loadDone := make(chan struct{})
		go func() {
			defer GinkgoRecover()
			defer close(loadDone)
			for i := 0; loadCtx.Err() == nil; i++ {
				v := fmt.Sprintf("v%d", i)
				a, err := prod.SendSync(loadCtx, catena.Record{Value: []byte(v), Partition: catena.PartitionOf(0)})
				if err != nil {
					Expect(loadCtx.Err()).To(HaveOccurred(), "a record failed: %v", err)
					return
				}
				mu.Lock()
				acks = append(acks, ack{at: time.Now(), offset: a.Offset, value: v})
				mu.Unlock()
			}
		}()
		acked := func() int {
			mu.Lock()
			defer mu.Unlock()
			return len(acks)
		}
		Eventually(acked).Should(BeNumerically(">", 50))

		var gaps []time.Duration
		for i := range 6 {
			var ch streamsv1alpha1.ReplicationChain
			Eventually(func(g Gomega) { ch = expectInstalled(g, "load", 1, 3)[0] }).Should(Succeed())
			n := acked()
			Eventually(acked).Should(BeNumerically(">", n+20), "writes flow before the kill")
			// Heads, middles and tails in turn: a head is noticed by its
			// silence only, the others also by their predecessor's link.
			role, victim := "head", ch.Head()
			switch i % 3 {
			case 1:
				role, victim = "middle", ch.Status.Members[1].Name
			case 2:
				role, victim = "tail", ch.Tail()
			}
			head := replicas.get(ns, victim)
			killed := time.Now()
			head.kill()
			mu.Lock()
			before := len(acks)
			last := acks[before-1].at
			mu.Unlock()
			Eventually(acked).WithTimeout(time.Minute).Should(BeNumerically(">", before), "writes resume after the head was killed")
			mu.Lock()
			first := acks[before].at
			mu.Unlock()
			gaps = append(gaps, first.Sub(last))
			GinkgoWriter.Printf("killed %s %s at %s: last ack %s before, first ack %s after\n", role, head.id, killed.Format(time.StampMilli),
				killed.Sub(last).Round(time.Millisecond), first.Sub(killed).Round(time.Millisecond))
			replicas.start(ns, head.id)
		}
		stopLoad()
		<-loadDone

		slices.Sort(gaps)
		p := func(q float64) time.Duration { return gaps[min(len(gaps)-1, int(q*float64(len(gaps))))] }
		AddReportEntry("write unavailability through the operator", fmt.Sprintf("p50 %v p99 %v (n=%d, failure timeout %v)",
			p(0.5).Round(time.Millisecond), p(0.99).Round(time.Millisecond), len(gaps), failureTimeout))
		fmt.Fprintf(GinkgoWriter, "write unavailability through the operator after member kills: p50 %v p99 %v (n=%d, failure timeout %v)\n",
			p(0.5).Round(time.Millisecond), p(0.99).Round(time.Millisecond), len(gaps), failureTimeout)

		By("finding every acknowledged record at its offset")
		Eventually(func(g Gomega) { expectInstalled(g, "load", 1, 3) }).Should(Succeed())
		mu.Lock()
		defer mu.Unlock()
		byOffset := map[uint64]string{}
		for next := uint64(0); next <= acks[len(acks)-1].offset; {
			res, err := c.Fetch(ctx, "load", 0, next, 1<<20, time.Second)
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Messages).NotTo(BeEmpty(), "nothing committed at %d", next)
			for _, m := range res.Messages {
				byOffset[m.Offset] = string(m.Value)
				next = m.Offset + 1
			}
		}
		for _, a := range acks {
			Expect(byOffset[a.offset]).To(Equal(a.value), "acknowledged record at offset %d", a.offset)
		}
	})

	It("drops a deleted Stream's partitions from its shared pool when its policy is Delete, and keeps them with Retain", func() {
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "scratch", "pool: trio\npartitions: 2\nvolumeReclaimPolicy: Delete"))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "keep", "pool: trio\npartitions: 2"))).To(Succeed())
		Eventually(func(g Gomega) {
			expectInstalled(g, "scratch", 2, 3)
			expectInstalled(g, "keep", 2, 3)
		}).Should(Succeed())
		for _, name := range []string{"scratch", "keep"} {
			Expect(k8s.Delete(ctx, &streamsv1alpha1.Stream{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})).To(Succeed())
		}
		Eventually(func(g Gomega) {
			for _, name := range []string{"scratch", "keep"} {
				err := k8s.Get(ctx, key(ns, name), &streamsv1alpha1.Stream{})
				g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "Stream %s: %v", name, err)
			}
		}).Should(Succeed())
		for i := range 3 {
			p := replicas.get(ns, fmt.Sprintf("trio-%d", i))
			hosted, err := p.hosted("scratch")
			Expect(err).NotTo(HaveOccurred())
			Expect(hosted).To(BeEmpty(), "%s still hosts the deleted Stream's partitions", p.id)
			hosted, err = p.hosted("keep")
			Expect(err).NotTo(HaveOccurred())
			Expect(hosted).To(HaveLen(2), "%s dropped a Retain Stream's partitions", p.id)
		}
	})

	It("records each chain in its Stream's ledger before installing it, and never writes over a ConfigMap in the ledger's way", func() {
		By("keeping the chains of a Stream whose ledger name is taken unplaced, and saying why")
		theirs := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "taken-chain-ledger"}, Data: map[string]string{"mine": "yes"}}
		Expect(k8s.Create(ctx, theirs)).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "taken", "pool: trio\npartitions: 2"))).To(Succeed())
		Eventually(func(g Gomega) {
			var evs eventsv1.EventList
			g.Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			var notes []string
			for _, e := range evs.Items {
				if e.Regarding.Kind == "ReplicationChain" && e.Regarding.Name == "taken-0" && e.Reason == "ChainLedgerUnreadable" {
					notes = append(notes, e.Note)
				}
			}
			g.Expect(notes).To(ContainElement(ContainSubstring("ConfigMap %s/taken-chain-ledger is in the way of Stream taken's chain ledger", ns)))
		}).Should(Succeed())
		Consistently(func(g Gomega) {
			for _, c := range chains(g, "taken", 2) {
				g.Expect(c.Status.Members).To(BeEmpty(), describeChain(&c))
			}
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(theirs), theirs)).To(Succeed())
			g.Expect(theirs.Data).To(Equal(map[string]string{"mine": "yes"}))
		}).WithTimeout(time.Second).Should(Succeed())

		By("placing them once it is out of the way, with the ledger the Stream owns as their record")
		Expect(k8s.Delete(ctx, theirs)).To(Succeed())
		var cs []streamsv1alpha1.ReplicationChain
		Eventually(func(g Gomega) { cs = expectInstalled(g, "taken", 2, 3) }).WithTimeout(30 * time.Second).Should(Succeed())
		var stream streamsv1alpha1.Stream
		Expect(k8s.Get(ctx, key(ns, "taken"), &stream)).To(Succeed())
		var ledger corev1.ConfigMap
		Expect(k8s.Get(ctx, key(ns, "taken-chain-ledger"), &ledger)).To(Succeed())
		Expect(metav1.GetControllerOf(&ledger).UID).To(Equal(stream.UID))
		for _, c := range cs {
			var e struct {
				Chain   string   `json:"chain"`
				Epoch   int64    `json:"epoch"`
				Members []string `json:"members"`
			}
			Expect(json.Unmarshal([]byte(ledger.Data[fmt.Sprintf("partition-%d", *c.Spec.Partition)]), &e)).To(Succeed())
			var members []string
			for _, m := range c.Status.Members {
				members = append(members, m.Name)
			}
			Expect(e.Chain).To(Equal(string(c.UID)))
			Expect(e.Epoch).To(Equal(c.Status.TargetEpoch), describeChain(&c))
			Expect(e.Members).To(Equal(members), describeChain(&c))
		}
	})
})
