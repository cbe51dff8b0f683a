package controllers

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
)

func TestChainDigestChangesWithWhatTheMasterDecidesFrom(t *testing.T) {
	members := []*catenapb.Member{{Id: "a"}, {Id: "b"}, {Id: "c"}}
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
	want := chainDigest(h0, r0)
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
		{"a member in doubt", func(h map[string]chainplan.Health, _ map[string]*catenapb.PartitionStatus) {
			h["b"] = chainplan.Unknown
		}, true},
		{"a member failed", func(h map[string]chainplan.Health, _ map[string]*catenapb.PartitionStatus) { h["b"] = chainplan.Failed }, true},
		{"a replica of the pool returns", func(h map[string]chainplan.Health, _ map[string]*catenapb.PartitionStatus) { h["d"] = chainplan.Alive }, true},
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
			if got := chainDigest(h, r) != want; got != tc.changed {
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
	if chainDigest(h1, r1) != chainDigest(h2, r2) {
		t.Fatalf("the digest changes with the length of a link report")
	}
}
