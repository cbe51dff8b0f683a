package envtest_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// The operator writes Partitions and ReplicationChains; their schema still
// holds it to the invariants of the design: epochs and committed offsets
// only grow, and names follow <stream>-<index>.
var _ = Describe("Partition", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	It("is named after its Stream and index", func() {
		expectRejected(k8s.Create(ctx, manifest(ns, "Partition", "orders-7", "stream: orders\nindex: 3")),
			"a Partition is named <stream>-<index>")
		Expect(k8s.Create(ctx, manifest(ns, "Partition", "orders-3", "stream: orders\nindex: 3"))).To(Succeed())
	})

	It("keeps its epoch and offsets from going backwards", func() {
		p := &streamsv1alpha1.Partition{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: streamsv1alpha1.PartitionName("orders", 0)},
			Spec:       streamsv1alpha1.PartitionSpec{Stream: "orders", Index: ptr.To[int32](0)},
		}
		Expect(k8s.Create(ctx, p)).To(Succeed())
		p.Status = streamsv1alpha1.PartitionStatus{
			Head: "shared-0", Tail: "shared-2", ChainEpoch: 5, CommittedOffset: 100, LogStartOffset: 10,
		}
		Expect(k8s.Status().Update(ctx, p)).To(Succeed())

		for _, c := range []struct {
			change  func(*streamsv1alpha1.PartitionStatus)
			message string
		}{
			{func(s *streamsv1alpha1.PartitionStatus) { s.ChainEpoch = 4 }, "chainEpoch only grows"},
			{func(s *streamsv1alpha1.PartitionStatus) { s.CommittedOffset = 99 }, "committedOffset never goes backwards"},
			{func(s *streamsv1alpha1.PartitionStatus) { s.LogStartOffset = 9 }, "logStartOffset never goes backwards"},
		} {
			q := p.DeepCopy()
			c.change(&q.Status)
			expectRejected(k8s.Status().Update(ctx, q), c.message)
		}

		p.Status.ChainEpoch, p.Status.CommittedOffset = 6, 150
		Expect(k8s.Status().Update(ctx, p)).To(Succeed())
	})

	It("has an immutable spec", func() {
		p := manifest(ns, "Partition", "orders-1", "stream: orders\nindex: 1")
		Expect(k8s.Create(ctx, p)).To(Succeed())
		stored := get(p)
		set(stored, "spec.index", "2")
		expectRejected(k8s.Update(ctx, stored), "a Partition's stream and index are immutable")
	})
})

var _ = Describe("ReplicationChain", func() {
	var ns string
	BeforeEach(func() { ns = newNamespace() })

	newChain := func() *streamsv1alpha1.ReplicationChain {
		c := &streamsv1alpha1.ReplicationChain{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: streamsv1alpha1.PartitionName("orders", 2)},
			Spec: streamsv1alpha1.ReplicationChainSpec{
				Stream: "orders", Partition: ptr.To[int32](2), Pool: "shared", ReplicationFactor: 3,
			},
		}
		Expect(k8s.Create(ctx, c)).To(Succeed())
		c.Status = streamsv1alpha1.ReplicationChainStatus{
			TargetEpoch: 3,
			Members: []streamsv1alpha1.ChainMember{
				{Name: "shared-1", State: streamsv1alpha1.MemberInChain, ConfirmedEpoch: 3},
				{Name: "shared-2", State: streamsv1alpha1.MemberInChain, ConfirmedEpoch: 3},
				{Name: "shared-0", State: streamsv1alpha1.MemberCatchingUp, ConfirmedEpoch: 2},
			},
			LastReconfiguration: &streamsv1alpha1.Reconfiguration{
				Time: metav1.Now(), Epoch: 3, Reason: streamsv1alpha1.ReconfigurationMemberReturned,
				Message: "shared-0 returned and is catching up from the tail",
			},
		}
		Expect(k8s.Status().Update(ctx, c)).To(Succeed())
		Expect(c.Head()).To(Equal("shared-1"))
		Expect(c.Tail()).To(Equal("shared-0"))
		Expect(c.Converged()).To(BeTrue())
		return c
	}

	It("keeps its target epoch from going backwards", func() {
		c := newChain()
		c.Status.TargetEpoch = 2
		c.Status.Members = c.Status.Members[2:]
		expectRejected(k8s.Status().Update(ctx, c), "targetEpoch only grows")
	})

	It("refuses a member confirming an epoch the operator has not written", func() {
		c := newChain()
		c.Status.Members[0].ConfirmedEpoch = 4
		expectRejected(k8s.Status().Update(ctx, c), "a member cannot have confirmed an epoch above targetEpoch")
	})

	It("refuses the same replica twice in a chain", func() {
		c := newChain()
		c.Status.Members[2].Name = "shared-1"
		expectRejected(k8s.Status().Update(ctx, c), "members must be distinct replica pods")
	})

	It("refuses an unknown member state and reconfiguration reason", func() {
		c := newChain()
		c.Status.Members[2].State = "Sleeping"
		c.Status.LastReconfiguration.Reason = "Whim"
		err := k8s.Status().Update(ctx, c)
		expectRejected(err, `status.members[2].state: Unsupported value: "Sleeping"`)
		expectRejected(err, `status.lastReconfiguration.reason: Unsupported value: "Whim"`)
	})

	It("has an immutable spec", func() {
		c := newChain()
		c.Spec.ReplicationFactor = 2
		expectRejected(k8s.Update(ctx, c), "a ReplicationChain's stream, partition, pool and replicationFactor are immutable")
	})
})
