package envtest_test

import (
	"context"
	"fmt"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
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

	// chains reads the ReplicationChains of a stream, by partition.
	chains := func(g Gomega, stream string, n int) []streamsv1alpha1.ReplicationChain {
		out := make([]streamsv1alpha1.ReplicationChain, n)
		for i := range n {
			g.Expect(k8s.Get(ctx, key(ns, streamsv1alpha1.PartitionName(stream, int32(i))), &out[i])).To(Succeed())
		}
		return out
	}
	// expectInstalled asserts that every chain of stream is placed, that
	// every member confirmed the chain's epoch, and that the replica
	// processes run exactly that membership.
	expectInstalled := func(g Gomega, stream string, n, rf int) []streamsv1alpha1.ReplicationChain {
		cs := chains(g, stream, n)
		for i := range cs {
			c := &cs[i]
			g.Expect(c.Status.Members).To(HaveLen(rf), describeChain(c))
			g.Expect(meta.IsStatusConditionTrue(c.Status.Conditions, streamsv1alpha1.ReplicationChainReadyCondition)).To(BeTrue(), describeChain(c))
			var want []string
			for _, m := range c.Status.Members {
				g.Expect(m.State).To(Equal(streamsv1alpha1.MemberInChain), describeChain(c))
				g.Expect(m.ConfirmedEpoch).To(Equal(c.Status.TargetEpoch), describeChain(c))
				want = append(want, m.Name)
			}
			for _, m := range c.Status.Members {
				hosted, err := replicas.get(ns, m.Name).hosted(stream)
				g.Expect(err).NotTo(HaveOccurred())
				ps := hosted[uint32(*c.Spec.Partition)]
				g.Expect(ps).NotTo(BeNil(), "%s does not host %s", m.Name, c.Name)
				g.Expect(ps.GetEpoch()).To(Equal(uint64(c.Status.TargetEpoch)), "%s's epoch of %s", m.Name, c.Name)
				var got []string
				for _, pm := range ps.GetMembers() {
					got = append(got, pm.GetId())
				}
				g.Expect(got).To(Equal(want), "%s's membership of %s", m.Name, c.Name)
			}
		}
		return cs
	}

	It("installs a Stream's chains on the replicas and reports what they confirmed", func() {
		for i := range 3 {
			replicas.start(ns, fmt.Sprintf("orders-pool-%d", i))
		}
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "orders", `
partitions: 3
replicas: 3
retention:
  time: 24h
  bytes: 1Gi`))).To(Succeed())

		By("placing every chain on three pods and installing it at epoch 1")
		var cs []streamsv1alpha1.ReplicationChain
		Eventually(func(g Gomega) { cs = expectInstalled(g, "orders", 3, 3) }).Should(Succeed())
		heads, tails := map[string]int{}, map[string]int{}
		for _, c := range cs {
			Expect(c.Status.TargetEpoch).To(Equal(int64(1)))
			Expect(c.Status.LastReconfiguration).NotTo(BeNil())
			Expect(c.Status.LastReconfiguration.Reason).To(Equal(streamsv1alpha1.ReconfigurationCreated))
			heads[c.Head()]++
			tails[c.Tail()]++
		}
		Expect(heads).To(HaveLen(3), "three chains on three pods: one head each")
		Expect(tails).To(HaveLen(3), "three chains on three pods: one tail each")

		By("sending the Stream's config with the membership")
		hosted, err := replicas.get(ns, "orders-pool-0").hosted("orders")
		Expect(err).NotTo(HaveOccurred())
		Expect(hosted).To(HaveLen(3))
		cfg := hosted[0].GetConfig()
		Expect(cfg.GetPartitions()).To(Equal(uint32(3)))
		Expect(cfg.GetRetentionMs()).To(Equal((24 * time.Hour).Milliseconds()))
		Expect(cfg.GetRetentionBytes()).To(Equal(int64(1 << 30)))
		Expect(cfg.GetDurability()).To(Equal(catenapb.Durability_DURABILITY_FSYNC))
		Expect(cfg.GetMinChainLength()).To(Equal(uint32(2)))

		By("reporting each Partition's head, tail, epoch and committed offset")
		c0 := cs[0]
		head := replicas.get(ns, c0.Head())
		recs := make([]*catenapb.AppendRecord, 5)
		for i := range recs {
			recs[i] = &catenapb.AppendRecord{Value: []byte(fmt.Sprintf("r%d", i))}
		}
		actx, cancelAppend := context.WithTimeout(ctx, 10*time.Second)
		_, err = head.client().Append(actx, &catenapb.AppendRequest{Stream: "orders", Partition: 0, Epoch: 1, Records: recs})
		cancelAppend()
		Expect(err).NotTo(HaveOccurred())
		Eventually(func(g Gomega) {
			var p streamsv1alpha1.Partition
			g.Expect(k8s.Get(ctx, key(ns, "orders-0"), &p)).To(Succeed())
			g.Expect(p.Status.Head).To(Equal(c0.Head()))
			g.Expect(p.Status.Tail).To(Equal(c0.Tail()))
			g.Expect(p.Status.ChainEpoch).To(Equal(int64(1)))
			g.Expect(p.Status.CommittedOffset).To(Equal(int64(5)))
			g.Expect(p.IsReady()).To(BeTrue())
		}).Should(Succeed())

		By("counting every Partition ready in the Stream")
		Eventually(func(g Gomega) {
			var s streamsv1alpha1.Stream
			g.Expect(k8s.Get(ctx, key(ns, "orders"), &s)).To(Succeed())
			g.Expect(s.Status.PartitionsReady).To(Equal(int32(3)))
		}).Should(Succeed())

		By("recording the placement as Events")
		Eventually(func(g Gomega) {
			var evs eventsv1.EventList
			g.Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			var reasons []string
			for _, e := range evs.Items {
				if e.Regarding.Kind == "ReplicationChain" && e.Regarding.Name == "orders-0" {
					reasons = append(reasons, e.Reason)
				}
			}
			g.Expect(reasons).To(ContainElement(string(streamsv1alpha1.ReconfigurationCreated)))
		}).Should(Succeed())
	})

	It("spreads the chains of two Streams on one shared ReplicaPool over the same pods", func() {
		for i := range 3 {
			replicas.start(ns, fmt.Sprintf("shared-%d", i))
		}
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "shared", "replicas: 3"))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "clicks", "pool: shared\npartitions: 3"))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", "views", "pool: shared\npartitions: 3"))).To(Succeed())

		var all []streamsv1alpha1.ReplicationChain
		Eventually(func(g Gomega) {
			all = append(expectInstalled(g, "clicks", 3, 3), expectInstalled(g, "views", 3, 3)...)
		}).Should(Succeed())
		heads, tails := map[string]int{}, map[string]int{}
		for _, c := range all {
			heads[c.Head()]++
			tails[c.Tail()]++
		}
		Expect(heads).To(Equal(map[string]int{"shared-0": 2, "shared-1": 2, "shared-2": 2}), "heads of both streams balanced over the pool")
		Expect(tails).To(Equal(map[string]int{"shared-0": 2, "shared-1": 2, "shared-2": 2}), "tails of both streams balanced over the pool")
		for i := range 3 {
			p := replicas.get(ns, fmt.Sprintf("shared-%d", i))
			for _, stream := range []string{"clicks", "views"} {
				hosted, err := p.hosted(stream)
				Expect(err).NotTo(HaveOccurred())
				Expect(hosted).To(HaveLen(3), "%s hosts every partition of %s (RF 3 on 3 pods)", p.id, stream)
			}
		}
	})

	It("reorders the chains of a killed replica under a new epoch and takes it back at the tail", func() {
		victim := replicas.get(ns, "shared-0")
		before := map[string]streamsv1alpha1.ReplicationChain{}
		Eventually(func(g Gomega) {
			for _, c := range append(chains(g, "clicks", 3), chains(g, "views", 3)...) {
				before[c.Name] = c
			}
		}).Should(Succeed())
		By("writing records to every partition, so that the killed replica returns with a log")
		for _, c := range before {
			recs := []*catenapb.AppendRecord{{Value: []byte("a")}, {Value: []byte("b")}, {Value: []byte("c")}}
			actx, cancelAppend := context.WithTimeout(ctx, 10*time.Second)
			_, err := replicas.get(ns, c.Head()).client().Append(actx, &catenapb.AppendRequest{
				Stream: c.Spec.Stream, Partition: uint32(*c.Spec.Partition), Epoch: uint64(c.Status.TargetEpoch), Records: recs})
			cancelAppend()
			Expect(err).NotTo(HaveOccurred(), "append to %s", c.Name)
		}
		victim.kill()

		By("removing it from every chain, with the role it had as the reason")
		Eventually(func(g Gomega) {
			for _, c := range append(chains(g, "clicks", 3), chains(g, "views", 3)...) {
				prev := before[c.Name]
				g.Expect(c.Status.TargetEpoch).To(BeNumerically(">", prev.Status.TargetEpoch), describeChain(&c))
				var names []string
				for _, m := range c.Status.Members {
					names = append(names, m.Name)
					g.Expect(m.ConfirmedEpoch).To(Equal(c.Status.TargetEpoch), describeChain(&c))
				}
				g.Expect(names).NotTo(ContainElement("shared-0"), describeChain(&c))
				want := map[string]streamsv1alpha1.ReconfigurationReason{
					prev.Head(): streamsv1alpha1.ReconfigurationHeadFailed,
					prev.Tail(): streamsv1alpha1.ReconfigurationTailFailed,
				}["shared-0"]
				if want == "" {
					want = streamsv1alpha1.ReconfigurationMiddleFailed
				}
				g.Expect(c.Status.LastReconfiguration.Reason).To(Equal(want), describeChain(&c))
				g.Expect(meta.IsStatusConditionTrue(c.Status.Conditions, streamsv1alpha1.ReplicationChainDegradedCondition)).To(BeTrue(), describeChain(&c))
			}
		}).Should(Succeed())

		By("taking the returning replica back at the tail of every chain")
		replicas.start(ns, "shared-0")
		Eventually(func(g Gomega) {
			for _, c := range append(expectInstalled(g, "clicks", 3, 3), expectInstalled(g, "views", 3, 3)...) {
				g.Expect(c.Tail()).To(Equal("shared-0"), describeChain(&c))
				g.Expect(c.Status.LastReconfiguration.Reason).To(Equal(streamsv1alpha1.ReconfigurationMemberReturned), describeChain(&c))
				g.Expect(meta.IsStatusConditionTrue(c.Status.Conditions, streamsv1alpha1.ReplicationChainDegradedCondition)).To(BeFalse(), describeChain(&c))
				hosted, err := replicas.get(ns, "shared-0").hosted(c.Spec.Stream)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(hosted[uint32(*c.Spec.Partition)].GetDurable()).To(BeNumerically(">=", 3), "%s's copy of %s", "shared-0", c.Name)
			}
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			var evs eventsv1.EventList
			g.Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
			var reasons []string
			for _, e := range evs.Items {
				reasons = append(reasons, e.Reason)
			}
			g.Expect(slices.Contains(reasons, string(streamsv1alpha1.ReconfigurationMemberReturned))).To(BeTrue(), "%v", reasons)
		}).Should(Succeed())
	})
})
