package ingest

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
)

// chainMember is a fake replica whose chain view the test changes, and
// which can be made to hang (as a paused or partitioned process does: its
// connections stay open, nothing is answered).
type chainMember struct {
	catenapb.UnimplementedReplicaServer
	id   string
	hung atomic.Bool
	// slowChain: the head answers each append's offsets at once (the
	// early answer to answer_assigned) and never commits it, as a head
	// whose chain is slow (a loaded machine, a slow member) does.
	slowChain atomic.Bool
	// partitions it reports of stream s (0: one), all on the same chain;
	// appends to partition hungPartition+1 (0: none) are never answered.
	partitions    uint32
	hungPartition atomic.Uint32
	// features it reports in Status.
	features []string

	mu      sync.Mutex
	epoch   uint64
	members []*catenapb.Member
	next    uint64 // next offset it gives
	appends int    // requests it answered
	reports []*catenapb.ReportHeadUnreachableRequest
}

func (m *chainMember) ReportHeadUnreachable(_ context.Context, req *catenapb.ReportHeadUnreachableRequest) (*catenapb.ReportHeadUnreachableResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reports = append(m.reports, req)
	return &catenapb.ReportHeadUnreachableResponse{}, nil
}

func (m *chainMember) headReports() []*catenapb.ReportHeadUnreachableRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.reports)
}

func (m *chainMember) view(epoch uint64, members []*catenapb.Member) {
	m.mu.Lock()
	m.epoch, m.members = epoch, members
	m.mu.Unlock()
}

// serveChain serves each member and has every one see the chain of all of
// them, in order, at epoch; it returns their addresses and the chain.
func serveChain(t *testing.T, epoch uint64, chain ...*chainMember) ([]string, []*catenapb.Member) {
	t.Helper()
	addrs := make([]string, len(chain))
	members := make([]*catenapb.Member, len(chain))
	for i, m := range chain {
		addrs[i] = serveReplica(t, m)
		members[i] = &catenapb.Member{Id: m.id, Addr: addrs[i]}
	}
	for _, m := range chain {
		m.view(epoch, members)
	}
	return addrs, members
}

func (m *chainMember) answered() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.appends
}

func (m *chainMember) Status(ctx context.Context, _ *catenapb.StatusRequest) (*catenapb.StatusResponse, error) {
	if m.hung.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := max(m.partitions, 1)
	resp := &catenapb.StatusResponse{ReplicaId: m.id, Features: m.features}
	for p := range n {
		resp.Partitions = append(resp.Partitions, &catenapb.PartitionStatus{
			Stream: "s", Partition: p, ReplicaId: m.id, Epoch: m.epoch, Members: m.members,
			Config: &catenapb.StreamConfig{Partitions: n},
		})
	}
	return resp, nil
}

func (m *chainMember) AppendStream(stream catenapb.Replica_AppendStreamServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		if m.hung.Load() || m.hungPartition.Load() == req.GetPartition()+1 {
			continue // received, never answered
		}
		resp, err := m.assign(req)
		if err != nil {
			return err
		}
		if m.slowChain.Load() && req.GetAnswerAssigned() {
			resp.Assigned, resp.Committed = true, 0
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// assign gives req's records the next offsets: the answer of a head that
// committed them at once, under the epoch of its view.
func (m *chainMember) assign(req *catenapb.AppendRequest) (*catenapb.AppendResponse, error) {
	_, recs, err := partlog.DecodeBatch(req.GetFrame())
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	resp := &catenapb.AppendResponse{RequestId: req.GetRequestId(), Epoch: m.epoch}
	for range recs {
		resp.Offsets = append(resp.Offsets, m.next)
		resp.Duplicate = append(resp.Duplicate, false)
		m.next++
	}
	resp.Committed = m.next
	m.appends++
	return resp, nil
}

// startIngestion runs ingestion over the fake replicas at addrs, with
// discovery rounds an hour apart (only what a test asks for refreshes it).
func startIngestion(t *testing.T, addrs []string) *Server {
	t.Helper()
	return startIngestionWith(t, Options{Replicas: addrs})
}

// quietStall is the StallAfter of tests that assert no head is reported:
// with the default 150 ms, a pause of the test process that long (seen
// on loaded CI machines) delays a head's answer into a report.
const quietStall = time.Second

// startIngestionWith is startIngestion with opts (discovery rounds an
// hour apart unless set).
func startIngestionWith(t *testing.T, opts Options) *Server {
	t.Helper()
	if opts.RefreshInterval == 0 {
		opts.RefreshInterval = time.Hour
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// produceAsync produces one record through s in the background; the
// channel gets its outcome.
func produceAsync(ctx context.Context, s *Server) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := s.Produce(ctx, &catenapb.ProduceRequest{Stream: "s", Records: []*catenapb.ProduceRecord{{Key: []byte("k"), Value: []byte("v")}}})
		done <- err
	}()
	return done
}

// expectAnsweredBy waits for the produce whose outcome done carries and
// checks that it succeeded at head, the chain's new head, in one append.
func expectAnsweredBy(t *testing.T, done <-chan error, head *chainMember) {
	t.Helper()
	if err := <-done; err != nil {
		t.Fatalf("produce once the chain moved to %s: %v", head.id, err)
	}
	if n := head.answered(); n != 1 {
		t.Fatalf("the new head %s answered %d appends, want 1", head.id, n)
	}
}

// firstHeadReport waits until m has been told a head is unreachable and
// returns the first such report; it fails the test when ctx ends first.
func firstHeadReport(t *testing.T, ctx context.Context, m *chainMember) *catenapb.ReportHeadUnreachableRequest {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if r := m.headReports(); len(r) > 0 {
			return r[0]
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s was never told that its predecessor, the head, cannot be reached", m.id)
		case <-tick.C:
		}
	}
}

// TestAStalledAppendRelearnsTheChain: a head that hangs (paused, cut off)
// never fails the append stream, so ingestion must itself look for the
// chain's next epoch while an append goes unanswered, not wait for its
// periodic discovery round: that wait came on top of the failure timeout
// and kept an isolated head's partition from writes for 3.2 s in the fault
// campaign. Here discovery rounds are an hour apart, so only a refresh the
// stall asks for can move the append to the new head.
func TestAStalledAppendRelearnsTheChain(t *testing.T) {
	head, next := &chainMember{id: "head"}, &chainMember{id: "next"}
	addrs, both := serveChain(t, 1, head, next)

	s := startIngestion(t, addrs)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	produce := func(what string) *catenapb.ProduceResponse {
		t.Helper()
		resp, err := s.Produce(ctx, &catenapb.ProduceRequest{Stream: "s", Records: []*catenapb.ProduceRecord{{Key: []byte("k"), Value: []byte(what)}}})
		if err != nil {
			t.Fatalf("produce %s: %v", what, err)
		}
		return resp
	}
	produce("before")
	if head.answered() != 1 {
		t.Fatalf("the head answered %d appends, want 1", head.answered())
	}

	// The head hangs; the chain master moves the chain to epoch 2 without
	// it. Nothing tells ingestion but the members' reports.
	head.hung.Store(true)
	next.view(2, both[1:])
	produce("after")
	if next.answered() != 1 {
		t.Fatalf("the new head answered %d appends, want 1", next.answered())
	}
}

// TestAStalledAppendReportsTheHead: while its appends to the head go
// unanswered, ingestion tells the head's successor (the head has no
// predecessor to witness against it), naming the head, the epoch and how
// long; the chain master reads it from the successor's Status.
func TestAStalledAppendReportsTheHead(t *testing.T) {
	head, next := &chainMember{id: "head"}, &chainMember{id: "next"}
	addrs, both := serveChain(t, 5, head, next)
	s := startIngestion(t, addrs)
	head.hung.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := produceAsync(ctx, s)
	got := firstHeadReport(t, ctx, next)
	if got.GetHeadId() != "head" || got.GetEpoch() != 5 || got.GetStream() != "s" || got.GetPartition() != 0 || got.GetDownMs() < uint64(stallAfter.Milliseconds()) || got.GetReporter() == "" {
		t.Fatalf("report %v: want head \"head\" at epoch 5, down for at least %s, a reporter", got, stallAfter)
	}
	if r := head.headReports(); len(r) != 0 {
		t.Fatalf("the head itself was sent %d reports", len(r))
	}
	// The head answers again: the append completes there.
	head.hung.Store(false)
	next.view(6, both) // a newer epoch ends the hung session; the head is still head
	head.view(6, both)
	if err := <-done; err != nil {
		t.Fatalf("produce after the head came back: %v", err)
	}
}

// A head that assigned the append's offsets answered: it is reachable, and
// the wait for the commit is the chain's, which the master's probes of the
// members judge. Under load every append waits past stallAfter, and
// reporting each head then cost every replica a report per partition
// every stallAfter (a twentieth of ingestion's CPU with 256 partitions).
func TestAHeadThatAnswersIsNotReportedWhileItsChainIsSlow(t *testing.T) {
	head, next := &chainMember{id: "head"}, &chainMember{id: "next"}
	addrs, _ := serveChain(t, 5, head, next)
	head.slowChain.Store(true)
	s := startIngestionWith(t, Options{Replicas: addrs, StallAfter: quietStall})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := produceAsync(ctx, s)
	deadline := time.Now().Add(3 * quietStall)
	for time.Now().Before(deadline) {
		if head.answered() > 0 && len(next.headReports()) > 0 {
			t.Fatalf("a head that answered with the offsets was reported unreachable: %v", next.headReports()[0])
		}
		time.Sleep(10 * time.Millisecond)
	}
	if head.answered() == 0 {
		t.Fatal("the head never saw the append")
	}
	select {
	case err := <-done:
		t.Fatalf("the append was answered though nothing committed it: %v", err)
	default:
	}
}

// TestAnAssignedAppendStillRelearnsTheChain: a head that assigned an
// append's offsets is reachable, but its chain may have moved on without
// it (the master removed it from the chain while ingestion could still
// reach it), and then the append waits forever. An assigned append asks
// discovery later than a silent head's (refreshAfter), but asks: here
// discovery rounds are an hour apart, so only that refresh can move the
// append to the new head.
func TestAnAssignedAppendStillRelearnsTheChain(t *testing.T) {
	head, next := &chainMember{id: "head"}, &chainMember{id: "next"}
	addrs, both := serveChain(t, 5, head, next)
	head.slowChain.Store(true)
	s := startIngestion(t, addrs)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := produceAsync(ctx, s)
	for head.answered() == 0 {
		select {
		case err := <-done:
			t.Fatalf("the append was answered though nothing committed it: %v", err)
		case <-ctx.Done():
			t.Fatal("the head never saw the append")
		case <-time.After(10 * time.Millisecond):
		}
	}
	next.view(6, both[1:])
	expectAnsweredBy(t, done, next)
}

// TestRefreshAfter: a silent head's append asks for a discovery round
// after stallAfter; an assigned one after four of its partition's usual
// round trips, never sooner than stallAfter nor later than the periodic
// round.
func TestRefreshAfter(t *testing.T) {
	interval := time.Second
	a := &appender{srv: &Server{disc: &discovery{interval: interval}, stallAfter: stallAfter}}
	for _, tc := range []struct {
		name      string
		assigned  bool
		roundTrip time.Duration
		want      time.Duration
	}{
		{"not assigned, quiet", false, 0, stallAfter},
		{"not assigned, loaded", false, 200 * time.Millisecond, stallAfter},
		{"assigned, no round trip yet", true, 0, stallAfter},
		{"assigned, quick chain", true, time.Millisecond, stallAfter},
		{"assigned, loaded chain", true, 100 * time.Millisecond, 400 * time.Millisecond},
		{"assigned, past the interval", true, 400 * time.Millisecond, interval},
	} {
		a.roundTrip = tc.roundTrip
		if got := a.refreshAfter(&sent{assigned: tc.assigned}); got != tc.want {
			t.Errorf("%s: refreshAfter = %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestAHeadThatAnswersOtherPartitionsIsNotReported: whether a head can be
// reached is a property of its process, which the master's detector
// judges (Health is per replica). A head that keeps answering appends to
// its other partitions is reachable, even while one partition's append
// waits past stallAfter for its offsets, as each does on a machine loaded
// past its capacity (256 partitions at full speed on two cores). Reporting
// it then gave the master its second witness the moment the head also
// missed a probe, and it removed a live, busy head from every chain: a
// reconfiguration under load, for nothing.
func TestAHeadThatAnswersOtherPartitionsIsNotReported(t *testing.T) {
	head, next := &chainMember{id: "head", partitions: 2}, &chainMember{id: "next", partitions: 2}
	addrs, _ := serveChain(t, 5, head, next)
	head.hungPartition.Store(0 + 1)
	s := startIngestionWith(t, Options{Replicas: addrs, StallAfter: quietStall})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stuck := make(chan error, 1)
	go func() {
		p := uint32(0)
		_, err := s.Produce(ctx, &catenapb.ProduceRequest{Stream: "s", Records: []*catenapb.ProduceRecord{{Value: []byte("waits"), Partition: &p}}})
		stuck <- err
	}()
	// Partition 1's appends go on being answered, one after another.
	answered := 0
	for deadline := time.Now().Add(3 * quietStall); time.Now().Before(deadline); answered++ {
		p := uint32(1)
		if _, err := s.Produce(ctx, &catenapb.ProduceRequest{Stream: "s", Records: []*catenapb.ProduceRecord{{Value: []byte("answered"), Partition: &p}}}); err != nil {
			t.Fatalf("produce to partition 1: %v", err)
		}
	}
	if r := next.headReports(); len(r) != 0 {
		t.Fatalf("a head that answered %d appends to another partition meanwhile was reported unreachable: %v", answered, r[0])
	}
	// Once it answers nothing at all, it is reported.
	head.hung.Store(true)
	if got := firstHeadReport(t, ctx, next); got.GetHeadId() != "head" || got.GetPartition() != 0 {
		t.Fatalf("report %v: want the head, for partition 0", got)
	}
	select {
	case err := <-stuck:
		t.Fatalf("the append to the hung partition was answered: %v", err)
	default:
	}
}

// TestAHeadThatNeverConnectsIsReportedAndLeft: a head whose connection
// never completes (its packets dropped mid-handshake; here a listener that
// accepts and never speaks HTTP/2) keeps gRPC connecting for its connect
// timeout (5 s), and opening the append stream used to wait that long
// before anything else happened. The appender now reports the head while
// it waits, and leaves for the new epoch's head as soon as there is one.
func TestAHeadThatNeverConnectsIsReportedAndLeft(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var heldMu sync.Mutex
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			heldMu.Lock()
			held = append(held, c)
			heldMu.Unlock()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		heldMu.Lock()
		for _, c := range held {
			c.Close()
		}
		heldMu.Unlock()
	})
	next := &chainMember{id: "next"}
	nextAddr := serveReplica(t, next)
	both := []*catenapb.Member{{Id: "dark", Addr: lis.Addr().String()}, {Id: "next", Addr: nextAddr}}
	next.view(7, both)
	s, err := New(Options{Replicas: []string{nextAddr}, RefreshInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := produceAsync(ctx, s)
	first := firstHeadReport(t, ctx, next)
	// Reported while connecting, not after the attempt timed out.
	if first.GetHeadId() != "dark" || first.GetEpoch() != 7 || first.GetDownMs() >= 5000 {
		t.Fatalf("first report %v: want head \"dark\" at epoch 7, sent before the 5 s connect timeout", first)
	}
	next.view(8, both[1:])
	expectAnsweredBy(t, done, next)
}

// TestANewHeadIsNotReportedForTheOldOnesSilence: when the chain leaves a
// hung head, what the appender reports afterwards is about the head it
// actually failed to reach, never the new head it has not tried yet.
func TestANewHeadIsNotReportedForTheOldOnesSilence(t *testing.T) {
	old, head, tail := &chainMember{id: "old"}, &chainMember{id: "head"}, &chainMember{id: "tail"}
	addrs := []string{serveReplica(t, old), serveReplica(t, head), serveReplica(t, tail)}
	all := []*catenapb.Member{{Id: "old", Addr: addrs[0]}, {Id: "head", Addr: addrs[1]}, {Id: "tail", Addr: addrs[2]}}
	for _, m := range []*chainMember{old, head, tail} {
		m.view(1, all)
	}
	s := startIngestionWith(t, Options{Replicas: addrs, StallAfter: quietStall})
	old.hung.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := produceAsync(ctx, s)
	firstHeadReport(t, ctx, head) // the old head is reported to its successor
	head.view(2, all[1:])
	tail.view(2, all[1:])
	if err := <-done; err != nil {
		t.Fatalf("produce after the chain left the hung head: %v", err)
	}
	for _, r := range tail.headReports() {
		t.Errorf("the new head's successor was told the new head is unreachable: %v", r)
	}
}

// TestHeadersGoOnlyToChainsThatCanStoreThem: in a rolling upgrade a chain
// may still have a member of a version before record headers, which would
// refuse their frames and stall the chain; a produce with headers to it is
// refused with the member's name and stores nothing, one without headers
// goes through.
func TestHeadersGoOnlyToChainsThatCanStoreThem(t *testing.T) {
	head := &chainMember{id: "head", features: []string{contract.FeatureRecordHeaders}}
	old := &chainMember{id: "old"}
	addrs, _ := serveChain(t, 1, head, old)
	s := startIngestion(t, addrs)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := s.Produce(ctx, &catenapb.ProduceRequest{Stream: "s", Records: []*catenapb.ProduceRecord{{Value: []byte("v"), Headers: []*catenapb.RecordHeader{{Key: "h"}}}}})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "replica old") {
		t.Fatalf("headers to a chain with an old member: %v, want FailedPrecondition naming it", err)
	}
	if head.answered() != 0 {
		t.Fatalf("the refused produce reached the head")
	}
	if _, err := s.Produce(ctx, &catenapb.ProduceRequest{Stream: "s", Records: []*catenapb.ProduceRecord{{Value: []byte("v")}}}); err != nil {
		t.Fatalf("a produce without headers: %v", err)
	}
}

// TestReportsOfADeadHeadAreGatheredPerSuccessor: a head that stops
// answering leads many chains, and every one of their appenders reports it
// to the same successor every stallAfter. Those reports go in one call per
// successor (ReportHeadUnreachable's more chains): one call per chain was
// hundreds of calls a second to the successor of a dead head of hundreds
// of chains, while the master was removing it.
func TestReportsOfADeadHeadAreGatheredPerSuccessor(t *testing.T) {
	const n = 64
	head, next := &chainMember{id: "head", partitions: n}, &chainMember{id: "next", partitions: n}
	addrs, _ := serveChain(t, 1, head, next)
	s := startIngestion(t, addrs)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	produce := func(ctx context.Context, p uint32) error {
		_, err := s.Produce(ctx, &catenapb.ProduceRequest{Stream: "s", Records: []*catenapb.ProduceRecord{{Value: []byte("v"), Partition: &p}}})
		return err
	}
	for p := range uint32(n) {
		if err := produce(ctx, p); err != nil {
			t.Fatalf("produce to partition %d: %v", p, err)
		}
	}
	head.hung.Store(true)
	stalled, stop := context.WithCancel(ctx)
	defer stop()
	for p := range uint32(n) {
		go produce(stalled, p) //nolint:errcheck // these never complete: the head hangs
	}
	reported := map[uint32]bool{}
	var calls []*catenapb.ReportHeadUnreachableRequest
	for len(reported) < n {
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d chains reported to the head's successor in %d calls", len(reported), n, len(calls))
		case <-time.After(20 * time.Millisecond):
		}
		calls = next.headReports()
		for _, r := range calls {
			if r.GetHeadId() != "head" || r.GetEpoch() != 1 || r.GetStream() != "s" || r.GetDownMs() < uint64(stallAfter.Milliseconds()) {
				t.Fatalf("report %+v", r)
			}
			reported[r.GetPartition()] = true
			for _, c := range r.GetMore() {
				if c.GetEpoch() != 1 || c.GetStream() != "s" || c.GetDownMs() < uint64(stallAfter.Milliseconds()) {
					t.Fatalf("chain %+v in report %+v", c, r)
				}
				reported[c.GetPartition()] = true
			}
		}
	}
	if len(calls) > n/4 {
		t.Errorf("%d chains' reports took %d calls to the successor, want them gathered (at most %d)", n, len(calls), n/4)
	}
	t.Logf("%d chains reported in %d calls", n, len(calls))
}
