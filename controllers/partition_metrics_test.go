package controllers

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

func TestCountPartitions(t *testing.T) {
	chain := func(ns, stream string, target int64, members ...streamsv1alpha1.ChainMember) streamsv1alpha1.ReplicationChain {
		c := streamsv1alpha1.ReplicationChain{}
		c.Namespace, c.Spec.Stream, c.Spec.ReplicationFactor = ns, stream, 3
		c.Status.TargetEpoch, c.Status.Members = target, members
		return c
	}
	in := func(name string, confirmed int64) streamsv1alpha1.ChainMember {
		return streamsv1alpha1.ChainMember{Name: name, State: streamsv1alpha1.MemberInChain, ConfirmedEpoch: confirmed}
	}
	catching := func(name string, confirmed int64) streamsv1alpha1.ChainMember {
		return streamsv1alpha1.ChainMember{Name: name, State: streamsv1alpha1.MemberCatchingUp, ConfirmedEpoch: confirmed}
	}
	chains := []streamsv1alpha1.ReplicationChain{
		chain("shop", "orders", 4, in("a", 4), in("b", 4), in("c", 4)),       // whole
		chain("shop", "orders", 9, in("a", 9), in("b", 9), catching("d", 9)), // a spare copying in
		chain("shop", "orders", 1027, in("b", 1027), in("c", 4)),             // a removal being confirmed
		chain("shop", "orders", 5, in("a", 5)),                               // one full copy: below min 2
		chain("shop", "unknown", 1, in("a", 1), in("b", 1), in("c", 1)),      // no Stream: not counted
		chain("billing", "orders", 2, in("a", 2), in("b", 2), in("c", 2)),    // another namespace's
	}
	got := countPartitions(chains, func(k types.NamespacedName) (int, bool) { return 2, k.Name == "orders" })
	want := map[types.NamespacedName]partitionCounts{
		{Namespace: "shop", Name: "orders"}:    {total: 4, underReplicated: 3, refusingWrites: 1, reconfiguring: 1},
		{Namespace: "billing", Name: "orders"}: {total: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %+v, want %+v", k, got[k], w)
		}
	}
}
