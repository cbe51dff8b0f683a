package chainmaster

import (
	"time"

	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// Failure detection, the same for the operator and catena dev. The chain
// master probes every replica's Status on a short deadline, round after
// round; Detector turns the rounds into the planner's Health. It is pure:
// callers pass the times (their clock), so tests drive it with a fake one.
//
//   - A replica whose process is known gone (dev saw it exit) is Failed
//     until a new process is started for it.
//   - A replica whose latest probe answered is Alive.
//   - A replica that has not answered for the failure timeout (counted
//     from its last answer, or from its start when it never answered) is
//     Failed: the master removes it from its chains as if it were dead. A
//     paused or partitioned process is thus replaced; it cannot complete a
//     write meanwhile, because its successor has moved to the new epoch.
//   - A replica that did not answer the latest probe while a predecessor
//     in one of its chains has reported their link down for
//     NeighbourDownAfter is Failed at once: two independent witnesses, so
//     the master need not wait out the timeout.
//   - In between (a probe or two missed) it is Unknown: the planner neither
//     removes it nor adds anyone.
//   - A master that hears from no replica at all in a round of two or more
//     suspects itself (its own link is cut, not every replica at once):
//     while it is blind every replica not known gone is Unknown, and once
//     it hears again silence counts from then, so that a replica whose
//     connection takes a round longer to come back is not removed for the
//     master's own outage.
//
// A replica declared Failed by the timeout that answers again (a paused
// process resumed) is Alive again: it is outside its chains by then, so the
// planner treats it as a returning member (truncate to where its epoch
// ended, rejoin at the tail).
type Detector struct {
	timeout time.Duration
	state   map[string]*probeState
	blind   bool      // the latest round of two or more replicas had no answer
	sight   time.Time // when the master last regained sight after being blind
}

// NeighbourDownAfter is how long a member must have reported its link to
// its successor down before the master takes that as evidence against the
// successor.
const NeighbourDownAfter = 500 * time.Millisecond

type probeState struct {
	since    time.Time // process start: the timeout counts from here until the first answer
	lastOK   time.Time // last answer
	answered bool      // the latest probe answered
	exited   bool      // the process is gone and not restarted yet
}

// NewDetector returns a detector that declares a replica failed after
// timeout of silence.
func NewDetector(timeout time.Duration) *Detector {
	return &Detector{timeout: timeout, state: map[string]*probeState{}}
}

// Timeout is the failure timeout.
func (d *Detector) Timeout() time.Duration { return d.timeout }

func (d *Detector) get(id string) *probeState {
	s := d.state[id]
	if s == nil {
		s = &probeState{}
		d.state[id] = s
	}
	return s
}

// Started records that a process for id started at now: Unknown until it
// answers, Failed if it does not within the timeout. A master that cannot
// see processes start (the operator) does not call it: a replica that never
// answered is then Unknown until other evidence (its pod) decides.
func (d *Detector) Started(id string, now time.Time) {
	d.state[id] = &probeState{since: now}
}

// Exited records that id's process is gone: Failed until Started again.
func (d *Detector) Exited(id string) {
	s := d.get(id)
	s.exited, s.answered = true, false
}

// Round records one probe round at now: every replica in probed was asked,
// those in answered answered, to a probe asked for at the time given (the
// replica was alive then; a master probing in rounds gives the round's
// start to all).
func (d *Detector) Round(now time.Time, probed []string, answered map[string]time.Time) {
	heard, live := 0, 0
	for _, id := range probed {
		s := d.get(id)
		if s.exited {
			continue // a late answer from the old process changes nothing
		}
		live++
		at, ok := answered[id]
		s.answered = ok
		if ok {
			heard++
			if at.After(s.lastOK) {
				s.lastOK = at
			}
		}
	}
	switch {
	case heard == 0 && live >= 2:
		d.blind = true
	case heard > 0 && d.blind:
		d.blind, d.sight = false, now
	}
}

// Heard records that id answered a probe asked for at at, whatever the
// rounds say of it since: silence counts from there.
func (d *Detector) Heard(id string, at time.Time) {
	s := d.get(id)
	if !s.exited && at.After(s.lastOK) {
		s.lastOK = at
	}
}

// Blind reports whether the latest round heard from nobody.
func (d *Detector) Blind() bool { return d.blind }

// Health is what the master believes of id at now; neighbourDown is the
// longest a predecessor of id in one of the chains being decided reports
// its link to id down (0: none does).
func (d *Detector) Health(id string, now time.Time, neighbourDown time.Duration) chainplan.Health {
	s := d.state[id]
	switch {
	case s == nil:
		return chainplan.Unknown
	case s.exited:
		return chainplan.Failed
	case s.answered:
		return chainplan.Alive
	case d.blind:
		return chainplan.Unknown
	case neighbourDown >= NeighbourDownAfter:
		return chainplan.Failed
	}
	if heard := d.heard(s); !heard.IsZero() && now.Sub(heard) >= d.timeout {
		return chainplan.Failed
	}
	return chainplan.Unknown
}

// heard is when silence started counting for s: its start, its last
// answer or the master's regained sight, whichever is latest (zero when
// none is known).
func (d *Detector) heard(s *probeState) time.Time {
	heard := s.since
	for _, t := range []time.Time{s.lastOK, d.sight} {
		if t.After(heard) {
			heard = t
		}
	}
	if s.since.IsZero() && s.lastOK.IsZero() {
		return time.Time{} // never started nor heard: regained sight says nothing of it
	}
	return heard
}

// SilentFor is how long id has not answered at now (0 when it answered or
// nothing is known), counted as Health counts it.
func (d *Detector) SilentFor(id string, now time.Time) time.Duration {
	s := d.state[id]
	if s == nil || s.answered {
		return 0
	}
	heard := d.heard(s)
	if heard.IsZero() {
		return 0
	}
	return now.Sub(heard)
}

// NeighbourDown is, for each replica, the longest a neighbour says it
// cannot reach it: a member of a partition's chain that answered reports
// its link to its successor down (successor_down_ms), or the head's
// successor carries an ingestion node's report that the head does not
// answer its appends (head_unreachable_ms; the head has no predecessor to
// witness against it), unless the carrier's own link onwards is down or
// stalled, which explains a stalled head. reports are the members' reports of the partition,
// by replica id.
func NeighbourDown(reports map[string]*catenapb.PartitionStatus) map[string]time.Duration {
	out := map[string]time.Duration{}
	for id, ps := range reports {
		ms := ps.GetMembers()
		if down := time.Duration(ps.GetSuccessorDownMs()) * time.Millisecond; down > 0 {
			for i := 0; i+1 < len(ms); i++ {
				if ms[i].GetId() == id {
					succ := ms[i+1].GetId()
					out[succ] = max(out[succ], down)
				}
			}
		}
		// A carrier whose own link onwards is down or stalled explains the
		// stall ingestion sees (the head waits for acknowledgements from
		// downstream): then it is no evidence against the head.
		downstream := ps.GetSuccessorDownMs() > 0 || ps.GetSuccessorStalledMs() > 0
		if down := time.Duration(ps.GetHeadUnreachableMs()) * time.Millisecond; down > 0 && !downstream && len(ms) > 1 && ms[1].GetId() == id {
			head := ms[0].GetId()
			out[head] = max(out[head], down)
		}
	}
	return out
}
