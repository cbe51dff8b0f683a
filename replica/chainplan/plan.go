// Package chainplan is the pure planner of chain reconfiguration: given a
// partition's current chain and what every known replica reports, it
// decides the next membership (and the epoch to install it under) and what
// the master must do to each replica first. It does no I/O and reads no
// clock; the operator and `catena dev` gather reports, call Next, carry the
// plan out, gather reports again and call Next again until it says
// Changed == false with no actions.
//
// # Rules
//
//   - Failed members are removed, survivors keep their order: when the head
//     fails its successor becomes head, when the tail fails its predecessor
//     becomes tail, when a middle fails its neighbours become adjacent.
//     Survivors are never re-ordered: each survivor's log is a prefix of
//     its predecessor's, and only removal keeps that true without repair.
//     A member whose log is corrupt counts as failed (its data must never
//     be copied to a peer).
//   - A member that reopened its log from its volume and has installed no
//     epoch since (Restarted: a crash, a restart, a power cut) has left the
//     chain, whatever its health: what it had not synced may be gone, and a
//     successor may hold more than it does, so neither its length nor its
//     place says what it agrees with. It is removed like a failed member
//     and returns at the tail after the epoch-end exchange. When no member
//     survives but restarted ones (a coordinated power cut, the whole pool
//     restarted), the restarted full copy holding the most (the highest
//     last log epoch, then the longest durable log, then the earliest in the
//     chain) becomes the chain alone under a new epoch, and the others
//     return behind it: every acknowledged record is durable on every
//     member, so it holds them all.
//   - A link that its sending end (alive, at the chain's epoch) reports
//     silent for LinkTimeoutMs or longer (down, or carrying records that are
//     not acknowledged) cuts the chain: nothing commits through it. One of
//     its two ends is removed like a failed member. When the successor does
//     not answer the master either (in doubt), it is the dark one and is
//     removed, without waiting for the master's own failure timeout. When
//     the successor answers the master, the link itself is cut, and the
//     predecessor is removed: it returns at the tail, where it sends to
//     no one, behind the old tail, over other links. Except the head:
//     a successor made head learns the committed offset a round trip
//     late, so removing a live head would make the chain's committed
//     offset go back; the successor is removed instead. (Removing the
//     successor instead would bring it back at the tail, right behind the
//     predecessor whenever that was the new tail, over the same cut link.)
//   - A member in doubt (Unknown: paused, partitioned, not yet past failure
//     detection) is neither removed nor replaced: the caller decides when
//     it has failed. While a member is in doubt nothing is added either.
//   - A member whose durable log ends below the chain's committed offset is
//     catching up (it joined at the tail and the link is filling it). It is
//     not counted as a full copy: not toward the minimum chain length, and
//     it is never made head. If every full copy fails and only catching-up
//     members survive, the chain is kept as it is and writes are refused:
//     promoting a partial copy would lose committed records. Whether a
//     member blocks the chain's growth is judged from its own report
//     instead (its commit notice beyond its durable end): the reports are
//     read at different instants, and under steady writes another member's
//     committed offset is beyond a durable end read a moment earlier.
//   - When the survivors (full copies) are fewer than MinLength the new
//     chain is still installed (so reads and repair go on) but
//     WritesAllowed is false. When no member survives the chain is kept
//     unchanged: an empty chain cannot be installed, and the first member
//     to come back with its volume is still a member of it.
//   - A chain shorter than the replication factor grows by one member at a
//     time, at the tail. A returning member (same id, log present) is first
//     asked where its log stops agreeing with the chain (ActionFindDivergence:
//     the master asks the head where the member's last log epoch ended,
//     Kafka leader-epoch style, and fills Replica.Agreement), then cut back
//     to that point (ActionTruncate) if it holds an orphan suffix, then
//     appended at the tail to catch up from its predecessor
//     (ActionCatchUp + ActionJoinAtTail). An empty member (lost volume) is
//     a new member: it catches up the whole log the same way. Returning
//     members are preferred to empty ones (less to copy).
//   - Members that have not confirmed the current epoch get it again
//     (ActionConfigure) before anything else changes; a member that reports
//     a newer epoch than the chain (a master died after installing it)
//     makes the planner re-install the membership under a newer epoch still.
//     New epochs are always above every epoch any replica reports.
//
// # One membership change per step
//
// Each plan is either a removal (of every member known failed at once) or
// the addition of one member, never both, so that each step is one epoch
// bump whose effect is easy to verify from the members' confirmations and
// easy to redo if the master dies half-way (scenario 13). Removals are
// batched because a failed member is of no use in any intermediate chain
// and removing members in order-preserving fashion is safe in any
// combination. Additions are one at a time because the point where a joiner
// agrees with the chain, and the predecessor it catches up from, are
// computed against one specific chain: adding two at once, or adding while
// removing, would let the joiner link behind a member whose own log is
// still being repaired (scenario 12).
//
// # Catching up
//
// With Input.CopyOutside, a joiner first copies the committed log from the
// tail while it is outside the chain (ActionCatchUp with the membership
// unchanged: Replica.CatchUp), and the chain commits at its own pace. Once
// its log is within JoinLag of the committed offset it is added at the tail
// and the replication link sends it the rest (the handshake sends
// everything past its log end); commit waits for it for that remainder
// only. Without CopyOutside it is added at once and catches up as the tail,
// and commit waits for the whole copy. Either way it is not counted as a
// full copy until its log reaches the committed offset, so a failure
// during catch-up never makes it head or the last copy.
package chainplan

import (
	"errors"
	"fmt"
	"slices"
	"sort"
)

// Health is what the master believes of a replica process.
type Health int

const (
	// Unknown: not heard from recently but not (yet) declared failed.
	Unknown Health = iota
	// Alive: answering.
	Alive
	// Failed: declared failed by the master (process gone, past detection).
	Failed
)

func (h Health) String() string {
	switch h {
	case Alive:
		return "alive"
	case Failed:
		return "failed"
	default:
		return "unknown"
	}
}

// LogState is the state of a replica's copy of the partition log.
type LogState int

const (
	// LogGood: the log opened and serves.
	LogGood LogState = iota
	// LogEmpty: no records (new replica or lost volume).
	LogEmpty
	// LogCorrupt: the replica refuses to serve this partition.
	LogCorrupt
)

// Chain is the current membership, head first.
type Chain struct {
	Epoch   uint64
	Members []string
}

// Replica is one replica's report for this partition.
type Replica struct {
	ID     string
	Health Health
	Log    LogState
	// Epoch is the chain epoch the replica has installed.
	Epoch uint64
	// LogEnd, DurableEnd and Committed are what the replica reports.
	LogEnd, DurableEnd, Committed uint64
	// CommittedNotice is the highest committed offset the replica has been
	// told of (by its predecessor, a copy's source, or the master's
	// Configure). Beyond DurableEnd only while it lacks committed records:
	// the one comparison that needs no other replica's report, read at
	// another instant.
	CommittedNotice uint64
	// LastLogEpoch is the epoch of the last batch in its log (0: empty).
	LastLogEpoch uint64
	// Restarted: the replica reopened this partition from its volume and
	// has installed no epoch since (it takes and passes on no write).
	Restarted bool
	// SuccessorSilentMs is how long the replica's link to its successor has
	// been down or stalled (0: fine, or no successor).
	SuccessorSilentMs uint64
	// Agreement, for a replica outside the chain, is the offset below which
	// its log agrees with the chain (from the epoch-end exchange); nil when
	// not known yet.
	Agreement *uint64
}

// Input is everything the planner decides from.
type Input struct {
	Chain    Chain
	Replicas []Replica
	// ReplicationFactor is the desired chain length.
	ReplicationFactor int
	// MinLength is the fewest full copies that may accept writes (>= 1).
	MinLength int
	// CopyOutside makes a joining replica copy the log outside the chain
	// (ActionCatchUp alone, membership unchanged) until its log is within
	// JoinLag offsets of the committed offset, and only then join at the
	// tail, where the link sends it the rest: commits wait for it only for
	// that remainder. Without it a joiner enters at once and catches up as
	// the tail, and commits wait for the whole copy.
	CopyOutside bool
	JoinLag     uint64
	// LinkTimeoutMs: a successor whose predecessor reports the link silent
	// this long is cut off (0: links are not judged).
	LinkTimeoutMs uint64
}

// ActionKind says what the master must do to one replica.
type ActionKind int

const (
	// ActionConfigure: (re)send the plan's membership and epoch.
	ActionConfigure ActionKind = iota + 1
	// ActionFindDivergence: ask From (a chain member) where epoch Epoch
	// ended, and fill Replica.Agreement.
	ActionFindDivergence
	// ActionTruncate: cut Member's log back to To.
	ActionTruncate
	// ActionCatchUp: Member copies the log from From, starting at To.
	ActionCatchUp
	// ActionJoinAtTail: Member enters the chain at the tail.
	ActionJoinAtTail
)

func (k ActionKind) String() string {
	switch k {
	case ActionConfigure:
		return "configure"
	case ActionFindDivergence:
		return "find-divergence"
	case ActionTruncate:
		return "truncate"
	case ActionCatchUp:
		return "catch-up"
	case ActionJoinAtTail:
		return "join-at-tail"
	}
	return fmt.Sprintf("action(%d)", int(k))
}

// Action is one step for one replica.
type Action struct {
	Kind   ActionKind
	Member string
	// To: the truncation point (ActionTruncate) or where catch-up starts
	// (ActionCatchUp).
	To uint64
	// From: the chain member to ask (ActionFindDivergence) or copy from
	// (ActionCatchUp).
	From string
	// Epoch: the epoch to ask about (ActionFindDivergence).
	Epoch uint64
}

func (a Action) String() string {
	switch a.Kind {
	case ActionFindDivergence:
		return fmt.Sprintf("%s %s: ask %s where epoch %d ended", a.Kind, a.Member, a.From, a.Epoch)
	case ActionTruncate:
		return fmt.Sprintf("%s %s to %d", a.Kind, a.Member, a.To)
	case ActionCatchUp:
		return fmt.Sprintf("%s %s from %s at %d", a.Kind, a.Member, a.From, a.To)
	}
	return fmt.Sprintf("%s %s", a.Kind, a.Member)
}

// Reasons a plan gives. They are stable strings for logs and status.
const (
	ReasonNoChange       = "chain is healthy"
	ReasonRemoveFailed   = "removed failed members"
	ReasonRemoveCutOff   = "removed a member at an end of a link that carries nothing"
	ReasonAllRestarted   = "every member restarted; the one holding the most is the chain, the others return at the tail"
	ReasonNoSurvivors    = "every member failed; chain kept until one returns"
	ReasonNoFullCopy     = "only members still catching up survive; chain kept until a full copy returns"
	ReasonConfirm        = "members have not confirmed the current epoch"
	ReasonSupersede      = "a member reports a newer epoch than the chain; membership re-installed above it"
	ReasonFindDivergence = "asking where a returning member's log stops agreeing with the chain"
	ReasonTruncate       = "truncating a returning member's suffix the chain never committed"
	ReasonAddReturning   = "returning member re-enters at the tail"
	ReasonAddNew         = "new member copies the log and enters at the tail"
	ReasonCopying        = "a joining member is copying the log outside the chain"
	ReasonWaitCatchUp    = "a member is still catching up"
	ReasonWaitUnknown    = "a member's health is unknown"
	ReasonNoCandidate    = "chain is short but no replica can join"
)

// Plan is the next step.
type Plan struct {
	// Members is the new membership, head first (the current one when
	// Changed is false).
	Members []string
	// Epoch to install Members under: current+1 (or above every epoch any
	// replica reports) when Changed, else the current epoch.
	Epoch   uint64
	Changed bool
	Reason  string
	// WritesAllowed is false when fewer than Input.MinLength full copies
	// are in Members.
	WritesAllowed bool
	// Actions to carry out, in order. When Changed, the caller installs
	// Members under Epoch (tail first) after the actions that precede
	// ActionJoinAtTail (none do today).
	Actions []Action
}

// WritesAllowed says whether a chain of members would take writes: at
// least in.MinLength of them full copies (not corrupt, holding the most
// any replica reports committed).
func WritesAllowed(in Input, members []string) bool {
	var committed uint64
	for _, r := range in.Replicas {
		committed = max(committed, r.Committed)
	}
	n := 0
	for _, m := range members {
		r := Replica{ID: m, Health: Unknown} // no report: holds nothing
		if i := slices.IndexFunc(in.Replicas, func(r Replica) bool { return r.ID == m }); i >= 0 {
			r = in.Replicas[i]
		}
		if r.Log != LogCorrupt && r.DurableEnd >= committed {
			n++
		}
	}
	return n >= max(in.MinLength, 1)
}

// Errors for inputs the planner cannot reason about.
var ErrInvalid = errors.New("invalid planner input")

// Next returns the next step for one partition's chain.
func Next(in Input) (Plan, error) {
	if err := validate(in); err != nil {
		return Plan{}, err
	}
	byID := make(map[string]Replica, len(in.Replicas))
	for _, r := range in.Replicas {
		byID[r.ID] = r
	}
	report := func(id string) Replica {
		if r, ok := byID[id]; ok {
			return r
		}
		return Replica{ID: id, Health: Unknown}
	}
	cur := in.Chain

	// The chain's committed offset: the most any replica reports (committed
	// is committed whatever the epoch).
	var committed, maxEpoch uint64
	for _, r := range in.Replicas {
		committed = max(committed, r.Committed)
		maxEpoch = max(maxEpoch, r.Epoch)
	}
	next := max(cur.Epoch, maxEpoch) + 1
	full := func(id string) bool {
		r := report(id)
		return r.Log != LogCorrupt && r.DurableEnd >= committed
	}
	writes := func(members []string) bool { return WritesAllowed(in, members) }
	keep := func(reason string) Plan {
		return Plan{Members: slices.Clone(cur.Members), Epoch: cur.Epoch, Reason: reason, WritesAllowed: writes(cur.Members)}
	}
	change := func(members []string, reason string, actions ...Action) Plan {
		return Plan{Members: members, Epoch: next, Changed: true, Reason: reason, WritesAllowed: writes(members), Actions: actions}
	}

	// 1. Remove failed (or corrupt), cut-off and restarted members,
	// keeping order.
	cutOff := map[string]bool{}
	for i, m := range cur.Members[:len(cur.Members)-1] {
		if r := report(m); r.Health == Alive && !r.Restarted && r.Epoch == cur.Epoch &&
			in.LinkTimeoutMs > 0 && r.SuccessorSilentMs >= in.LinkTimeoutMs {
			switch succ := report(cur.Members[i+1]); {
			case succ.Health == Alive && succ.Restarted:
				// It refuses links until it is back at a new epoch; it is
				// removed below for that, and the link is not to blame.
			case succ.Health == Alive && i > 0:
				cutOff[m] = true
			default:
				cutOff[succ.ID] = true
			}
		}
	}
	var survivors []string
	var restarted []Replica
	onlyCut := true
	for _, m := range cur.Members {
		r := report(m)
		switch {
		case r.Health == Failed || (r.Health == Alive && r.Log == LogCorrupt):
			onlyCut = false
			continue
		case cutOff[m]:
			continue
		case r.Health == Alive && r.Restarted:
			restarted = append(restarted, r)
			onlyCut = false
			continue
		}
		survivors = append(survivors, m)
	}
	if len(survivors) < len(cur.Members) {
		// Survivors are full copies first, then catching-up members (they
		// joined at the tail). The head must be a full copy.
		if len(survivors) == 0 || !full(survivors[0]) {
			if best, ok := mostHeld(restarted, full); ok {
				return change([]string{best}, ReasonAllRestarted), nil
			}
			reason := ReasonNoFullCopy
			if len(survivors) == 0 {
				reason = ReasonNoSurvivors
			}
			p := keep(reason)
			p.WritesAllowed = false
			return p, nil
		}
		if onlyCut {
			return change(survivors, ReasonRemoveCutOff), nil
		}
		return change(survivors, ReasonRemoveFailed), nil
	}

	// 2. Finish the current epoch before changing anything.
	if maxEpoch > cur.Epoch {
		return change(slices.Clone(cur.Members), ReasonSupersede), nil
	}
	var confirm []Action
	for _, m := range cur.Members {
		if r := report(m); r.Health == Alive && r.Epoch < cur.Epoch {
			confirm = append(confirm, Action{Kind: ActionConfigure, Member: m})
		}
	}
	if len(confirm) > 0 {
		p := keep(ReasonConfirm)
		p.Actions = confirm
		return p, nil
	}

	// 3. Grow toward the replication factor, one member at a time.
	if len(cur.Members) >= in.ReplicationFactor {
		return keep(ReasonNoChange), nil
	}
	for _, m := range cur.Members {
		r := report(m)
		if r.Health != Alive {
			return keep(ReasonWaitUnknown), nil
		}
		if catchingUp(r) {
			return keep(ReasonWaitCatchUp), nil
		}
	}
	var cands []Replica
	for _, r := range in.Replicas {
		if r.Health == Alive && r.Log != LogCorrupt && !slices.Contains(cur.Members, r.ID) {
			cands = append(cands, r)
		}
	}
	if len(cands) == 0 {
		return keep(ReasonNoCandidate), nil
	}
	sort.Slice(cands, func(i, j int) bool {
		ei, ej := empty(cands[i]), empty(cands[j])
		if ei != ej {
			return !ei
		}
		return cands[i].ID < cands[j].ID
	})
	c := cands[0]
	head, tail := cur.Members[0], cur.Members[len(cur.Members)-1]
	grown := append(slices.Clone(cur.Members), c.ID)
	copying := func() Plan {
		p := keep(ReasonCopying)
		p.Actions = []Action{{Kind: ActionCatchUp, Member: c.ID, From: tail, To: c.LogEnd}}
		return p
	}
	if in.CopyOutside && empty(c) && in.JoinLag < committed {
		return copying(), nil
	}
	if empty(c) {
		return change(grown, ReasonAddNew,
			Action{Kind: ActionCatchUp, Member: c.ID, From: tail, To: 0},
			Action{Kind: ActionJoinAtTail, Member: c.ID}), nil
	}
	switch {
	case c.Agreement == nil:
		p := keep(ReasonFindDivergence)
		p.Actions = []Action{{Kind: ActionFindDivergence, Member: c.ID, From: head, Epoch: c.LastLogEpoch}}
		return p, nil
	case *c.Agreement < c.LogEnd:
		p := keep(ReasonTruncate)
		p.Actions = []Action{{Kind: ActionTruncate, Member: c.ID, To: *c.Agreement}}
		return p, nil
	case in.CopyOutside && c.LogEnd+in.JoinLag < committed:
		return copying(), nil
	}
	return change(grown, ReasonAddReturning,
		Action{Kind: ActionCatchUp, Member: c.ID, From: tail, To: c.LogEnd},
		Action{Kind: ActionJoinAtTail, Member: c.ID}), nil
}

func empty(r Replica) bool { return r.Log == LogEmpty || r.LogEnd == 0 }

// catchingUp reports whether a member of the chain, confirmed at its epoch
// (step 2 saw to that), still lacks records the chain committed, by its own
// report: the commit notice it heard beyond its durable end. A joiner is
// configured with the committed offset the master knows and then hears of
// every later commit from its predecessor, so it says so until its copy is
// whole. Its durable end is not compared with the most any replica
// reports: the reports are read at different instants, and under steady
// writes a committed offset read after a member's durable end is beyond it
// whichever member was read first (the head commits what the tail made
// durable a moment before; the tail hears of it a moment after), so every
// member looked like it was catching up and the chain never grew while
// writes flowed.
func catchingUp(r Replica) bool {
	return r.Log == LogCorrupt || r.DurableEnd < r.CommittedNotice
}

// mostHeld picks, among reports in chain order, the full copy whose log
// holds the most: the highest last log epoch (Kafka's rule: a later epoch's
// records supersede an earlier one's at the same offsets), then the longest
// durable log, then the earliest in the chain.
func mostHeld(reports []Replica, full func(string) bool) (string, bool) {
	var best *Replica
	for i := range reports {
		r := &reports[i]
		if !full(r.ID) {
			continue
		}
		if best == nil || r.LastLogEpoch > best.LastLogEpoch ||
			(r.LastLogEpoch == best.LastLogEpoch && r.DurableEnd > best.DurableEnd) {
			best = r
		}
	}
	if best == nil {
		return "", false
	}
	return best.ID, true
}

func validate(in Input) error {
	if in.Chain.Epoch == 0 || len(in.Chain.Members) == 0 {
		return fmt.Errorf("%w: chain needs an epoch and at least one member (initial placement is not the planner's)", ErrInvalid)
	}
	seen := map[string]bool{}
	for _, m := range in.Chain.Members {
		if m == "" || seen[m] {
			return fmt.Errorf("%w: chain member %q is empty or repeated", ErrInvalid, m)
		}
		seen[m] = true
	}
	seen = map[string]bool{}
	for _, r := range in.Replicas {
		if r.ID == "" || seen[r.ID] {
			return fmt.Errorf("%w: replica %q is empty or reported twice", ErrInvalid, r.ID)
		}
		seen[r.ID] = true
	}
	if in.ReplicationFactor < 1 {
		return fmt.Errorf("%w: replication factor %d", ErrInvalid, in.ReplicationFactor)
	}
	return nil
}
