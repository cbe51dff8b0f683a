package kafka

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/ingest"
	"github.com/catena-streams/catena/ingest/groups"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// node is one of several ingestion nodes sharing the groups, as the pods
// of an ingestion Deployment: its own ingestion server, coordinator, Kafka
// listener and Groups service, on its own loopback address and the same
// ports as every other node.
type node struct {
	host       string
	membership *groups.Membership
	ing        *ingest.Server
	kafka      *Server
	grpc       *grpc.Server
	pool       *transport.Pool
}

// samePorts listens on a port free on every host, n times.
func samePorts(t *testing.T, hosts []string, n int) [][]net.Listener {
	t.Helper()
	out := make([][]net.Listener, n)
	for i := range n {
	retry:
		for range 100 {
			first, err := net.Listen("tcp", net.JoinHostPort(hosts[0], "0"))
			if err != nil {
				// Linux routes all of 127.0.0.0/8 to the loopback
				// interface; other systems (macOS) only 127.0.0.1, and
				// there two nodes cannot share ports on their own hosts.
				t.Skipf("this system has no loopback address %s (Linux has all of 127.0.0.0/8): %v", hosts[0], err)
			}
			_, port, _ := net.SplitHostPort(first.Addr().String())
			ls := []net.Listener{first}
			for _, h := range hosts[1:] {
				l, err := net.Listen("tcp", net.JoinHostPort(h, port))
				if err != nil {
					for _, l := range ls {
						l.Close()
					}
					continue retry
				}
				ls = append(ls, l)
			}
			out[i] = ls
			break
		}
		if out[i] == nil {
			t.Fatal("no port free on every host")
		}
	}
	return out
}

// startNodes starts an ingestion node on each host (127.0.0.x) over c's
// replicas, each knowing all the others.
func (c *cluster) startNodes(hosts ...string) []*node {
	t := c.t
	t.Helper()
	ports := samePorts(t, hosts, 2)
	_, kafkaPort, _ := net.SplitHostPort(ports[0][0].Addr().String())
	_, grpcPort, _ := net.SplitHostPort(ports[1][0].Addr().String())
	var nodes []*node
	for i, host := range hosts {
		n := &node{host: host, membership: groups.NewMembership(host)}
		n.membership.Set(hosts)
		var err error
		if n.ing, err = ingest.New(ingest.Options{Replicas: c.replicas, Logger: testr.New(t).WithName(host)}); err != nil {
			t.Fatal(err)
		}
		for _, stream := range []string{"s", groups.DefaultOffsetsStream} {
			waitFor(t, 30*time.Second, host+" to discover stream "+stream, func() bool {
				_, err := n.ing.Stream(context.Background(), stream)
				return err == nil
			})
		}
		coord := groups.New(groups.Options{Offsets: &groups.StreamOffsets{Ingest: n.ing}, Membership: n.membership, Logger: testr.New(t).WithName(host)})
		runCoordinator(t, coord)
		n.pool = transport.NewPool(nil)
		n.grpc = grpc.NewServer(transport.ServerOptions(nil)...)
		n.ing.Register(n.grpc)
		(&groups.Service{Coordinator: coord, Ingest: n.ing, Membership: n.membership, Dial: func(h string) (*grpc.ClientConn, error) {
			return n.pool.Get(net.JoinHostPort(h, grpcPort))
		}}).Register(n.grpc)
		go func() { _ = n.grpc.Serve(ports[1][i]) }()
		if n.kafka, err = New(Options{Ingest: n.ing, Groups: coord, Membership: n.membership, Advertise: net.JoinHostPort(host, kafkaPort), Logger: testr.New(t).WithName(host)}); err != nil {
			t.Fatal(err)
		}
		go func() { _ = n.kafka.Serve(ports[0][i]) }()
		t.Cleanup(n.stop)
		nodes = append(nodes, n)
	}
	c.seeds = nil
	for _, n := range nodes {
		c.seeds = append(c.seeds, net.JoinHostPort(n.host, kafkaPort))
	}
	c.grpcAddr = net.JoinHostPort(hosts[len(hosts)-1], grpcPort)
	return nodes
}

// stop stops the node as a killed pod stops: its connections drop.
func (n *node) stop() {
	if n.kafka == nil {
		return
	}
	n.kafka.Close()
	n.grpc.Stop()
	n.pool.Close()
	n.ing.Close()
	n.kafka = nil
}

// ownedBy is a group that nodes[i] coordinates.
func ownedBy(t *testing.T, n *node, prefix string) string {
	t.Helper()
	for i := range 1000 {
		g := prefix + strconv.Itoa(i)
		if _, self := n.membership.Owner(g); self {
			return g
		}
	}
	t.Fatal("no group is the node's")
	return ""
}

// TestGroupMovesWhenItsCoordinatorIsKilled: two ingestion nodes are two
// brokers; a group of three franz-go consumers is coordinated by the
// first. The first is killed and leaves the list; the group's members find
// the second, which coordinates it from the offsets the first stored:
// every record is read, and none that was committed before the kill is
// read again.
func TestGroupMovesWhenItsCoordinatorIsKilled(t *testing.T) {
	const partitions = 6
	c := startCluster(t, partitions)
	nodes := c.startNodes("127.0.0.2", "127.0.0.3")
	adm := kadm.NewClient(c.client())
	ctx := ctxT(t, 120*time.Second)

	brokers, err := adm.ListBrokers(ctx)
	if err != nil || len(brokers) != 2 {
		t.Fatalf("brokers %v (%v), want the two nodes", brokers, err)
	}
	for i, b := range brokers {
		if b.NodeID != groups.PeerID(b.Host) || (b.Host != "127.0.0.2" && b.Host != "127.0.0.3") || b.Port != brokers[0].Port {
			t.Fatalf("broker %d is %+v, want a node's host, its id and the shared port", i, b)
		}
	}
	md, err := adm.Metadata(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	leaders := map[int32]int{}
	for _, p := range md.Topics["s"].Partitions {
		leaders[p.Leader]++
	}
	if len(leaders) != 2 || leaders[brokers[0].NodeID] != 3 {
		t.Fatalf("partition leaders %v, want the 6 partitions spread 3 and 3", leaders)
	}

	group := ownedBy(t, nodes[0], "moving-")
	all := c.produceN(t, partitions, 50)
	var members []*member
	for i := range 3 {
		members = append(members, c.groupMember(t, fmt.Sprintf("m%d", i), group, kgo.RangeBalancer()))
	}
	union := func() map[string]bool {
		out := map[string]bool{}
		for _, m := range members {
			for k := range m.consumed2() {
				out[k] = true
			}
		}
		return out
	}
	waitFor(t, 30*time.Second, "a stable group of three that committed the first 300 records", func() bool {
		d, err := adm.DescribeGroups(ctx, group)
		if err != nil || d[group].State != "Stable" || len(d[group].Members) != 3 || d[group].Coordinator.NodeID != groups.PeerID("127.0.0.2") {
			return false
		}
		offs, err := adm.FetchOffsets(ctx, group)
		if err != nil {
			return false
		}
		for p := range partitions {
			if o, ok := offs.Lookup("s", int32(p)); !ok || o.At != 50 {
				return false
			}
		}
		return true
	})
	before := union()
	for _, m := range members {
		m.mu.Lock()
		m.consumed = map[string]bool{}
		m.mu.Unlock()
	}

	t.Log("killing the group's coordinator")
	nodes[0].stop()
	nodes[1].membership.Set([]string{"127.0.0.3"})
	c.seeds = c.seeds[1:]
	more := c.produceN(t, partitions, 50)
	waitFor(t, 60*time.Second, "the group to read every record produced after the kill", func() bool {
		got := union()
		for _, k := range more {
			if !got[k] {
				return false
			}
		}
		return true
	})
	for k := range union() {
		if before[k] {
			t.Errorf("record %s was committed before the kill and read again after: the new coordinator did not start from the stored offsets", k)
		}
	}
	for _, k := range all {
		if !before[k] {
			t.Errorf("record %s was never read before the kill", k)
		}
	}
	// An admin client started now (franz-go's admin client keeps a
	// group's coordinator cached through dial errors) finds the new one.
	adm = kadm.NewClient(c.client())
	waitFor(t, 30*time.Second, "the group described with its 3 members on the second node", func() bool {
		d, err := adm.DescribeGroups(ctx, group)
		return err == nil && len(d[group].Members) == 3 && d[group].Coordinator.NodeID == groups.PeerID("127.0.0.3")
	})
}

// TestGoClientReachesTheCoordinatorThroughAnyNode: a Go client connected
// to one node is a member of a group another node coordinates (its calls
// are forwarded), catenactl's list asks every node, and when the
// coordinator is killed the group goes on on the node the client is
// connected to.
func TestGoClientReachesTheCoordinatorThroughAnyNode(t *testing.T) {
	const partitions = 4
	c := startCluster(t, partitions)
	nodes := c.startNodes("127.0.0.2", "127.0.0.3")
	ctx := ctxT(t, 90*time.Second)
	group := ownedBy(t, nodes[0], "forwarded-")
	first := c.produceN(t, partitions, 20)

	// c.grpcAddr is the second node's.
	m := c.goGroupMember(t, "go", group)
	waitFor(t, 30*time.Second, "the member to read the first records", func() bool { return len(m.read()) >= len(first) })

	cl, err := client.Dial(ctx, c.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	d, err := cl.DescribeGroup(ctx, group, "")
	if err != nil || len(d.GetMembers()) != 1 {
		t.Fatalf("describe through the other node: %v (%v)", d, err)
	}
	if host := d.GetMembers()[0].GetClientHost(); host != "/127.0.0.1" {
		t.Errorf("member's client host %q, want the client's (/127.0.0.1), not the forwarding node's", host)
	}
	// A group the second node coordinates, with an offset committed.
	other := ownedBy(t, nodes[1], "local-")
	if _, err := cl.ResetGroupOffsets(ctx, &catenapb.ResetGroupOffsetsRequest{Group: other, Stream: "s", Spec: catenapb.OffsetSpec_OFFSET_SPEC_EARLIEST}); err != nil {
		t.Fatalf("reset a group of the second node: %v", err)
	}
	list, err := cl.ListGroups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range list {
		names = append(names, g.GetGroup())
	}
	if fmt.Sprint(names) != fmt.Sprint([]string{group, other}) && fmt.Sprint(names) != fmt.Sprint([]string{other, group}) {
		t.Fatalf("groups listed %v, want %s (first node) and %s (second), once each", names, group, other)
	}

	nodes[0].stop()
	nodes[1].membership.Set([]string{"127.0.0.3"})
	c.seeds = c.seeds[1:]
	more := c.produceN(t, partitions, 20)
	waitFor(t, 60*time.Second, "the member to read the records produced after the coordinator was killed", func() bool {
		got := m.read()
		for _, k := range more {
			if !got[k] {
				return false
			}
		}
		return true
	})
	m.cancel()
	<-m.done
	if err := m.gc.Close(ctx); err != nil {
		t.Fatalf("leave: %v", err)
	}
}
