package devcluster

import (
	"time"

	"github.com/catena-streams/catena/replica/chainplan"
)

// Failure detection. The dev master probes every replica's Status on a
// short deadline (probeTimeout) every probeInterval; healthTracker turns
// the outcomes into the planner's Health. It is pure: callers pass the
// probe times (the master passes its clock), so tests drive it with a fake
// clock.
//
//   - A replica whose process exited is Failed at once (the master saw the
//     exit) until a new process is started for it.
//   - A replica whose latest probe answered is Alive.
//   - A replica that has not answered for failureTimeout (counted from its
//     last answer, or from its start when it never answered) is Failed: the
//     master removes it from its chains as if it were dead. A paused or
//     partitioned process is thus replaced; it cannot complete a write
//     meanwhile because its successor has moved to the new epoch.
//   - In between (a probe or two missed) it is Unknown: the planner neither
//     removes it nor adds anyone.
//
// A replica declared Failed by the timeout that answers again (a paused
// process resumed) is Alive again: it is outside its chains by then, so the
// planner treats it as a returning member (truncate to where its epoch
// ended, rejoin at the tail).

const (
	// DefaultFailureTimeout is how long a replica may go without answering
	// Status before the master declares it failed (--failure-timeout).
	DefaultFailureTimeout = time.Second
	// probeInterval is how often the master probes every replica (and
	// re-plans every chain).
	probeInterval = 200 * time.Millisecond
	// probeTimeout is each Status probe's deadline: a paused process must
	// not hold the master up.
	probeTimeout = 300 * time.Millisecond
	// minFailureTimeout keeps detection above a couple of probes, so one
	// slow answer on a loaded machine does not remove a member.
	minFailureTimeout = 2 * probeTimeout
	maxFailureTimeout = 5 * time.Minute
)

// healthTracker decides each replica's Health from probe outcomes.
type healthTracker struct {
	timeout time.Duration
	state   map[string]*probeState
}

type probeState struct {
	since    time.Time // process start: the timeout counts from here until the first answer
	lastOK   time.Time // last answer
	answered bool      // the latest probe answered
	exited   bool      // the process is gone and not restarted yet
}

func newHealthTracker(failureTimeout time.Duration) *healthTracker {
	return &healthTracker{timeout: failureTimeout, state: map[string]*probeState{}}
}

func (h *healthTracker) get(id string) *probeState {
	s := h.state[id]
	if s == nil {
		s = &probeState{}
		h.state[id] = s
	}
	return s
}

// started records that a process for id started at now: Unknown until it
// answers, Failed if it does not within the timeout.
func (h *healthTracker) started(id string, now time.Time) {
	h.state[id] = &probeState{since: now}
}

// exited records that id's process is gone: Failed until started again.
func (h *healthTracker) exited(id string) {
	s := h.get(id)
	s.exited, s.answered = true, false
}

// observe records a probe of id at now and whether it answered.
func (h *healthTracker) observe(id string, now time.Time, answered bool) {
	s := h.get(id)
	if s.exited {
		return // a late answer from the old process changes nothing
	}
	s.answered = answered
	if answered && now.After(s.lastOK) {
		s.lastOK = now
	}
}

// health is what the master believes of id at now.
func (h *healthTracker) health(id string, now time.Time) chainplan.Health {
	s := h.state[id]
	switch {
	case s == nil:
		return chainplan.Unknown
	case s.exited:
		return chainplan.Failed
	case s.answered:
		return chainplan.Alive
	}
	heard := s.since
	if s.lastOK.After(heard) {
		heard = s.lastOK
	}
	if !heard.IsZero() && now.Sub(heard) >= h.timeout {
		return chainplan.Failed
	}
	return chainplan.Unknown
}

// silentFor is how long id has not answered at now (0 when it answered).
func (h *healthTracker) silentFor(id string, now time.Time) time.Duration {
	s := h.state[id]
	if s == nil || s.answered {
		return 0
	}
	heard := s.since
	if s.lastOK.After(heard) {
		heard = s.lastOK
	}
	if heard.IsZero() {
		return 0
	}
	return now.Sub(heard)
}
