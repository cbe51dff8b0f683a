// Package chain is the pure chain-replication state machine of one
// partition replica. It owns no goroutines, sockets, clocks or files: a
// driver feeds it events (configuration, local durability, frames from the
// predecessor, acknowledgements from the successor) and carries out the
// Effects it returns, persisting before acknowledging.
//
// Offsets are exclusive ends throughout: a log whose end is 10 holds
// offsets 0..9; "committed = 10" means offsets below 10 are committed.
//
// The core forwards only what is durable locally, so every member's durable
// log is a prefix of its predecessor's. It follows that the tail's durable
// end is the chain's committed offset, and that an acknowledgement flowing
// back up the chain (min of own durable end and the successor's ack) tells
// the head exactly what is committed.
//
// # Protocol
//
// A partition's chain under epoch E is an ordered member list, head first.
// The head (or a sole member) assigns offsets with Propose; every member
// appends what it is given, and reports back with Durable once its log is
// durable up to some end. Data moves down the chain and acknowledgements
// move up it:
//
//	head --Forward[b,e)+committed--> middle --Forward--> tail
//	head <------------AckUpstream--- middle <--Ack------ tail
//	head --CommitNotice------------> middle --Notice---> tail
//
// Per member the core keeps logEnd (next offset), durableEnd (the driver's
// last Durable report), successorAck (the successor's cumulative ack under
// E), committed, and, while the successor link is up, forwardedEnd and the
// window of forwarded-but-unacknowledged ranges.
//
//   - Forwarding. A member forwards [forwardedEnd, durableEnd) whenever
//     durableEnd grows (Durable) or a link comes up (SuccessorLinked, which
//     sets forwardedEnd to the successor's log end). Never anything that is
//     not durable here, which is what keeps the durable logs prefix-ordered.
//   - Acknowledging. A member's ack value is durableEnd at the tail and
//     min(durableEnd, successorAck) elsewhere: everything below it is durable
//     here and on every member downstream. A middle or tail sends it
//     upstream (AckUpstream) each time it grows within the epoch.
//   - Committing. Because everything in a member's log is durable on every
//     member upstream of it (prefix order), a member's ack value is durable
//     on every member, i.e. committed. Each member's committed offset is
//     therefore max(committed, ack value, min(notice, durableEnd)) where
//     notice is the highest committed offset heard from the predecessor
//     (CommitNotice, or piggy-backed on Forwarded). It never goes backwards
//     and never exceeds durableEnd. Committed is emitted each time it grows;
//     the driver publishes it to readers and sends it downstream as a notice.
//     Within an epoch a middle learns of a commit from its own ack value
//     before the head does; notices matter across reconfigurations (a new
//     successor, a member that starts again from successorAck = 0).
//   - Guarding the prefix order. A successor can only hold records that
//     were durable on a predecessor, so a successor whose log end at link
//     time exceeds the local durable end (ErrBehind), or whose ack does
//     (ErrAckBeyondEnd), holds records that did not come from this chain, or
//     that this replica could still lose: it needs repair. The core cannot
//     check a member's own log: the operator must only add a member whose
//     log is a prefix of its predecessor's durable log, because on entering
//     at the tail it counts its durable log committed.
//   - Epochs. Every message carries the sender's epoch. Older epochs are
//     refused (ErrStaleEpoch), newer ones too (ErrFutureEpoch: the driver
//     should fetch the newer configuration). Neither changes any state, so
//     a deposed member cannot append, acknowledge or commit anything here.
//   - Reconfiguration. Configure with a newer epoch resets everything tied
//     to the old links: the link is down, the window is empty, successorAck
//     and the last ack sent upstream are zero (an ack vouches for the
//     downstream membership of the epoch it was sent in). Log, durable end
//     and committed survive. A member that becomes tail or sole commits what
//     it holds durably and acks it upstream at once; appends still in flight
//     are kept and commit when Durable covers them. A new head proposes from
//     its own log end.
//
// # What the driver must do
//
//   - Carry out Effects in order: persist Append, send Forward (with the
//     current committed offset piggy-backed), send AckUpstream, publish
//     Committed (and send it downstream as a commit notice).
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
//     ErrAckBeyondEnd or ErrSuccessorRegressed, report the successor to the
//     operator (it needs repair: truncation or a full copy) rather than
//     retry.
//   - Never report durability from before a truncation (there is no
//     truncation here yet: repair is a later step).
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
	// RoleTail completes writes: its durable end is the committed offset.
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
}

// Range is a half-open offset range [Base, End).
type Range struct {
	Base, End uint64
}

// Effects is what the driver must do after an event, in this order:
// persist Append, then send Forward to the successor, then send AckUpstream
// to the predecessor, then publish Committed to readers and to producers
// waiting on completion (head) and as a commit notice downstream.
type Effects struct {
	// Append asks the driver to write these offsets to the local log (the
	// driver holds the bytes); it reports durability back with Durable.
	Append *Range
	// Forward lists ranges to send to the successor, in order.
	Forward []Range
	// AckUpstream, when set, is the new cumulative acknowledgement to send
	// to the predecessor: everything below it is durable here and on every
	// member downstream.
	AckUpstream *uint64
	// Committed, when set, is the new committed offset known here.
	Committed *uint64
}

// Errors the core returns. Callers map them to wire status codes.
var (
	ErrStaleEpoch  = errors.New("message from an older epoch")
	ErrFutureEpoch = errors.New("message from a newer epoch than this replica has been configured with")
	ErrNotMember   = errors.New("replica is not a member of the chain under the current epoch")
	ErrNotHead     = errors.New("replica is not the head of the chain")
	ErrWrongSender = errors.New("message from a member that is not this replica's neighbour")
	ErrGap         = errors.New("forwarded range starts beyond the local log end")
	ErrConflict    = errors.New("configuration conflicts with the one already installed for this epoch")
	ErrBehind      = errors.New("successor's log end is beyond this replica's durable log end")

	// ErrInvalidConfig: epoch 0, no members, an empty or duplicate member.
	ErrInvalidConfig = errors.New("invalid chain configuration")
	// ErrAckBeyondEnd: the successor acknowledged offsets that are not
	// durable here, so it cannot have had them from this chain.
	ErrAckBeyondEnd = errors.New("acknowledgement beyond this replica's durable end")
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
