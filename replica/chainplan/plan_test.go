package chainplan

import (
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"
)

// Report builders. Every replica reports the chain's committed offset 100
// unless a case says otherwise.
func alive(id string, epoch, end uint64) Replica {
	return Replica{ID: id, Health: Alive, Epoch: epoch, LogEnd: end, DurableEnd: end, Committed: min(end, 100), LastLogEpoch: epoch}
}

func failed(id string, epoch, end uint64) Replica {
	r := alive(id, epoch, end)
	r.Health = Failed
	return r
}

func unknown(id string, epoch, end uint64) Replica {
	r := alive(id, epoch, end)
	r.Health = Unknown
	return r
}

func corrupt(id string, epoch uint64) Replica {
	r := alive(id, epoch, 0)
	r.Log = LogCorrupt
	r.Committed = 0
	return r
}

// restarted reopened its log from its volume at epoch and installed none
// since: it reports committed 0 (it has not heard of a commit yet).
func restarted(id string, epoch, end uint64) Replica {
	r := alive(id, epoch, end)
	r.Restarted, r.Committed = true, 0
	return r
}

// silentLink is r reporting its link to its successor down or stalled
// for ms.
func silentLink(r Replica, ms uint64) Replica {
	r.SuccessorSilentMs = ms
	return r
}

// linkTimeout judges links after ms.
func linkTimeout(in Input, ms uint64) Input {
	in.LinkTimeoutMs = ms
	return in
}

// noticed is r reporting that it has been told of commits up to c (its
// Configure, its predecessor's notices).
func noticed(r Replica, c uint64) Replica {
	r.CommittedNotice = c
	return r
}

func emptyVol(id string) Replica {
	return Replica{ID: id, Health: Alive, Log: LogEmpty}
}

// returning is a member that was removed under an older epoch: its log may
// hold a suffix the chain never had; agreement is what the epoch-end
// exchange found (nil: not asked yet).
func returning(id string, epoch, end uint64, agreement *uint64) Replica {
	r := alive(id, epoch, end)
	r.Agreement = agreement
	return r
}

func u64(v uint64) *uint64 { return &v }

func copyOutside(in Input) Input {
	in.CopyOutside, in.JoinLag = true, 10
	return in
}

func chain(epoch uint64, members ...string) Chain { return Chain{Epoch: epoch, Members: members} }

func in(c Chain, rf, minLen int, reps ...Replica) Input {
	return Input{Chain: c, Replicas: reps, ReplicationFactor: rf, MinLength: minLen}
}

func abc(epoch uint64) []Replica {
	return []Replica{alive("a", epoch, 100), alive("b", epoch, 100), alive("c", epoch, 100)}
}

func with(reps []Replica, rs ...Replica) []Replica {
	out := slices.Clone(reps)
	for _, r := range rs {
		if i := slices.IndexFunc(out, func(x Replica) bool { return x.ID == r.ID }); i >= 0 {
			out[i] = r
		} else {
			out = append(out, r)
		}
	}
	return out
}

func TestNext(t *testing.T) {
	c5 := chain(5, "a", "b", "c")
	tests := []struct {
		name string
		in   Input
		want Plan
	}{
		// Healthy.
		{"healthy chain: no change", in(c5, 3, 2, abc(5)...),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonNoChange, WritesAllowed: true}},
		{"healthy chain longer than rf: no change", in(c5, 2, 1, abc(5)...),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonNoChange, WritesAllowed: true}},

		// Single failures.
		{"head fails: successor is head", in(c5, 3, 1, with(abc(5), failed("a", 5, 100))...),
			Plan{Members: []string{"b", "c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"middle fails: predecessor links to successor", in(c5, 3, 1, with(abc(5), failed("b", 5, 100))...),
			Plan{Members: []string{"a", "c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"tail fails: predecessor is tail", in(c5, 3, 1, with(abc(5), failed("c", 5, 100))...),
			Plan{Members: []string{"a", "b"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"head with the most records fails: survivors kept in order", in(c5, 3, 1, failed("a", 5, 130), alive("b", 5, 120), alive("c", 5, 110)),
			Plan{Members: []string{"b", "c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"corrupt member counts as failed", in(c5, 3, 1, with(abc(5), corrupt("b", 5))...),
			Plan{Members: []string{"a", "c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"member without any report is in doubt, not failed", in(c5, 3, 1, alive("a", 5, 100), alive("c", 5, 100)),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonNoChange, WritesAllowed: true}},
		{"short chain with a member in doubt: wait", in(chain(5, "a", "b"), 3, 1, alive("a", 5, 100), unknown("b", 5, 100), emptyVol("d")),
			Plan{Members: []string{"a", "b"}, Epoch: 5, Reason: ReasonWaitUnknown, WritesAllowed: true}},
		{"full-length chain with a member in doubt: no change", in(c5, 3, 1, with(abc(5), unknown("b", 5, 100))...),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonNoChange, WritesAllowed: true}},
		{"failed member outside the chain is ignored", in(c5, 3, 2, with(abc(5), failed("d", 3, 40))...),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonNoChange, WritesAllowed: true}},

		// Two failures, all failed, minimum length.
		{"head and middle fail: tail is sole", in(c5, 3, 1, with(abc(5), failed("a", 5, 100), failed("b", 5, 100))...),
			Plan{Members: []string{"c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"head and tail fail: middle is sole", in(c5, 3, 1, with(abc(5), failed("a", 5, 100), failed("c", 5, 100))...),
			Plan{Members: []string{"b"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"middle and tail fail: head is sole", in(c5, 3, 1, with(abc(5), failed("b", 5, 100), failed("c", 5, 100))...),
			Plan{Members: []string{"a"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"two fail below min length 2: survivor installed, writes refused", in(c5, 3, 2, with(abc(5), failed("a", 5, 100), failed("b", 5, 100))...),
			Plan{Members: []string{"c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: false}},
		{"one fails at min length 2: writes go on", in(c5, 3, 2, with(abc(5), failed("b", 5, 100))...),
			Plan{Members: []string{"a", "c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"min length 3 with one failed: writes refused", in(c5, 3, 3, with(abc(5), failed("b", 5, 100))...),
			Plan{Members: []string{"a", "c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: false}},
		{"all fail: chain kept, writes refused", in(c5, 3, 1, failed("a", 5, 100), failed("b", 5, 100), failed("c", 5, 100)),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonNoSurvivors, WritesAllowed: false}},
		{"sole member fails: chain kept", in(chain(2, "a"), 1, 1, failed("a", 2, 10)),
			Plan{Members: []string{"a"}, Epoch: 2, Reason: ReasonNoSurvivors, WritesAllowed: false}},
		{"all failed, one returns with its volume: it is still a member", in(c5, 3, 1, alive("a", 5, 100), failed("b", 5, 100), failed("c", 5, 100)),
			Plan{Members: []string{"a"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"min length above the chain: healthy chain refuses writes", in(chain(5, "a", "b"), 2, 3, alive("a", 5, 100), alive("b", 5, 100)),
			Plan{Members: []string{"a", "b"}, Epoch: 5, Reason: ReasonNoChange, WritesAllowed: false}},

		// Epochs.
		{"new epoch is above every reported epoch", in(c5, 3, 1, failed("a", 5, 100), alive("b", 5, 100), alive("c", 5, 100), alive("d", 9, 30)),
			Plan{Members: []string{"b", "c"}, Epoch: 10, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"members that have not confirmed get the epoch again", in(c5, 3, 1, alive("a", 5, 100), alive("b", 4, 100), alive("c", 4, 100)),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonConfirm, WritesAllowed: true,
				Actions: []Action{{Kind: ActionConfigure, Member: "b"}, {Kind: ActionConfigure, Member: "c"}}}},
		{"a member reports a newer epoch than the chain: re-install above it", in(chain(5, "a", "b"), 2, 1, alive("a", 6, 100), alive("b", 5, 100)),
			Plan{Members: []string{"a", "b"}, Epoch: 7, Changed: true, Reason: ReasonSupersede, WritesAllowed: true}},
		{"failure wins over confirmation", in(c5, 3, 1, alive("a", 5, 100), failed("b", 4, 100), alive("c", 4, 100)),
			Plan{Members: []string{"a", "c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},

		// Returning members.
		{"returning member: ask the head where its epoch ended", in(chain(6, "b", "c"), 3, 1, alive("b", 6, 120), alive("c", 6, 120), returning("a", 5, 104, nil)),
			Plan{Members: []string{"b", "c"}, Epoch: 6, Reason: ReasonFindDivergence, WritesAllowed: true,
				Actions: []Action{{Kind: ActionFindDivergence, Member: "a", From: "b", Epoch: 5}}}},
		{"returning member with an orphan suffix is truncated", in(chain(6, "b", "c"), 3, 1, alive("b", 6, 120), alive("c", 6, 120), returning("a", 5, 104, u64(100))),
			Plan{Members: []string{"b", "c"}, Epoch: 6, Reason: ReasonTruncate, WritesAllowed: true,
				Actions: []Action{{Kind: ActionTruncate, Member: "a", To: 100}}}},
		{"returning member that agrees joins at the tail", in(chain(6, "b", "c"), 3, 1, alive("b", 6, 120), alive("c", 6, 120), returning("a", 5, 100, u64(100))),
			Plan{Members: []string{"b", "c", "a"}, Epoch: 7, Changed: true, Reason: ReasonAddReturning, WritesAllowed: true,
				Actions: []Action{{Kind: ActionCatchUp, Member: "a", From: "c", To: 100}, {Kind: ActionJoinAtTail, Member: "a"}}}},
		{"returning member behind the chain joins and catches up", in(chain(6, "b", "c"), 3, 2, alive("b", 6, 120), alive("c", 6, 120), returning("a", 5, 60, u64(80))),
			Plan{Members: []string{"b", "c", "a"}, Epoch: 7, Changed: true, Reason: ReasonAddReturning, WritesAllowed: true,
				Actions: []Action{{Kind: ActionCatchUp, Member: "a", From: "c", To: 60}, {Kind: ActionJoinAtTail, Member: "a"}}}},
		{"returning member is not added while the chain is full", in(c5, 3, 1, with(abc(5), returning("d", 3, 50, nil))...),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonNoChange, WritesAllowed: true}},
		{"returning member preferred to an empty one", in(chain(6, "b", "c"), 3, 1, alive("b", 6, 120), alive("c", 6, 120), emptyVol("d"), returning("e", 5, 100, u64(100))),
			Plan{Members: []string{"b", "c", "e"}, Epoch: 7, Changed: true, Reason: ReasonAddReturning, WritesAllowed: true,
				Actions: []Action{{Kind: ActionCatchUp, Member: "e", From: "c", To: 100}, {Kind: ActionJoinAtTail, Member: "e"}}}},
		{"two returning members: one at a time, by id", in(chain(6, "b"), 3, 1, alive("b", 6, 120), returning("c", 5, 100, u64(100)), returning("a", 5, 100, u64(100))),
			Plan{Members: []string{"b", "a"}, Epoch: 7, Changed: true, Reason: ReasonAddReturning, WritesAllowed: true,
				Actions: []Action{{Kind: ActionCatchUp, Member: "a", From: "b", To: 100}, {Kind: ActionJoinAtTail, Member: "a"}}}},
		{"corrupt replica is never a candidate", in(chain(6, "b", "c"), 3, 1, alive("b", 6, 120), alive("c", 6, 120), corrupt("a", 5)),
			Plan{Members: []string{"b", "c"}, Epoch: 6, Reason: ReasonNoCandidate, WritesAllowed: true}},
		{"returning member in doubt is not a candidate", in(chain(6, "b", "c"), 3, 1, alive("b", 6, 120), alive("c", 6, 120), unknown("a", 5, 100)),
			Plan{Members: []string{"b", "c"}, Epoch: 6, Reason: ReasonNoCandidate, WritesAllowed: true}},
		{"nothing to add", in(chain(6, "b", "c"), 3, 1, alive("b", 6, 120), alive("c", 6, 120)),
			Plan{Members: []string{"b", "c"}, Epoch: 6, Reason: ReasonNoCandidate, WritesAllowed: true}},

		// Copying outside the chain (CopyOutside, JoinLag 10; committed 100).
		{"empty replica copies outside the chain first", copyOutside(in(chain(6, "b", "c"), 3, 1, alive("b", 6, 120), alive("c", 6, 120), emptyVol("a"))),
			Plan{Members: []string{"b", "c"}, Epoch: 6, Reason: ReasonCopying, WritesAllowed: true,
				Actions: []Action{{Kind: ActionCatchUp, Member: "a", From: "c", To: 0}}}},
		{"a copy far behind keeps copying", copyOutside(in(chain(6, "b", "c"), 3, 1, alive("b", 6, 120), alive("c", 6, 120), returning("a", 6, 80, u64(80)))),
			Plan{Members: []string{"b", "c"}, Epoch: 6, Reason: ReasonCopying, WritesAllowed: true,
				Actions: []Action{{Kind: ActionCatchUp, Member: "a", From: "c", To: 80}}}},
		{"a copy within the lag joins at the tail", copyOutside(in(chain(6, "b", "c"), 3, 1, alive("b", 6, 120), alive("c", 6, 120), returning("a", 6, 95, u64(95)))),
			Plan{Members: []string{"b", "c", "a"}, Epoch: 7, Changed: true, Reason: ReasonAddReturning, WritesAllowed: true,
				Actions: []Action{{Kind: ActionCatchUp, Member: "a", From: "c", To: 95}, {Kind: ActionJoinAtTail, Member: "a"}}}},
		{"a returning member is cut back before it copies", copyOutside(in(chain(6, "b", "c"), 3, 1, alive("b", 6, 120), alive("c", 6, 120), returning("a", 5, 104, u64(60)))),
			Plan{Members: []string{"b", "c"}, Epoch: 6, Reason: ReasonTruncate, WritesAllowed: true,
				Actions: []Action{{Kind: ActionTruncate, Member: "a", To: 60}}}},
		{"an empty replica of a young partition joins at once", copyOutside(in(chain(6, "b", "c"), 3, 1, alive("b", 6, 8), alive("c", 6, 8), emptyVol("a"))),
			Plan{Members: []string{"b", "c", "a"}, Epoch: 7, Changed: true, Reason: ReasonAddNew, WritesAllowed: true,
				Actions: []Action{{Kind: ActionCatchUp, Member: "a", From: "c", To: 0}, {Kind: ActionJoinAtTail, Member: "a"}}}},

		// Lost volumes.
		{"empty volume is a new member: full copy then tail", in(chain(6, "b", "c"), 3, 1, alive("b", 6, 120), alive("c", 6, 120), emptyVol("a")),
			Plan{Members: []string{"b", "c", "a"}, Epoch: 7, Changed: true, Reason: ReasonAddNew, WritesAllowed: true,
				Actions: []Action{{Kind: ActionCatchUp, Member: "a", From: "c", To: 0}, {Kind: ActionJoinAtTail, Member: "a"}}}},
		{"member that came back empty in place counts as lagging, not full", in(c5, 3, 3, alive("a", 5, 100), alive("b", 5, 100), emptyVol("c")),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonConfirm, WritesAllowed: false,
				Actions: []Action{{Kind: ActionConfigure, Member: "c"}}}},

		// Failures during catch-up.
		{"joiner still catching up: no second joiner", in(chain(7, "b", "c", "a"), 4, 1, alive("b", 7, 120), alive("c", 7, 120), noticed(alive("a", 7, 60), 100), emptyVol("d")),
			Plan{Members: []string{"b", "c", "a"}, Epoch: 7, Reason: ReasonWaitCatchUp, WritesAllowed: true}},
		// Reports read at different instants under steady writes: the
		// head's committed offset, read last, is beyond the tail's durable
		// end read a moment before. Each says it lacks nothing.
		{"a committed offset read after a member's durable end: the chain still grows", in(chain(6, "b", "c"), 3, 1,
			Replica{ID: "b", Health: Alive, Epoch: 6, LogEnd: 130, DurableEnd: 130, Committed: 128, CommittedNotice: 100, LastLogEpoch: 6},
			Replica{ID: "c", Health: Alive, Epoch: 6, LogEnd: 120, DurableEnd: 120, Committed: 120, CommittedNotice: 120, LastLogEpoch: 6},
			returning("a", 5, 104, nil)),
			Plan{Members: []string{"b", "c"}, Epoch: 6, Reason: ReasonFindDivergence, WritesAllowed: true,
				Actions: []Action{{Kind: ActionFindDivergence, Member: "a", From: "b", Epoch: 5}}}},
		{"joiner catching up does not count toward min length", in(chain(7, "b", "c", "a"), 3, 3, alive("b", 7, 120), alive("c", 7, 120), alive("a", 7, 60)),
			Plan{Members: []string{"b", "c", "a"}, Epoch: 7, Reason: ReasonNoChange, WritesAllowed: false}},
		{"old tail fails during catch-up: joiner now follows the head", in(chain(7, "b", "c", "a"), 3, 1, alive("b", 7, 120), failed("c", 7, 120), alive("a", 7, 60)),
			Plan{Members: []string{"b", "a"}, Epoch: 8, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"joiner fails during catch-up: removed", in(chain(7, "b", "c", "a"), 3, 1, alive("b", 7, 120), alive("c", 7, 120), failed("a", 7, 60)),
			Plan{Members: []string{"b", "c"}, Epoch: 8, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"every full copy fails during catch-up: joiner never made head", in(chain(7, "b", "c", "a"), 3, 1, failed("b", 7, 120), failed("c", 7, 120), alive("a", 7, 60)),
			Plan{Members: []string{"b", "c", "a"}, Epoch: 7, Reason: ReasonNoFullCopy, WritesAllowed: false}},
		{"joiner written but not durable up to committed is not yet full", in(chain(7, "b", "c", "a"), 3, 3, alive("b", 7, 120), alive("c", 7, 120),
			Replica{ID: "a", Health: Alive, Epoch: 7, LogEnd: 120, DurableEnd: 90, Committed: 90, LastLogEpoch: 7}),
			Plan{Members: []string{"b", "c", "a"}, Epoch: 7, Reason: ReasonNoChange, WritesAllowed: false}},
		{"paused member resumed after its removal: asked like any returning member", in(chain(6, "a", "c"), 3, 1, alive("a", 6, 120), alive("c", 6, 120), returning("b", 5, 100, nil)),
			Plan{Members: []string{"a", "c"}, Epoch: 6, Reason: ReasonFindDivergence, WritesAllowed: true,
				Actions: []Action{{Kind: ActionFindDivergence, Member: "b", From: "a", Epoch: 5}}}},
		{"member restarted within detection: still a member, nothing to do", in(c5, 3, 2, with(abc(5), Replica{ID: "b", Health: Alive, Epoch: 5, LogEnd: 100, DurableEnd: 100, LastLogEpoch: 5})...),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonNoChange, WritesAllowed: true}},
		{"failure and a returning member at once: removal first", in(chain(6, "b", "c"), 3, 1, alive("b", 6, 120), failed("c", 6, 120), returning("a", 5, 100, u64(100))),
			Plan{Members: []string{"b"}, Epoch: 7, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		// Restarts (crashes, power cuts): a member back from its volume at
		// the epoch it was in has left the chain.
		{"middle restarted: removed, returns at the tail later", in(c5, 3, 1, with(abc(5), restarted("b", 5, 100))...),
			Plan{Members: []string{"a", "c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"head restarted short of its successor: removed", in(c5, 3, 1, with(abc(5), restarted("a", 5, 95))...),
			Plan{Members: []string{"b", "c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"every member restarted: the longest log is the chain", in(c5, 3, 1, restarted("a", 5, 100), restarted("b", 5, 100), restarted("c", 5, 104)),
			Plan{Members: []string{"c"}, Epoch: 6, Changed: true, Reason: ReasonAllRestarted, WritesAllowed: true}},
		{"every member restarted: a later last epoch beats a longer log", in(c5, 3, 1, restarted("a", 5, 100),
			Replica{ID: "b", Health: Alive, Restarted: true, Epoch: 5, LogEnd: 102, DurableEnd: 102, LastLogEpoch: 5},
			Replica{ID: "c", Health: Alive, Restarted: true, Epoch: 5, LogEnd: 110, DurableEnd: 110, LastLogEpoch: 4}),
			Plan{Members: []string{"b"}, Epoch: 6, Changed: true, Reason: ReasonAllRestarted, WritesAllowed: true}},
		{"every member restarted alike: the earliest in the chain", in(c5, 3, 1, restarted("a", 5, 100), restarted("b", 5, 100), restarted("c", 5, 100)),
			Plan{Members: []string{"a"}, Epoch: 6, Changed: true, Reason: ReasonAllRestarted, WritesAllowed: true}},
		{"every member restarted, min length 2: one is the chain, writes refused until another returns", in(c5, 3, 2, restarted("a", 5, 100), restarted("b", 5, 100), restarted("c", 5, 100)),
			Plan{Members: []string{"a"}, Epoch: 6, Changed: true, Reason: ReasonAllRestarted, WritesAllowed: false}},
		{"restarted and failed members only: the restarted one is the chain", in(c5, 3, 1, failed("a", 5, 100), restarted("b", 5, 100), failed("c", 5, 100)),
			Plan{Members: []string{"b"}, Epoch: 6, Changed: true, Reason: ReasonAllRestarted, WritesAllowed: true}},
		{"a restarted member short of what was committed is never the chain", in(c5, 3, 1, failed("a", 5, 100), restarted("b", 5, 80),
			Replica{ID: "c", Health: Failed, Epoch: 5, LogEnd: 100, DurableEnd: 100, Committed: 100, LastLogEpoch: 5}),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonNoSurvivors, WritesAllowed: false}},
		{"restarted member outside the chain returns like any other", in(chain(6, "a", "c"), 3, 1, alive("a", 6, 120), alive("c", 6, 120), restarted("b", 5, 100)),
			Plan{Members: []string{"a", "c"}, Epoch: 6, Reason: ReasonFindDivergence, WritesAllowed: true,
				Actions: []Action{{Kind: ActionFindDivergence, Member: "b", From: "a", Epoch: 5}}}},
		// Links (SCENARIOS.md 23): a predecessor's report of a silent link
		// removes the successor when it is dark, the predecessor when the
		// successor answers the master (the link is cut).
		{"head cannot reach a middle that answers the master: the head stays (its committed offset), the middle goes", linkTimeout(in(c5, 3, 1, with(abc(5), silentLink(alive("a", 5, 100), 2000))...), 2000),
			Plan{Members: []string{"a", "c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveCutOff, WritesAllowed: true}},
		{"middle cannot reach a tail that answers the master: middle removed", linkTimeout(in(c5, 3, 1, with(abc(5), silentLink(alive("b", 5, 100), 2500))...), 2000),
			Plan{Members: []string{"a", "c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveCutOff, WritesAllowed: true}},
		{"head cannot reach a middle in doubt: the dark middle removed", linkTimeout(in(c5, 3, 1, silentLink(alive("a", 5, 100), 2000), unknown("b", 5, 100), alive("c", 5, 100)), 2000),
			Plan{Members: []string{"a", "c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveCutOff, WritesAllowed: true}},
		{"middle cannot reach a tail in doubt: the dark tail removed", linkTimeout(in(c5, 3, 1, alive("a", 5, 100), silentLink(alive("b", 5, 100), 2000), unknown("c", 5, 100)), 2000),
			Plan{Members: []string{"a", "b"}, Epoch: 6, Changed: true, Reason: ReasonRemoveCutOff, WritesAllowed: true}},
		{"a restarted successor refuses the link: it is removed, not its predecessor", linkTimeout(in(c5, 3, 1, silentLink(alive("a", 5, 100), 3000), restarted("b", 5, 100), alive("c", 5, 100)), 2000),
			Plan{Members: []string{"a", "c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"link silent less than the timeout: no change", linkTimeout(in(c5, 3, 1, with(abc(5), silentLink(alive("a", 5, 100), 1999))...), 2000),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonNoChange, WritesAllowed: true}},
		{"links not judged without a timeout", in(c5, 3, 1, with(abc(5), silentLink(alive("a", 5, 100), 60000))...),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonNoChange, WritesAllowed: true}},
		{"a report from an older epoch is no evidence", linkTimeout(in(c5, 3, 1, with(abc(5), silentLink(alive("a", 4, 100), 9000))...), 2000),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonConfirm, WritesAllowed: true,
				Actions: []Action{{Kind: ActionConfigure, Member: "a"}}}},
		{"a reporter in doubt is no evidence", linkTimeout(in(c5, 3, 1, with(abc(5), silentLink(unknown("a", 5, 100), 9000))...), 2000),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonNoChange, WritesAllowed: true}},
		{"a cut link and a failed member at once: both removed", linkTimeout(in(chain(5, "a", "b", "c", "d"), 4, 1, silentLink(alive("a", 5, 100), 3000), alive("b", 5, 100), alive("c", 5, 100), failed("d", 5, 100)), 2000),
			Plan{Members: []string{"a", "c"}, Epoch: 6, Changed: true, Reason: ReasonRemoveFailed, WritesAllowed: true}},
		{"the tail's own report names no successor", linkTimeout(in(c5, 3, 1, with(abc(5), silentLink(alive("c", 5, 100), 9000))...), 2000),
			Plan{Members: []string{"a", "b", "c"}, Epoch: 5, Reason: ReasonNoChange, WritesAllowed: true}},
		{"joiner caught up: counted as full", in(chain(7, "b", "c", "a"), 3, 3, alive("b", 7, 120), alive("c", 7, 120), alive("a", 7, 120)),
			Plan{Members: []string{"b", "c", "a"}, Epoch: 7, Reason: ReasonNoChange, WritesAllowed: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Next(tc.in)
			if err != nil {
				t.Fatalf("Next: %v", err)
			}
			if !equalPlan(got, tc.want) {
				t.Fatalf("plan\n got %s\nwant %s", show(got), show(tc.want))
			}
			checkInvariants(t, tc.in, got)
		})
	}
}

func TestInvalidInput(t *testing.T) {
	for name, bad := range map[string]Input{
		"epoch 0":            in(chain(0, "a"), 1, 1),
		"no members":         in(chain(1), 1, 1),
		"repeated member":    in(chain(1, "a", "a"), 2, 1),
		"empty member":       in(chain(1, ""), 1, 1),
		"replica twice":      in(chain(1, "a"), 1, 1, alive("a", 1, 0), alive("a", 1, 0)),
		"replication factor": in(chain(1, "a"), 0, 1),
	} {
		if _, err := Next(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
}

func equalPlan(a, b Plan) bool {
	return slices.Equal(a.Members, b.Members) && a.Epoch == b.Epoch && a.Changed == b.Changed &&
		a.Reason == b.Reason && a.WritesAllowed == b.WritesAllowed && slices.Equal(a.Actions, b.Actions)
}

func show(p Plan) string {
	acts := make([]string, len(p.Actions))
	for i, a := range p.Actions {
		acts[i] = a.String()
	}
	return fmt.Sprintf("%v@%d changed=%v writes=%v %q [%s]", p.Members, p.Epoch, p.Changed, p.WritesAllowed, p.Reason, strings.Join(acts, "; "))
}

// checkInvariants holds every plan to the rules whatever the input.
func checkInvariants(t *testing.T, in Input, p Plan) {
	t.Helper()
	cur := in.Chain
	var maxEpoch uint64
	for _, r := range in.Replicas {
		maxEpoch = max(maxEpoch, r.Epoch)
	}
	if len(p.Members) == 0 {
		t.Fatalf("empty membership: %s", show(p))
	}
	if p.Changed {
		if p.Epoch <= max(cur.Epoch, maxEpoch) {
			t.Fatalf("changed plan under epoch %d, not above chain %d / reported %d", p.Epoch, cur.Epoch, maxEpoch)
		}
	} else if p.Epoch != cur.Epoch || !slices.Equal(p.Members, cur.Members) {
		t.Fatalf("unchanged plan moved the chain: %s", show(p))
	}
	// Survivors keep their relative order; at most one member is added,
	// at the tail, and never together with a removal.
	var kept, added []string
	for _, m := range p.Members {
		if slices.Contains(cur.Members, m) {
			kept = append(kept, m)
		} else {
			added = append(added, m)
		}
	}
	if !isSubsequence(kept, cur.Members) {
		t.Fatalf("survivors re-ordered: %v from %v", p.Members, cur.Members)
	}
	if len(added) > 1 || (len(added) == 1 && (p.Members[len(p.Members)-1] != added[0] || len(kept) != len(cur.Members))) {
		t.Fatalf("more than one membership change, or an addition not at the tail: %v from %v", p.Members, cur.Members)
	}
	byID := map[string]Replica{}
	for _, r := range in.Replicas {
		byID[r.ID] = r
	}
	for _, m := range p.Members {
		if r, ok := byID[m]; ok && p.Changed && (r.Health == Failed || r.Log == LogCorrupt) {
			t.Fatalf("failed or corrupt member %s installed: %s", m, show(p))
		}
	}
	for _, a := range p.Actions {
		if a.Kind == ActionTruncate || a.Kind == ActionFindDivergence {
			if slices.Contains(cur.Members, a.Member) {
				t.Fatalf("%s on a chain member: %s", a.Kind, show(p))
			}
		}
	}
}

func isSubsequence(sub, of []string) bool {
	i := 0
	for _, x := range of {
		if i < len(sub) && sub[i] == x {
			i++
		}
	}
	return i == len(sub)
}

// world is a toy model of the replicas, enough to carry plans out: it
// tracks each replica's log as a list of (epoch) per offset so that the
// epoch-end exchange and truncation can be computed for real.
type world struct {
	chain   Chain
	health  map[string]Health
	logs    map[string][]uint64 // epoch of each offset's batch
	epoch   map[string]uint64   // installed epoch
	commit  uint64
	corrupt map[string]bool
	// copyOutside and joinLag are the planner's Input.CopyOutside and
	// Input.JoinLag.
	copyOutside bool
	joinLag     uint64
	// reasons counts the plans made, by reason.
	reasons map[string]int
}

func (w *world) input(rf, minLen int) Input {
	var reps []Replica
	for _, id := range sortedKeys(w.health) {
		l := w.logs[id]
		r := Replica{ID: id, Health: w.health[id], Epoch: w.epoch[id], LogEnd: uint64(len(l)), DurableEnd: uint64(len(l)),
			Committed: min(w.commit, uint64(len(l)))}
		if len(l) == 0 {
			r.Log = LogEmpty
		} else {
			r.LastLogEpoch = l[len(l)-1]
		}
		if w.corrupt[id] {
			r.Log = LogCorrupt
		}
		reps = append(reps, r)
	}
	return Input{Chain: w.chain, Replicas: reps, ReplicationFactor: rf, MinLength: minLen, CopyOutside: w.copyOutside, JoinLag: w.joinLag}
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// epochEnd is EpochEndOffset on a log: the first offset of an epoch > e.
func epochEnd(l []uint64, e uint64) uint64 {
	for i, x := range l {
		if x > e {
			return uint64(i)
		}
	}
	return uint64(len(l))
}

// apply carries a plan out, filling agreement answers for the next round.
func (w *world) apply(t *testing.T, in Input, p Plan) Input {
	t.Helper()
	for _, a := range p.Actions {
		switch a.Kind {
		case ActionConfigure:
			w.epoch[a.Member] = w.chain.Epoch
		case ActionFindDivergence:
			ag := min(epochEnd(w.logs[a.From], a.Epoch), uint64(len(w.logs[a.Member])))
			for i := range in.Replicas {
				if in.Replicas[i].ID == a.Member {
					in.Replicas[i].Agreement = &ag
				}
			}
			return in
		case ActionTruncate:
			// What is kept must agree with the chain, and nothing that
			// agrees is cut (the agreement is exact in this model).
			w.logs[a.Member] = w.logs[a.Member][:a.To]
			head := w.logs[w.chain.Members[0]]
			l := w.logs[a.Member]
			if len(l) > len(head) || !slices.Equal(l, head[:len(l)]) {
				t.Fatalf("truncated %s to %d: %v still disagrees with the head's %v", a.Member, a.To, l, head)
			}
		case ActionCatchUp:
			src := w.logs[w.chain.Members[0]]
			if l := w.logs[a.Member]; len(l) > len(src) || !slices.Equal(l, src[:len(l)]) {
				t.Fatalf("joiner %s log %v is not a prefix of the chain's %v", a.Member, l, src)
			}
			if p.Changed {
				// Joining: the link copies everything from the predecessor.
				w.logs[a.Member] = slices.Clone(src)
			} else {
				// Copying outside the chain: committed records only.
				w.logs[a.Member] = slices.Clone(src[:max(w.commit, uint64(len(w.logs[a.Member])))])
			}
		}
	}
	if p.Changed {
		w.chain = Chain{Epoch: p.Epoch, Members: slices.Clone(p.Members)}
		for _, m := range p.Members {
			if w.health[m] == Alive {
				w.epoch[m] = p.Epoch
			}
		}
	}
	return w.input(in.ReplicationFactor, in.MinLength)
}

// converge plans and applies until the plan is a no-op, checking that
// planning again on the result yields no change (idempotence).
func (w *world) converge(t *testing.T, rf, minLen int) Plan {
	t.Helper()
	input := w.input(rf, minLen)
	for step := 0; step < 20; step++ {
		p, err := Next(input)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		checkInvariants(t, input, p)
		if w.reasons != nil {
			w.reasons[p.Reason]++
		}
		if !p.Changed && len(p.Actions) == 0 {
			again, _ := Next(input)
			if !equalPlan(again, p) {
				t.Fatalf("planning twice differs: %s vs %s", show(p), show(again))
			}
			return p
		}
		input = w.apply(t, input, p)
	}
	t.Fatalf("no convergence in 20 steps")
	return Plan{}
}

func newWorld(members ...string) *world {
	w := &world{chain: Chain{Epoch: 1, Members: members}, health: map[string]Health{}, logs: map[string][]uint64{},
		epoch: map[string]uint64{}, corrupt: map[string]bool{}}
	for _, m := range members {
		w.health[m] = Alive
		w.epoch[m] = 1
	}
	return w
}

// write appends n records at the head under the chain's epoch and copies
// them down to every alive member; commit follows.
func (w *world) write(n int) {
	head := w.chain.Members[0]
	for range n {
		w.logs[head] = append(w.logs[head], w.chain.Epoch)
	}
	for _, m := range w.chain.Members[1:] {
		if w.health[m] == Alive {
			w.logs[m] = slices.Clone(w.logs[head])
		}
	}
	w.commit = uint64(len(w.logs[head]))
}

// Scenario 3: a head appends locally, never forwards, dies; the new head
// writes other records at those offsets; the old head returns and is
// truncated to where its epoch ended, then rejoins at the tail.
func TestScenarioHeadOrphanSuffix(t *testing.T) {
	w := newWorld("a", "b", "c")
	w.write(10)
	w.logs["a"] = append(w.logs["a"], 1, 1, 1) // local only
	w.health["a"] = Failed
	p := w.converge(t, 3, 1)
	if !slices.Equal(p.Members, []string{"b", "c"}) || p.Epoch != 2 {
		t.Fatalf("after head failure: %s", show(p))
	}
	w.write(5) // epoch-2 records at offsets 10..14
	w.health["a"] = Alive
	p = w.converge(t, 3, 1)
	if !slices.Equal(p.Members, []string{"b", "c", "a"}) || p.Epoch != 3 {
		t.Fatalf("after return: %s", show(p))
	}
	if !slices.Equal(w.logs["a"], w.logs["b"]) {
		t.Fatalf("returning member's log %v differs from the head's %v", w.logs["a"], w.logs["b"])
	}
}

// A returning member whose last epoch the chain never saw (it was head of
// an epoch nobody else wrote in) and a chain with several later epochs.
func TestScenarioSeveralEpochsLater(t *testing.T) {
	w := newWorld("a", "b", "c")
	w.write(4)
	w.health["c"] = Failed
	w.converge(t, 3, 1) // epoch 2: a, b
	w.write(3)
	w.logs["a"] = append(w.logs["a"], 2, 2)
	w.health["a"] = Failed
	w.converge(t, 3, 1) // epoch 3: b
	w.write(2)
	w.health["a"] = Alive
	w.health["c"] = Alive
	p := w.converge(t, 3, 1)
	if len(p.Members) != 3 || p.Members[0] != "b" {
		t.Fatalf("final chain: %s", show(p))
	}
	for _, m := range p.Members {
		if !slices.Equal(w.logs[m], w.logs["b"]) {
			t.Fatalf("%s log %v differs from head %v", m, w.logs[m], w.logs["b"])
		}
	}
}

// Scenario 7: a member comes back with an empty volume.
func TestScenarioLostVolume(t *testing.T) {
	w := newWorld("a", "b", "c")
	w.write(10)
	w.health["b"] = Failed
	w.converge(t, 3, 2)
	w.logs["b"] = nil
	w.health["b"] = Alive
	p := w.converge(t, 3, 2)
	if !slices.Equal(p.Members, []string{"a", "c", "b"}) || !p.WritesAllowed {
		t.Fatalf("after lost volume: %s", show(p))
	}
	if !slices.Equal(w.logs["b"], w.logs["a"]) {
		t.Fatalf("new member not a full copy")
	}
}

// Random failures and returns: plans always satisfy the invariants, epochs
// only grow, and the process converges with logs that are prefixes of the
// head's.
func TestRandomFailuresAndReturns(t *testing.T) {
	randomFailuresAndReturns(t, false)
}

// The same with joiners copying outside the chain first.
func TestRandomFailuresAndReturnsCopyingOutside(t *testing.T) {
	randomFailuresAndReturns(t, true)
}

func randomFailuresAndReturns(t *testing.T, copyOutside bool) {
	ids := []string{"a", "b", "c", "d"}
	reasons := map[string]int{}
	defer func() {
		// The walk reaches the cases it is meant to check.
		for _, r := range []string{ReasonRemoveFailed, ReasonAddReturning, ReasonAddNew, ReasonTruncate} {
			if reasons[r] == 0 {
				t.Errorf("no plan for %q in the random walk", r)
			}
		}
		if copyOutside && reasons[ReasonCopying] == 0 {
			t.Errorf("no joiner copied outside the chain in the random walk")
		}
		t.Logf("plans by reason: %v", reasons)
	}()
	for seed := int64(0); seed < 300; seed++ {
		rng := rand.New(rand.NewSource(seed))
		w := newWorld("a", "b", "c")
		w.health["d"] = Alive
		w.copyOutside, w.joinLag, w.reasons = copyOutside, uint64(rng.Intn(3)), reasons
		rf, minLen := 3, 1+rng.Intn(2)
		lastEpoch := w.chain.Epoch
		for round := 0; round < 12; round++ {
			// Keep at least one full copy alive so that acked data survives.
			id := ids[rng.Intn(len(ids))]
			switch rng.Intn(4) {
			case 0:
				alive := 0
				for _, m := range w.chain.Members {
					if w.health[m] == Alive && uint64(len(w.logs[m])) >= w.commit {
						alive++
					}
				}
				if alive > 1 || !slices.Contains(w.chain.Members, id) {
					w.health[id] = Failed
				}
			case 1:
				if w.health[id] == Failed {
					w.health[id] = Alive
				}
			case 2:
				if w.health[id] == Failed && !slices.Contains(w.chain.Members, id) {
					w.logs[id] = nil // lost volume
				}
			case 3:
				head := w.chain.Members[0]
				if w.health[head] == Alive {
					w.write(1 + rng.Intn(3))
					if rng.Intn(3) == 0 {
						w.logs[head] = append(w.logs[head], w.chain.Epoch) // orphan
						w.health[head] = Failed
					}
				}
			}
			p := w.converge(t, rf, minLen)
			if p.Epoch < lastEpoch {
				t.Fatalf("seed %d: epoch went back %d -> %d", seed, lastEpoch, p.Epoch)
			}
			lastEpoch = p.Epoch
			head := w.logs[w.chain.Members[0]]
			if uint64(len(head)) < w.commit {
				t.Fatalf("seed %d: head %s lost committed records", seed, w.chain.Members[0])
			}
			for _, m := range w.chain.Members {
				if w.health[m] != Alive {
					continue
				}
				l := w.logs[m]
				if len(l) > len(head) || !slices.Equal(l, head[:len(l)]) {
					t.Fatalf("seed %d: member %s log %v is not a prefix of head's %v", seed, m, l, head)
				}
			}
		}
	}
}
