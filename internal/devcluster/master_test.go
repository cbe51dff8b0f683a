package devcluster

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/replica/chainmaster"
	"github.com/catena-streams/catena/replica/server"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// replicaNode is an in-process replica server on a fixed loopback address.
type replicaNode struct {
	id, addr, dir string
	srv           *server.Server
	g             *grpc.Server
}

func startNode(t *testing.T, id, addr, dir string) *replicaNode {
	t.Helper()
	return startNodeWith(t, id, addr, dir, server.Options{})
}

// startNodeWith is startNode with opts (ID, data directory, logger and
// fatal hook filled in).
func startNodeWith(t *testing.T, id, addr, dir string, opts server.Options) *replicaNode {
	t.Helper()
	opts.ID, opts.DataDir, opts.Logger = id, dir, logr.Discard()
	opts.Fatal = func(err error) { t.Errorf("replica %s stopped: %v", id, err) }
	srv, err := server.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	var lis net.Listener
	deadline := time.Now().Add(5 * time.Second)
	for {
		lis, err = net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) {
			break
		}
		<-time.After(10 * time.Millisecond) // poll interval
	}
	if err != nil {
		t.Fatal(err)
	}
	n := &replicaNode{id: id, addr: lis.Addr().String(), dir: dir, srv: srv, g: grpc.NewServer(transport.ServerOptions(nil)...)}
	srv.Register(n.g)
	go func() { _ = n.g.Serve(lis) }()
	t.Cleanup(n.stop)
	return n
}

func (n *replicaNode) stop() {
	n.g.Stop()
	n.srv.Close()
}

// threeNodes starts replicas a, b and c, with a pool the test's master and
// calls share and a client of a node through it.
func threeNodes(t *testing.T) (a, b, c *replicaNode, pool *transport.Pool, rc func(*replicaNode) catenapb.ReplicaClient) {
	t.Helper()
	a = startNode(t, "a", "127.0.0.1:0", t.TempDir())
	b = startNode(t, "b", "127.0.0.1:0", t.TempDir())
	c = startNode(t, "c", "127.0.0.1:0", t.TempDir())
	pool = transport.NewPool(nil)
	t.Cleanup(pool.Close)
	rc = func(n *replicaNode) catenapb.ReplicaClient {
		conn, err := pool.Get(n.addr)
		if err != nil {
			t.Fatal(err)
		}
		return catenapb.NewReplicaClient(conn)
	}
	return a, b, c, pool, rc
}

// installChain configures stream s's partition 0 on chain (head first) at
// epoch 1, tail first, with fsync and a minimum chain length of one.
func installChain(t *testing.T, rc func(*replicaNode) catenapb.ReplicaClient, chain ...*replicaNode) {
	t.Helper()
	cfg := &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC, MinChainLength: 1}
	req := &catenapb.ConfigureRequest{Stream: "s", Epoch: 1, Config: cfg}
	for _, n := range chain {
		req.Members = append(req.Members, &catenapb.Member{Id: n.id, Addr: n.addr})
	}
	for i := len(chain) - 1; i >= 0; i-- {
		if _, err := rc(chain[i]).Configure(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMasterRepairsAReturningHeadWithOrphans drives the dev master's repair
// over real (in-process) replicas through SCENARIOS.md 3: the head appends
// records it never forwards and dies; the master removes it; the new head
// writes other records at those offsets; the old head returns and the
// master truncates its orphans and re-adds it at the tail.
func TestMasterRepairsAReturningHeadWithOrphans(t *testing.T) {
	ctx := context.Background()
	a, b, c, pool, rc := threeNodes(t)
	// A failure timeout no test reaches: only the exits the test reports
	// count.
	m := newMaster(pool, logr.Discard(), map[string]string{"a": a.addr, "b": b.addr, "c": c.addr}, 3, time.Hour, newMasterStream("s", 1, nil))
	defer m.stop()
	chains := m.streams[0].chains
	installChain(t, rc, a, b, c)
	appendAt := func(n *replicaNode, epoch, producer, seq uint64, count int, timeout time.Duration) error {
		recs := make([]*catenapb.AppendRecord, count)
		for i := range recs {
			recs[i] = &catenapb.AppendRecord{Value: []byte(fmt.Sprintf("p%d-%d", producer, seq+uint64(i))), ProducerId: producer, Sequence: seq + uint64(i)}
		}
		actx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		_, err := rc(n).Append(actx, &catenapb.AppendRequest{Stream: "s", Epoch: epoch, Records: recs})
		return err
	}
	for i := range 5 {
		if err := appendAt(a, 1, 1, uint64(i*2+1), 2, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	m.repair(ctx) // healthy: nothing to do
	if ch := chains[0]; ch.Epoch != 0 {
		t.Fatalf("healthy chain changed: %+v", ch)
	}

	// Orphans: the successor is unreachable while the head appends.
	b.stop()
	if err := appendAt(a, 1, 2, 1, 3, 200*time.Millisecond); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("append with the successor down: %v", err)
	}
	waitFor(t, func() error {
		st := partStatus(t, rc(a))
		if st.GetDurable() != 13 {
			return fmt.Errorf("head durable %d, want 13", st.GetDurable())
		}
		return nil
	})
	a.stop()
	m.failed["a"] = true
	b = startNode(t, "b", b.addr, b.dir)
	waitAnswers(t, m, "b")
	// The head is gone and b was restarted: c alone is left of the chain
	// (epoch 2), and b returns behind it (epoch 3).
	m.repair(ctx)
	if ch := chains[0]; ch.Epoch != 3 || fmt.Sprint(ch.Members) != "[c b]" {
		t.Fatalf("after the head failed: %+v", chains[0])
	}
	for i := range 4 {
		if err := appendAt(c, 3, 3, uint64(i*2+1), 2, 5*time.Second); err != nil {
			t.Fatalf("append at the new head: %v", err)
		}
	}

	// The old head returns on its volume.
	a = startNode(t, "a", a.addr, a.dir)
	delete(m.failed, "a")
	waitAnswers(t, m, "a")
	if st := partStatus(t, rc(a)); st.GetLogEnd() != 13 || st.GetLastLogEpoch() != 1 {
		t.Fatalf("returning head: end %d last epoch %d", st.GetLogEnd(), st.GetLastLogEpoch())
	}
	m.repair(ctx)
	if ch := chains[0]; ch.Epoch != 4 || fmt.Sprint(ch.Members) != "[c b a]" {
		t.Fatalf("after the return: %+v", chains[0])
	}
	if err := appendAt(c, 4, 3, 9, 2, 5*time.Second); err != nil {
		t.Fatalf("append after the rejoin: %v", err)
	}
	waitFor(t, func() error {
		sb := partStatus(t, rc(c))
		for _, n := range []*replicaNode{c, b, a} {
			st := partStatus(t, rc(n))
			if st.GetEpoch() != 4 || st.GetLogEnd() != 20 || st.GetCommitted() != 20 || st.GetChecksum() != sb.GetChecksum() {
				return fmt.Errorf("%s: epoch %d end %d committed %d sum %08x; head sum %08x", n.id, st.GetEpoch(), st.GetLogEnd(), st.GetCommitted(), st.GetChecksum(), sb.GetChecksum())
			}
		}
		return nil
	})
	// The orphans are gone: offsets 10..19 hold producer 3's records.
	resp, err := rc(a).Read(ctx, &catenapb.FetchRequest{Stream: "s", Offset: 10, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.GetRecords() {
		if want := fmt.Sprintf("p3-%d", i+1); string(r.GetValue()) != want {
			t.Fatalf("offset %d on the returned head: %q, want %q", r.GetOffset(), r.GetValue(), want)
		}
	}
	m.repair(ctx) // converged: nothing more
	if ch := chains[0]; ch.Epoch != 4 {
		t.Fatalf("repair of a converged chain moved it: %+v", ch)
	}
}

func partStatus(t *testing.T, c catenapb.ReplicaClient) *catenapb.PartitionStatus {
	t.Helper()
	p := uint32(0)
	resp, err := c.Status(context.Background(), &catenapb.StatusRequest{Stream: "s", Partition: &p})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetPartitions()[0]
}

func waitFor(t *testing.T, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		<-time.After(10 * time.Millisecond) // poll interval
	}
}

// TestMasterRepairsEveryStream: one master, two streams of different
// partition counts on the same replicas; when a replica fails, every chain
// of both streams moves to a new epoch without it, from one round of
// Status calls.
// waitAnswers waits until the master's observer hears from a restarted
// replica (its reconnect back-off may take a moment).
func waitAnswers(t *testing.T, m *master, id string) {
	t.Helper()
	waitFor(t, func() error {
		if !m.obs.Snapshot().Answered[id] {
			return fmt.Errorf("%s does not answer the master yet", id)
		}
		return nil
	})
}

func TestMasterRepairsEveryStream(t *testing.T) {
	ctx := context.Background()
	nodes := []*replicaNode{
		startNode(t, "a", "127.0.0.1:0", t.TempDir()),
		startNode(t, "b", "127.0.0.1:0", t.TempDir()),
		startNode(t, "c", "127.0.0.1:0", t.TempDir()),
	}
	pool := transport.NewPool(nil)
	defer pool.Close()
	addrs := map[string]string{}
	var members []*catenapb.Member
	for _, n := range nodes {
		addrs[n.id] = n.addr
		members = append(members, &catenapb.Member{Id: n.id, Addr: n.addr})
	}
	m := newMaster(pool, logr.Discard(), addrs, 3, time.Hour, newMasterStream("demo", 2, nil), newMasterStream("demo-checkpoints", 1, nil))
	defer m.stop()
	for _, s := range m.streams {
		cfg := &catenapb.StreamConfig{Partitions: uint32(s.partitions), Durability: catenapb.Durability_DURABILITY_FSYNC, MinChainLength: 1}
		for p := range uint32(s.partitions) {
			req := &catenapb.ConfigureRequest{Stream: s.name, Partition: p, Epoch: 1, Config: cfg, Members: members}
			for i := len(nodes) - 1; i >= 0; i-- {
				conn, err := pool.Get(nodes[i].addr)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := catenapb.NewReplicaClient(conn).Configure(ctx, req); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	m.repair(ctx) // healthy: nothing to do
	for _, s := range m.streams {
		if len(s.chains) != 0 {
			t.Fatalf("%s: healthy chains changed: %v", s.name, s.chains)
		}
	}

	nodes[0].stop()
	m.failed["a"] = true
	m.repair(ctx)
	for _, s := range m.streams {
		for p := range uint32(s.partitions) {
			if ch := s.chains[p]; ch.Epoch != 2 || fmt.Sprint(ch.Members) != "[b c]" {
				t.Errorf("%s/%d after a failed: %+v, want epoch 2 [b c]", s.name, p, ch)
			}
		}
	}
	// The replicas confirm: every chain of both streams is at epoch 2.
	waitFor(t, func() error {
		for _, n := range nodes[1:] {
			conn, err := pool.Get(n.addr)
			if err != nil {
				return err
			}
			resp, err := catenapb.NewReplicaClient(conn).Status(ctx, &catenapb.StatusRequest{})
			if err != nil {
				return err
			}
			if len(resp.GetPartitions()) != 3 {
				return fmt.Errorf("%s hosts %d partitions, want 3", n.id, len(resp.GetPartitions()))
			}
			for _, ps := range resp.GetPartitions() {
				if ps.GetEpoch() != 2 {
					return fmt.Errorf("%s: %s/%d at epoch %d, want 2", n.id, ps.GetStream(), ps.GetPartition(), ps.GetEpoch())
				}
			}
		}
		return nil
	})
}

// TestMasterRejoinsACopyUnderSteadyWrites: a replica that returns further
// behind than the join lag copies the chain from outside it while a
// producer writes on. The copy moves its log end between any two rounds;
// the master must keep the agreement it found at the copy's start rather
// than ask again every round, which held the join back until a lull in the
// writes (a returning replica took seconds to rejoin under a steady
// 2,000 records/s, and a failure meanwhile left its chain too short).
func TestMasterRejoinsACopyUnderSteadyWrites(t *testing.T) {
	ctx := context.Background()
	a, b, c, pool, rc := threeNodes(t)
	var asked atomic.Int32
	logger := funcr.New(func(_, args string) {
		if strings.Contains(args, `"msg"="Found where a returning replica agrees with the chain"`) {
			asked.Add(1)
		}
	}, funcr.Options{})
	m := newMaster(pool, logger, map[string]string{"a": a.addr, "b": b.addr, "c": c.addr}, 3, time.Hour, newMasterStream("s", 1, nil))
	defer m.stop()
	chains := m.streams[0].chains
	installChain(t, rc, a, b, c)
	seq := uint64(1)
	appendBatch := func(epoch uint64, count int) error {
		recs := make([]*catenapb.AppendRecord, count)
		for i := range recs {
			recs[i] = &catenapb.AppendRecord{Value: []byte(fmt.Sprintf("r%d", seq+uint64(i))), ProducerId: 1, Sequence: seq + uint64(i)}
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := rc(a).Append(actx, &catenapb.AppendRequest{Stream: "s", Epoch: epoch, Records: recs})
		if err == nil {
			seq += uint64(count)
		}
		return err
	}
	if err := appendBatch(1, 100); err != nil {
		t.Fatal(err)
	}

	// c goes; the chain moves on without it, further than the join lag.
	c.stop()
	m.failed["c"] = true
	m.repair(ctx)
	if ch := chains[0]; ch.Epoch != 2 || fmt.Sprint(ch.Members) != "[a b]" {
		t.Fatalf("after c failed: %+v", ch)
	}
	for range 2*chainmaster.DefaultJoinLag/500 + 1 {
		if err := appendBatch(2, 500); err != nil {
			t.Fatal(err)
		}
	}

	// c returns while a producer writes a few records every millisecond
	// or two, following the chain's epoch.
	c = startNode(t, "c", c.addr, c.dir)
	delete(m.failed, "c")
	waitAnswers(t, m, "c")
	stop := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() {
		epoch := uint64(2)
		for {
			select {
			case <-stop:
				writerDone <- nil
				return
			case <-time.After(time.Millisecond): // the producer's pace
			}
			if err := appendBatch(epoch, 5); err != nil {
				st, serr := rc(a).Status(ctx, &catenapb.StatusRequest{Stream: "s"})
				if serr != nil || st.GetPartitions()[0].GetEpoch() == epoch {
					writerDone <- fmt.Errorf("append at epoch %d: %v", epoch, err)
					return
				}
				epoch = st.GetPartitions()[0].GetEpoch()
			}
		}
	}()
	// The master's ticks, back to back.
	waitFor(t, func() error {
		m.repair(ctx)
		if ch := chains[0]; fmt.Sprint(ch.Members) != "[a b c]" {
			return fmt.Errorf("c has not rejoined under steady writes (asked where it agrees %d times): %+v", asked.Load(), ch)
		}
		return nil
	})
	close(stop)
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	if n := asked.Load(); n > 2 {
		t.Errorf("the master asked where the copy agrees %d times; once is enough while the copy runs", n)
	}
	// Every record, in order, on every member.
	end := seq - 1
	waitFor(t, func() error {
		sa := partStatus(t, rc(a))
		for _, n := range []*replicaNode{a, b, c} {
			st := partStatus(t, rc(n))
			if st.GetLogEnd() != end || st.GetCommitted() != end || st.GetChecksum() != sa.GetChecksum() {
				return fmt.Errorf("%s: end %d committed %d sum %08x; want %d, head sum %08x", n.id, st.GetLogEnd(), st.GetCommitted(), st.GetChecksum(), end, sa.GetChecksum())
			}
		}
		return nil
	})
}

// TestMasterWaitsUntilTheTailReachesAJoiner: a replica returns, answering
// the master, but the chain's tail cannot connect to it yet (a returned
// pod's name may resolve to nothing for as long as DNS caches the
// answer). The master does not add it behind the tail, where the tail's
// link could not come up and the failure timeout would cut the link and
// a member with it; once the tail reaches it, it joins.
func TestMasterWaitsUntilTheTailReachesAJoiner(t *testing.T) {
	ctx := context.Background()
	var cAddr atomic.Value
	var blocked atomic.Bool
	dialer := grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		if blocked.Load() && addr == cAddr.Load() {
			return nil, fmt.Errorf("dial %s: no such host (a DNS answer cached from before the pod returned)", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	})
	a := startNode(t, "a", "127.0.0.1:0", t.TempDir())
	b := startNodeWith(t, "b", "127.0.0.1:0", t.TempDir(), server.Options{DialOptions: []grpc.DialOption{dialer}})
	c := startNode(t, "c", "127.0.0.1:0", t.TempDir())
	cAddr.Store(c.addr)
	pool := transport.NewPool(nil)
	t.Cleanup(pool.Close)
	rc := func(n *replicaNode) catenapb.ReplicaClient {
		conn, err := pool.Get(n.addr)
		if err != nil {
			t.Fatal(err)
		}
		return catenapb.NewReplicaClient(conn)
	}
	m := newMaster(pool, logr.Discard(), map[string]string{"a": a.addr, "b": b.addr, "c": c.addr}, 3, time.Hour, newMasterStream("s", 1, nil))
	defer m.stop()
	chains := m.streams[0].chains
	installChain(t, rc, a, b, c)

	c.stop()
	m.failed["c"] = true
	m.repair(ctx)
	if ch := chains[0]; fmt.Sprint(ch.Members) != "[a b]" {
		t.Fatalf("after c failed: %+v", ch)
	}
	epoch := chains[0].Epoch

	blocked.Store(true)
	c = startNode(t, "c", c.addr, c.dir)
	delete(m.failed, "c")
	waitAnswers(t, m, "c")
	m.repair(ctx)
	if ch := chains[0]; ch.Epoch != epoch || fmt.Sprint(ch.Members) != "[a b]" {
		t.Fatalf("c joined behind a tail that cannot reach it: %+v", ch)
	}

	blocked.Store(false)
	waitFor(t, func() error { // the failed pair is asked again after chainmaster.RecheckAfter
		m.repair(ctx)
		if ch := chains[0]; ch.Epoch <= epoch || fmt.Sprint(ch.Members) != "[a b c]" {
			return fmt.Errorf("c did not join once the tail reached it: %+v", ch)
		}
		return nil
	})
	waitFor(t, func() error {
		if st := partStatus(t, rc(b)); st.GetSuccessorDownMs() != 0 || st.GetEpoch() != chains[0].Epoch {
			return fmt.Errorf("b's link to c: epoch %d, down %d ms", st.GetEpoch(), st.GetSuccessorDownMs())
		}
		return nil
	})
}
