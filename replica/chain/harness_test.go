package chain

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
)

// This file is a tiny driver for the core, used by the datadriven scripts
// and the randomized simulation: it holds each replica's log contents (record
// ids, so that agreement can be checked offset for offset), carries out
// Effects, and models the network as one queue of messages that tests
// deliver, drop, duplicate and reorder at will.

// simNode is one replica and the log its driver holds.
type simNode struct {
	r   *Replica
	log []string // record id at each offset
}

type msgKind int

const (
	msgForward msgKind = iota
	msgAck
	msgCommit
	msgConfig // from the operator; only the simulation queues these
)

type message struct {
	kind     msgKind
	from, to string
	epoch    uint64
	base     uint64   // msgForward
	recs     []string // msgForward
	value    uint64   // msgAck: ack end; msgCommit, msgForward: committed
	up       uint64   // msgCommit, msgForward: the sender's upstream-durable offset
	members  []string // msgConfig
}

func (m message) String() string {
	switch m.kind {
	case msgForward:
		return fmt.Sprintf("%s->%s fwd e%d [%d,%d) c=%d u=%d", m.from, m.to, m.epoch, m.base, m.base+uint64(len(m.recs)), m.value, m.up)
	case msgAck:
		return fmt.Sprintf("%s->%s ack e%d %d", m.from, m.to, m.epoch, m.value)
	case msgCommit:
		return fmt.Sprintf("%s->%s notice e%d c=%d u=%d", m.from, m.to, m.epoch, m.value, m.up)
	default:
		return fmt.Sprintf("op->%s config e%d %s", m.to, m.epoch, strings.Join(m.members, ","))
	}
}

// fataler is how the cluster reports a harness violation: a *testing.T, or
// the simulation (which adds its seed and trace).
type fataler interface {
	Fatalf(format string, args ...any)
}

type cluster struct {
	tb    fataler
	nodes map[string]*simNode
	names []string // creation order, for stable output
	net   []message
	// proposed counts records proposed per node, to give each record a
	// globally unique id ("a7" is a's eighth record).
	proposed map[string]int
	// fwdBeforeDurable counts Forward ranges that reached beyond the
	// sender's durable end: evidence that forwarding is pipelined.
	fwdBeforeDurable int
}

func newCluster(tb fataler) *cluster {
	return &cluster{tb: tb, nodes: map[string]*simNode{}, proposed: map[string]int{}}
}

// add creates a replica whose (durable) log holds recs.
func (c *cluster) add(name string, recs []string) *simNode {
	if _, ok := c.nodes[name]; ok {
		c.tb.Fatalf("node %q exists", name)
	}
	n := &simNode{r: New(name, uint64(len(recs))), log: slices.Clone(recs)}
	c.nodes[name] = n
	c.names = append(c.names, name)
	return n
}

func (c *cluster) node(name string) *simNode {
	n, ok := c.nodes[name]
	if !ok {
		c.tb.Fatalf("no node %q", name)
	}
	return n
}

// apply carries out eff for node name as a driver would: write Append
// (recs supplies the records of a range), queue Forward, AckUpstream and
// the commit notice. Harness-level inconsistencies (the core asking for
// something no correct driver could do) fail the test.
func (c *cluster) apply(name string, eff Effects, recs func(Range) []string) {
	n := c.node(name)
	st := n.r.Status()
	if a := eff.Append; a != nil {
		if a.Base != uint64(len(n.log)) || a.End <= a.Base {
			c.tb.Fatalf("%s: append %v does not extend the log of length %d", name, *a, len(n.log))
		}
		n.log = append(n.log, recs(*a)...)
		if st.LogEnd != uint64(len(n.log)) {
			c.tb.Fatalf("%s: log end %d after append, driver log holds %d", name, st.LogEnd, len(n.log))
		}
	}
	for _, f := range eff.Forward {
		// Forwarding is pipelined: what is written may be forwarded before
		// it is durable, but never what is not written.
		if f.End > st.LogEnd || f.End > uint64(len(n.log)) || f.Base >= f.End {
			c.tb.Fatalf("%s: forwards %v, log end %d (driver holds %d)", name, f, st.LogEnd, len(n.log))
		}
		if f.End > st.DurableEnd {
			c.fwdBeforeDurable++
		}
		c.net = append(c.net, message{kind: msgForward, from: name, to: st.Successor, epoch: st.Epoch,
			base: f.Base, recs: slices.Clone(n.log[f.Base:f.End]), value: st.Committed, up: st.DurableDown})
	}
	if eff.AckUpstream != nil {
		if st.Predecessor == "" {
			c.tb.Fatalf("%s: acks upstream with no predecessor", name)
		}
		c.net = append(c.net, message{kind: msgAck, from: name, to: st.Predecessor, epoch: st.Epoch, value: *eff.AckUpstream})
	}
	if d := eff.DurableDown; d != nil && (st.Successor == "" || *d > st.LogEnd || *d != st.DurableDown) {
		c.tb.Fatalf("%s: sends upstream-durable %d down (successor %q, log end %d, status %d)", name, *d, st.Successor, st.LogEnd, st.DurableDown)
	}
	// A notice when committed grew, or when the upstream-durable offset
	// grew and no frame carries it.
	if st.Successor != "" && (eff.Committed != nil || eff.DurableDown != nil && len(eff.Forward) == 0) {
		c.net = append(c.net, message{kind: msgCommit, from: name, to: st.Successor, epoch: st.Epoch, value: st.Committed, up: st.DurableDown})
	}
}

func noRecords(r Range) []string { panic(fmt.Sprintf("no records to append for %v", r)) }

func (c *cluster) configure(name string, cfg Config) (Effects, error) {
	eff, err := c.node(name).r.Configure(cfg)
	if err == nil {
		c.apply(name, eff, noRecords)
	}
	return eff, err
}

func (c *cluster) propose(name string, count uint64) (uint64, Effects, error) {
	base, eff, err := c.node(name).r.Propose(count)
	if err == nil {
		c.apply(name, eff, func(r Range) []string {
			var recs []string
			for range r.End - r.Base {
				recs = append(recs, fmt.Sprintf("%s%d", name, c.proposed[name]))
				c.proposed[name]++
			}
			return recs
		})
	}
	return base, eff, err
}

func (c *cluster) durable(name string, end uint64) Effects {
	eff := c.node(name).r.Durable(end)
	c.apply(name, eff, noRecords)
	return eff
}

// deliver hands message i to its destination and applies the result. On
// ErrGap the receiving driver drops the link, which the sender sees as
// SuccessorLost; the returned note says so.
func (c *cluster) deliver(i int) (m message, eff Effects, note string, err error) {
	m = c.net[i]
	c.net = slices.Delete(c.net, i, i+1)
	n := c.node(m.to)
	switch m.kind {
	case msgForward:
		eff, err = n.r.Forwarded(m.epoch, m.from, m.base, uint64(len(m.recs)), m.value, m.up)
		if err == nil {
			c.apply(m.to, eff, func(r Range) []string { return m.recs[r.Base-m.base : r.End-m.base] })
		}
		if errors.Is(err, ErrGap) {
			c.node(m.from).r.SuccessorLost(m.epoch)
			note = fmt.Sprintf("link %s->%s dropped", m.from, m.to)
		}
	case msgAck:
		eff, err = n.r.Acked(m.epoch, m.from, m.value)
		if err == nil {
			c.apply(m.to, eff, noRecords)
		}
	case msgCommit:
		eff, err = n.r.CommitNotice(m.epoch, m.from, m.value, m.up)
		if err == nil {
			c.apply(m.to, eff, noRecords)
		}
	case msgConfig:
		eff, err = c.configure(m.to, Config{Epoch: m.epoch, Members: m.members})
	}
	return m, eff, note, err
}

// link performs the link handshake from name to its successor (see the
// package doc): SuccessorLinked with the successor's log end, Acked with
// the successor's latest ack, CommitNotice with name's committed offset.
// It returns one line per call that had effects.
func (c *cluster) link(name string) ([]string, error) {
	x := c.node(name)
	st := x.r.Status()
	if st.Successor == "" {
		_, err := x.r.SuccessorLinked(st.Epoch, 0)
		return nil, err
	}
	y := c.node(st.Successor)
	yst := y.r.Status()
	if yst.Epoch != st.Epoch {
		return nil, fmt.Errorf("%s is at epoch %d, refuses a handshake under epoch %d", st.Successor, yst.Epoch, st.Epoch)
	}
	var out []string
	eff, err := x.r.SuccessorLinked(st.Epoch, yst.LogEnd)
	if err != nil {
		return nil, err
	}
	c.apply(name, eff, noRecords)
	out = append(out, fmt.Sprintf("%s: linked to %s at %d: %s", name, st.Successor, yst.LogEnd, fmtEffects(eff)))
	if yst.AckedUpstream > 0 {
		eff, err := x.r.Acked(st.Epoch, st.Successor, yst.AckedUpstream)
		if err != nil {
			return out, err
		}
		c.apply(name, eff, noRecords)
		out = append(out, fmt.Sprintf("%s: handshake ack %d: %s", name, yst.AckedUpstream, fmtEffects(eff)))
	}
	if cm := x.r.Status().Committed; cm > 0 {
		eff, err := y.r.CommitNotice(st.Epoch, name, cm, 0)
		if err != nil {
			return out, err
		}
		c.apply(st.Successor, eff, noRecords)
		out = append(out, fmt.Sprintf("%s: handshake commit %d: %s", st.Successor, cm, fmtEffects(eff)))
	}
	return out, nil
}

// toleratedDeliveryError reports whether err is one a correct chain meets
// on an unreliable network: old or early frames, and gaps from lost or
// reordered frames.
func toleratedDeliveryError(err error) bool {
	return err == nil || errors.Is(err, ErrStaleEpoch) || errors.Is(err, ErrFutureEpoch) || errors.Is(err, ErrGap)
}

// settle brings the cluster to quiescence: every log durable, every link
// re-established (a reconnection is always safe), every message delivered
// in order, until nothing changes.
func (c *cluster) settle() {
	for round := 0; ; round++ {
		if round == 100 {
			c.tb.Fatalf("cluster does not settle:\n%s", c.statusAll())
		}
		before := c.snapshot()
		for _, name := range c.names {
			c.durable(name, uint64(len(c.nodes[name].log)))
		}
		for _, name := range c.names {
			r := c.nodes[name].r
			st := r.Status()
			if st.Successor == "" || c.node(st.Successor).r.Status().Epoch != st.Epoch {
				continue
			}
			r.SuccessorLost(st.Epoch)
			if _, err := c.link(name); err != nil {
				c.tb.Fatalf("settle: link %s: %v", name, err)
			}
		}
		for len(c.net) > 0 {
			m, _, _, err := c.deliver(0)
			if !toleratedDeliveryError(err) {
				c.tb.Fatalf("settle: deliver %v: %v", m, err)
			}
		}
		if reflect.DeepEqual(before, c.snapshot()) {
			return
		}
	}
}

func (c *cluster) snapshot() []Status {
	var s []Status
	for _, name := range c.names {
		st := c.nodes[name].r.Status()
		st.InFlight = nil // relinking clears it; not progress
		s = append(s, st)
	}
	return s
}

func fmtEffects(e Effects) string {
	var parts []string
	if e.Append != nil {
		parts = append(parts, "append="+fmtRange(*e.Append))
	}
	if len(e.Forward) > 0 {
		var fs []string
		for _, f := range e.Forward {
			fs = append(fs, fmtRange(f))
		}
		parts = append(parts, "forward="+strings.Join(fs, ","))
	}
	if e.AckUpstream != nil {
		parts = append(parts, fmt.Sprintf("ack-up=%d", *e.AckUpstream))
	}
	if e.Committed != nil {
		parts = append(parts, fmt.Sprintf("committed=%d", *e.Committed))
	}
	if e.DurableDown != nil {
		parts = append(parts, fmt.Sprintf("down=%d", *e.DurableDown))
	}
	if len(parts) == 0 {
		return "no effects"
	}
	return strings.Join(parts, " ")
}

func fmtRange(r Range) string { return fmt.Sprintf("[%d,%d)", r.Base, r.End) }

func fmtStatus(st Status) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: e%d %s", st.Self, st.Epoch, st.Role)
	if len(st.Members) > 0 {
		fmt.Fprintf(&b, " [%s]", strings.Join(st.Members, ","))
	}
	fmt.Fprintf(&b, " log=%d durable=%d committed=%d", st.LogEnd, st.DurableEnd, st.Committed)
	if st.Successor != "" {
		fmt.Fprintf(&b, " succ-ack=%d", st.SuccessorAck)
		if st.Linked {
			fmt.Fprintf(&b, " linked fwd-end=%d", st.ForwardedEnd)
			if len(st.InFlight) > 0 {
				var fs []string
				for _, f := range st.InFlight {
					fs = append(fs, fmtRange(f))
				}
				fmt.Fprintf(&b, " inflight=%s", strings.Join(fs, ","))
			}
		} else {
			b.WriteString(" unlinked")
		}
	}
	if st.Predecessor != "" {
		fmt.Fprintf(&b, " acked-up=%d", st.AckedUpstream)
	}
	return b.String()
}

func (c *cluster) statusAll() string {
	var lines []string
	for _, name := range c.names {
		lines = append(lines, fmtStatus(c.nodes[name].r.Status()))
	}
	return strings.Join(lines, "\n")
}

func (c *cluster) fmtNet() string {
	if len(c.net) == 0 {
		return "net: empty"
	}
	var lines []string
	for i, m := range c.net {
		lines = append(lines, fmt.Sprintf("%d: %v", i, m))
	}
	return strings.Join(lines, "\n")
}

// checkAgreement verifies that all replicas agree on every committed
// offset each one knows, and that along members (in chain order) each log
// is a prefix of its predecessor's. It returns the violations found.
func (c *cluster) checkAgreement(members []string) []string {
	var bad []string
	var agreed []string // longest committed prefix seen
	for _, name := range c.names {
		n := c.nodes[name]
		cm := n.r.Status().Committed
		if cm > uint64(len(n.log)) {
			bad = append(bad, fmt.Sprintf("%s: committed %d beyond its log of %d", name, cm, len(n.log)))
			continue
		}
		prefix := n.log[:cm]
		k := min(len(prefix), len(agreed))
		if !slices.Equal(prefix[:k], agreed[:k]) {
			bad = append(bad, fmt.Sprintf("%s: committed records %v disagree with %v", name, prefix[:k], agreed[:k]))
		}
		if len(prefix) > len(agreed) {
			agreed = prefix
		}
	}
	for i := 1; i < len(members); i++ {
		p, s := c.nodes[members[i-1]], c.nodes[members[i]]
		if p == nil || s == nil {
			continue
		}
		if len(s.log) > len(p.log) || !slices.Equal(s.log, p.log[:len(s.log)]) {
			bad = append(bad, fmt.Sprintf("%s's log %v is not a prefix of %s's %v", members[i], s.log, members[i-1], p.log))
		}
	}
	return bad
}
