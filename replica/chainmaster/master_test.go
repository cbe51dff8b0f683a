package chainmaster

import (
	"fmt"
	"strings"
	"testing"

	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
)

var cfg = &catenapb.StreamConfig{Partitions: 1, MinChainLength: 2}

func rep(epoch uint64, members []string, end uint64, c *catenapb.StreamConfig) *catenapb.PartitionStatus {
	ps := &catenapb.PartitionStatus{Stream: "s", Epoch: epoch, LogEnd: end, Durable: end, Committed: end, LastLogEpoch: epoch, Config: c}
	for _, m := range members {
		ps.Members = append(ps.Members, &catenapb.Member{Id: m, Addr: m + ":1"})
	}
	return ps
}

// joining is ps of a member that joined the chain at the tail and is being
// copied the records committed when it was configured (committed).
func joining(ps *catenapb.PartitionStatus, committed uint64) *catenapb.PartitionStatus {
	ps.CommittedNotice = committed
	return ps
}

// copying is ps of a replica outside the chain copying it from source
// since its log ended at start.
func copying(ps *catenapb.PartitionStatus, source string, start uint64) *catenapb.PartitionStatus {
	ps.Copy = &catenapb.CatchUpCopy{SourceId: source, Start: start}
	return ps
}

// calls renders a repair's calls: kind(to@epoch [members]).
func calls(r *Repair) string {
	if r == nil {
		return "nothing"
	}
	var out []string
	for _, j := range r.Joins {
		out = append(out, fmt.Sprintf("reach(%s=%s -> %s=%s)", j.Pred, j.PredAddr, j.Member, j.MemberAddr))
	}
	for _, c := range r.Calls {
		switch c.Kind {
		case CallConfigure:
			var ms []string
			for _, m := range c.Configure.GetMembers() {
				ms = append(ms, m.GetId()+"="+m.GetAddr())
			}
			out = append(out, fmt.Sprintf("configure(%s@%d %v)", c.Replica, c.Configure.GetEpoch(), ms))
		case CallEpochEnd:
			out = append(out, fmt.Sprintf("epochend(%s e%d for %s)", c.Replica, c.EpochEnd.GetEpoch(), c.Member))
		case CallTruncate:
			out = append(out, fmt.Sprintf("truncate(%s to %d)", c.Replica, c.Truncate.GetTo()))
		case CallDrop:
			out = append(out, fmt.Sprintf("drop(%s@%d)", c.Replica, c.Drop.GetEpoch()))
		case CallCatchUp:
			out = append(out, fmt.Sprintf("catchup(%s@%d from %s=%s)", c.Replica, c.CatchUp.GetChain().GetEpoch(), c.CatchUp.GetSourceId(), c.CatchUp.GetSourceAddr()))
		}
	}
	return strings.Join(out, " ")
}

func TestPlan(t *testing.T) {
	abc := []string{"a", "b", "c"}
	addrs := map[string]string{"a": "a:1", "b": "b:1", "c": "c:1"}
	all := map[string]bool{"a": true, "b": true, "c": true}
	other := &catenapb.StreamConfig{Partitions: 2, MinChainLength: 2}
	bcd := []string{"b", "c", "d"}
	addrs4 := map[string]string{"a": "a:1", "b": "b:1", "c": "c:1", "d": "d:1"}
	all4 := map[string]bool{"a": true, "b": true, "c": true, "d": true}
	corrupt := rep(1, abc, 7, cfg)
	corrupt.Error = "segment 0: checksum mismatch"
	for _, tc := range []struct {
		name string
		in   Input
		want string
	}{
		{
			name: "nothing known of the stream",
			in:   Input{Addrs: addrs, Answered: all, Replication: 3},
			want: "nothing",
		},
		{
			name: "no record and no configured replica: placement is the caller's",
			in:   Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, Reports: map[string]*catenapb.PartitionStatus{}},
			want: "nothing",
		},
		{
			name: "a recorded chain nobody runs yet is installed tail first",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2,
				Chain: &chainplan.Chain{Epoch: 1, Members: abc}, Reports: map[string]*catenapb.PartitionStatus{}},
			want: "configure(c@1 [a=a:1 b=b:1 c=c:1]) configure(b@1 [a=a:1 b=b:1 c=c:1]) configure(a@1 [a=a:1 b=b:1 c=c:1])",
		},
		{
			name: "a member in doubt is not called; the others are",
			in: Input{Config: cfg, Addrs: addrs, Answered: map[string]bool{"a": true, "c": true}, Replication: 3, MinLength: 2,
				Chain: &chainplan.Chain{Epoch: 1, Members: abc}, Reports: map[string]*catenapb.PartitionStatus{}},
			want: "configure(c@1 [a=a:1 b=b:1 c=c:1]) configure(a@1 [a=a:1 b=b:1 c=c:1])",
		},
		{
			name: "a settled chain with the master's config: nothing",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2,
				Chain:   &chainplan.Chain{Epoch: 1, Members: abc},
				Reports: map[string]*catenapb.PartitionStatus{"a": rep(1, abc, 5, cfg), "b": rep(1, abc, 5, cfg), "c": rep(1, abc, 5, cfg)}},
			want: "nothing",
		},
		{
			name: "members running another config get the master's under the same epoch",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2,
				Chain:   &chainplan.Chain{Epoch: 1, Members: abc},
				Reports: map[string]*catenapb.PartitionStatus{"a": rep(1, abc, 5, other), "b": rep(1, abc, 5, cfg), "c": rep(1, abc, 5, other)}},
			want: "configure(c@1 [a=a:1 b=b:1 c=c:1]) configure(a@1 [a=a:1 b=b:1 c=c:1])",
		},
		{
			name: "without a record, the chain of the highest epoch reported",
			in: Input{Config: cfg, Addrs: addrs, Answered: map[string]bool{"b": true, "c": true}, Failed: map[string]bool{"a": true}, Replication: 3, MinLength: 2,
				Reports: map[string]*catenapb.PartitionStatus{"b": rep(3, abc, 5, cfg), "c": rep(2, abc, 5, cfg)}},
			want: "configure(c@4 [b=b:1 c=c:1]) configure(b@4 [b=b:1 c=c:1])",
		},
		{
			name: "a returning member is asked where it agrees, after learning the chain",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2,
				Chain:   &chainplan.Chain{Epoch: 2, Members: []string{"b", "c"}},
				Reports: map[string]*catenapb.PartitionStatus{"a": rep(1, abc, 7, cfg), "b": rep(2, []string{"b", "c"}, 9, cfg), "c": rep(2, []string{"b", "c"}, 9, cfg)}},
			want: "configure(a@2 [b=b:1 c=c:1]) epochend(b e1 for a)",
		},
		{
			name: "an agreement below its log end truncates it",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2,
				Chain:      &chainplan.Chain{Epoch: 2, Members: []string{"b", "c"}},
				Agreements: map[string]Agreement{"a": {ChainEpoch: 2, LogEnd: 7, LastLogEpoch: 1, Offset: 5}},
				Reports:    map[string]*catenapb.PartitionStatus{"a": rep(1, abc, 7, cfg), "b": rep(2, []string{"b", "c"}, 9, cfg), "c": rep(2, []string{"b", "c"}, 9, cfg)}},
			want: "configure(a@2 [b=b:1 c=c:1]) truncate(a to 5)",
		},
		{
			name: "an agreement of another epoch is stale and asked again",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2,
				Chain:      &chainplan.Chain{Epoch: 2, Members: []string{"b", "c"}},
				Agreements: map[string]Agreement{"a": {ChainEpoch: 1, LogEnd: 7, LastLogEpoch: 1, Offset: 5}},
				Reports:    map[string]*catenapb.PartitionStatus{"a": rep(1, abc, 7, cfg), "b": rep(2, []string{"b", "c"}, 9, cfg), "c": rep(2, []string{"b", "c"}, 9, cfg)}},
			want: "configure(a@2 [b=b:1 c=c:1]) epochend(b e1 for a)",
		},
		{
			name: "an agreeing returning member joins at the tail",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2,
				Chain:      &chainplan.Chain{Epoch: 2, Members: []string{"b", "c"}},
				Agreements: map[string]Agreement{"a": {ChainEpoch: 2, LogEnd: 5, LastLogEpoch: 1, Offset: 5}},
				Reports:    map[string]*catenapb.PartitionStatus{"a": rep(1, abc, 5, cfg), "b": rep(2, []string{"b", "c"}, 9, cfg), "c": rep(2, []string{"b", "c"}, 9, cfg)}},
			want: "reach(c=c:1 -> a=a:1) configure(a@3 [b=b:1 c=c:1 a=a:1]) configure(c@3 [b=b:1 c=c:1 a=a:1]) configure(b@3 [b=b:1 c=c:1 a=a:1])",
		},
		{
			name: "a joiner far behind copies outside the chain from the tail",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2, JoinLag: 2,
				Chain:      &chainplan.Chain{Epoch: 2, Members: []string{"b", "c"}},
				Agreements: map[string]Agreement{"a": {ChainEpoch: 2, LogEnd: 5, LastLogEpoch: 1, Offset: 5}},
				Reports:    map[string]*catenapb.PartitionStatus{"a": rep(1, abc, 5, cfg), "b": rep(2, []string{"b", "c"}, 9, cfg), "c": rep(2, []string{"b", "c"}, 9, cfg)}},
			want: "catchup(a@2 from c=c:1)",
		},
		{
			// Under steady writes the copy's log end moves between every
			// two rounds: asking again each time, the master never
			// planned the join (a returning replica rejoined only in a
			// lull of the writes).
			name: "a copy that grew its agreeing log is not asked again, and joins once close",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2, JoinLag: 2,
				Chain:      &chainplan.Chain{Epoch: 2, Members: []string{"b", "c"}},
				Agreements: map[string]Agreement{"a": {ChainEpoch: 2, LogEnd: 5, LastLogEpoch: 1, Offset: 5}},
				Reports: map[string]*catenapb.PartitionStatus{"a": copying(rep(2, []string{"b", "c"}, 8, cfg), "c", 5),
					"b": rep(2, []string{"b", "c"}, 9, cfg), "c": rep(2, []string{"b", "c"}, 9, cfg)}},
			want: "reach(c=c:1 -> a=a:1) configure(a@3 [b=b:1 c=c:1 a=a:1]) configure(c@3 [b=b:1 c=c:1 a=a:1]) configure(b@3 [b=b:1 c=c:1 a=a:1])",
		},
		{
			name: "a copy found agreeing as it ran keeps copying while far behind",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2, JoinLag: 2,
				Chain:      &chainplan.Chain{Epoch: 2, Members: []string{"b", "c"}},
				Agreements: map[string]Agreement{"a": {ChainEpoch: 2, LogEnd: 6, LastLogEpoch: 2, Offset: 6}},
				Reports: map[string]*catenapb.PartitionStatus{"a": copying(rep(2, []string{"b", "c"}, 10, cfg), "c", 5),
					"b": rep(2, []string{"b", "c"}, 20, cfg), "c": rep(2, []string{"b", "c"}, 20, cfg)}},
			want: "catchup(a@2 from c=c:1)",
		},
		{
			// Records between the agreement and the copy's start were
			// appended before the copy began: no agreement covers them.
			name: "a copy begun above the agreement is asked again",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2, JoinLag: 2,
				Chain:      &chainplan.Chain{Epoch: 2, Members: []string{"b", "c"}},
				Agreements: map[string]Agreement{"a": {ChainEpoch: 2, LogEnd: 5, LastLogEpoch: 1, Offset: 5}},
				Reports: map[string]*catenapb.PartitionStatus{"a": copying(rep(2, []string{"b", "c"}, 8, cfg), "c", 6),
					"b": rep(2, []string{"b", "c"}, 9, cfg), "c": rep(2, []string{"b", "c"}, 9, cfg)}},
			want: "configure(a@2 [b=b:1 c=c:1]) epochend(b e2 for a)",
		},
		{
			name: "an agreement that asked for a cut is not carried by a copy",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2, JoinLag: 2,
				Chain:      &chainplan.Chain{Epoch: 2, Members: []string{"b", "c"}},
				Agreements: map[string]Agreement{"a": {ChainEpoch: 2, LogEnd: 7, LastLogEpoch: 1, Offset: 5}},
				Reports: map[string]*catenapb.PartitionStatus{"a": copying(rep(2, []string{"b", "c"}, 8, cfg), "c", 5),
					"b": rep(2, []string{"b", "c"}, 9, cfg), "c": rep(2, []string{"b", "c"}, 9, cfg)}},
			want: "configure(a@2 [b=b:1 c=c:1]) epochend(b e2 for a)",
		},
		{
			name: "a log that grew without a copy is asked again",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2, JoinLag: 2,
				Chain:      &chainplan.Chain{Epoch: 2, Members: []string{"b", "c"}},
				Agreements: map[string]Agreement{"a": {ChainEpoch: 2, LogEnd: 5, LastLogEpoch: 1, Offset: 5}},
				Reports: map[string]*catenapb.PartitionStatus{"a": rep(2, []string{"b", "c"}, 8, cfg),
					"b": rep(2, []string{"b", "c"}, 9, cfg), "c": rep(2, []string{"b", "c"}, 9, cfg)}},
			want: "configure(a@2 [b=b:1 c=c:1]) epochend(b e2 for a)",
		},
		{
			name: "a copy made at an older epoch is asked again",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2, JoinLag: 2,
				Chain:      &chainplan.Chain{Epoch: 3, Members: []string{"b", "c"}},
				Agreements: map[string]Agreement{"a": {ChainEpoch: 3, LogEnd: 5, LastLogEpoch: 1, Offset: 5}},
				Reports: map[string]*catenapb.PartitionStatus{"a": copying(rep(2, []string{"b", "c"}, 8, cfg), "c", 5),
					"b": rep(3, []string{"b", "c"}, 9, cfg), "c": rep(3, []string{"b", "c"}, 9, cfg)}},
			want: "configure(a@3 [b=b:1 c=c:1]) epochend(b e2 for a)",
		},
		{
			name: "catching up in the chain, the joiner enters at once",
			in: Input{Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2, JoinLag: 2, CatchUpInChain: true,
				Chain:      &chainplan.Chain{Epoch: 2, Members: []string{"b", "c"}},
				Agreements: map[string]Agreement{"a": {ChainEpoch: 2, LogEnd: 5, LastLogEpoch: 1, Offset: 5}},
				Reports:    map[string]*catenapb.PartitionStatus{"a": rep(1, abc, 5, cfg), "b": rep(2, []string{"b", "c"}, 9, cfg), "c": rep(2, []string{"b", "c"}, 9, cfg)}},
			want: "reach(c=c:1 -> a=a:1) configure(a@3 [b=b:1 c=c:1 a=a:1]) configure(c@3 [b=b:1 c=c:1 a=a:1]) configure(b@3 [b=b:1 c=c:1 a=a:1])",
		},
		{
			name: "a complete chain drops the copy of a replica replaced while away",
			in: Input{Config: cfg, Addrs: addrs4, Answered: all4, Replication: 3, MinLength: 2,
				Chain: &chainplan.Chain{Epoch: 3, Members: bcd},
				Reports: map[string]*catenapb.PartitionStatus{"a": rep(1, abc, 7, cfg),
					"b": rep(3, bcd, 9, cfg), "c": rep(3, bcd, 9, cfg), "d": rep(3, bcd, 9, cfg)}},
			want: "drop(a@3)",
		},
		{
			name: "an incomplete chain keeps every other copy",
			in: Input{Config: cfg, Addrs: addrs4, Answered: all4, Replication: 3, MinLength: 2,
				Chain: &chainplan.Chain{Epoch: 3, Members: bcd},
				Reports: map[string]*catenapb.PartitionStatus{"a": rep(1, abc, 7, cfg),
					"b": rep(3, bcd, 9, cfg), "c": rep(3, bcd, 9, cfg), "d": joining(rep(3, bcd, 4, cfg), 9)}},
			want: "nothing",
		},
		{
			name: "a corrupt copy outside the chain is dropped at once",
			in: Input{Config: cfg, Addrs: addrs4, Answered: all, Replication: 3, MinLength: 2,
				Chain: &chainplan.Chain{Epoch: 3, Members: []string{"b", "c"}},
				Reports: map[string]*catenapb.PartitionStatus{"a": corrupt,
					"b": rep(3, []string{"b", "c"}, 9, cfg), "c": rep(3, []string{"b", "c"}, 9, cfg)}},
			want: "drop(a@3)",
		},
		{
			// The record was lost behind the members' epoch (a stale copy):
			// the newest membership is the chain, not the record's.
			name: "a newer epoch than the record is the chain",
			in: Input{Config: cfg, Addrs: addrs, Answered: map[string]bool{"b": true, "c": true}, Replication: 3, MinLength: 2,
				Chain:   &chainplan.Chain{Epoch: 3, Members: abc},
				Reports: map[string]*catenapb.PartitionStatus{"b": rep(4, []string{"b", "c"}, 9, cfg), "c": rep(4, []string{"b", "c"}, 9, cfg)}},
			want: "nothing",
		},
		{
			name: "a removal installed on the tail only is finished, not undone",
			in: Input{Config: cfg, Addrs: addrs, Answered: map[string]bool{"b": true, "c": true}, Replication: 3, MinLength: 2,
				Chain:   &chainplan.Chain{Epoch: 3, Members: abc},
				Reports: map[string]*catenapb.PartitionStatus{"b": rep(3, abc, 9, cfg), "c": rep(4, []string{"b", "c"}, 9, cfg)}},
			want: "configure(b@4 [b=b:1 c=c:1])",
		},
		{
			name: "the record of the newest epoch is the chain, whatever an older copy says",
			in: Input{Config: cfg, Addrs: addrs4, Answered: all4, Replication: 3, MinLength: 2,
				Chain: &chainplan.Chain{Epoch: 3, Members: bcd},
				Reports: map[string]*catenapb.PartitionStatus{"a": rep(2, abc, 7, cfg),
					"b": rep(3, bcd, 9, cfg), "c": rep(3, bcd, 9, cfg), "d": rep(3, bcd, 9, cfg)}},
			want: "drop(a@3)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Stream = "s"
			r, err := Plan(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if got := calls(r); got != tc.want {
				t.Errorf("calls\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestLatestReport(t *testing.T) {
	if LatestReport(nil) != nil {
		t.Error("no reports: want nil")
	}
	unconfigured := map[string]*catenapb.PartitionStatus{"a": rep(0, nil, 0, nil)}
	if LatestReport(unconfigured) != nil {
		t.Error("only epoch 0: want nil")
	}
	reports := map[string]*catenapb.PartitionStatus{"a": rep(2, nil, 0, nil), "b": rep(3, nil, 0, nil), "c": rep(3, nil, 0, cfg)}
	if got := LatestReport(reports); got != reports["b"] {
		t.Errorf("got %v, want b's (highest epoch, first by id)", got)
	}
}

// TestPlanTeachesTheCommittedOffset: every Configure carries the highest
// committed offset any replica reported (committed is committed whatever
// the epoch or the state of the copy now), so a new head whose
// predecessor knew more, or a member restarted with a lagging record of
// it, does not start lower than the chain.
func TestPlanTeachesTheCommittedOffset(t *testing.T) {
	abc := []string{"a", "b", "c"}
	b, c := rep(1, abc, 9, cfg), rep(1, abc, 9, cfg)
	b.Committed, c.Committed = 6, 8
	r, err := Plan(Input{Config: cfg, Addrs: map[string]string{"a": "a:1", "b": "b:1", "c": "c:1"},
		Answered: map[string]bool{"b": true, "c": true}, Failed: map[string]bool{"a": true}, Replication: 3, MinLength: 2,
		Chain:   &chainplan.Chain{Epoch: 1, Members: abc},
		Reports: map[string]*catenapb.PartitionStatus{"b": b, "c": c}})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, call := range r.Calls {
		if call.Kind != CallConfigure {
			continue
		}
		n++
		if got := call.Configure.GetCommitted(); got != 8 {
			t.Errorf("configure of %s at epoch %d carries committed %d, want 8", call.Replica, call.Configure.GetEpoch(), got)
		}
	}
	if n != 2 {
		t.Fatalf("want a Configure of b and c in %s", calls(r))
	}
}

// Why a new membership is recorded before it is installed (2026-12-03, the
// install-first change taken back): [y z] at epoch 5 removed x, and y and z
// committed records x lacks; then y and z stop answering and x returns.
// Planned from the record of [y z], no survivor remains: the chain is kept
// and nothing is installed. Planned from an older record [x y z] (what a
// master that installed first and died before recording would leave), x
// would be made head alone without the records y and z committed.
func TestARecordedRemovalIsNeverUndoneByTheRemovedMember(t *testing.T) {
	xyz, yz := []string{"x", "y", "z"}, []string{"y", "z"}
	in := Input{Stream: "s", Config: cfg, Addrs: map[string]string{"x": "x:1", "y": "y:1", "z": "z:1"},
		Answered: map[string]bool{"x": true}, Failed: map[string]bool{"y": true, "z": true}, Replication: 3, MinLength: 2,
		Reports: map[string]*catenapb.PartitionStatus{"x": rep(4, xyz, 7, cfg)}}

	in.Chain = &chainplan.Chain{Epoch: 5, Members: yz}
	r, err := Plan(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := calls(r); got != "nothing" {
		t.Errorf("from the record of [y z]: %s, want nothing (keep the chain, refuse writes)", got)
	}

	in.Chain = &chainplan.Chain{Epoch: 4, Members: xyz}
	r, err = Plan(in)
	if err != nil {
		t.Fatal(err)
	}
	if got, lost := calls(r), "configure(x@5 [x=x:1])"; got != lost {
		t.Errorf("from the older record: %s; this test documents that it would be %s", got, lost)
	}
}
