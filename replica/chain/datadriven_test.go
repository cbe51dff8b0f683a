package chain

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestScripts runs the protocol scenarios in testdata/*.txt against a
// simulated chain (see harness_test.go). Commands:
//
//	init nodes=a,b,c end=N           create replicas holding the same N durable records
//	new node=d [copy=c]              create a replica, optionally with c's durable log
//	configure epoch=E members=a,b,c [nodes=a,b]
//	                                 install a configuration on nodes (default: every node)
//	propose node=a count=N
//	durable [node=a] [end=N]         report durability (default: the whole log; every node)
//	link node=a                      handshake from a to its successor
//	unlink node=a                    SuccessorLost at a
//	deliver [idx=I] [count=N]        deliver message I, the first N, or all until quiet
//	drop [idx=I]                     lose message I (default: every message)
//	duplicate idx=I                  queue a copy of message I at the end
//	reorder [order=2,0,1]            permute the queue (default: reverse it)
//	net                              show the queue
//	status [node=a]
//	logs                             show each replica's records
//	settle                           durable + relink + deliver until quiet
//	check [members=a,b]              committed agreement and prefix order
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		c := newCluster(t)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return runCommand(t, c, d)
		})
	})
}

func runCommand(t *testing.T, c *cluster, d *datadriven.TestData) string {
	var out []string
	switch d.Cmd {
	case "init":
		var end uint64
		d.ScanArgs(t, "end", &end)
		var recs []string
		for i := range end {
			recs = append(recs, fmt.Sprintf("r%d", i))
		}
		for _, name := range listArg(t, d, "nodes") {
			c.add(name, recs)
		}
		return c.statusAll()

	case "new":
		var name, from string
		d.ScanArgs(t, "node", &name)
		var recs []string
		if d.MaybeScanArgs(t, "copy", &from) {
			src := c.node(from)
			recs = src.log[:src.r.Status().DurableEnd]
		}
		return fmtStatus(c.add(name, recs).r.Status())

	case "configure":
		var epoch uint64
		d.ScanArgs(t, "epoch", &epoch)
		members := listArg(t, d, "members")
		for _, m := range members {
			if _, ok := c.nodes[m]; !ok {
				c.add(m, nil)
			}
		}
		targets := c.names
		if d.HasArg("nodes") {
			targets = listArg(t, d, "nodes")
		}
		for _, name := range targets {
			eff, err := c.configure(name, Config{Epoch: epoch, Members: members})
			out = append(out, fmt.Sprintf("%s: %s", name, fmtResult(eff, err)))
		}

	case "propose":
		var name string
		var count uint64
		d.ScanArgs(t, "node", &name)
		d.ScanArgs(t, "count", &count)
		base, eff, err := c.propose(name, count)
		if err != nil {
			return fmt.Sprintf("%s: error: %v", name, err)
		}
		return fmt.Sprintf("%s: base=%d %s", name, base, fmtEffects(eff))

	case "durable":
		targets := c.names
		if d.HasArg("node") {
			var name string
			d.ScanArgs(t, "node", &name)
			targets = []string{name}
		}
		for _, name := range targets {
			end := uint64(len(c.node(name).log))
			d.MaybeScanArgs(t, "end", &end)
			out = append(out, fmt.Sprintf("%s: %s", name, fmtEffects(c.durable(name, end))))
		}

	case "link":
		var name string
		d.ScanArgs(t, "node", &name)
		lines, err := c.link(name)
		out = append(out, lines...)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: error: %v", name, err))
		}

	case "unlink":
		var name string
		d.ScanArgs(t, "node", &name)
		n := c.node(name)
		n.r.SuccessorLost(n.r.Status().Epoch)
		return fmtStatus(n.r.Status())

	case "deliver":
		n := -1 // all, including messages produced on the way
		var idx int
		if d.MaybeScanArgs(t, "idx", &idx) {
			if idx >= len(c.net) {
				d.Fatalf(t, "no message %d", idx)
			}
			m, eff, note, err := c.deliver(idx)
			return fmtDelivery(m, eff, note, err)
		}
		d.MaybeScanArgs(t, "count", &n)
		for i := 0; len(c.net) > 0 && (n < 0 || i < n); i++ {
			m, eff, note, err := c.deliver(0)
			out = append(out, fmtDelivery(m, eff, note, err))
		}
		if len(out) == 0 {
			return "net: empty"
		}

	case "drop":
		var idx int
		if d.MaybeScanArgs(t, "idx", &idx) {
			c.net = slices.Delete(c.net, idx, idx+1)
		} else {
			c.net = nil
		}
		return c.fmtNet()

	case "duplicate":
		var idx int
		d.ScanArgs(t, "idx", &idx)
		c.net = append(c.net, c.net[idx])
		return c.fmtNet()

	case "reorder":
		if d.HasArg("order") {
			var next []message
			for _, s := range listArg(t, d, "order") {
				i, err := strconv.Atoi(s)
				if err != nil || i >= len(c.net) {
					d.Fatalf(t, "bad index %q", s)
				}
				next = append(next, c.net[i])
			}
			if len(next) != len(c.net) {
				d.Fatalf(t, "order names %d of %d messages", len(next), len(c.net))
			}
			c.net = next
		} else {
			slices.Reverse(c.net)
		}
		return c.fmtNet()

	case "net":
		return c.fmtNet()

	case "status":
		if d.HasArg("node") {
			var name string
			d.ScanArgs(t, "node", &name)
			return fmtStatus(c.node(name).r.Status())
		}
		return c.statusAll()

	case "logs":
		for _, name := range c.names {
			out = append(out, fmt.Sprintf("%s: %s", name, strings.Join(c.nodes[name].log, " ")))
		}

	case "settle":
		c.settle()
		return c.statusAll()

	case "check":
		var members []string
		if d.HasArg("members") {
			members = listArg(t, d, "members")
		}
		if bad := c.checkAgreement(members); len(bad) > 0 {
			return strings.Join(bad, "\n")
		}
		return "ok"

	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	return strings.Join(out, "\n")
}

func listArg(t *testing.T, d *datadriven.TestData, key string) []string {
	arg, ok := d.Arg(key)
	if !ok {
		d.Fatalf(t, "missing argument %q", key)
	}
	var vals []string
	for _, v := range arg.Vals {
		vals = append(vals, strings.Split(v, ",")...)
	}
	return vals
}

func fmtResult(eff Effects, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return fmtEffects(eff)
}

func fmtDelivery(m message, eff Effects, note string, err error) string {
	s := fmt.Sprintf("%v => %s", m, fmtResult(eff, err))
	if note != "" {
		s += "; " + note
	}
	return s
}
