package ingest

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// fakeMember is a chain member that reports a fixed chain and answers
// reads with a fixed committed offset.
type fakeMember struct {
	catenapb.UnimplementedReplicaServer
	id        string
	committed uint64
	chain     func() []*catenapb.Member

	mu    sync.Mutex
	waits []uint32 // max_wait_ms of each read received
}

// serveReplica serves a fake replica on a loopback port until the test
// ends and returns its address.
func serveReplica(t *testing.T, srv catenapb.ReplicaServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	catenapb.RegisterReplicaServer(g, srv)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

func (f *fakeMember) Status(context.Context, *catenapb.StatusRequest) (*catenapb.StatusResponse, error) {
	return &catenapb.StatusResponse{ReplicaId: f.id, Partitions: []*catenapb.PartitionStatus{{
		Stream: "s", Partition: 0, ReplicaId: f.id, Epoch: 1, Members: f.chain(),
		Config: &catenapb.StreamConfig{Partitions: 1}, Committed: f.committed,
	}}}, nil
}

func (f *fakeMember) Read(_ context.Context, req *catenapb.FetchRequest) (*catenapb.FetchResponse, error) {
	f.mu.Lock()
	f.waits = append(f.waits, req.GetMaxWaitMs())
	f.mu.Unlock()
	return &catenapb.FetchResponse{Committed: f.committed}, nil
}

func (f *fakeMember) reads() []uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]uint32(nil), f.waits...)
}

// startAheadBehind runs ingestion over the chain [ahead behind], committed 9
// and 5: the tail, read first, is the one behind (as the old tail is, a
// moment after a returning member joined behind it).
func startAheadBehind(t *testing.T) (*Server, *fakeMember, *fakeMember) {
	t.Helper()
	ahead := &fakeMember{id: "ahead", committed: 9}
	behind := &fakeMember{id: "behind", committed: 5}
	addrs := []string{serveReplica(t, ahead), serveReplica(t, behind)}
	chain := func() []*catenapb.Member {
		return []*catenapb.Member{{Id: "ahead", Addr: addrs[0]}, {Id: "behind", Addr: addrs[1]}}
	}
	ahead.chain, behind.chain = chain, chain
	s, err := New(Options{Replicas: addrs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, ahead, behind
}

// TestFetchSeesWhatItAcknowledged: a read through ingestion never answers
// with less committed than ingestion acknowledged when a member knows
// more, and a read of offsets known committed does not long-poll.
func TestFetchSeesWhatItAcknowledged(t *testing.T) {
	s, ahead, behind := startAheadBehind(t)
	ctx := context.Background()
	fetch := func(offset uint64, waitMs uint32) uint64 {
		t.Helper()
		resp, err := s.Fetch(ctx, &catenapb.FetchRequest{Stream: "s", Partition: 0, Offset: offset, MaxWaitMs: waitMs})
		if err != nil {
			t.Fatalf("fetch at %d: %v", offset, err)
		}
		return resp.GetCommitted()
	}

	if got := fetch(0, 0); got != 5 {
		t.Errorf("nothing acknowledged: committed %d, want the tail's 5 (read first)", got)
	}
	if n := len(ahead.reads()); n != 0 {
		t.Errorf("nothing acknowledged, yet the member ahead was read %d times", n)
	}
	s.appenderFor("s", 0).acknowledged(8)
	if got := fetch(0, 0); got != 9 {
		t.Errorf("acknowledged up to 8: committed %d, want 9 from the member ahead", got)
	}
	s.appenderFor("s", 0).acknowledged(12)
	if got := fetch(0, 0); got != 9 {
		t.Errorf("acknowledged up to 12, no member knows: committed %d, want the best answer, 9", got)
	}
	s.appenderFor("s", 0).acknowledged(3) // never backwards
	if got := s.committedSeen("s", 0); got != 12 {
		t.Errorf("committed seen went from 12 to %d", got)
	}
	fetch(4, 5000)
	for _, f := range []*fakeMember{ahead, behind} {
		r := f.reads()
		if w := r[len(r)-1]; w != 0 {
			t.Errorf("%s: a read below the acknowledged offset long-polled (max_wait_ms %d)", f.id, w)
		}
	}
}

func (f *fakeMember) ListOffsets(_ context.Context, req *catenapb.ListOffsetsRequest) (*catenapb.ListOffsetsResponse, error) {
	if req.GetSpec() == catenapb.OffsetSpec_OFFSET_SPEC_LATEST {
		return &catenapb.ListOffsetsResponse{Offset: f.committed}, nil
	}
	return &catenapb.ListOffsetsResponse{}, nil
}

// TestLatestOffsetSeesWhatItAcknowledged: the latest offset through
// ingestion is never below what ingestion acknowledged. A producer is
// answered on the tail's completion, a round trip before the other members
// learn the commit; a ListOffsets right after (the Kafka listener's lookup
// by timestamp does one) answered a member's older committed offset and
// took the acknowledged records for not there yet (TestListOffsetsByTimestamp
// failed that way in CI).
func TestLatestOffsetSeesWhatItAcknowledged(t *testing.T) {
	s, _, _ := startAheadBehind(t)
	latest := func() uint64 {
		t.Helper()
		resp, err := s.ListOffsets(context.Background(), &catenapb.ListOffsetsRequest{Stream: "s", Partition: 0, Spec: catenapb.OffsetSpec_OFFSET_SPEC_LATEST})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOffset()
	}
	if got := latest(); got != 5 {
		t.Errorf("nothing acknowledged: latest %d, want the tail's 5 (read first)", got)
	}
	s.appenderFor("s", 0).acknowledged(8)
	if got := latest(); got != 9 {
		t.Errorf("acknowledged up to 8: latest %d, want 9 from the member ahead", got)
	}
	s.appenderFor("s", 0).acknowledged(12)
	if got := latest(); got != 12 {
		t.Errorf("acknowledged up to 12, no member knows: latest %d, want 12 (acknowledged means committed)", got)
	}
}
