// Package chainmaster is a chain master's work for one partition, shared by the
// operator's chain controller and `catena dev`: Plan turns what the
// replicas report into the planner's input (replica/chainplan), and the
// plan into the RPCs that carry it out; Executor makes those RPCs. Neither
// keeps the master's record of the chain: the operator keeps it in the
// Stream's chain ledger (controllers/chain_ledger.go), catena dev in memory. Both write the new
// membership to that record before Execute installs it, so that a master
// that dies half-way is finished by the next one (members that have not
// confirmed the epoch get it again), and so that the record, not what
// whichever members answer, holds every decision: a master that installed
// first and died would leave the only trace of its decision on members
// that may not answer the next one.
package chainmaster

import (
	"cmp"
	"fmt"
	"slices"
	"sort"

	"google.golang.org/protobuf/proto"

	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// Input is what Plan decides from, for one partition.
type Input struct {
	Stream    string
	Partition uint32
	// Config is sent with every Configure; members that report another
	// config are sent it again under the current epoch. Nil: nothing is
	// known of the stream yet, and Plan returns nil.
	Config *catenapb.StreamConfig
	// Replication is the chain length to grow to; MinLength the fewest
	// full copies that take writes.
	Replication, MinLength int
	// Addrs of every replica that may be a member, by id.
	Addrs map[string]string
	// Failed replicas: the master has declared them failed.
	Failed map[string]bool
	// Reports are each replica's latest report of this partition (possibly
	// from an earlier round). Answered says who answered this round: one
	// that answered without a report of the partition holds none of it;
	// one that did not answer is in doubt unless Failed.
	Reports  map[string]*catenapb.PartitionStatus
	Answered map[string]bool
	// Chain is the master's record of the chain. Nil: the membership of the
	// highest epoch any replica reports.
	Chain *chainplan.Chain
	// Agreements found by earlier EpochEnd exchanges, by replica.
	Agreements map[string]Agreement
	// JoinLag: a joining replica copies the log outside the chain
	// (Replica.CatchUp) until it is within JoinLag offsets of the committed
	// offset, then joins at the tail (0: DefaultJoinLag). See
	// chainplan.Input.CopyOutside.
	JoinLag uint64
	// CatchUpInChain turns copying outside the chain off: joiners enter at
	// once and the chain's commits wait for their whole copy.
	CatchUpInChain bool
	// LinkTimeoutMs: a member whose predecessor reports its link down or
	// stalled this long is cut off and removed (0: links are not judged).
	// The master's failure timeout.
	LinkTimeoutMs uint64
}

// DefaultJoinLag is how far behind the committed offset a joining replica
// may be when it enters the chain: the link sends it the rest, and the
// chain's commits wait for that much. A copy that follows its source
// continuously is well within it; a bound of zero could be missed by every
// report under steady writes.
const DefaultJoinLag = 4096

// Agreement is a returning replica's agreement with a chain: its log agrees
// with the chain below Offset. It is valid while the chain epoch and the
// replica's log are what they were when it was found.
type Agreement struct {
	ChainEpoch, LogEnd, LastLogEpoch uint64
	Offset                           uint64
}

// CallKind is an RPC the master makes.
type CallKind int

const (
	CallConfigure CallKind = iota + 1
	CallEpochEnd
	CallTruncate
	CallDrop
	CallCatchUp
)

// Call is one RPC to one replica.
type Call struct {
	Kind    CallKind
	Replica string // who receives the call
	Addr    string

	Configure *catenapb.ConfigureRequest
	Truncate  *catenapb.TruncateRequest
	Drop      *catenapb.DropRequest
	CatchUp   *catenapb.CatchUpRequest
	// EpochEnd asks a chain member where Member's last log epoch ended;
	// the answer, capped at Member's log end, is Member's agreement.
	EpochEnd     *catenapb.EpochEndRequest
	Member       string
	MemberAddr   string
	MemberLogEnd uint64
}

// Repair is the plan for one partition and the calls carrying it out, in
// order.
type Repair struct {
	Partition uint32
	Chain     chainplan.Chain // the chain the plan starts from
	Plan      chainplan.Plan
	Calls     []Call
	// Joins are the replicas the plan adds to the chain, each with the
	// member it joins behind: the master asks that member to reach the
	// joiner (Executor.CheckJoins) before it records the plan.
	Joins []Join
	// ChainWritesAllowed is whether Chain, as it stands, takes writes
	// (what to report while a plan waits).
	ChainWritesAllowed bool
}

// Join is a replica a plan adds to a chain behind member Pred.
type Join struct {
	Pred, PredAddr     string
	Member, MemberAddr string
}

// Plan returns the next step for the partition's chain and the calls that
// carry it out, or nil when there is nothing to do (or nothing known to act
// on). It does no I/O.
func Plan(in Input) (*Repair, error) {
	if in.Config == nil {
		return nil, nil
	}
	ids := make([]string, 0, len(in.Addrs))
	for id := range in.Addrs {
		ids = append(ids, id)
	}
	sort.Strings(ids)

	cur, ok := Current(in.Chain, in.Reports)
	if !ok {
		return nil, nil // not configured yet: initial placement is the caller's
	}

	reps := make([]chainplan.Replica, 0, len(ids))
	for _, id := range ids {
		reps = append(reps, replicaOf(in, id, cur))
	}
	pin := chainplan.Input{Chain: cur, Replicas: reps, ReplicationFactor: in.Replication, MinLength: in.MinLength,
		CopyOutside: !in.CatchUpInChain, JoinLag: cmp.Or(in.JoinLag, DefaultJoinLag), LinkTimeoutMs: in.LinkTimeoutMs}
	plan, err := chainplan.Next(pin)
	if err != nil {
		return nil, fmt.Errorf("partition %s/%d: %w", in.Stream, in.Partition, err)
	}

	// Committed is committed whatever the epoch or the state of the copy
	// that reports it: every Configure teaches the most any replica knows.
	var committed uint64
	for _, ps := range in.Reports {
		committed = max(committed, ps.GetCommitted())
	}
	configure := func(epoch uint64, members []string) *catenapb.ConfigureRequest {
		req := &catenapb.ConfigureRequest{Stream: in.Stream, Partition: in.Partition, Epoch: epoch, Config: in.Config, Committed: committed}
		for _, m := range members {
			req.Members = append(req.Members, &catenapb.Member{Id: m, Addr: in.Addrs[m]})
		}
		return req
	}
	call := func(kind CallKind, to string) Call {
		return Call{Kind: kind, Replica: to, Addr: in.Addrs[to]}
	}
	r := &Repair{Partition: in.Partition, Chain: cur, Plan: plan, ChainWritesAllowed: chainplan.WritesAllowed(pin, cur.Members)}
	for _, a := range plan.Actions {
		switch a.Kind {
		case chainplan.ActionConfigure:
			// Members confirm in chain order; they are configured tail
			// first, like an install (ActionConfigure comes alone).
			c := call(CallConfigure, a.Member)
			c.Configure = configure(cur.Epoch, cur.Members)
			r.Calls = slices.Insert(r.Calls, 0, c)
		case chainplan.ActionFindDivergence:
			// Tell the returning replica the current chain first: it
			// stops believing in the membership it left (it has no role
			// in this one), which Truncate requires.
			c := call(CallConfigure, a.Member)
			c.Configure = configure(cur.Epoch, cur.Members)
			r.Calls = append(r.Calls, c)
			c = call(CallEpochEnd, a.From)
			c.EpochEnd = &catenapb.EpochEndRequest{Stream: in.Stream, Partition: in.Partition, Epoch: a.Epoch}
			c.Member, c.MemberAddr = a.Member, in.Addrs[a.Member]
			c.MemberLogEnd = in.Reports[a.Member].GetLogEnd()
			r.Calls = append(r.Calls, c)
		case chainplan.ActionTruncate:
			c := call(CallConfigure, a.Member)
			c.Configure = configure(cur.Epoch, cur.Members)
			r.Calls = append(r.Calls, c)
			c = call(CallTruncate, a.Member)
			c.Truncate = &catenapb.TruncateRequest{Stream: in.Stream, Partition: in.Partition, To: a.To}
			r.Calls = append(r.Calls, c)
		case chainplan.ActionCatchUp:
			if plan.Changed {
				// Joining now: the link sends the new tail the rest.
				continue
			}
			c := call(CallCatchUp, a.Member)
			c.CatchUp = &catenapb.CatchUpRequest{Chain: configure(cur.Epoch, cur.Members), SourceId: a.From, SourceAddr: in.Addrs[a.From]}
			r.Calls = append(r.Calls, c)
		case chainplan.ActionJoinAtTail:
			if i := slices.Index(plan.Members, a.Member); plan.Changed && i > 0 {
				pred := plan.Members[i-1]
				r.Joins = append(r.Joins, Join{Pred: pred, PredAddr: in.Addrs[pred], Member: a.Member, MemberAddr: in.Addrs[a.Member]})
			}
		}
	}
	if plan.Changed {
		// Tail first: by the time a predecessor links, its successor
		// already knows the epoch. A member in doubt (it did not answer
		// this round: paused, partitioned) is not called, so it cannot
		// hold the master up; when it answers again it has not confirmed
		// the epoch and gets it then (ActionConfigure).
		req := configure(plan.Epoch, plan.Members)
		for i := len(plan.Members) - 1; i >= 0; i-- {
			m := plan.Members[i]
			if in.Failed[m] || !in.Answered[m] {
				continue
			}
			c := call(CallConfigure, m)
			c.Configure = req
			r.Calls = append(r.Calls, c)
		}
	} else if len(plan.Actions) == 0 {
		// The membership is settled: members running with another stream
		// config (retention changed, partitions added, another minimum
		// chain length) get the master's under the same epoch.
		for i := len(cur.Members) - 1; i >= 0; i-- {
			m := cur.Members[i]
			ps := in.Reports[m]
			if !in.Answered[m] || in.Failed[m] || ps == nil || ps.GetEpoch() != cur.Epoch || proto.Equal(ps.GetConfig(), in.Config) {
				continue
			}
			c := call(CallConfigure, m)
			c.Configure = configure(cur.Epoch, cur.Members)
			r.Calls = append(r.Calls, c)
		}
	}
	if !plan.Changed {
		r.Calls = append(r.Calls, drops(in, cur, plan)...)
	}
	if !plan.Changed && len(r.Calls) == 0 {
		return nil, nil
	}
	return r, nil
}

// drops are the copies of the partition outside the chain that nothing
// needs: a corrupt copy at any time (it is never copied from, and dropping
// it lets its replica rejoin empty), and any other copy once the chain is
// complete (every member alive, a full copy, at the current epoch): a
// replica replaced while it was away would otherwise keep its old copy
// for ever. A replica that reports a newer epoch than the chain is left to
// the planner.
func drops(in Input, cur chainplan.Chain, plan chainplan.Plan) []Call {
	complete := plan.Reason == chainplan.ReasonNoChange && len(plan.Actions) == 0
	for _, m := range cur.Members {
		// A member lacks committed records by its own report (its commit
		// notice beyond its durable end), not by another member's
		// committed offset read at another instant: under steady writes
		// that is beyond every member's durable end, and stale copies
		// were never dropped while writes flowed.
		ps := in.Reports[m]
		if !in.Answered[m] || ps == nil || ps.GetEpoch() != cur.Epoch || ps.GetError() != "" || ps.GetDurable() < ps.GetCommittedNotice() {
			complete = false
		}
	}
	ids := make([]string, 0, len(in.Reports))
	for id := range in.Reports {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var out []Call
	for _, id := range ids {
		ps := in.Reports[id]
		if slices.Contains(cur.Members, id) || !in.Answered[id] || in.Failed[id] || ps.GetEpoch() > cur.Epoch {
			continue
		}
		if ps.GetError() == "" && !complete {
			continue
		}
		out = append(out, Call{Kind: CallDrop, Replica: id, Addr: in.Addrs[id],
			Drop: &catenapb.DropRequest{Stream: in.Stream, Partition: in.Partition, Epoch: cur.Epoch}})
	}
	return out
}

// replicaOf is the planner's view of one replica.
func replicaOf(in Input, id string, cur chainplan.Chain) chainplan.Replica {
	r := chainplan.Replica{ID: id, Health: chainplan.Unknown}
	ps := in.Reports[id]
	switch {
	case in.Failed[id]:
		r.Health = chainplan.Failed
	case in.Answered[id] && ps == nil:
		r.Health, r.Log = chainplan.Alive, chainplan.LogEmpty
	case in.Answered[id]:
		r.Health = chainplan.Alive
	}
	if ps == nil {
		return r
	}
	r.Epoch, r.LogEnd, r.DurableEnd, r.Committed, r.LastLogEpoch = ps.GetEpoch(), ps.GetLogEnd(), ps.GetDurable(), ps.GetCommitted(), ps.GetLastLogEpoch()
	r.CommittedNotice = ps.GetCommittedNotice()
	r.Restarted = ps.GetRestored()
	r.SuccessorSilentMs = max(ps.GetSuccessorDownMs(), ps.GetSuccessorStalledMs())
	switch {
	case ps.GetError() != "":
		r.Log = chainplan.LogCorrupt
	case ps.GetLogEnd() == 0:
		r.Log = chainplan.LogEmpty
	}
	if a, ok := in.Agreements[id]; ok && a.ChainEpoch == cur.Epoch {
		switch {
		case a.LogEnd == r.LogEnd && a.LastLogEpoch == r.LastLogEpoch:
			r.Agreement = &a.Offset
		case copiedSince(a, ps, cur):
			end := r.LogEnd
			r.Agreement = &end
		}
	}
	return r
}

// copiedSince reports whether a replica's log, found to agree with the
// chain up to its end at a.LogEnd, still agrees up to its end now: it is
// outside the chain at the chain's epoch, and a copy begun at or below
// a.LogEnd runs. Outside the chain a replica takes no appends and no
// links, so while its epoch stays the agreement's, everything past the
// copy's start is committed records of the chain, in order, at its log end
// (PartitionStatus.copy). Without this, a copy's log end,
// which moves between any two rounds while the chain is written, made
// every agreement stale by the next round: the master asked again and
// again and planned the join only in a lull of the writes.
func copiedSince(a Agreement, ps *catenapb.PartitionStatus, cur chainplan.Chain) bool {
	c := ps.GetCopy()
	return c != nil && a.Offset == a.LogEnd && c.GetStart() <= a.LogEnd && ps.GetLogEnd() >= a.LogEnd &&
		ps.GetEpoch() == cur.Epoch && ps.GetRole() == catenapb.Role_ROLE_NONE
}

// Current is the chain a master plans from: its record, unless a replica
// reports a newer epoch, whose membership is then the chain (a record lost:
// catena dev restarted, with no record at all). Every epoch is recorded
// before any member runs it, under the record's own ordering, so a newer
// epoch is a later decision; its members may have committed records under
// it that the record's other members lack, so it is the one to finish and
// build on, never the older membership re-installed above it. ok is false
// when there is neither a record nor a configured replica.
func Current(record *chainplan.Chain, reports map[string]*catenapb.PartitionStatus) (cur chainplan.Chain, ok bool) {
	latest := LatestReport(reports)
	if record != nil && (latest == nil || latest.GetEpoch() <= record.Epoch) {
		return chainplan.Chain{Epoch: record.Epoch, Members: slices.Clone(record.Members)}, true
	}
	if latest == nil {
		return chainplan.Chain{}, false
	}
	cur.Epoch = latest.GetEpoch()
	for _, m := range latest.GetMembers() {
		cur.Members = append(cur.Members, m.GetId())
	}
	return cur, true
}

// LatestReport is the report of the highest epoch (ties: the first in id
// order), or nil when no replica reports a configured partition.
func LatestReport(reports map[string]*catenapb.PartitionStatus) *catenapb.PartitionStatus {
	ids := make([]string, 0, len(reports))
	for id := range reports {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var latest *catenapb.PartitionStatus
	for _, id := range ids {
		if ps := reports[id]; ps != nil && ps.GetEpoch() > 0 && (latest == nil || ps.GetEpoch() > latest.GetEpoch()) {
			latest = ps
		}
	}
	return latest
}

// ActionStrings renders a plan's actions for logs and events.
func ActionStrings(as []chainplan.Action) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return out
}
