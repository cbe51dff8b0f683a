package devcluster

import (
	"fmt"
	"strings"
	"testing"

	"github.com/catena-streams/catena/replica/chainmaster"
	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
)

func ps(id string, epoch uint64, members []string, end, lastEpoch uint64) *catenapb.PartitionStatus {
	st := &catenapb.PartitionStatus{Stream: "s", Partition: 0, ReplicaId: id, Epoch: epoch, LogEnd: end, Durable: end, Committed: min(end, 10), LastLogEpoch: lastEpoch,
		Config: &catenapb.StreamConfig{Partitions: 1, MinChainLength: 1}}
	for _, m := range members {
		st.Members = append(st.Members, &catenapb.Member{Id: m, Addr: m + ":1"})
	}
	return st
}

func resp(parts ...*catenapb.PartitionStatus) *catenapb.StatusResponse {
	return &catenapb.StatusResponse{Partitions: parts}
}

func describe(prs []*chainmaster.Repair) string {
	var b strings.Builder
	for _, pr := range prs {
		fmt.Fprintf(&b, "p%d %q:", pr.Partition, pr.Plan.Reason)
		for _, c := range pr.Calls {
			switch c.Kind {
			case chainmaster.CallConfigure:
				var ms []string
				for _, m := range c.Configure.GetMembers() {
					ms = append(ms, m.GetId())
				}
				fmt.Fprintf(&b, " configure(%s@%d %v)", c.Replica, c.Configure.GetEpoch(), ms)
			case chainmaster.CallEpochEnd:
				fmt.Fprintf(&b, " epochend(%s e%d for %s)", c.Replica, c.EpochEnd.GetEpoch(), c.Member)
			case chainmaster.CallTruncate:
				fmt.Fprintf(&b, " truncate(%s to %d)", c.Replica, c.Truncate.GetTo())
			}
		}
		b.WriteString(";")
	}
	return b.String()
}

// The whole dev repair of a killed head, step by step, from reports alone.
func TestPlanRepairsKilledHeadRejoins(t *testing.T) {
	abc := []string{"r0", "r1", "r2"}
	in := repairInput{
		Stream: "s", Partitions: 1, Replication: 3,
		Addrs:      map[string]string{"r0": "r0:1", "r1": "r1:1", "r2": "r2:1"},
		Failed:     map[string]bool{},
		Chains:     map[uint32]chainplan.Chain{},
		Agreements: map[agreeKey]chainmaster.Agreement{},
		Reports: map[string]*catenapb.StatusResponse{
			"r0": resp(ps("r0", 1, abc, 10, 1)), "r1": resp(ps("r1", 1, abc, 10, 1)), "r2": resp(ps("r2", 1, abc, 10, 1)),
		},
	}
	step := func(want string) {
		t.Helper()
		in.Answered = map[string]bool{}
		for id := range in.Reports {
			in.Answered[id] = true
		}
		prs, err := planRepairs(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := describe(prs); got != want {
			t.Fatalf("calls\n got %s\nwant %s", got, want)
		}
	}
	step("") // healthy

	// r0 (head) exits: a chain without it, tail first, before any restart.
	in.Failed["r0"] = true
	delete(in.Reports, "r0")
	step(`p0 "removed failed members": configure(r2@2 [r1 r2]) configure(r1@2 [r1 r2]);`)

	// Installed; the new head writes at 10..15. r0 returns with orphans
	// at 10..12, still believing epoch 1.
	in.Chains[0] = chainplan.Chain{Epoch: 2, Members: []string{"r1", "r2"}}
	delete(in.Failed, "r0")
	in.Reports = map[string]*catenapb.StatusResponse{
		"r0": resp(ps("r0", 1, abc, 13, 1)),
		"r1": resp(ps("r1", 2, abc[1:], 16, 2)), "r2": resp(ps("r2", 2, abc[1:], 16, 2)),
	}
	step(`p0 "asking where a returning member's log stops agreeing with the chain": configure(r0@2 [r1 r2]) epochend(r1 e1 for r0);`)

	// The head said epoch 1 ended at 10.
	in.Agreements[agreeKey{0, "r0"}] = chainmaster.Agreement{ChainEpoch: 2, LogEnd: 13, LastLogEpoch: 1, Offset: 10}
	step(`p0 "truncating a returning member's suffix the chain never committed": configure(r0@2 [r1 r2]) truncate(r0 to 10);`)

	// Truncated: the old agreement no longer describes its log; asked again.
	in.Reports["r0"] = resp(ps("r0", 2, abc[1:], 10, 1))
	step(`p0 "asking where a returning member's log stops agreeing with the chain": configure(r0@2 [r1 r2]) epochend(r1 e1 for r0);`)
	in.Agreements[agreeKey{0, "r0"}] = chainmaster.Agreement{ChainEpoch: 2, LogEnd: 10, LastLogEpoch: 1, Offset: 10}
	step(`p0 "returning member re-enters at the tail": configure(r0@3 [r1 r2 r0]) configure(r2@3 [r1 r2 r0]) configure(r1@3 [r1 r2 r0]);`)

	// Installed and caught up: nothing left.
	in.Chains[0] = chainplan.Chain{Epoch: 3, Members: []string{"r1", "r2", "r0"}}
	m := []string{"r1", "r2", "r0"}
	in.Reports = map[string]*catenapb.StatusResponse{
		"r0": resp(ps("r0", 3, m, 16, 2)), "r1": resp(ps("r1", 3, m, 16, 2)), "r2": resp(ps("r2", 3, m, 16, 2)),
	}
	step("")
}

func TestPlanRepairsSlowReplicaIsNotRemoved(t *testing.T) {
	abc := []string{"r0", "r1", "r2"}
	in := repairInput{
		Stream: "s", Partitions: 1, Replication: 3,
		Addrs:  map[string]string{"r0": "r0:1", "r1": "r1:1", "r2": "r2:1"},
		Failed: map[string]bool{},
		// r1 did not answer in time: in doubt, not failed.
		Reports:  map[string]*catenapb.StatusResponse{"r0": resp(ps("r0", 1, abc, 10, 1)), "r1": resp(ps("r1", 1, abc, 10, 1)), "r2": resp(ps("r2", 1, abc, 10, 1))},
		Answered: map[string]bool{"r0": true, "r2": true},
	}
	prs, err := planRepairs(in)
	if err != nil || len(prs) != 0 {
		t.Fatalf("got %s, %v; want nothing", describe(prs), err)
	}
}

func TestPlanRepairsRemovesAFailedMemberNextToOneInDoubt(t *testing.T) {
	// r0 exited; r1 (head) does not answer this round but said it holds
	// the whole log: r0 is removed at once, r1 kept. r1 is not called (it
	// could hold the master up); it gets the epoch when it answers again.
	abc := []string{"r1", "r0", "r2"}
	in := repairInput{
		Stream: "s", Partitions: 1, Replication: 3,
		Addrs:  map[string]string{"r0": "r0:1", "r1": "r1:1", "r2": "r2:1"},
		Failed: map[string]bool{"r0": true},
		Reports: map[string]*catenapb.StatusResponse{
			"r0": resp(ps("r0", 1, abc, 10, 1)), "r1": resp(ps("r1", 1, abc, 10, 1)), "r2": resp(ps("r2", 1, abc, 10, 1)),
		},
		Answered: map[string]bool{"r2": true},
	}
	prs, err := planRepairs(in)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := describe(prs), `p0 "removed failed members": configure(r2@2 [r1 r2]);`; got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
}

func TestPlanRepairsFinishesAHalfInstalledEpoch(t *testing.T) {
	// The master recorded epoch 2 and only the tail installed it.
	in := repairInput{
		Stream: "s", Partitions: 1, Replication: 2,
		Addrs:  map[string]string{"r0": "r0:1", "r1": "r1:1", "r2": "r2:1"},
		Failed: map[string]bool{"r2": true},
		Chains: map[uint32]chainplan.Chain{0: {Epoch: 2, Members: []string{"r0", "r1"}}},
		Reports: map[string]*catenapb.StatusResponse{
			"r0": resp(ps("r0", 1, []string{"r2", "r0", "r1"}, 10, 1)), "r1": resp(ps("r1", 2, []string{"r0", "r1"}, 10, 1)),
		},
		Answered: map[string]bool{"r0": true, "r1": true},
	}
	prs, err := planRepairs(in)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := describe(prs), `p0 "members have not confirmed the current epoch": configure(r0@2 [r0 r1]);`; got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
}

// The master's config is what every install carries, so the heads refuse
// writes below its minimum chain length (replica/server enforces it): a
// majority of the replication factor by default, as in the operator.
func TestPlanRepairsCarriesMinChainLength(t *testing.T) {
	abc := []string{"r0", "r1", "r2"}
	in := repairInput{
		Stream: "s", Partitions: 1, Replication: 3,
		Config: chainmaster.StreamConfig(chainmaster.StreamSettings{Partitions: 1, Replication: 3}),
		Addrs:  map[string]string{"r0": "r0:1", "r1": "r1:1", "r2": "r2:1"},
		Failed: map[string]bool{"r0": true, "r1": true},
		Reports: map[string]*catenapb.StatusResponse{
			"r2": resp(ps("r2", 1, abc, 10, 1)),
		},
		Answered: map[string]bool{"r2": true},
	}
	prs, err := planRepairs(in)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := describe(prs), `p0 "removed failed members": configure(r2@2 [r2]);`; got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
	if prs[0].Plan.WritesAllowed {
		t.Errorf("a chain of 1 with minimum 2 allows writes")
	}
	if got := prs[0].Calls[0].Configure.GetConfig().GetMinChainLength(); got != 2 {
		t.Errorf("install carries min_chain_length %d, want 2", got)
	}
	if got := in.Reports["r2"].GetPartitions()[0].GetConfig().GetMinChainLength(); got != 1 {
		t.Errorf("planning changed the report's config (min_chain_length %d)", got)
	}
}

func TestKeepsCopying(t *testing.T) {
	catchUp := func(replica, source string) chainmaster.Call {
		return chainmaster.Call{Kind: chainmaster.CallCatchUp, Replica: replica,
			CatchUp: &catenapb.CatchUpRequest{Chain: &catenapb.ConfigureRequest{Stream: "s", Partition: 0}, SourceId: source}}
	}
	copying := func(source string) map[string]*catenapb.PartitionStatus {
		st := ps("a", 2, []string{"b", "c"}, 5, 1)
		st.Copy = &catenapb.CatchUpCopy{SourceId: source, Start: 5}
		return map[string]*catenapb.PartitionStatus{"a": st}
	}
	for _, tc := range []struct {
		name    string
		pr      *chainmaster.Repair
		reports map[string]*catenapb.PartitionStatus
		want    bool
	}{
		{"the copy it asks for runs", &chainmaster.Repair{Calls: []chainmaster.Call{catchUp("a", "c")}}, copying("c"), true},
		{"a copy from another source runs", &chainmaster.Repair{Calls: []chainmaster.Call{catchUp("a", "c")}}, copying("b"), false},
		{"no copy runs yet", &chainmaster.Repair{Calls: []chainmaster.Call{catchUp("a", "c")}},
			map[string]*catenapb.PartitionStatus{"a": ps("a", 2, []string{"b", "c"}, 5, 1)}, false},
		{"no report", &chainmaster.Repair{Calls: []chainmaster.Call{catchUp("a", "c")}}, nil, false},
		{"a new epoch", &chainmaster.Repair{Plan: chainplan.Plan{Changed: true}, Calls: []chainmaster.Call{catchUp("a", "c")}}, copying("c"), false},
		{"another call too", &chainmaster.Repair{Calls: []chainmaster.Call{catchUp("a", "c"), {Kind: chainmaster.CallConfigure, Replica: "b"}}}, copying("c"), false},
		{"no calls", &chainmaster.Repair{}, copying("c"), false},
	} {
		if got := keepsCopying(tc.pr, tc.reports); got != tc.want {
			t.Errorf("%s: keepsCopying %v, want %v", tc.name, got, tc.want)
		}
	}
}
