package chain

import (
	"fmt"
	"slices"
)

// Replica is the chain state of one partition on one replica node.
// Not safe for concurrent use: the driver serialises calls.
type Replica struct {
	self string

	// Configuration under the current epoch.
	epoch       uint64
	members     []string
	role        Role
	predecessor string
	successor   string

	// Local log. logEnd >= durableEnd; both only grow. logEnd is what the
	// driver has been asked to write (and is forwarded at once); durableEnd
	// is what it has reported durable.
	logEnd     uint64
	durableEnd uint64

	// Successor link, reset by every new epoch. While linked, everything
	// below forwardedEnd has been sent (or was already held by the
	// successor at link time); inFlight is what was sent on this link and
	// not yet acknowledged. Forwarding follows logEnd, not durableEnd.
	linked       bool
	forwardedEnd uint64
	inFlight     []Range
	// successorAck is the successor's cumulative ack under the current
	// epoch; an ack from an earlier epoch vouches for a different
	// downstream membership, so it is not carried over.
	successorAck uint64
	// ackedUpstream is the last AckUpstream emitted under the current epoch.
	ackedUpstream uint64

	// noticed is the highest committed offset heard from a predecessor. A
	// committed offset stays committed whatever the epoch, so it survives
	// reconfiguration; it is applied only up to durableEnd. It is the only
	// way a middle or tail learns what is committed: its own ack value
	// says nothing about the members upstream, which may not have made
	// those records durable yet.
	noticed uint64
	// committed only grows, independently of successorAck resets.
	committed uint64

	// upstream is the predecessor's upstream-durable offset under the
	// current epoch: everything below it is durable on every member
	// before this one. Like successorAck it vouches for one epoch's
	// membership and is reset by every new epoch. With the local durable
	// end and (at a middle) successorAck it gives the committed offset
	// without the acknowledgement round trip: at the tail first.
	upstream uint64
	// sentDown is the last upstream-durable offset sent to the successor
	// on the current link (reset by a new link, so that the handshake
	// carries it again).
	sentDown uint64
}

// New returns the state of a replica named self whose local log ends at
// logEnd, all of it durable (recovered logs are durable by construction).
// It starts with no configuration (epoch 0, RoleNone).
func New(self string, logEnd uint64) *Replica {
	return &Replica{self: self, logEnd: logEnd, durableEnd: logEnd}
}

// Configure installs cfg. An epoch below the current one is refused with
// ErrStaleEpoch; the same epoch with different members with ErrConflict; the
// same epoch and members is a no-op. Epoch 0, an empty member list or an
// empty or repeated member name is ErrInvalidConfig. On a new epoch the
// forwarding window is reset: nothing is forwarded until SuccessorLinked
// reports the successor's log end, and successorAck starts again from 0 (the
// committed offset does not move back). A replica that becomes (or stays)
// tail acknowledges its durable end upstream at once (AckUpstream), but does
// not commit it: records it holds may not be durable on its predecessors,
// and it learns what is committed from the new head's notices. A replica
// that becomes sole commits its durable end (Committed). A commit notice
// heard under an earlier epoch may also take effect (it is capped at the
// durable end, which may have grown since). A replica not in cfg.Members
// gets RoleNone. cfg.Committed is taken as a commit notice (see Config).
func (r *Replica) Configure(cfg Config) (Effects, error) {
	if err := validateConfig(cfg); err != nil {
		return Effects{}, err
	}
	switch {
	case cfg.Epoch < r.epoch:
		return Effects{}, fmt.Errorf("%w: configuration epoch %d, current %d", ErrStaleEpoch, cfg.Epoch, r.epoch)
	case cfg.Epoch == r.epoch:
		if slices.Equal(cfg.Members, r.members) {
			return Effects{}, nil
		}
		return Effects{}, fmt.Errorf("%w: epoch %d has members %v, got %v", ErrConflict, cfg.Epoch, r.members, cfg.Members)
	}

	r.epoch = cfg.Epoch
	r.members = slices.Clone(cfg.Members)
	r.role, r.predecessor, r.successor = RoleNone, "", ""
	if i := slices.Index(r.members, r.self); i >= 0 {
		last := len(r.members) - 1
		switch {
		case last == 0:
			r.role = RoleSole
		case i == 0:
			r.role = RoleHead
		case i == last:
			r.role = RoleTail
		default:
			r.role = RoleMiddle
		}
		if i > 0 {
			r.predecessor = r.members[i-1]
		}
		if i < last {
			r.successor = r.members[i+1]
		}
	}
	r.linked = false
	r.forwardedEnd = 0
	r.inFlight = nil
	r.successorAck = 0
	r.ackedUpstream = 0
	r.upstream = 0
	r.sentDown = 0
	r.noticed = max(r.noticed, cfg.Committed)

	var eff Effects
	r.advance(&eff)
	return eff, nil
}

func validateConfig(cfg Config) error {
	if cfg.Epoch == 0 {
		return fmt.Errorf("%w: epoch 0 is reserved for an unconfigured replica", ErrInvalidConfig)
	}
	if len(cfg.Members) == 0 {
		return fmt.Errorf("%w: epoch %d has no members", ErrInvalidConfig, cfg.Epoch)
	}
	seen := make(map[string]bool, len(cfg.Members))
	for _, m := range cfg.Members {
		if m == "" {
			return fmt.Errorf("%w: epoch %d has an empty member name", ErrInvalidConfig, cfg.Epoch)
		}
		if seen[m] {
			return fmt.Errorf("%w: epoch %d lists member %q twice", ErrInvalidConfig, cfg.Epoch, m)
		}
		seen[m] = true
	}
	return nil
}

// Propose assigns offsets [base, base+count) to count new records at the
// head (or sole). It returns ErrNotHead at a middle or tail, and an error
// matching both ErrNotMember and ErrNotHead at a non-member (so a driver
// that only knows "redirect to the head" handles both). Effects.Append asks
// the driver to write them; if the successor link is up, Effects.Forward
// sends them on at once, before they are durable here (the driver writes
// first, then forwards, and reports durability later with Durable).
// Proposing zero records is a no-op that returns the log end.
func (r *Replica) Propose(count uint64) (base uint64, eff Effects, err error) {
	switch r.role {
	case RoleHead, RoleSole:
	case RoleNone:
		return 0, Effects{}, fmt.Errorf("%w (%w): %q under epoch %d", ErrNotMember, ErrNotHead, r.self, r.epoch)
	default:
		return 0, Effects{}, fmt.Errorf("%w: %q is %v under epoch %d", ErrNotHead, r.self, r.role, r.epoch)
	}
	base = r.logEnd
	end := base + count
	if end < base {
		return 0, Effects{}, fmt.Errorf("%w: propose %d records at %d", ErrOverflow, count, base)
	}
	if count == 0 {
		return base, Effects{}, nil
	}
	r.logEnd = end
	eff = Effects{Append: &Range{Base: base, End: end}}
	r.advance(&eff)
	return base, eff, nil
}

// Durable reports that the local log is durable up to end (cumulative,
// monotonic; smaller or repeated values are ignored). Nothing is forwarded
// here (records were forwarded when they were appended). A middle or tail
// may acknowledge more upstream; the head may commit more (up to its
// successor's ack), a sole member commits up to end, and a middle or tail
// may apply a commit notice it could not apply in full before. A report
// beyond the log end is clamped to it: durability up to end implies it up
// to the log end, and nothing beyond the log end was asked for. (The driver
// must not deliver a durability report that predates a truncation.)
func (r *Replica) Durable(end uint64) Effects {
	end = min(end, r.logEnd)
	if end <= r.durableEnd {
		return Effects{}
	}
	r.durableEnd = end
	var eff Effects
	r.advance(&eff)
	return eff
}

// Forwarded handles records [base, base+count) forwarded by the predecessor
// from under epoch, with the predecessor's committed offset and its
// upstream-durable offset (durable there and on every member before it)
// piggy-backed.
// Duplicates (entirely below the local log end) append nothing; a range that
// starts beyond the log end returns ErrGap (the link must resynchronise); a
// range that overlaps the end appends only the new suffix. What is appended
// is also forwarded at once if the successor link is up (Effects.Append and
// Effects.Forward together: write, then send). The piggy-backed
// committed offset is applied even on a duplicate (it is monotone and
// capped at durableEnd), so a duplicate can still yield Committed.
func (r *Replica) Forwarded(epoch uint64, from string, base, count, committed, upstream uint64) (Effects, error) {
	if err := r.checkMessage("forwarded", epoch); err != nil {
		return Effects{}, err
	}
	if err := r.checkFrom("forwarded", from, r.predecessor, "predecessor"); err != nil {
		return Effects{}, err
	}
	appended, err := r.extend("forwarded", base, count)
	if err != nil {
		return Effects{}, err
	}
	eff := Effects{Append: appended}
	r.noticed = max(r.noticed, committed)
	r.upstream = max(r.upstream, upstream)
	r.advance(&eff)
	return eff, nil
}

// Copied handles records [base, base+count) copied from a chain member's
// committed log while this replica is outside the chain (RoleNone): it is
// catching up before the master adds it at the tail, so that commits do not
// wait for a long copy. Members receive records through their link only
// (ErrMember). Duplicates append nothing; a range that starts beyond the
// log end is ErrGap; an overlap appends the new suffix (Effects.Append).
// Copied records are committed at the source: its committed offset is
// noted like a predecessor's notice, so it applies once this replica is a
// member and holds the records durably. A non-member forwards,
// acknowledges and commits nothing.
func (r *Replica) Copied(base, count, committed uint64) (Effects, error) {
	if r.role != RoleNone {
		return Effects{}, fmt.Errorf("%w: %q is %v under epoch %d", ErrMember, r.self, r.role, r.epoch)
	}
	appended, err := r.extend("copied", base, count)
	if err != nil {
		return Effects{}, err
	}
	r.noticed = max(r.noticed, min(committed, base+count))
	return Effects{Append: appended}, nil
}

// extend takes records [base, base+count) received from another member:
// what lies below the log end is a duplicate, what starts beyond it a gap
// (ErrGap); the new suffix, if any, is appended (returned, and the log end
// moved). Errors change nothing.
func (r *Replica) extend(what string, base, count uint64) (*Range, error) {
	end := base + count
	if end < base {
		return nil, fmt.Errorf("%w: %s %d records at %d", ErrOverflow, what, count, base)
	}
	if base > r.logEnd {
		return nil, fmt.Errorf("%w: %s [%d,%d), log end %d", ErrGap, what, base, end, r.logEnd)
	}
	if end <= r.logEnd {
		return nil, nil
	}
	appended := &Range{Base: r.logEnd, End: end}
	r.logEnd = end
	return appended, nil
}

// Acked handles a cumulative acknowledgement from the successor. Old or
// duplicate acks are ignored. An ack beyond the local log end is
// ErrAckBeyondEnd: the successor cannot hold what was never written here
// (see SuccessorLinked). An ack beyond the local durable end is normal:
// forwarding does not wait for durability, so the successor may have made
// durable what is still being written here. Acks are accepted whether or
// not the link is up: they are facts about the successor under the current
// epoch. At the head, this advances the committed offset (up to the local
// durable end); at a middle, it may produce AckUpstream (never Committed:
// a middle learns commits from notices).
func (r *Replica) Acked(epoch uint64, from string, ackEnd uint64) (Effects, error) {
	if err := r.checkMessage("ack", epoch); err != nil {
		return Effects{}, err
	}
	if err := r.checkFrom("ack", from, r.successor, "successor"); err != nil {
		return Effects{}, err
	}
	if ackEnd > r.logEnd {
		return Effects{}, fmt.Errorf("%w: ack %d from %q, log end %d", ErrAckBeyondEnd, ackEnd, from, r.logEnd)
	}
	if ackEnd <= r.successorAck {
		return Effects{}, nil
	}
	r.successorAck = ackEnd
	r.trimInFlight()
	var eff Effects
	r.advance(&eff)
	return eff, nil
}

// CommitNotice handles the committed offset and the upstream-durable offset
// sent down the chain by the predecessor (also carried on Forwarded). It
// never moves committed backwards and never beyond the local durable end;
// a notice above the durable end takes effect as Durable catches up.
func (r *Replica) CommitNotice(epoch uint64, from string, committed, upstream uint64) (Effects, error) {
	if err := r.checkMessage("commit notice", epoch); err != nil {
		return Effects{}, err
	}
	if err := r.checkFrom("commit notice", from, r.predecessor, "predecessor"); err != nil {
		return Effects{}, err
	}
	r.noticed = max(r.noticed, committed)
	r.upstream = max(r.upstream, upstream)
	var eff Effects
	r.advance(&eff)
	return eff, nil
}

// SuccessorLinked reports that a link to the successor under epoch is up
// and the successor's log ends at succEnd. Everything written here from
// succEnd on is forwarded at once (durable or not), and later appends are
// forwarded as they are made.
//
// succEnd beyond the local log end is ErrBehind. Beyond the durable end is
// fine: forwarding does not wait for durability, so the successor may hold,
// and even have made durable, records still being written here. But a
// successor only ever receives records this replica wrote first (every
// predecessor's records reached this one's log before they were forwarded
// on), so one that holds more than this replica's log end has records that
// did not come from this chain through this replica: it needs repair. (A
// replica that lost unsynced records in a machine crash is the one that
// needs repair then; see the package doc.) succEnd below what the
// successor already acknowledged under this epoch is ErrSuccessorRegressed;
// a tail or sole member has no successor (ErrNoSuccessor). succEnd is not
// an acknowledgement (see the package doc); the handshake's ack goes
// through Acked. A second SuccessorLinked replaces the first link.
func (r *Replica) SuccessorLinked(epoch uint64, succEnd uint64) (Effects, error) {
	if err := r.checkMessage("successor link", epoch); err != nil {
		return Effects{}, err
	}
	if r.successor == "" {
		return Effects{}, fmt.Errorf("%w: %q is %v under epoch %d", ErrNoSuccessor, r.self, r.role, r.epoch)
	}
	if succEnd > r.logEnd {
		return Effects{}, fmt.Errorf("%w: successor %q log end %d, local log end %d", ErrBehind, r.successor, succEnd, r.logEnd)
	}
	if succEnd < r.successorAck {
		return Effects{}, fmt.Errorf("%w: successor %q log end %d, acknowledged %d", ErrSuccessorRegressed, r.successor, succEnd, r.successorAck)
	}
	r.linked = true
	r.forwardedEnd = succEnd
	r.inFlight = nil
	r.sentDown = 0
	var eff Effects
	r.advance(&eff)
	return eff, nil
}

// SuccessorLost reports that the link to the successor broke; forwarding
// stops until the next SuccessorLinked and the in-flight window is
// forgotten (the next link resumes from the successor's log end). A loss
// reported for another epoch is ignored.
func (r *Replica) SuccessorLost(epoch uint64) {
	if epoch != r.epoch || !r.linked {
		return
	}
	r.linked = false
	r.inFlight = nil
}

// checkMessage applies the rules every message shares: its epoch must be
// the current one, and this replica must be a member under it.
func (r *Replica) checkMessage(what string, epoch uint64) error {
	switch {
	case epoch < r.epoch:
		return fmt.Errorf("%w: %s under epoch %d, current %d", ErrStaleEpoch, what, epoch, r.epoch)
	case epoch > r.epoch:
		return fmt.Errorf("%w: %s under epoch %d, current %d", ErrFutureEpoch, what, epoch, r.epoch)
	case r.role == RoleNone:
		return fmt.Errorf("%w: %s for %q under epoch %d", ErrNotMember, what, r.self, epoch)
	}
	return nil
}

func (r *Replica) checkFrom(what, from, want, wantRole string) error {
	if want == "" || from != want {
		return fmt.Errorf("%w: %s from %q, %s under epoch %d is %q", ErrWrongSender, what, from, wantRole, r.epoch, want)
	}
	return nil
}

// trimInFlight drops the acknowledged part of the window.
func (r *Replica) trimInFlight() {
	i := 0
	for i < len(r.inFlight) && r.inFlight[i].End <= r.successorAck {
		i++
	}
	r.inFlight = r.inFlight[i:]
	if len(r.inFlight) > 0 && r.inFlight[0].Base < r.successorAck {
		r.inFlight[0].Base = r.successorAck
	}
	if len(r.inFlight) == 0 {
		r.inFlight = nil
	}
}

// ackValue is the offset below which everything is durable here and on
// every member downstream (0 for a non-member). It says nothing about the
// members upstream, so except at the head (which has none) and a sole
// member it is not a committed offset.
func (r *Replica) ackValue() uint64 {
	switch r.role {
	case RoleHead, RoleMiddle:
		return min(r.durableEnd, r.successorAck)
	case RoleTail, RoleSole:
		return r.durableEnd
	}
	return 0
}

// advance derives the consequences of a state change: forward newly
// written data, acknowledge upstream, commit. Every mutating event ends
// here, so the rules live in one place.
func (r *Replica) advance(eff *Effects) {
	if r.linked && r.logEnd > r.forwardedEnd {
		rg := Range{Base: r.forwardedEnd, End: r.logEnd}
		eff.Forward = append(eff.Forward, rg)
		r.inFlight = append(r.inFlight, rg)
		r.forwardedEnd = r.logEnd
	}
	if r.role == RoleNone {
		return
	}
	ack := r.ackValue()
	if (r.role == RoleMiddle || r.role == RoleTail) && ack > r.ackedUpstream {
		r.ackedUpstream = ack
		eff.AckUpstream = &ack
	}
	// A notice from a predecessor is committed by definition, but only
	// readable here up to durableEnd. Only the head's ack value (durable
	// here and on every member downstream, i.e. on every member) and a sole
	// member's durable end are committed in their own right; a middle's or
	// tail's ack value may cover records not yet durable upstream.
	c := min(r.noticed, r.durableEnd)
	switch r.role {
	case RoleHead, RoleSole:
		c = max(c, ack)
	case RoleTail:
		// Durable here and on every member before: on every member.
		c = max(c, min(r.durableEnd, r.upstream))
	case RoleMiddle:
		// Durable before, here (ack covers it) and after.
		c = max(c, min(r.upstream, ack))
	}
	if c > r.committed {
		r.committed = c
		eff.Committed = &c
	}
	if down := r.downValue(); r.linked && down > r.sentDown {
		r.sentDown = down
		eff.DurableDown = &down
	}
}

// SuccessorCommits is the committed offset the successor works out for
// itself, having heard sent as this member's upstream-durable offset under
// the current epoch: it is a middle or tail, which commits the least of
// its upstream and its own ack value (see advance), and that is at least
// min(sent, the ack it sent here). A commit notice at or below it tells
// the successor nothing; the driver may leave it out (each is a wake-up
// on both sides). 0 without a successor.
func (r *Replica) SuccessorCommits(sent uint64) uint64 {
	if r.successor == "" {
		return 0
	}
	return min(sent, r.successorAck)
}

// DurableDown is the upstream-durable offset every frame and notice to
// the successor carries now (Status().DurableDown, without the copy).
func (r *Replica) DurableDown() uint64 { return r.downValue() }

// downValue is the upstream-durable offset to send the successor: durable
// here and on every member before this one, under the current epoch.
func (r *Replica) downValue() uint64 {
	switch r.role {
	case RoleHead:
		return r.durableEnd
	case RoleMiddle:
		return min(r.durableEnd, r.upstream)
	}
	return 0
}

// Status is a snapshot for admin APIs and metrics.
type Status struct {
	Self         string
	Epoch        uint64
	Members      []string
	Role         Role
	Predecessor  string
	Successor    string
	LogEnd       uint64 // next offset to assign or receive
	DurableEnd   uint64
	SuccessorAck uint64
	Committed    uint64
	// Noticed is the highest committed offset heard from a predecessor (or
	// a copy's source). It exceeds DurableEnd only while this member lacks
	// records the chain has committed: a joiner catching up at the tail.
	Noticed  uint64
	InFlight []Range // forwarded, not yet acknowledged

	// Linked reports whether the successor link is up under Epoch.
	Linked bool
	// ForwardedEnd is where forwarding resumes on the current link (the
	// successor's log end at link time, then the end of the last Forward).
	// Meaningless when not Linked.
	ForwardedEnd uint64
	// AckedUpstream is the last AckUpstream emitted under Epoch; the link
	// handshake carries it to the predecessor (see the package doc).
	AckedUpstream uint64
	// Upstream is the predecessor's upstream-durable offset under Epoch;
	// DurableDown is this member's, which every frame and notice to the
	// successor carries (0 at a tail or sole member).
	Upstream, DurableDown uint64
}

// Status returns a snapshot.
func (r *Replica) Status() Status {
	return Status{
		Self:          r.self,
		Epoch:         r.epoch,
		Members:       slices.Clone(r.members),
		Role:          r.role,
		Predecessor:   r.predecessor,
		Successor:     r.successor,
		LogEnd:        r.logEnd,
		DurableEnd:    r.durableEnd,
		SuccessorAck:  r.successorAck,
		Committed:     r.committed,
		Noticed:       r.noticed,
		InFlight:      slices.Clone(r.inFlight),
		Linked:        r.linked,
		ForwardedEnd:  r.forwardedEnd,
		AckedUpstream: r.ackedUpstream,
		Upstream:      r.upstream,
		DurableDown:   r.downValue(),
	}
}
