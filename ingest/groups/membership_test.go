package groups

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestOwnerIsTheSameOnEveryNodeAndMovesOnlyWhatALeavingNodeHad(t *testing.T) {
	hosts := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}
	nodes := make([]*Membership, len(hosts))
	for i, h := range hosts {
		nodes[i] = NewMembership(h)
		// Each node reads the list in its own order.
		nodes[i].Set(append(append([]string{}, hosts[i:]...), hosts[:i]...))
	}
	owned := map[string]int{}
	before := map[string]Peer{}
	for g := range 300 {
		group := fmt.Sprintf("group-%d", g)
		p, _ := nodes[0].Owner(group)
		selves := 0
		for _, n := range nodes {
			q, self := n.Owner(group)
			if q != p {
				t.Fatalf("%s: node %s names %v, node %s names %v", group, nodes[0].Self().Host, p, n.Self().Host, q)
			}
			if self {
				selves++
			}
		}
		if selves != 1 {
			t.Fatalf("%s: %d nodes take themselves for its coordinator, want 1", group, selves)
		}
		owned[p.Host]++
		before[group] = p
	}
	for _, h := range hosts {
		// 300 groups over 3 nodes: each gets a fair share.
		if owned[h] < 60 {
			t.Errorf("node %s coordinates %d of 300 groups: %v", h, owned[h], owned)
		}
	}
	// 10.0.0.2 leaves: only its groups move.
	nodes[0].Set([]string{"10.0.0.1", "10.0.0.3"})
	for group, was := range before {
		now, _ := nodes[0].Owner(group)
		if was.Host != "10.0.0.2" && now != was {
			t.Errorf("%s moved from %s to %s though %s stayed", group, was.Host, now.Host, was.Host)
		}
		if now.Host == "10.0.0.2" {
			t.Errorf("%s is still given to the node that left", group)
		}
	}
}

func TestMembershipList(t *testing.T) {
	m := NewMembership("10.0.0.1")
	if _, self := m.Owner("g"); !self || len(m.Peers()) != 1 {
		t.Fatalf("alone: owner self %v, peers %v", self, m.Peers())
	}
	v := m.Version()
	m.Set([]string{"10.0.0.2", "10.0.0.1", "10.0.0.2"})
	if got := m.Peers(); len(got) != 2 || got[0].Host != "10.0.0.1" || got[1].Host != "10.0.0.2" || got[1].ID != PeerID("10.0.0.2") {
		t.Fatalf("peers %v, want 10.0.0.1 and 10.0.0.2 by host, each once", got)
	}
	if m.Version() != v+1 {
		t.Fatalf("version %d after a change from %d", m.Version(), v)
	}
	m.Set([]string{"10.0.0.1", "10.0.0.2"})
	if m.Version() != v+1 {
		t.Fatal("the same list again counted as a change")
	}
	// Not published as up (not ready yet): it coordinates nothing, as the
	// others count it out.
	m.Set([]string{"10.0.0.2"})
	for g := range 50 {
		if p, self := m.Owner(fmt.Sprint(g)); self || p.Host != "10.0.0.2" {
			t.Fatalf("group %d: owner %v self %v while this node is not listed", g, p, self)
		}
	}
	// Nothing published at all: alone rather than refusing every group.
	m.Set(nil)
	if _, self := m.Owner("g"); !self {
		t.Fatal("with an empty list the node does not coordinate")
	}
	if PeerID("10.0.0.1") < 0 || PeerID("10.0.0.1") != PeerID("10.0.0.1") {
		t.Fatal("peer ids are not stable and non-negative")
	}
}

// sharedFixture is two coordinators over one store, as two ingestion
// nodes over one offsets stream.
func sharedFixture(t *testing.T) (a, b *Coordinator, ma, mb *Membership, store *memOffsets, clk *clock) {
	clk = &clock{t: time.Unix(1_700_000_000, 0)}
	store = &memOffsets{}
	ma, mb = NewMembership("10.0.0.1"), NewMembership("10.0.0.2")
	a = New(Options{Offsets: store, Now: clk.now, InitialRebalanceDelay: -1, Membership: ma})
	b = New(Options{Offsets: store, Now: clk.now, InitialRebalanceDelay: -1, Membership: mb})
	return
}

// groupOwnedBy is a group name m's node coordinates among both.
func groupOwnedBy(t *testing.T, m *Membership) string {
	for i := range 100 {
		g := fmt.Sprintf("g%d", i)
		if _, self := m.Owner(g); self {
			return g
		}
	}
	t.Fatal("no group of 100 is this node's")
	return ""
}

func TestAGroupMovesWithItsCommittedOffsets(t *testing.T) {
	a, b, ma, mb, _, _ := sharedFixture(t)
	both := []string{"10.0.0.1", "10.0.0.2"}
	ma.Set(both)
	mb.Set(both)
	g := groupOwnedBy(t, ma)
	tp := TopicPartition{"orders", 0}
	commit := func(c *Coordinator, o int64) error {
		errs, err := c.CommitOffsets(ctx, g, "", -1, []Commit{{TopicPartition: tp, Committed: Committed{Offset: o}}})
		if err == nil {
			err = errs[0]
		}
		return err
	}

	// b is not the group's coordinator: it refuses, and says who is.
	if err := commit(b, 5); CodeOf(err) != NotCoordinator || !strings.Contains(err.Error(), "10.0.0.1") {
		t.Fatalf("commit on the other node: %v, want NotCoordinator naming 10.0.0.1", err)
	}
	if _, err := b.FetchOffsets(ctx, g, nil); CodeOf(err) != NotCoordinator {
		t.Fatalf("fetch on the other node: %v", err)
	}

	// A member joins a, which commits 5.
	r := <-a.Join(ctx, consumerJoin(g, ""))
	first := <-a.Join(ctx, consumerJoin(g, r.MemberID))
	if first.Err != nil {
		t.Fatal(first.Err)
	}
	if res := <-a.Sync(ctx, SyncRequest{Group: g, Generation: first.Generation, MemberID: r.MemberID, Assignments: map[string][]byte{r.MemberID: []byte("all")}}); res.Err != nil {
		t.Fatal(res.Err)
	}
	if err := commit(a, 5); CodeOf(err) != UnknownMemberID {
		t.Fatalf("commit outside the generation while it has a member: %v", err)
	}
	if errs, err := a.CommitOffsets(ctx, g, r.MemberID, first.Generation, []Commit{{TopicPartition: tp, Committed: Committed{Offset: 5}}}); err != nil || errs[0] != nil {
		t.Fatalf("member's commit: %v %v", errs, err)
	}
	// b has loaded before that commit.
	if _, err := b.List(ctx); err != nil {
		t.Fatal(err)
	}
	// A second member waits in JoinGroup for the first to join again.
	r2 := <-a.Join(ctx, consumerJoin(g, ""))
	waiting := a.Join(ctx, consumerJoin(g, r2.MemberID))
	pending(t, waiting)

	// a leaves the list: b takes the group over with what a stored, and
	// a forgets the group's members, telling the waiting one to move.
	ma.Set([]string{"10.0.0.2"})
	mb.Set([]string{"10.0.0.2"})
	offs, err := b.FetchOffsets(ctx, g, nil)
	if err != nil || offs[tp].Offset != 5 {
		t.Fatalf("fetch on the new coordinator: %v %v, want offset 5 committed through the old one", offs, err)
	}
	if err := a.Heartbeat(ctx, g, r.MemberID, first.Generation); CodeOf(err) != NotCoordinator {
		t.Fatalf("heartbeat to the old coordinator: %v", err)
	}
	a.Tick()
	if res := got(t, waiting); CodeOf(res.Err) != NotCoordinator {
		t.Fatalf("waiting join on the old coordinator: %+v, want NotCoordinator", res)
	}
	// The member finds b and joins it; the group is b's and empty of the
	// old generation's members.
	r3 := <-b.Join(ctx, consumerJoin(g, ""))
	j3 := <-b.Join(ctx, consumerJoin(g, r3.MemberID))
	if j3.Err != nil {
		t.Fatal(j3.Err)
	}
	if res := <-b.Sync(ctx, SyncRequest{Group: g, Generation: j3.Generation, MemberID: r3.MemberID, Assignments: map[string][]byte{r3.MemberID: []byte("all")}}); res.Err != nil {
		t.Fatal(res.Err)
	}
	if errs, err := b.CommitOffsets(ctx, g, r3.MemberID, j3.Generation, []Commit{{TopicPartition: tp, Committed: Committed{Offset: 9}}}); err != nil || errs[0] != nil {
		t.Fatalf("commit on the new coordinator: %v %v", errs, err)
	}

	// a comes back: the group returns to it with b's commit.
	ma.Set(both)
	mb.Set(both)
	offs, err = a.FetchOffsets(ctx, g, nil)
	if err != nil || offs[tp].Offset != 9 {
		t.Fatalf("fetch after the group came back: %v %v, want 9", offs, err)
	}
	if gs, _ := a.List(ctx); len(gs) != 1 || gs[0].Name != g {
		t.Fatalf("a lists %v", gs)
	}
	if gs, _ := b.List(ctx); len(gs) != 0 {
		t.Fatalf("b still lists %v after the group left it", gs)
	}
}
