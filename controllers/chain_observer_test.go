package controllers

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// testChain is a ReplicationChain of replication factor rf with members.
func testChain(rf int32, members ...string) *streamsv1alpha1.ReplicationChain {
	c := &streamsv1alpha1.ReplicationChain{}
	c.Spec.ReplicationFactor = rf
	for _, m := range members {
		c.Status.Members = append(c.Status.Members, streamsv1alpha1.ChainMember{Name: m, State: streamsv1alpha1.MemberInChain})
	}
	if len(members) > 0 {
		c.Status.TargetEpoch = 1
	}
	return c
}

func TestChainDigestChangesWithWhatTheMasterDecidesFrom(t *testing.T) {
	members := []*catenapb.Member{{Id: "a"}, {Id: "b"}, {Id: "c"}}
	whole := testChain(3, "a", "b", "c")
	base := func() (map[string]chainplan.Health, map[string]*catenapb.PartitionStatus) {
		health := map[string]chainplan.Health{"a": chainplan.Alive, "b": chainplan.Alive, "c": chainplan.Alive}
		reports := map[string]*catenapb.PartitionStatus{}
		for _, m := range members {
			reports[m.GetId()] = &catenapb.PartitionStatus{Stream: "s", ReplicaId: m.GetId(), Epoch: 3, Members: members,
				LogEnd: 100, Durable: 100, Committed: 90, LastLogEpoch: 3}
		}
		return health, reports
	}
	h0, r0 := base()
	want := chainDigest(h0, r0, whole)
	for _, tc := range []struct {
		name    string
		change  func(map[string]chainplan.Health, map[string]*catenapb.PartitionStatus)
		changed bool
	}{
		{"nothing", func(map[string]chainplan.Health, map[string]*catenapb.PartitionStatus) {}, false},
		{"offsets grow", func(_ map[string]chainplan.Health, r map[string]*catenapb.PartitionStatus) {
			for _, ps := range r {
				ps.LogEnd, ps.Durable, ps.Committed = 500, 500, 480
			}
		}, false},
		{"a member falls behind what the chain committed", func(_ map[string]chainplan.Health, r map[string]*catenapb.PartitionStatus) {
			r["c"].Durable = 80
		}, true},
		{"a member's predecessor sends it a commit notice beyond what it holds", func(_ map[string]chainplan.Health, r map[string]*catenapb.PartitionStatus) {
			r["c"].CommittedNotice = 120
		}, true},
		{"a member in doubt", func(h map[string]chainplan.Health, _ map[string]*catenapb.PartitionStatus) {
			h["b"] = chainplan.Unknown
		}, true},
		{"a member failed", func(h map[string]chainplan.Health, _ map[string]*catenapb.PartitionStatus) { h["b"] = chainplan.Failed }, true},
		// A whole chain has no use for a spare: a replica of the pool that
		// is no member of it comes and goes unnoticed (a replica gone dark
		// wakes its own chains, not all of the pool's).
		{"a replica of the pool returns", func(h map[string]chainplan.Health, _ map[string]*catenapb.PartitionStatus) { h["d"] = chainplan.Alive }, false},
		{"a replica of the pool fails", func(h map[string]chainplan.Health, _ map[string]*catenapb.PartitionStatus) {
			h["d"] = chainplan.Failed
		}, false},
		{"a replica holding a stale copy returns", func(h map[string]chainplan.Health, r map[string]*catenapb.PartitionStatus) {
			h["d"] = chainplan.Alive
			r["d"] = &catenapb.PartitionStatus{Stream: "s", ReplicaId: "d", Epoch: 1, Members: []*catenapb.Member{{Id: "d"}}, Restored: true}
		}, true},
		{"a member's report is gone", func(_ map[string]chainplan.Health, r map[string]*catenapb.PartitionStatus) { delete(r, "c") }, true},
		{"a new epoch", func(_ map[string]chainplan.Health, r map[string]*catenapb.PartitionStatus) { r["c"].Epoch = 4 }, true},
		{"a new membership", func(_ map[string]chainplan.Health, r map[string]*catenapb.PartitionStatus) {
			r["a"].Members = members[:2]
		}, true},
		{"a link goes down", func(_ map[string]chainplan.Health, r map[string]*catenapb.PartitionStatus) {
			r["a"].SuccessorDownMs = 20
		}, true},
		{"a link stalls", func(_ map[string]chainplan.Health, r map[string]*catenapb.PartitionStatus) {
			r["b"].SuccessorStalledMs = 20
		}, true},
		{"ingestion cannot reach the head", func(_ map[string]chainplan.Health, r map[string]*catenapb.PartitionStatus) {
			r["b"].HeadUnreachableMs = 150
		}, true},
		{"a copy reopened from its volume", func(_ map[string]chainplan.Health, r map[string]*catenapb.PartitionStatus) { r["c"].Restored = true }, true},
		{"an error", func(_ map[string]chainplan.Health, r map[string]*catenapb.PartitionStatus) {
			r["c"].Error = "checksum mismatch"
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, r := base()
			for id, ps := range r {
				r[id] = proto.Clone(ps).(*catenapb.PartitionStatus)
			}
			tc.change(h, r)
			if got := chainDigest(h, r, whole) != want; got != tc.changed {
				t.Fatalf("digest changed: %v, want %v", got, tc.changed)
			}
		})
	}
	// How long a link has been down is not news; the health it leads to
	// is.
	h1, r1 := base()
	r1["a"].SuccessorDownMs = 20
	h2, r2 := base()
	r2["a"].SuccessorDownMs = 900
	if chainDigest(h1, r1, whole) != chainDigest(h2, r2, whole) {
		t.Fatalf("the digest changes with the length of a link report")
	}
}

func TestChainDigestOfAShortChainWatchesThePool(t *testing.T) {
	health := map[string]chainplan.Health{"a": chainplan.Alive, "b": chainplan.Alive}
	short := testChain(3, "a", "b")
	unplaced := testChain(3)
	for _, c := range []*streamsv1alpha1.ReplicationChain{short, unplaced} {
		before := chainDigest(health, nil, c)
		// A spare appears: the master of a short chain may grow it.
		after := chainDigest(map[string]chainplan.Health{"a": chainplan.Alive, "b": chainplan.Alive, "d": chainplan.Alive}, nil, c)
		if before == after {
			t.Errorf("chain of %d members: a new spare does not change the digest", len(c.Status.Members))
		}
	}
}

func TestFailedMember(t *testing.T) {
	abc := []*catenapb.Member{{Id: "a"}, {Id: "b"}, {Id: "c"}}
	dbc := []*catenapb.Member{{Id: "d"}, {Id: "b"}, {Id: "c"}}
	for _, tc := range []struct {
		name             string
		health           map[string]chainplan.Health
		reports          map[string]*catenapb.PartitionStatus
		chain            *streamsv1alpha1.ReplicationChain
		wantFailed, head bool
	}{
		{"all alive", map[string]chainplan.Health{"a": chainplan.Alive, "b": chainplan.Alive, "c": chainplan.Alive}, nil, testChain(3, "a", "b", "c"), false, false},
		{"a recorded middle failed", map[string]chainplan.Health{"a": chainplan.Alive, "b": chainplan.Failed, "c": chainplan.Alive}, nil, testChain(3, "a", "b", "c"), true, false},
		{"the recorded head failed", map[string]chainplan.Health{"a": chainplan.Failed, "b": chainplan.Alive, "c": chainplan.Alive}, nil, testChain(3, "a", "b", "c"), true, true},
		{"a member in doubt is not yet failed", map[string]chainplan.Health{"a": chainplan.Alive, "b": chainplan.Unknown, "c": chainplan.Alive}, nil, testChain(3, "a", "b", "c"), false, false},
		{"another replica of the pool failed", map[string]chainplan.Health{"a": chainplan.Alive, "b": chainplan.Alive, "c": chainplan.Alive, "d": chainplan.Failed}, nil, testChain(3, "a", "b", "c"), false, false},
		{"a member only the reports name failed", map[string]chainplan.Health{"a": chainplan.Alive, "b": chainplan.Alive, "c": chainplan.Failed},
			map[string]*catenapb.PartitionStatus{"a": {ReplicaId: "a", Epoch: 2, Members: abc}}, testChain(3, "a", "b"), true, false},
		{"a removal installed and not yet recorded: no longer waiting", map[string]chainplan.Health{"a": chainplan.Failed, "b": chainplan.Alive, "c": chainplan.Alive},
			map[string]*catenapb.PartitionStatus{"b": {ReplicaId: "b", Epoch: 1027, Members: abc[1:]}, "c": {ReplicaId: "c", Epoch: 1027, Members: abc[1:]}}, testChain(3, "a", "b", "c"), false, false},
		{"the head of an epoch not yet recorded failed", map[string]chainplan.Health{"a": chainplan.Alive, "b": chainplan.Alive, "c": chainplan.Alive, "d": chainplan.Failed},
			map[string]*catenapb.PartitionStatus{"b": {ReplicaId: "b", Epoch: 1027, Members: dbc}}, testChain(3, "a", "b", "c"), true, true},
	} {
		failed, head := failedMember(tc.health, tc.reports, tc.chain)
		if failed != tc.wantFailed || head != tc.head {
			t.Errorf("%s: failedMember = %v, %v, want %v, %v", tc.name, failed, head, tc.wantFailed, tc.head)
		}
	}
}

func BenchmarkChainDigest(b *testing.B) {
	members := []*catenapb.Member{{Id: "pool-0"}, {Id: "pool-1"}, {Id: "pool-2"}}
	health := map[string]chainplan.Health{}
	for i := range 6 {
		health[fmt.Sprintf("pool-%d", i)] = chainplan.Alive
	}
	reports := map[string]*catenapb.PartitionStatus{}
	for _, m := range members {
		reports[m.GetId()] = &catenapb.PartitionStatus{Stream: "s", ReplicaId: m.GetId(), Epoch: 3, Members: members, LastLogEpoch: 3}
	}
	chain := testChain(3, "pool-0", "pool-1", "pool-2")
	b.ReportAllocs()
	for b.Loop() {
		chainDigest(health, reports, chain)
	}
}

func TestResyncAfterSpreadsChains(t *testing.T) {
	seen := map[time.Duration]bool{}
	for i := range 64 {
		d := resyncAfter(types.NamespacedName{Namespace: "ns", Name: fmt.Sprintf("wide-%d", i)})
		if d < chainResyncInterval || d > chainResyncInterval*6/5 {
			t.Fatalf("chain %d resyncs after %v, outside [%v, %v]", i, d, chainResyncInterval, chainResyncInterval*6/5)
		}
		seen[d] = true
	}
	if len(seen) < 32 {
		t.Fatalf("64 chains resync at only %d distinct delays", len(seen))
	}
}

func TestEnqueueAtPutsUrgentChainsFirst(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("test")
	defer q.ShutDown()
	chain := func(name string) event.GenericEvent {
		c := &streamsv1alpha1.ReplicationChain{}
		c.Namespace, c.Name = "ns", name
		return event.GenericEvent{Object: c}
	}
	ordinary := &handler.EnqueueRequestForObject{}
	urgent := enqueueAt(urgentPriority)
	ctx := context.Background()
	ordinary.Generic(ctx, chain("settled-0"), q)
	ordinary.Generic(ctx, chain("settled-1"), q)
	urgent.Generic(ctx, chain("failed-member"), q)
	// Already queued at the ordinary priority, then found urgent: raised.
	urgent.Generic(ctx, chain("settled-1"), q)

	var order []string
	for range 3 {
		req, prio, _ := q.GetWithPriority()
		order = append(order, fmt.Sprintf("%s@%d", req.Name, prio))
		q.Done(req)
	}
	want := []string{"failed-member@100", "settled-1@100", "settled-0@0"}
	if !slices.Equal(order, want) {
		t.Fatalf("dequeued %v, want %v", order, want)
	}
}
