package groups

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/catena-streams/catena/rpc/contract"
)

// memOffsets is an Offsets in memory that can be made to fail.
type memOffsets struct {
	mu      sync.Mutex
	stored  map[string]map[TopicPartition]Committed
	fail    error
	commits int
	deleted []string
	// held is each group's retention holds; moved counts MoveHolds'
	// moves.
	held  map[string]map[TopicPartition]int64
	moved int
}

func (m *memOffsets) Load(context.Context) (map[string]map[TopicPartition]Committed, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return nil, m.fail
	}
	out := map[string]map[TopicPartition]Committed{}
	for g, offs := range m.stored {
		out[g] = map[TopicPartition]Committed{}
		for tp, o := range offs {
			out[g][tp] = o
		}
	}
	return out, nil
}

func (m *memOffsets) Commit(_ context.Context, group string, commits []Commit) ([]error, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return nil, m.fail
	}
	m.commits++
	if m.stored == nil {
		m.stored = map[string]map[TopicPartition]Committed{}
	}
	if m.stored[group] == nil {
		m.stored[group] = map[TopicPartition]Committed{}
	}
	errs := make([]error, len(commits))
	for i, c := range commits {
		if c.Topic == "missing" {
			errs[i] = refuse(UnknownTopicOrPartition, "no stream %q", c.Topic)
			continue
		}
		m.stored[group][c.TopicPartition] = c.Committed
		m.holdLocked(group, c.TopicPartition, c.Offset)
	}
	return errs, nil
}

func (m *memOffsets) holdLocked(group string, tp TopicPartition, offset int64) {
	if m.held == nil {
		m.held = map[string]map[TopicPartition]int64{}
	}
	if m.held[group] == nil {
		m.held[group] = map[TopicPartition]int64{}
	}
	m.held[group][tp] = offset
}

func (m *memOffsets) Holds(_ context.Context, groups, topics []string) (map[string]map[TopicPartition]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return nil, m.fail
	}
	out := map[string]map[TopicPartition]int64{}
	for _, g := range groups {
		for tp, o := range m.held[g] {
			if slices.Contains(topics, tp.Topic) {
				if out[g] == nil {
					out[g] = map[TopicPartition]int64{}
				}
				out[g][tp] = o
			}
		}
	}
	return out, nil
}

func (m *memOffsets) MoveHolds(_ context.Context, group string, commits []Commit) []error {
	m.mu.Lock()
	defer m.mu.Unlock()
	errs := make([]error, len(commits))
	for i, c := range commits {
		if m.fail != nil {
			errs[i] = m.fail
			continue
		}
		if c.Topic == "gone" {
			errs[i] = fmt.Errorf("stream %q: %w", c.Topic, ErrPartitionGone)
			continue
		}
		m.holdLocked(group, c.TopicPartition, c.Offset)
		m.moved++
	}
	return errs
}

func (m *memOffsets) Delete(_ context.Context, group string, _ []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	delete(m.stored, group)
	delete(m.held, group)
	m.deleted = append(m.deleted, group)
	return nil
}

// clock is a settable time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	t     *testing.T
	c     *Coordinator
	clock *clock
	store *memOffsets
}

func newFixture(t *testing.T) *fixture {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	store := &memOffsets{}
	c := New(Options{Offsets: store, Now: clk.now, InitialRebalanceDelay: 3 * time.Second})
	return &fixture{t: t, c: c, clock: clk, store: store}
}

var ctx = context.Background()

func consumerJoin(group, id string, protocols ...string) JoinRequest {
	if len(protocols) == 0 {
		protocols = []string{"range"}
	}
	req := JoinRequest{Group: group, MemberID: id, ClientID: "c", ProtocolType: "consumer", SessionTimeout: 10 * time.Second, RebalanceTimeout: 30 * time.Second, RequireKnownMember: true}
	for _, p := range protocols {
		req.Protocols = append(req.Protocols, Protocol{Name: p, Metadata: []byte(p + "-of-" + id)})
	}
	return req
}

// firstJoin joins a new member: MemberIDRequired with its id, then the
// join that waits for the generation.
func (f *fixture) firstJoin(group string, protocols ...string) (string, <-chan JoinResult) {
	f.t.Helper()
	r := <-f.c.Join(ctx, consumerJoin(group, "", protocols...))
	if CodeOf(r.Err) != MemberIDRequired || r.MemberID == "" {
		f.t.Fatalf("first join: %+v, want MemberIDRequired with an id", r)
	}
	return r.MemberID, f.c.Join(ctx, consumerJoin(group, r.MemberID, protocols...))
}

func pending[T any](t *testing.T, ch <-chan T) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("answered early: %+v", r)
	default:
	}
}

func got[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case r := <-ch:
		return r
	default:
		t.Fatal("not answered")
	}
	var zero T
	return zero
}

// stable brings n members to a stable generation of group "g" and
// returns their ids, leader first, and the generation.
func (f *fixture) stable(n int) ([]string, int32) {
	f.t.Helper()
	var ids []string
	var chans []<-chan JoinResult
	for range n {
		id, ch := f.firstJoin("g")
		ids, chans = append(ids, id), append(chans, ch)
	}
	f.clock.advance(3 * time.Second)
	f.c.Tick()
	var gen int32
	var syncs []<-chan SyncResult
	for i, ch := range chans {
		r := got(f.t, ch)
		if r.Err != nil {
			f.t.Fatalf("join %d: %v", i, r.Err)
		}
		gen = r.Generation
		if r.Leader != ids[0] {
			f.t.Fatalf("leader %s, want the first to join %s", r.Leader, ids[0])
		}
		if i > 0 {
			syncs = append(syncs, f.c.Sync(ctx, SyncRequest{Group: "g", Generation: gen, MemberID: ids[i]}))
		}
	}
	assign := map[string][]byte{}
	for _, id := range ids {
		assign[id] = []byte("parts-of-" + id)
	}
	got(f.t, f.c.Sync(ctx, SyncRequest{Group: "g", Generation: gen, MemberID: ids[0], Assignments: assign}))
	for _, s := range syncs {
		got(f.t, s)
	}
	return ids, gen
}

func TestFirstGenerationWaitsForMembersStartedTogether(t *testing.T) {
	f := newFixture(t)
	a, ja := f.firstJoin("g", "cooperative-sticky", "range")
	f.clock.advance(time.Second)
	f.c.Tick()
	pending(t, ja)
	b, jb := f.firstJoin("g", "range")
	f.clock.advance(2 * time.Second)
	f.c.Tick()
	// b's join pushed the first generation out by the delay again.
	pending(t, ja)
	f.clock.advance(time.Second)
	f.c.Tick()
	ra, rb := got(t, ja), got(t, jb)
	if ra.Err != nil || rb.Err != nil {
		t.Fatalf("joins: %v, %v", ra.Err, rb.Err)
	}
	if ra.Generation != 1 || rb.Generation != 1 || ra.Leader != a || rb.Leader != a {
		t.Fatalf("generation %d/%d leader %s/%s, want 1 and %s", ra.Generation, rb.Generation, ra.Leader, rb.Leader, a)
	}
	// Only the protocol every member supports can be chosen.
	if ra.Protocol != "range" || ra.ProtocolType != "consumer" {
		t.Fatalf("protocol %q/%q, want consumer/range", ra.ProtocolType, ra.Protocol)
	}
	if len(ra.Members) != 2 || len(rb.Members) != 0 {
		t.Fatalf("the leader sees %d members, the follower %d; want 2 and 0", len(ra.Members), len(rb.Members))
	}
	if string(ra.Members[1].Metadata) != "range-of-"+b {
		t.Fatalf("member metadata %q, want the chosen protocol's", ra.Members[1].Metadata)
	}

	// The follower's sync waits for the leader's assignment.
	sb := f.c.Sync(ctx, SyncRequest{Group: "g", Generation: 1, MemberID: b})
	pending(t, sb)
	sa := f.c.Sync(ctx, SyncRequest{Group: "g", Generation: 1, MemberID: a, Assignments: map[string][]byte{a: []byte("A"), b: []byte("B")}})
	if r := got(t, sa); r.Err != nil || string(r.Assignment) != "A" {
		t.Fatalf("leader's sync: %+v", r)
	}
	if r := got(t, sb); r.Err != nil || string(r.Assignment) != "B" {
		t.Fatalf("follower's sync: %+v", r)
	}
	d, _ := f.c.Describe(ctx, "g")
	if d.State != Stable || len(d.Members) != 2 {
		t.Fatalf("described %+v, want Stable with 2 members", d)
	}
}

func TestJoinRefusals(t *testing.T) {
	f := newFixture(t)
	f.stable(1)
	short := consumerJoin("g", "")
	short.SessionTimeout = time.Second
	otherType := consumerJoin("g", "")
	otherType.ProtocolType = "connect"
	for _, tc := range []struct {
		name string
		req  JoinRequest
		want Code
	}{
		{"no group id", consumerJoin("", ""), InvalidGroupID},
		{"session below the minimum", short, InvalidSessionTimeout},
		{"unknown member", consumerJoin("g", "nobody"), UnknownMemberID},
		{"member of a group that does not exist", consumerJoin("h", "nobody"), UnknownMemberID},
		{"another protocol type", otherType, InconsistentGroupProtocol},
		{"no protocol in common", consumerJoin("g", "", "roundrobin"), InconsistentGroupProtocol},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := got(t, f.c.Join(ctx, tc.req))
			if CodeOf(r.Err) != tc.want {
				t.Fatalf("got %v, want %v", r.Err, tc.want)
			}
		})
	}
}

func TestKilledMemberIsExpiredAndTheOthersRebalance(t *testing.T) {
	f := newFixture(t)
	ids, gen := f.stable(3)
	// ids[2] is killed: it never heartbeats again. The others do.
	for range 4 {
		f.clock.advance(3 * time.Second)
		for _, id := range ids[:2] {
			if err := f.c.Heartbeat(ctx, "g", id, gen); err != nil {
				t.Fatalf("heartbeat of %s: %v", id, err)
			}
		}
		f.c.Tick()
	}
	for _, id := range ids[:2] {
		if err := f.c.Heartbeat(ctx, "g", id, gen); CodeOf(err) != RebalanceInProgress {
			t.Fatalf("heartbeat after the expiry: %v, want RebalanceInProgress", err)
		}
	}
	j0 := f.c.Join(ctx, consumerJoin("g", ids[0]))
	pending(t, j0)
	j1 := f.c.Join(ctx, consumerJoin("g", ids[1]))
	r0, r1 := got(t, j0), got(t, j1)
	if r0.Generation != gen+1 || r1.Generation != gen+1 || len(r0.Members) != 2 {
		t.Fatalf("rejoined at generation %d/%d with %d members; want %d and 2", r0.Generation, r1.Generation, len(r0.Members), gen+1)
	}
	if err := f.c.Heartbeat(ctx, "g", ids[2], gen); CodeOf(err) != UnknownMemberID {
		t.Fatalf("the expired member's heartbeat: %v, want UnknownMemberID", err)
	}
}

func TestRebalanceTimeoutDropsMembersThatDoNotJoin(t *testing.T) {
	f := newFixture(t)
	ids, gen := f.stable(2)
	// The leader rejoins (its subscription changed); the follower keeps
	// heartbeating but never joins.
	j0 := f.c.Join(ctx, consumerJoin("g", ids[0]))
	for range 9 {
		f.clock.advance(3 * time.Second)
		f.c.Heartbeat(ctx, "g", ids[1], gen)
		f.c.Tick()
	}
	pending(t, j0)
	f.clock.advance(3 * time.Second)
	f.c.Tick()
	r := got(t, j0)
	if r.Err != nil || r.Generation != gen+1 || len(r.Members) != 1 {
		t.Fatalf("join after the rebalance timeout: %+v", r)
	}
	if err := f.c.Heartbeat(ctx, "g", ids[1], gen); CodeOf(err) != UnknownMemberID {
		t.Fatalf("heartbeat of the dropped member: %v", err)
	}
}

func TestLeaveRebalancesAndTheLastLeavesTheGroupEmpty(t *testing.T) {
	f := newFixture(t)
	ids, gen := f.stable(2)
	errs, err := f.c.Leave(ctx, "g", []string{ids[0], "nobody"})
	if err != nil || errs[0] != nil || CodeOf(errs[1]) != UnknownMemberID {
		t.Fatalf("leave: %v %v", errs, err)
	}
	if err := f.c.Heartbeat(ctx, "g", ids[1], gen); CodeOf(err) != RebalanceInProgress {
		t.Fatalf("heartbeat: %v, want RebalanceInProgress", err)
	}
	r := got(t, f.c.Join(ctx, consumerJoin("g", ids[1])))
	if r.Leader != ids[1] || r.Generation != gen+1 {
		t.Fatalf("the remaining member: %+v, want it leader of generation %d", r, gen+1)
	}
	f.c.Leave(ctx, "g", []string{ids[1]})
	d, _ := f.c.Describe(ctx, "g")
	if d.State != Empty || len(d.Members) != 0 {
		t.Fatalf("after the last left: %+v", d)
	}
}

func TestStableFollowerRejoiningKeepsItsGeneration(t *testing.T) {
	f := newFixture(t)
	ids, gen := f.stable(2)
	r := got(t, f.c.Join(ctx, consumerJoin("g", ids[1])))
	if r.Err != nil || r.Generation != gen {
		t.Fatalf("follower rejoining unchanged: %+v, want generation %d", r, gen)
	}
	d, _ := f.c.Describe(ctx, "g")
	if d.State != Stable {
		t.Fatalf("state %s, want Stable", d.State)
	}
}

func TestLeaderSyncNeverComingSendsFollowersBackToJoin(t *testing.T) {
	f := newFixture(t)
	a, ja := f.firstJoin("g")
	b, jb := f.firstJoin("g")
	f.clock.advance(3 * time.Second)
	f.c.Tick()
	got(t, ja)
	gen := got(t, jb).Generation
	sb := f.c.Sync(ctx, SyncRequest{Group: "g", Generation: gen, MemberID: b})
	pending(t, sb)
	// The leader dies before its SyncGroup: its session expires.
	for range 4 {
		f.clock.advance(3 * time.Second)
		f.c.Heartbeat(ctx, "g", b, gen)
		f.c.Tick()
	}
	if r := got(t, sb); CodeOf(r.Err) != RebalanceInProgress {
		t.Fatalf("follower's sync: %+v, want RebalanceInProgress", r)
	}
	r := got(t, f.c.Join(ctx, consumerJoin("g", b)))
	if r.Leader != b || r.Generation != gen+1 {
		t.Fatalf("rejoin: %+v", r)
	}
	_ = a
}

func TestCommitRules(t *testing.T) {
	tp := TopicPartition{"orders", 0}
	at := func(o int64) []Commit { return []Commit{{TopicPartition: tp, Committed: Committed{Offset: o}}} }
	t.Run("outside any generation while the group is empty", func(t *testing.T) {
		f := newFixture(t)
		errs, err := f.c.CommitOffsets(ctx, "manual", "", -1, at(7))
		if err != nil || errs[0] != nil {
			t.Fatalf("commit: %v %v", errs, err)
		}
		offs, _ := f.c.FetchOffsets(ctx, "manual", []TopicPartition{tp, {"orders", 1}})
		if len(offs) != 1 || offs[tp].Offset != 7 {
			t.Fatalf("fetched %v", offs)
		}
	})
	f := newFixture(t)
	ids, gen := f.stable(2)
	for _, tc := range []struct {
		name       string
		member     string
		generation int32
		want       Code
	}{
		{"no generation while the group has members", "", -1, UnknownMemberID},
		{"an old generation", ids[1], gen - 1, IllegalGeneration},
		{"not a member", "nobody", gen, UnknownMemberID},
		{"a member of the generation", ids[1], gen, OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.c.CommitOffsets(ctx, "g", tc.member, tc.generation, at(11))
			if CodeOf(err) != tc.want {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	t.Run("while waiting for the leader's assignment", func(t *testing.T) {
		f.c.Join(ctx, consumerJoin("g", ids[0]))
		j := f.c.Join(ctx, consumerJoin("g", ids[1]))
		gen2 := got(t, j).Generation
		if _, err := f.c.CommitOffsets(ctx, "g", ids[1], gen2, at(12)); CodeOf(err) != RebalanceInProgress {
			t.Fatalf("got %v, want RebalanceInProgress", err)
		}
	})
	t.Run("a store that fails commits nothing", func(t *testing.T) {
		f := newFixture(t)
		f.c.CommitOffsets(ctx, "m", "", -1, at(5))
		f.store.fail = errors.New("chain unavailable")
		if _, err := f.c.CommitOffsets(ctx, "m", "", -1, at(6)); err == nil || CodeOf(err) != CoordinatorNotAvailable {
			t.Fatalf("got %v, want the store's failure", err)
		}
		offs, _ := f.c.FetchOffsets(ctx, "m", nil)
		if offs[tp].Offset != 5 {
			t.Fatalf("offset %d after a failed commit, want 5", offs[tp].Offset)
		}
	})
	t.Run("a partition the store refuses keeps its offset", func(t *testing.T) {
		f := newFixture(t)
		errs, err := f.c.CommitOffsets(ctx, "m", "", -1, []Commit{{TopicPartition: TopicPartition{"missing", 0}}, {TopicPartition: tp, Committed: Committed{Offset: 3}}})
		if err != nil || CodeOf(errs[0]) != UnknownTopicOrPartition || errs[1] != nil {
			t.Fatalf("commit: %v %v", errs, err)
		}
		offs, _ := f.c.FetchOffsets(ctx, "m", nil)
		if len(offs) != 1 || offs[tp].Offset != 3 {
			t.Fatalf("fetched %v", offs)
		}
	})
}

func TestOffsetsAreLoadedBeforeAnythingIsServed(t *testing.T) {
	f := newFixture(t)
	tp := TopicPartition{"orders", 2}
	f.store.stored = map[string]map[TopicPartition]Committed{"g": {tp: {Offset: 42, LeaderEpoch: -1}}}
	f.store.fail = errors.New("offsets stream unavailable")
	if _, err := f.c.FetchOffsets(ctx, "g", nil); CodeOf(err) != CoordinatorLoadInProgress {
		t.Fatalf("fetch while loading fails: %v, want CoordinatorLoadInProgress", err)
	}
	if r := got(t, f.c.Join(ctx, consumerJoin("g", ""))); CodeOf(r.Err) != CoordinatorLoadInProgress {
		t.Fatalf("join while loading fails: %v", r.Err)
	}
	f.store.fail = nil
	offs, err := f.c.FetchOffsets(ctx, "g", nil)
	if err != nil || offs[tp].Offset != 42 {
		t.Fatalf("after the load: %v %v", offs, err)
	}
	groups, _ := f.c.List(ctx)
	if len(groups) != 1 || groups[0].Name != "g" || groups[0].State != Empty {
		t.Fatalf("listed %+v, want the loaded group, empty", groups)
	}
}

func TestDeleteOnlyAnEmptyGroup(t *testing.T) {
	f := newFixture(t)
	ids, _ := f.stable(1)
	if err := f.c.Delete(ctx, "g"); CodeOf(err) != NonEmptyGroup {
		t.Fatalf("delete with a member: %v", err)
	}
	if err := f.c.Delete(ctx, "nope"); CodeOf(err) != GroupIDNotFound {
		t.Fatalf("delete of no group: %v", err)
	}
	f.c.Leave(ctx, "g", ids)
	if err := f.c.Delete(ctx, "g"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if len(f.store.deleted) != 1 {
		t.Fatalf("the store deleted %v", f.store.deleted)
	}
	if d, _ := f.c.Describe(ctx, "g"); d.State != Dead {
		t.Fatalf("described after delete: %s", d.State)
	}
}

func TestHoldName(t *testing.T) {
	for _, g := range []string{"billing", "Billing", "my group!", "", strings.Repeat("x", 400), "a/b", "-x-"} {
		n := HoldName(g)
		if err := contract.ValidateConsumer(n); err != nil {
			t.Errorf("HoldName(%q) = %q: %v", g, n, err)
		}
	}
	if HoldName("billing") != "kafka.group/billing" {
		t.Errorf("a valid id is kept: %q", HoldName("billing"))
	}
	if HoldName("Billing") == HoldName("billing") {
		t.Errorf("ids differing in case share hold %q", HoldName("billing"))
	}
}

// TestMemberWaitingInSyncIsNotExpired: clients do not heartbeat while
// they wait in SyncGroup for the leader's assignment; a slow leader must
// not get its followers expired (and the group rebalanced again).
func TestMemberWaitingInSyncIsNotExpired(t *testing.T) {
	f := newFixture(t)
	a, ja := f.firstJoin("g")
	b, jb := f.firstJoin("g")
	f.clock.advance(3 * time.Second)
	f.c.Tick()
	got(t, ja)
	gen := got(t, jb).Generation
	sb := f.c.Sync(ctx, SyncRequest{Group: "g", Generation: gen, MemberID: b})
	for range 5 {
		f.clock.advance(3 * time.Second)
		f.c.Heartbeat(ctx, "g", a, gen) // the leader is alive, assigning
		f.c.Tick()
	}
	pending(t, sb)
	got(t, f.c.Sync(ctx, SyncRequest{Group: "g", Generation: gen, MemberID: a, Assignments: map[string][]byte{a: []byte("A"), b: []byte("B")}}))
	if r := got(t, sb); r.Err != nil || string(r.Assignment) != "B" {
		t.Fatalf("the follower's sync after a slow leader: %+v", r)
	}
}

// TestHandedOutIDsDoNotRebalanceAStableGroup: an id handed out with
// MemberIDRequired that is never joined with, or left, is no member: its
// expiry changes no generation.
func TestHandedOutIDsDoNotRebalanceAStableGroup(t *testing.T) {
	f := newFixture(t)
	ids, gen := f.stable(1)
	r := got(t, f.c.Join(ctx, consumerJoin("g", "")))
	if CodeOf(r.Err) != MemberIDRequired {
		t.Fatalf("join: %+v", r)
	}
	if _, err := f.c.Leave(ctx, "g", []string{r.MemberID}); err != nil {
		t.Fatal(err)
	}
	got(t, f.c.Join(ctx, consumerJoin("g", ""))) // another, left to expire
	for range 5 {
		f.clock.advance(3 * time.Second)
		f.c.Heartbeat(ctx, "g", ids[0], gen)
		f.c.Tick()
	}
	if err := f.c.Heartbeat(ctx, "g", ids[0], gen); err != nil {
		t.Fatalf("heartbeat: %v, want the generation unchanged", err)
	}
}

func TestUnchangedCommitWritesNothing(t *testing.T) {
	f := newFixture(t)
	at := []Commit{{TopicPartition: TopicPartition{"orders", 0}, Committed: Committed{Offset: 7, LeaderEpoch: -1}}}
	for range 3 {
		if errs, err := f.c.CommitOffsets(ctx, "m", "", -1, at); err != nil || errs[0] != nil {
			t.Fatalf("commit: %v %v", errs, err)
		}
	}
	if f.store.commits != 1 {
		t.Fatalf("three commits of one offset wrote %d records, want 1", f.store.commits)
	}
}

// holdsRemain is a store whose deletion is stored but leaves holds.
type holdsRemain struct{ memOffsets }

func (h *holdsRemain) Delete(context.Context, string, []string) error {
	return fmt.Errorf("%w: chain unavailable", ErrHoldsRemain)
}

func TestDeleteThatLeavesHoldsStillDeletes(t *testing.T) {
	store := &holdsRemain{}
	c := New(Options{Offsets: store})
	if _, err := c.CommitOffsets(ctx, "m", "", -1, []Commit{{TopicPartition: TopicPartition{"orders", 0}, Committed: Committed{Offset: 1}}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "m"); !errors.Is(err, ErrHoldsRemain) {
		t.Fatalf("delete: %v, want ErrHoldsRemain", err)
	}
	if d, _ := c.Describe(ctx, "m"); d.State != Dead {
		t.Fatalf("after a stored deletion the group is %s, want gone", d.State)
	}
}

func TestOffsetsOfGroupsWithoutMembersExpire(t *testing.T) {
	tp := TopicPartition{"orders", 0}
	commit := func(f *fixture, group, member string, gen int32) {
		t.Helper()
		errs, err := f.c.CommitOffsets(ctx, group, member, gen, []Commit{{TopicPartition: tp, Committed: Committed{Offset: 7}}})
		if err != nil || errs[0] != nil {
			t.Fatalf("commit: %v %v", errs, err)
		}
	}
	expire := func(f *fixture, want ...string) {
		t.Helper()
		got, err := f.c.ExpireOffsets(ctx)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("expired %v (%v), want %v", got, err, want)
		}
	}

	t.Run("a group that only commits, after the retention from its last commit", func(t *testing.T) {
		f := newFixture(t)
		commit(f, "adhoc", "", -1)
		f.clock.advance(DefaultOffsetsRetention - time.Minute)
		expire(f)
		commit(f, "adhoc", "", -1) // unchanged: writes nothing, and is no sign of life
		f.clock.advance(2 * time.Minute)
		expire(f, "adhoc")
		if offs, _ := f.c.FetchOffsets(ctx, "adhoc", nil); len(offs) != 0 || len(f.store.deleted) != 1 {
			t.Fatalf("after expiry: offsets %v, store deletions %v", offs, f.store.deleted)
		}
		expire(f)
	})

	t.Run("a group with members keeps its offsets however old its commits", func(t *testing.T) {
		f := newFixture(t)
		ids, gen := f.stable(1)
		commit(f, "g", ids[0], gen)
		f.clock.advance(2 * DefaultOffsetsRetention)
		expire(f) // seen with a member now
		if _, err := f.c.Leave(ctx, "g", ids); err != nil {
			t.Fatal(err)
		}
		f.clock.advance(DefaultOffsetsRetention - time.Minute)
		expire(f)
		f.clock.advance(2 * time.Minute)
		expire(f, "g")
	})

	t.Run("a group without offsets is only forgotten", func(t *testing.T) {
		f := newFixture(t)
		ids, _ := f.stable(1)
		if _, err := f.c.Leave(ctx, "g", ids); err != nil {
			t.Fatal(err)
		}
		f.clock.advance(DefaultOffsetsRetention + time.Minute)
		expire(f)
		if gs, _ := f.c.List(ctx); len(gs) != 0 || len(f.store.deleted) != 0 {
			t.Fatalf("groups %v, store deletions %v", gs, f.store.deleted)
		}
	})

	t.Run("never, with a negative retention", func(t *testing.T) {
		clk := &clock{t: time.Unix(1_700_000_000, 0)}
		store := &memOffsets{}
		c := New(Options{Offsets: store, Now: clk.now, OffsetsRetention: -1})
		f := &fixture{t: t, c: c, clock: clk, store: store}
		commit(f, "kept", "", -1)
		f.clock.advance(100 * DefaultOffsetsRetention)
		expire(f)
	})
}

// TestLoadedGroupsGetAFullRetention: after a restart a coordinator does
// not know whether a group had members; one whose commits are old is not
// expired before its members had the time to rejoin.
func TestLoadedGroupsGetAFullRetention(t *testing.T) {
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	store := &memOffsets{stored: map[string]map[TopicPartition]Committed{
		"idle": {{"orders", 0}: {Offset: 7, At: clk.now().Add(-30 * 24 * time.Hour).UnixMilli()}},
	}}
	c := New(Options{Offsets: store, Now: clk.now})
	if got, err := c.ExpireOffsets(ctx); err != nil || len(got) != 0 {
		t.Fatalf("expired %v (%v) right after the load", got, err)
	}
	clk.advance(DefaultOffsetsRetention)
	if got, err := c.ExpireOffsets(ctx); err != nil || fmt.Sprint(got) != "[idle]" {
		t.Fatalf("expired %v (%v) a retention after the load, want [idle]", got, err)
	}
}

func TestReassertHoldsMovesTheHoldsNotAtTheCommittedOffsets(t *testing.T) {
	a0, a1, b0 := TopicPartition{"orders", 0}, TopicPartition{"orders", 1}, TopicPartition{"audit", 0}
	store := &memOffsets{stored: map[string]map[TopicPartition]Committed{
		"behind":  {a0: {Offset: 50}, a1: {Offset: 40}},
		"missing": {b0: {Offset: 9}},
		"level":   {a0: {Offset: 7}},
	}, held: map[string]map[TopicPartition]int64{
		"behind": {a0: 20, a1: 40}, // a former coordinator's late move
		"level":  {a0: 7},
	}}
	c := New(Options{Offsets: store})
	if c.takeHoldsDue() {
		t.Fatal("holds due before any load")
	}
	// A load (here the first call about a group) leaves the holds due for
	// Run, which reasserts them.
	if _, err := c.FetchOffsets(ctx, "level", nil); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	due := c.holdsDue
	c.mu.Unlock()
	if !due {
		t.Fatal("the load did not leave the holds due")
	}
	moved, err := c.ReassertHolds(ctx)
	if err != nil || moved != 2 {
		t.Fatalf("reasserted %d holds (%v), want 2 (behind's partition 0, missing's only one)", moved, err)
	}
	want := map[string]map[TopicPartition]int64{"behind": {a0: 50, a1: 40}, "missing": {b0: 9}, "level": {a0: 7}}
	if fmt.Sprint(store.held) != fmt.Sprint(want) {
		t.Fatalf("holds %v, want %v", store.held, want)
	}
	if c.takeHoldsDue() {
		t.Fatal("holds still due after a pass")
	}
	if moved, err := c.ReassertHolds(ctx); err != nil || moved != 0 {
		t.Fatalf("a second pass moved %d (%v), want none", moved, err)
	}

	// A move that fails is reported, and done by the next pass.
	store.mu.Lock()
	store.held["level"][a0] = 3
	store.fail = errors.New("chain unavailable")
	store.mu.Unlock()
	if _, err := c.ReassertHolds(ctx); err == nil {
		t.Fatal("a pass whose store failed reported no error")
	}
	store.mu.Lock()
	store.fail = nil
	store.mu.Unlock()
	if moved, err := c.ReassertHolds(ctx); err != nil || moved != 1 || store.held["level"][a0] != 7 {
		t.Fatalf("after the failure: moved %d (%v), hold %d, want 1 and 7", moved, err, store.held["level"][a0])
	}
}

func TestReassertHoldsLeavesGroupsOfOtherNodes(t *testing.T) {
	tp := TopicPartition{"orders", 0}
	store := &memOffsets{stored: map[string]map[TopicPartition]Committed{}, held: map[string]map[TopicPartition]int64{}}
	for i := range 20 {
		g := fmt.Sprintf("g%d", i)
		store.stored[g] = map[TopicPartition]Committed{tp: {Offset: 10}}
		store.held[g] = map[TopicPartition]int64{tp: 1}
	}
	m := NewMembership("a:9092")
	m.Set([]string{"a:9092", "b:9092"})
	c := New(Options{Offsets: store, Membership: m})
	moved, err := c.ReassertHolds(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for g, h := range store.held {
		if _, self := m.Owner(g); self != (h[tp] == 10) {
			t.Errorf("group %s (this node's: %v) held at %d", g, self, h[tp])
		}
	}
	if moved == 0 || moved == 20 {
		t.Fatalf("moved %d of 20 groups' holds: want this node's only", moved)
	}
}

// TestReassertHoldsPassesOverDeletedStreams: a group keeps offsets on a
// stream deleted since; it has no hold to move there, which is neither an
// error nor a move (else every sweep would report it).
func TestReassertHoldsPassesOverDeletedStreams(t *testing.T) {
	store := &memOffsets{stored: map[string]map[TopicPartition]Committed{
		"g": {{"gone", 0}: {Offset: 5}, {"orders", 0}: {Offset: 3}},
	}}
	c := New(Options{Offsets: store})
	moved, err := c.ReassertHolds(ctx)
	if err != nil || moved != 1 {
		t.Fatalf("moved %d (%v), want 1 (orders/0) and no error", moved, err)
	}
	if moved, err := c.ReassertHolds(ctx); err != nil || moved != 0 {
		t.Fatalf("a second pass moved %d (%v), want none", moved, err)
	}
}
