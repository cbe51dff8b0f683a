package controllers

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

func chainOf(name string, target int64, members ...streamsv1alpha1.ChainMember) streamsv1alpha1.ReplicationChain {
	c := streamsv1alpha1.ReplicationChain{}
	c.Name = name
	c.Spec.ReplicationFactor = 2
	c.Spec.Stream = "s"
	var p int32
	fmt.Sscanf(name, "s-%d", &p)
	c.Spec.Partition = &p
	c.Status.TargetEpoch = target
	c.Status.Members = members
	return c
}

func member(name string, state streamsv1alpha1.MemberState, confirmed int64) streamsv1alpha1.ChainMember {
	return streamsv1alpha1.ChainMember{Name: name, State: state, ConfirmedEpoch: confirmed}
}

func TestChainsReady(t *testing.T) {
	in := streamsv1alpha1.MemberInChain
	holds := func(parts ...int32) map[partitionKey]heldCopy {
		m := map[partitionKey]heldCopy{}
		for _, p := range parts {
			m[partitionKey{"s", p}] = heldCopy{}
		}
		return m
	}
	restoredToo := func(m map[partitionKey]heldCopy, p int32) map[partitionKey]heldCopy {
		m[partitionKey{"s", p}] = heldCopy{restored: true}
		return m
	}
	for _, tc := range []struct {
		name   string
		chains []streamsv1alpha1.ReplicationChain
		hosted map[partitionKey]heldCopy
		ready  bool
		msg    string
	}{
		{"no chains: nothing waits for it", nil, nil, true, "every chain"},
		{"in chain everywhere at the target", []streamsv1alpha1.ReplicationChain{
			chainOf("s-0", 3, member("p-0", in, 3), member("p-1", in, 3)),
			chainOf("s-1", 5, member("p-1", in, 5), member("p-0", in, 5)),
		}, holds(0, 1), true, "every chain"},
		{"removed and not yet taken back: a short chain whose copy it holds", []streamsv1alpha1.ReplicationChain{
			chainOf("s-0", 4, member("p-1", in, 4)),
			chainOf("s-1", 3, member("p-1", in, 3), member("p-2", in, 3)),
		}, holds(0), false, "s-0 has 1 of 2 members in chain and not its copy"},
		{"another pod's chain is short: not this pod's business", []streamsv1alpha1.ReplicationChain{
			chainOf("s-0", 4, member("p-1", in, 4)),
			chainOf("s-1", 3, member("p-0", in, 3), member("p-2", in, 3)),
		}, holds(1), true, "every chain"},
		{"replaced: the chain is full without its copy", []streamsv1alpha1.ReplicationChain{
			chainOf("s-0", 3, member("p-1", in, 3), member("p-2", in, 3)),
		}, holds(0), true, "every chain"},
		{"listed failed (the chain's last member)", []streamsv1alpha1.ReplicationChain{
			chainOf("s-1", 4, member("p-0", streamsv1alpha1.MemberFailed, 3)),
		}, holds(1), false, "s-1 lists it Failed at epoch 3 of 4"},
		{"catching up at the tail", []streamsv1alpha1.ReplicationChain{
			chainOf("s-0", 6, member("p-1", in, 6), member("p-0", streamsv1alpha1.MemberCatchingUp, 5)),
		}, holds(0), false, "s-0 lists it CatchingUp"},
		{"restarted, still listed in chain: its restored copy holds the gate", []streamsv1alpha1.ReplicationChain{
			chainOf("s-0", 3, member("p-0", in, 3), member("p-1", in, 3)),
			chainOf("s-1", 5, member("p-1", in, 5), member("p-0", in, 5)),
		}, restoredToo(holds(0), 1), false, "s-1: its copy was reopened from its volume"},
		{"in chain, not yet confirmed a new epoch: still in chain", []streamsv1alpha1.ReplicationChain{
			chainOf("s-0", 7, member("p-0", in, 6), member("p-1", in, 7)),
		}, holds(0), true, "every chain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ready, msg := chainsReady("p-0", tc.chains, tc.hosted)
			if ready != tc.ready || !strings.Contains(msg, tc.msg) {
				t.Fatalf("chainsReady = %v %q, want %v and a message with %q", ready, msg, tc.ready, tc.msg)
			}
		})
	}
	var many []streamsv1alpha1.ReplicationChain
	for i := range 12 {
		many = append(many, chainOf("c"+string(rune('a'+i)), 2, member("p-0", streamsv1alpha1.MemberFailed, 1)))
	}
	if _, msg := chainsReady("p-0", many, nil); !strings.HasSuffix(msg, "and 4 more") {
		t.Fatalf("a long list must be cut: %q", msg)
	}
}

func TestGateCondition(t *testing.T) {
	t0 := metav1.NewTime(time.Unix(100, 0))
	t1 := metav1.NewTime(time.Unix(200, 0))
	c := gateCondition(nil, false, "not yet back in s-0", t0)
	if c.Type != ChainsReadyCondition || c.Status != corev1.ConditionFalse || c.Reason != chainsReadyNotInChains || !c.LastTransitionTime.Equal(&t0) {
		t.Fatalf("first condition: %+v", c)
	}
	same := gateCondition(&c, false, "not yet back in s-1", t1)
	if !same.LastTransitionTime.Equal(&t0) || same.Message != "not yet back in s-1" {
		t.Fatalf("a new message without a new status keeps the transition time: %+v", same)
	}
	flipped := gateCondition(&c, true, "in chain", t1)
	if flipped.Status != corev1.ConditionTrue || flipped.Reason != chainsReadyInChains || !flipped.LastTransitionTime.Equal(&t1) {
		t.Fatalf("a flip moves the transition time: %+v", flipped)
	}
}
