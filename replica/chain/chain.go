// Package chain is the pure chain-replication state machine of one
// partition replica. It owns no goroutines, sockets, clocks or files: a
// driver feeds it events (configuration, local durability, frames from the
// predecessor, acknowledgements from the successor) and carries out the
// Effects it returns, persisting before acknowledging.
//
// Offsets are exclusive ends throughout: a log whose end is 10 holds
// offsets 0..9; "committed = 10" means offsets below 10 are committed.
//
// Forwarding is pipelined: a member forwards what it has written as soon as
// it has written it, durable or not, and every member fsyncs in parallel, so
// a write costs one fsync of latency rather than one per member in series.
// Safety rests on acknowledgements and commit, which still require
// durability everywhere: an acknowledgement flowing back up the chain (min
// of own durable end and the successor's ack) vouches for durability here
// and downstream, so at the head it is the minimum of every member's durable
// end, which is the committed offset. Durability also flows down with the
// data: each member sends its successor its upstream-durable offset (min of
// its own durable end and its predecessor's), so the tail knows the same
// minimum with no acknowledgement round trip, and completes writes first
// (docs/architecture.md, "Completion at the tail"). The head sends the
// committed offset down as a commit notice for members that learn it no
// other way.
//
// # Protocol
//
// A partition's chain under epoch E is an ordered member list, head first.
// The head (or a sole member) assigns offsets with Propose; every member
// writes what it is given, forwards it at once, and reports back with
// Durable once its log is durable up to some end. Data moves down the chain
// and acknowledgements move up it; commit notices follow the data down:
//
//	head --Forward[b,e)+committed+up--> middle --Forward--> tail
//	head <---------------AckUpstream--- middle <--Ack------ tail
//	head --CommitNotice(committed,up)-> middle --Notice---> tail
//
// Per member the core keeps logEnd (next offset: what the driver has been
// asked to write), durableEnd (the driver's last Durable report),
// successorAck (the successor's cumulative ack under E), committed, and,
// while the successor link is up, forwardedEnd and the window of
// forwarded-but-unacknowledged ranges.
//
//   - Forwarding. A member forwards [forwardedEnd, logEnd) whenever logEnd
//     grows (Propose at the head, Forwarded at a middle: the same Effects
//     carry Append and Forward, and the driver writes before it sends) or a
//     link comes up (SuccessorLinked, which sets forwardedEnd to the
//     successor's log end). Durable forwards nothing. Forwarded records are
//     written, not necessarily durable, here: each member's written log is
//     a prefix of its predecessor's, but a successor's durable end may be
//     ahead of its predecessor's.
//   - Acknowledging. A member's ack value is durableEnd at the tail and
//     min(durableEnd, successorAck) elsewhere: everything below it is durable
//     here and on every member downstream. A middle or tail sends it
//     upstream (AckUpstream) each time it grows within the epoch. Nothing
//     is acknowledged that is not durable here.
//   - Durability downstream. A member's upstream-durable offset is
//     durableEnd at the head and min(durableEnd, upstream) at a middle,
//     where upstream is the predecessor's, heard under E (piggy-backed on
//     Forwarded or CommitNotice; reset by every new epoch, as it vouches
//     for E's members only). It is sent down (DurableDown) each time it
//     grows while the link is up, and again on every new link.
//   - Committing. The head's ack value is durable on every member, i.e.
//     committed; so is a sole member's durable end; so is
//     min(durableEnd, upstream) at the tail and min(upstream, ack value) at
//     a middle: each is the least durable end over the members of E. A
//     middle's or tail's ack value alone is not: its predecessors may not
//     have made those records durable yet. A commit notice from the
//     predecessor (CommitNotice, or piggy-backed on Forwarded) also counts,
//     capped at the local durable end. Every member's committed offset is
//     the largest of these; it never goes backwards and never exceeds
//     durableEnd.
//     Committed is emitted each time it grows; the driver publishes it to
//     readers and sends it downstream as a notice. Everything reported
//     committed anywhere is durable on every current member.
//   - Guarding the prefix order. A successor can only hold records that a
//     predecessor wrote first, so a successor whose log end at link time
//     exceeds the local log end (ErrBehind), or whose ack does
//     (ErrAckBeyondEnd), holds records that did not come from this chain
//     through this replica: it needs repair. Beyond the local durable end
//     is normal under pipelining and accepted. The core cannot check a
//     member's own log: the operator must only add a member whose log is a
//     prefix of its predecessor's log.
//   - Epochs. Every message carries the sender's epoch. Older epochs are
//     refused (ErrStaleEpoch), newer ones too (ErrFutureEpoch: the driver
//     should fetch the newer configuration). Neither changes any state, so
//     a deposed member cannot append, acknowledge or commit anything here.
//   - Reconfiguration. Configure with a newer epoch resets everything tied
//     to the old links: the link is down, the window is empty, successorAck,
//     the last ack sent upstream and the upstream-durable offset heard are
//     zero (an ack or an upstream-durable offset vouches for the membership
//     of the epoch it was sent in). Log, durable end,
//     the last notice heard and committed survive. A member that becomes
//     (or stays) tail acknowledges its durable end upstream at once but
//     does NOT commit it: a middle that becomes tail may hold records
//     forwarded before they were durable upstream. Every new predecessor
//     was upstream of it before, so holds them written; they commit once
//     durable on every current member, which the head learns from the acks
//     of the new epoch (and notifies down) and the tail from the
//     upstream-durable offsets of the new epoch. A member that becomes sole
//     commits its durable end. Appends still in flight are kept and commit
//     when Durable covers them. A new head proposes from its own log end.
//
// # What the driver must do
//
//   - Carry out Effects in order: write Append (fsync later and report with
//     Durable), send Forward (with the current committed and
//     upstream-durable offsets piggy-backed; the records were just written,
//     so they can be read back or forwarded from memory), send AckUpstream,
//     publish Committed (and send it downstream as a commit notice, with
//     the upstream-durable offset, which DurableDown alone also sends when
//     no Forward carries it). A driver may leave out a commit notice for
//     an offset the successor commits by itself (at most the least of
//     the upstream-durable offset it sent and the successor's ack); any
//     other is needed: without it a member whose predecessors stopped
//     writing never learns the last commits.
//   - Link handshake. When a member connects to its successor under epoch E,
//     the successor answers with its log end, its latest ack under E
//     (Status().AckedUpstream) and the predecessor sends its committed
//     offset. The driver calls SuccessorLinked(E, logEnd), then
//     Acked(E, succ, ack) when ack > 0, and the successor calls
//     CommitNotice(E, pred, committed). Acks and notices are sent only when
//     they grow, so this is how they survive a lost connection or a message
//     sent before the other end had installed E.
//   - On ErrGap, drop the link and relink (SuccessorLost, then a new
//     handshake): the successor's log end tells the predecessor where to
//     resume. Duplicate frames after a relink are ignored by the successor.
//   - On ErrFutureEpoch, fetch the newer configuration; on ErrBehind,
//     ErrAckBeyondEnd or ErrSuccessorRegressed, report the link's failure
//     to the master (the server's Status: successor_error, and how long the
//     link has been down); the master removes an end of a link that stays
//     down for its failure timeout, and the removed member is repaired
//     (truncation or a full copy) before it returns.
//   - Truncation (chain repair, only outside the chain) is not an event
//     of the core: the driver cuts the log, builds a new core with New over
//     the shorter log, reinstalls the configuration it holds, and never
//     reports durability measured before the cut.
//   - Crash recovery. New counts the recovered log durable, which is true,
//     but a machine crash (not a process crash: written data survives that
//     in the page cache) loses what was written and not yet synced, and
//     under pipelining the successor may hold those records, or hold fewer
//     than this member does: after a coordinated power cut, equal lengths
//     at one epoch do not mean equal records. So a recovered member with
//     neighbours takes no part under its old epoch at all: the driver
//     refuses appends and links and forwards nothing (the server's
//     `restored`) until the master, having compared the members' logs by
//     epoch, installs a new one.
//
// The successor's log end at link time is deliberately not treated as an
// acknowledgement: it says what the successor holds, not that it is durable
// there or on anyone downstream of it.
package chain

import "errors"

// Role is a replica's position in its chain.
type Role int

const (
	// RoleNone: the replica is not a member under the current epoch (never
	// configured, or removed). It accepts no writes and acknowledges nothing.
	RoleNone Role = iota
	// RoleHead assigns offsets to new records and forwards to its successor.
	RoleHead
	// RoleMiddle appends what its predecessor forwards and forwards on.
	RoleMiddle
	// RoleTail is the last member: it acknowledges its durable end upstream
	// and learns the committed offset from its predecessor's notices.
	RoleTail
	// RoleSole is head and tail at once (a chain of one).
	RoleSole
)

func (r Role) String() string {
	switch r {
	case RoleHead:
		return "head"
	case RoleMiddle:
		return "middle"
	case RoleTail:
		return "tail"
	case RoleSole:
		return "sole"
	default:
		return "none"
	}
}

// Config is one epoch's ordered membership, head first.
type Config struct {
	Epoch   uint64
	Members []string
	// Committed is a committed offset learned outside the chain: the
	// chain master's (the highest its members reported) or this
	// replica's own from before a restart. It counts as a commit notice
	// (applied up to the durable end, never moving committed back), so a
	// member that forgot or never heard what its predecessors knew does
	// not start lower. Zero says nothing.
	Committed uint64
}

// Range is a half-open offset range [Base, End).
type Range struct {
	Base, End uint64
}

// Effects is what the driver must do after an event, in this order:
// write Append (durability is reported later, with Durable), then send
// Forward to the successor (it may cover the records just written, not yet
// durable), then send AckUpstream
// to the predecessor, then publish Committed to readers and to producers
// waiting on completion (head) and as a commit notice downstream.
type Effects struct {
	// Append asks the driver to write these offsets to the local log (the
	// driver holds the bytes); it reports durability back with Durable.
	Append *Range
	// Forward lists ranges to send to the successor, in order. They are
	// written here, not necessarily durable.
	Forward []Range
	// AckUpstream, when set, is the new cumulative acknowledgement to send
	// to the predecessor: everything below it is durable here and on every
	// member downstream.
	AckUpstream *uint64
	// Committed, when set, is the new committed offset known here.
	Committed *uint64
	// DurableDown, when set, is a new upstream-durable offset for the
	// successor: durable here and on every member before this one. The
	// driver sends it on the frames of Forward, or in a notice of its own
	// when Forward is empty. Set only while the successor link is up; a new
	// link sets it again.
	DurableDown *uint64
}

// Errors the core returns. Callers map them to wire status codes.
var (
	ErrStaleEpoch  = errors.New("message from an older epoch")
	ErrFutureEpoch = errors.New("message from a newer epoch than this replica has been configured with")
	ErrNotMember   = errors.New("replica is not a member of the chain under the current epoch")
	ErrNotHead     = errors.New("replica is not the head of the chain")
	ErrWrongSender = errors.New("message from a member that is not this replica's neighbour")
	ErrGap         = errors.New("forwarded range starts beyond the local log end")
	// ErrMember: a member was handed records copied outside the chain; it
	// receives records through its link.
	ErrMember   = errors.New("replica is a member of the chain; members receive records through their link")
	ErrConflict = errors.New("configuration conflicts with the one already installed for this epoch")
	// ErrBehind: the successor's log end at link time is beyond this
	// replica's log end (beyond its durable end is normal: forwarding does
	// not wait for durability).
	ErrBehind = errors.New("successor's log end is beyond this replica's log end")

	// ErrInvalidConfig: epoch 0, no members, an empty or duplicate member.
	ErrInvalidConfig = errors.New("invalid chain configuration")
	// ErrAckBeyondEnd: the successor acknowledged offsets that were never
	// written here, so it cannot have had them from this chain. (Offsets
	// written but not yet durable here may be acknowledged: the successor
	// may sync first.)
	ErrAckBeyondEnd = errors.New("acknowledgement beyond this replica's log end")
	// ErrNoSuccessor: SuccessorLinked on a tail or sole member.
	ErrNoSuccessor = errors.New("replica has no successor under the current epoch")
	// ErrSuccessorRegressed: the successor's log end at link time is below
	// what it has already acknowledged under this epoch, so it lost durable
	// data (e.g. came back with an empty volume) and must re-enter as a new
	// member.
	ErrSuccessorRegressed = errors.New("successor's log end is below what it acknowledged")
	// ErrOverflow: an offset range that does not fit in uint64.
	ErrOverflow = errors.New("offset range overflows")
)
