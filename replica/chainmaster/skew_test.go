package chainmaster

import (
	"testing"

	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// A master's reports of one partition are read at different instants (each
// replica is probed on its own cadence), and under steady writes a
// committed offset read after a member's durable end is beyond it, whatever
// the order: the head commits once the tail has made a record durable, and
// the tail learns of the commit one notice later. A member at the chain's epoch
// lacks committed records only when its own report says so (its commit
// notice beyond its durable end); judged against another member's
// committed offset, every member of a chain under load looked like it was
// catching up, and a returning replica was never taken back while writes
// flowed (envtest "measures write unavailability through the operator
// after member kills", under load).
func TestPlanTakesAReturningReplicaBackWhileWritesFlow(t *testing.T) {
	bc, abc := []string{"b", "c"}, []string{"a", "b", "c"}
	addrs := map[string]string{"a": "a:1", "b": "b:1", "c": "c:1"}
	all := map[string]bool{"a": true, "b": true, "c": true}
	// at is a member's report of [b c] at epoch 6: its log end (all of it
	// durable), its committed offset and the commit notice it heard.
	at := func(end, committed, notice uint64) *catenapb.PartitionStatus {
		ps := rep(6, bc, end, cfg)
		ps.Committed, ps.CommittedNotice = committed, notice
		return ps
	}
	// a was removed at epoch 6 and came back from its volume.
	returned := rep(5, abc, 104, cfg)
	returned.Committed, returned.Restored = 100, true
	const findDivergence = "configure(a@6 [b=b:1 c=c:1]) epochend(b e5 for a)"

	for _, tc := range []struct {
		name string
		b, c *catenapb.PartitionStatus
		want string
	}{
		{"reports read together", at(130, 128, 100), at(128, 128, 128), findDivergence},
		// The tail was read 20 ms before the head: the head has committed
		// since what the tail made durable then.
		{"tail read before the head", at(130, 128, 100), at(120, 120, 120), findDivergence},
		// The head was read before the tail: the tail has heard of
		// commits since of records the head appended after it was read.
		{"head read before the tail", at(120, 118, 100), at(126, 125, 125), findDivergence},
		// A member whose own report says it lacks committed records is
		// catching up: nothing is added behind it.
		{"tail catching up by its own report", at(130, 128, 100), at(90, 90, 128), "nothing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Plan(Input{Stream: "s", Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2,
				Chain:   &chainplan.Chain{Epoch: 6, Members: bc},
				Reports: map[string]*catenapb.PartitionStatus{"a": returned, "b": tc.b, "c": tc.c}})
			if err != nil {
				t.Fatal(err)
			}
			if got := calls(r); got != tc.want {
				reason := ""
				if r != nil {
					reason = r.Plan.Reason
				}
				t.Errorf("calls %s (%s), want %s", got, reason, tc.want)
			}
		})
	}
}

// The same skew must not keep a complete chain from dropping the copy of a
// replica replaced while it was away.
func TestPlanDropsAStaleCopyWhileWritesFlow(t *testing.T) {
	bcd := []string{"b", "c", "d"}
	at := func(end, committed, notice uint64) *catenapb.PartitionStatus {
		ps := rep(3, bcd, end, cfg)
		ps.Committed, ps.CommittedNotice = committed, notice
		return ps
	}
	addrs := map[string]string{"a": "a:1", "b": "b:1", "c": "c:1", "d": "d:1"}
	all := map[string]bool{"a": true, "b": true, "c": true, "d": true}
	for _, tc := range []struct {
		name    string
		b, c, d *catenapb.PartitionStatus
		want    string
	}{
		// The head was read last: it has committed beyond what c and d
		// had made durable when they were read.
		{"the head read last", at(140, 138, 120), at(130, 130, 130), at(128, 128, 128), "drop(a@3)"},
		// d says it lacks committed records: the chain is not whole yet.
		{"a member catching up by its own report", at(140, 138, 120), at(130, 130, 130), at(60, 60, 130), "nothing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Plan(Input{Stream: "s", Config: cfg, Addrs: addrs, Answered: all, Replication: 3, MinLength: 2,
				Chain:   &chainplan.Chain{Epoch: 3, Members: bcd},
				Reports: map[string]*catenapb.PartitionStatus{"a": rep(1, []string{"a", "b", "c"}, 7, cfg), "b": tc.b, "c": tc.c, "d": tc.d}})
			if err != nil {
				t.Fatal(err)
			}
			if got := calls(r); got != tc.want {
				t.Errorf("calls %s, want %s", got, tc.want)
			}
		})
	}
}
