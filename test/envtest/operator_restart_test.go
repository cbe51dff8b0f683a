package envtest_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/controllers"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// The operator killed in the middle of a repair: what it decided is in the
// API (the Stream's chain ledger) before any replica hears of it, so the next operator (a restarted
// pod, or another replica taking the lease) finishes the step, and status
// says what happened.

// recordedReorder is a chain's reorder as the killed operator wrote it.
type recordedReorder struct {
	mu      sync.Mutex
	chain   string
	epoch   int64
	members []string
	reason  streamsv1alpha1.ReconfigurationReason
}

// ledgerEntry is an entry of a Stream's chain ledger, the ConfigMap
// <stream>-chain-ledger whose key partition-<n> holds partition n's record
// as JSON (controllers/chain_ledger.go).
type ledgerEntry struct {
	Epoch   int64                                 `json:"epoch"`
	Members []string                              `json:"members"`
	Reason  streamsv1alpha1.ReconfigurationReason `json:"reason"`
}

// matcher is a kill point: the first write of stream's chain ledger that
// records a reorder removing a failed member above epoch floor[chain].
func (rr *recordedReorder) matcher(ns, stream string, floor map[string]int64) func(client.Object) bool {
	return func(obj client.Object) bool {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok || cm.Namespace != ns || cm.Name != stream+"-chain-ledger" {
			return false
		}
		for k, v := range cm.Data {
			p, err := strconv.Atoi(strings.TrimPrefix(k, "partition-"))
			Expect(err).NotTo(HaveOccurred(), "ledger key %q", k)
			var e ledgerEntry
			Expect(json.Unmarshal([]byte(v), &e)).To(Succeed(), "ledger entry %s", k)
			name := streamsv1alpha1.PartitionName(stream, int32(p))
			if e.Epoch <= floor[name] {
				continue
			}
			switch e.Reason {
			case streamsv1alpha1.ReconfigurationHeadFailed, streamsv1alpha1.ReconfigurationMiddleFailed, streamsv1alpha1.ReconfigurationTailFailed:
			default:
				continue
			}
			rr.mu.Lock()
			rr.chain, rr.epoch, rr.reason, rr.members = name, e.Epoch, e.Reason, e.Members
			rr.mu.Unlock()
			return true
		}
		return false
	}
}

func (rr *recordedReorder) get() (string, int64, []string, streamsv1alpha1.ReconfigurationReason) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return rr.chain, rr.epoch, slices.Clone(rr.members), rr.reason
}

// expectReorderFinished asserts that the recorded reorder is what the
// chain runs: the epoch the killed operator wrote, confirmed by the
// members it wrote, with its reason, and that every member holds the
// records acknowledged before.
func expectReorderFinished(g Gomega, replicas *replicaSet, ns, stream string, rr *recordedReorder, acked uint64) {
	name, epoch, members, reason := rr.get()
	var c streamsv1alpha1.ReplicationChain
	g.Expect(k8s.Get(ctx, key(ns, name), &c)).To(Succeed())
	g.Expect(c.Status.TargetEpoch).To(Equal(epoch), "the next operator installs the epoch the killed one recorded: %s", describeChain(&c))
	g.Expect(c.Status.LastReconfiguration.Reason).To(Equal(reason), describeChain(&c))
	var got []string
	for _, m := range c.Status.Members {
		got = append(got, m.Name)
		g.Expect(m.State).To(Equal(streamsv1alpha1.MemberInChain), describeChain(&c))
		g.Expect(m.ConfirmedEpoch).To(Equal(epoch), describeChain(&c))
		hosted, err := replicas.get(ns, m.Name).hosted(stream)
		g.Expect(err).NotTo(HaveOccurred())
		ps := hosted[uint32(*c.Spec.Partition)]
		g.Expect(ps.GetEpoch()).To(Equal(uint64(epoch)), "%s's epoch of %s", m.Name, c.Name)
		g.Expect(ps.GetDurable()).To(BeNumerically(">=", acked), "%s's copy of %s", m.Name, c.Name)
	}
	g.Expect(got).To(Equal(members), describeChain(&c))
}

var _ = Describe("The operator killed in the middle of a repair", Ordered, func() {
	const (
		failureTimeout = 2 * time.Second
		stream         = "ledger"
		partitions     = 3
		victim         = "crash-1"
	)
	var (
		ns       string
		replicas *replicaSet
		op       *operatorSupervisor
		before   = map[string]streamsv1alpha1.ReplicationChain{}
	)

	BeforeAll(func() {
		ns = newNamespace()
		replicas = newReplicaSet()
		for i := range 3 {
			// A returning replica copies at 1 MiB/s: a catch-up lasts
			// long enough to kill the operator in the middle of it.
			replicas.start(ns, fmt.Sprintf("crash-%d", i), "--catch-up-rate", "1")
		}
		op = superviseOperator(controllers.Options{Image: testImage, ReplicaAddr: replicas.addr, FailureTimeout: failureTimeout}, false, 1, ns)
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "crash", "replicas: 3"))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", stream, fmt.Sprintf("pool: crash\npartitions: %d", partitions)))).To(Succeed())
		Eventually(func(g Gomega) {
			for _, c := range expectChainsInstalled(g, replicas, ns, stream, partitions, 3) {
				before[c.Name] = c
			}
		}).Should(Succeed())
		for _, c := range before {
			appendRecords(replicas, ns, c, 50, 0)
		}
	})

	It("finishes a reorder whose new epoch it had recorded but not installed", func() {
		floor := map[string]int64{}
		for name, c := range before {
			floor[name] = c.Status.TargetEpoch
		}
		rr := &recordedReorder{}
		op.killAfter(rr.matcher(ns, stream, floor))
		replicas.get(ns, victim).kill()

		Eventually(op.killed).Should(Equal(1), "no reorder was recorded")
		name, epoch, members, reason := rr.get()
		GinkgoWriter.Printf("killed after recording %s at epoch %d: %v (%s)\n", name, epoch, members, reason)
		Expect(members).NotTo(ContainElement(victim))

		By("having the restarted operator install it, and the other chains' reorders too")
		Eventually(func(g Gomega) { expectReorderFinished(g, replicas, ns, stream, rr, 50) }).Should(Succeed())
		Eventually(func(g Gomega) {
			for _, c := range chainsOf(g, ns, stream, partitions) {
				g.Expect(c.Status.TargetEpoch).To(BeNumerically(">", floor[c.Name]), describeChain(&c))
				for _, m := range c.Status.Members {
					g.Expect(m.Name).NotTo(Equal(victim), describeChain(&c))
					g.Expect(m.ConfirmedEpoch).To(Equal(c.Status.TargetEpoch), describeChain(&c))
				}
			}
		}).Should(Succeed())
	})

	It("finishes a catch-up it was killed in the middle of", func() {
		c := chainsOf(Default, ns, stream, partitions)[0]
		// 8192 records (4 MiB) the victim missed: twice the join lag, so
		// that it copies outside the chain first, for about 2 s at 1 MiB/s.
		for range 16 {
			appendRecords(replicas, ns, c, 512, 512)
		}
		head, err := replicas.get(ns, c.Head()).hosted(stream)
		Expect(err).NotTo(HaveOccurred())
		end := head[0].GetLogEnd()

		replicas.start(ns, victim, "--catch-up-rate", "1")
		By("killing the operator while the victim copies the log outside the chain")
		Eventually(func(g Gomega) {
			hosted, err := replicas.get(ns, victim).hosted(stream)
			g.Expect(err).NotTo(HaveOccurred())
			ps := hosted[0]
			g.Expect(ps).NotTo(BeNil())
			g.Expect(ps.GetRole()).To(Equal(catenapb.Role_ROLE_NONE))
			g.Expect(ps.GetLogEnd()).To(And(BeNumerically(">", 50), BeNumerically("<", end)), "copied so far")
		}).WithPolling(20 * time.Millisecond).Should(Succeed())
		kills := op.killed()
		op.killNow(op.leader())
		Expect(op.killed()).To(Equal(kills + 1))

		By("having the restarted operator take it back at the tail once it has copied everything")
		Eventually(func(g Gomega) {
			cs := expectChainsInstalled(g, replicas, ns, stream, partitions, 3)
			g.Expect(cs[0].Tail()).To(Equal(victim), describeChain(&cs[0]))
			g.Expect(cs[0].Status.LastReconfiguration.Reason).To(Equal(streamsv1alpha1.ReconfigurationMemberReturned), describeChain(&cs[0]))
			hosted, err := replicas.get(ns, victim).hosted(stream)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(hosted[0].GetDurable()).To(BeNumerically(">=", end), "the victim's copy")
		}).WithTimeout(2 * time.Minute).Should(Succeed())
	})
})

var _ = Describe("Two operator replicas with leader election", Ordered, func() {
	const (
		failureTimeout = 2 * time.Second
		stream         = "audit"
		partitions     = 2
		victim         = "elect-2"
	)

	It("hand over a reorder the killed leader had recorded, without losing it", func() {
		ns := newNamespace()
		replicas := newReplicaSet()
		for i := range 3 {
			replicas.start(ns, fmt.Sprintf("elect-%d", i))
		}
		op := superviseOperator(controllers.Options{Image: testImage, ReplicaAddr: replicas.addr, FailureTimeout: failureTimeout}, true, 2, ns)
		Expect(k8s.Create(ctx, manifest(ns, "ReplicaPool", "elect", "replicas: 3"))).To(Succeed())
		Expect(k8s.Create(ctx, manifest(ns, "Stream", stream, fmt.Sprintf("pool: elect\npartitions: %d", partitions)))).To(Succeed())
		floor := map[string]int64{}
		Eventually(func(g Gomega) {
			for _, c := range expectChainsInstalled(g, replicas, ns, stream, partitions, 3) {
				floor[c.Name] = c.Status.TargetEpoch
			}
		}).Should(Succeed())
		for _, c := range chainsOf(Default, ns, stream, partitions) {
			appendRecords(replicas, ns, c, 20, 0)
		}
		leader := op.leader()
		Expect(leader).NotTo(BeNil())
		holder := func(g Gomega) string {
			var l coordinationv1.Lease
			g.Expect(k8s.Get(ctx, key(ns, "catena-operator.streams.catena.io"), &l)).To(Succeed())
			g.Expect(l.Spec.HolderIdentity).NotTo(BeNil())
			return *l.Spec.HolderIdentity
		}
		first := holder(Default)

		rr := &recordedReorder{}
		op.killAfter(rr.matcher(ns, stream, floor))
		replicas.get(ns, victim).kill()
		Eventually(op.killed).Should(Equal(1), "no reorder was recorded")
		name, epoch, members, _ := rr.get()
		GinkgoWriter.Printf("leader %s killed after recording %s at epoch %d: %v\n", leader.name, name, epoch, members)

		By("having the other replica take the lease, before the killed one is back, and install what the killed leader recorded")
		Eventually(func(g Gomega) {
			g.Expect(holder(g)).NotTo(Equal(first))
			expectReorderFinished(g, replicas, ns, stream, rr, 20)
		}).Should(Succeed())
		next := op.leader()
		Expect(next).NotTo(BeNil())
		Expect(next).NotTo(BeIdenticalTo(leader))
		Expect(next.name).NotTo(Equal(leader.name), "the standby took over")
	})
})
