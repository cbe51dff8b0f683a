package chain

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestRandomizedChain drives a chain of three replicas through random
// proposals, durability reports, link failures and reconnections, member
// removals (head, middle or tail) with configurations reaching members in
// any order (and removed members possibly never), over a network that
// delays, reorders, duplicates and loses messages. Forwarding is pipelined
// (records move on before they are durable), so the key invariant is that
// whatever any replica counts as committed is durable on every current
// member. Invariants are checked after every step; each run ends by
// draining the network and checking that the chain converged.
func TestRandomizedChain(t *testing.T) {
	const (
		seeds = 300
		steps = 400
	)
	seen := map[string]int{}
	for seed := uint64(1); seed <= seeds; seed++ {
		s := newSim(t, seed)
		s.seen = seen
		for range steps {
			s.step()
			s.check()
		}
		s.drain()
		seen["final committed"] += int(s.c.nodes[s.members[0]].r.Status().Committed)
		seen["forwarded before durable"] += s.c.fwdBeforeDurable
	}
	// Guard against a simulation that quietly stops exercising anything.
	for _, what := range []string{
		"remove head", "remove middle", "remove tail", "proposal by a deposed head",
		"refused stale", "refused future", "refused gap", "duplicate ignored", "partial overlap",
		"config out of order", "drain", "final committed", "forwarded before durable",
		"durable downstream before upstream", "ack beyond durable end", "link beyond durable end",
		"tail committed ahead of the head's notice",
	} {
		if seen[what] == 0 {
			t.Errorf("no run exercised %q: %v", what, seen)
		}
	}
	t.Logf("%v", seen)
}

type sim struct {
	t       *testing.T
	seed    uint64
	rng     *rand.Rand
	c       *cluster
	epoch   uint64   // latest configuration
	members []string // latest configuration
	removed int

	seen map[string]int // events exercised, across runs

	lastEpoch     map[string]uint64
	lastCommitted map[string]uint64
	trace         []string
}

func newSim(t *testing.T, seed uint64) *sim {
	s := &sim{
		t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x636861696e)),
		epoch: 1, members: []string{"a", "b", "c"},
		lastEpoch: map[string]uint64{}, lastCommitted: map[string]uint64{},
	}
	s.c = newCluster(s)
	for _, name := range s.members {
		s.c.add(name, nil)
		if _, err := s.c.configure(name, Config{Epoch: 1, Members: s.members}); err != nil {
			s.fatalf("configure %s: %v", name, err)
		}
	}
	return s
}

// The cluster reports harness violations through the sim, so that they
// carry the seed and the trace.
func (s *sim) Fatalf(format string, args ...any) { s.fatalf(format, args...) }

func (s *sim) fatalf(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf("seed %d: %s\nlast steps:\n  %s\nstate:\n%s\n%s", s.seed, fmt.Sprintf(format, args...),
		strings.Join(s.trace, "\n  "), s.c.statusAll(), s.c.fmtNet())
}

func (s *sim) log(format string, args ...any) {
	s.trace = append(s.trace, fmt.Sprintf(format, args...))
	if len(s.trace) > 40 {
		s.trace = s.trace[1:]
	}
}

func (s *sim) randomNode() *simNode { return s.c.nodes[s.c.names[s.rng.IntN(len(s.c.names))]] }

func (s *sim) step() {
	c := s.c
	switch k := s.rng.IntN(100); {
	case k < 12: // a node that believes it is head proposes (deposed heads too)
		n := s.randomNode()
		if role := n.r.Status().Role; role != RoleHead && role != RoleSole {
			return
		}
		count := 1 + s.rng.Uint64N(3)
		base, eff, err := c.propose(n.r.self, count)
		s.log("propose %s %d: base=%d %s %v", n.r.self, count, base, fmtEffects(eff), err)
		if err != nil {
			s.fatalf("propose at a head: %v", err)
		}
		if !slices.Contains(s.members, n.r.self) || n.r.Status().Epoch != s.epoch {
			s.seen["proposal by a deposed head"]++
		}

	case k < 30: // some of a node's pending appends become durable
		n := s.randomNode()
		st := n.r.Status()
		end := st.DurableEnd + s.rng.Uint64N(st.LogEnd-st.DurableEnd+1)
		eff := c.durable(n.r.self, end)
		s.log("durable %s %d: %s", n.r.self, end, fmtEffects(eff))

	case k < 55, k < 65 && len(c.net) > 0: // deliver any message (reordering), or the oldest
		if len(c.net) == 0 {
			return
		}
		i := 0
		if k < 55 {
			i = s.rng.IntN(len(c.net))
		}
		m, eff, note, err := c.deliver(i)
		s.log("deliver %v => %s %s", m, fmtResult(eff, err), note)
		if !toleratedDeliveryError(err) {
			s.fatalf("deliver %v: %v", m, err)
		}
		s.count(m, eff, err)

	case k < 70: // duplicate
		if len(c.net) > 0 {
			i := s.rng.IntN(len(c.net))
			c.net = append(c.net, c.net[i])
			s.log("duplicate %v", c.net[i])
		}

	case k < 75: // lose a message (the operator retries configurations, so never those)
		if len(c.net) > 0 {
			i := s.rng.IntN(len(c.net))
			if c.net[i].kind != msgConfig {
				s.log("drop %v", c.net[i])
				c.net = slices.Delete(c.net, i, i+1)
			}
		}

	case k < 80: // a link breaks
		n := s.randomNode()
		n.r.SuccessorLost(n.r.Status().Epoch)
		s.log("unlink %s", n.r.self)

	case k < 92: // a link (re)connects
		n := s.randomNode()
		st := n.r.Status()
		if st.Successor == "" || c.node(st.Successor).r.Status().Epoch != st.Epoch {
			return
		}
		if c.node(st.Successor).r.Status().LogEnd > st.DurableEnd {
			s.seen["link beyond durable end"]++
		}
		lines, err := c.link(n.r.self)
		s.log("link %s: %s", n.r.self, strings.Join(lines, "; "))
		if err != nil {
			s.fatalf("link %s: %v", n.r.self, err)
		}

	case k < 94: // the operator removes a member
		if len(s.members) == 1 || s.removed == 2 || s.rng.IntN(3) > 0 {
			return
		}
		i := s.rng.IntN(len(s.members))
		gone := s.members[i]
		switch {
		case i == 0:
			s.seen["remove head"]++
		case i == len(s.members)-1:
			s.seen["remove tail"]++
		default:
			s.seen["remove middle"]++
		}
		s.members = slices.DeleteFunc(slices.Clone(s.members), func(m string) bool { return m == gone })
		s.epoch++
		s.removed++
		s.log("remove %s: epoch %d members %v", gone, s.epoch, s.members)
		for _, name := range c.names {
			// A removed member may be paused and never hear of it.
			if !slices.Contains(s.members, name) && s.rng.IntN(2) == 0 {
				continue
			}
			c.net = append(c.net, message{kind: msgConfig, to: name, epoch: s.epoch, members: s.members})
		}

	case k < 95:
		s.drain()

	default: // a message is held back behind all others
		if len(c.net) > 1 {
			i := s.rng.IntN(len(c.net))
			m := c.net[i]
			c.net = append(slices.Delete(c.net, i, i+1), m)
			s.log("delay %v", m)
		}
	}
}

func (s *sim) count(m message, eff Effects, err error) {
	switch {
	case errors.Is(err, ErrStaleEpoch) && m.kind == msgConfig:
		s.seen["config out of order"]++
	case errors.Is(err, ErrStaleEpoch):
		s.seen["refused stale"]++
	case errors.Is(err, ErrFutureEpoch):
		s.seen["refused future"]++
	case errors.Is(err, ErrGap):
		s.seen["refused gap"]++
	case m.kind == msgAck && err == nil && m.value > s.c.nodes[m.to].r.Status().DurableEnd:
		s.seen["ack beyond durable end"]++
	case m.kind == msgForward && eff.Append == nil:
		s.seen["duplicate ignored"]++
	case m.kind == msgForward && eff.Append.Base > m.base:
		s.seen["partial overlap"]++
	}
}

// check asserts the invariants that hold after every step.
func (s *sim) check() {
	s.t.Helper()
	for _, name := range s.c.names {
		n := s.c.nodes[name]
		st := n.r.Status()
		if st.Epoch < s.lastEpoch[name] {
			s.fatalf("%s: epoch went back from %d to %d", name, s.lastEpoch[name], st.Epoch)
		}
		if st.Committed < s.lastCommitted[name] {
			s.fatalf("%s: committed went back from %d to %d", name, s.lastCommitted[name], st.Committed)
		}
		s.lastEpoch[name], s.lastCommitted[name] = st.Epoch, st.Committed
		if st.Role == RoleTail && st.Committed > min(st.Noticed, st.DurableEnd) {
			// Learned from the upstream-durable offsets, with no ack round
			// trip: the completion the tail gives ingestion.
			s.seen["tail committed ahead of the head's notice"]++
		}
		if st.LogEnd != uint64(len(n.log)) || st.DurableEnd > st.LogEnd || st.Committed > st.DurableEnd {
			s.fatalf("%s: log end %d (driver holds %d), durable %d, committed %d", name, st.LogEnd, len(n.log), st.DurableEnd, st.Committed)
		}
		// Members are only ever removed, so the latest members were members
		// of every epoch: whatever any replica counts as committed must be
		// durable on all of them (in particular the head's committed).
		for _, m := range s.members {
			if d := s.c.nodes[m].r.Status().DurableEnd; st.Committed > d {
				s.fatalf("%s: committed %d beyond %s's durable end %d", name, st.Committed, m, d)
			}
		}
		// Neighbours under one epoch: the written log is a prefix of the
		// predecessor's (so logEnd <= the predecessor's logEnd), while the
		// durable end may run ahead of the predecessor's (pipelining).
		if st.Predecessor != "" {
			p := s.c.nodes[st.Predecessor]
			pst := p.r.Status()
			if pst.Epoch == st.Epoch {
				if st.LogEnd > pst.LogEnd || len(n.log) > len(p.log) || !slices.Equal(n.log, p.log[:len(n.log)]) {
					s.fatalf("%s's log (end %d) is not a prefix of its predecessor %s's (end %d)", name, st.LogEnd, st.Predecessor, pst.LogEnd)
				}
				if st.DurableEnd > pst.DurableEnd {
					s.seen["durable downstream before upstream"]++
				}
			}
		}
	}
	// Committed records agree everywhere; along the latest chain each log
	// is a prefix of its predecessor's.
	if bad := s.c.checkAgreement(s.members); len(bad) > 0 {
		s.fatalf("%s", strings.Join(bad, "\n"))
	}
}

// drain delivers everything, makes every log durable and relinks, then
// checks that the chain converged: every member under the latest epoch,
// holding the same durable log, with the head's committed offset equal to
// the smallest durable end among members, and every member knowing it.
func (s *sim) drain() {
	s.t.Helper()
	s.log("drain")
	s.seen["drain"]++
	s.c.settle()
	s.check()
	minDurable := uint64(1<<64 - 1)
	for _, m := range s.members {
		minDurable = min(minDurable, s.c.nodes[m].r.Status().DurableEnd)
	}
	head := s.c.nodes[s.members[0]]
	for _, m := range s.members {
		n := s.c.nodes[m]
		st := n.r.Status()
		if st.Epoch != s.epoch {
			s.fatalf("drained: %s at epoch %d, want %d", m, st.Epoch, s.epoch)
		}
		if st.Committed != minDurable {
			s.fatalf("drained: %s committed %d, least durable end among members %d", m, st.Committed, minDurable)
		}
		if !slices.Equal(n.log, head.log) {
			s.fatalf("drained: %s's log differs from the head's", m)
		}
	}
	if head.r.Status().Committed != uint64(len(head.log)) {
		s.fatalf("drained: head committed %d of %d", head.r.Status().Committed, len(head.log))
	}
}
