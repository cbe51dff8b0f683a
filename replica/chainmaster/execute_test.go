package chainmaster

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// reachServer is a replica that answers Reach with err (nil: reached),
// or, old, does not know the call.
type reachServer struct {
	catenapb.UnimplementedReplicaServer
	err error
}

func (s reachServer) Reach(context.Context, *catenapb.ReachRequest) (*catenapb.ReachResponse, error) {
	return &catenapb.ReachResponse{}, s.err
}

func serveReplica(t *testing.T, srv catenapb.ReplicaServer) string {
	t.Helper()
	return serveDesc(t, &catenapb.Replica_ServiceDesc, srv)
}

// serveDesc serves srv as desc describes the Replica service, under
// opts (an authorization policy's interceptors).
func serveDesc(t *testing.T, desc *grpc.ServiceDesc, srv catenapb.ReplicaServer, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(append(transport.ServerOptions(nil), opts...)...)
	g.RegisterService(desc, srv)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// olderReplica is the Replica service of a build without Reach.
func olderReplica() *grpc.ServiceDesc {
	desc := catenapb.Replica_ServiceDesc
	desc.Methods = slices.DeleteFunc(slices.Clone(desc.Methods), func(m grpc.MethodDesc) bool { return m.MethodName == "Reach" })
	return &desc
}

// CheckJoins passes a plan whose joiners the members they join behind
// reach, or that an older member (no Reach) cannot tell about, and stops
// one whose joiner is not reached, naming both.
func TestCheckJoins(t *testing.T) {
	pool := transport.NewPool(nil)
	t.Cleanup(pool.Close)
	exec := Executor{Conns: pool, Log: logr.Discard()}
	reaches := serveReplica(t, reachServer{})
	cannot := serveReplica(t, reachServer{err: status.Error(codes.Unavailable, "replica b cannot reach replica \"c\" at c:1: context deadline exceeded")})
	old := serveDesc(t, olderReplica(), &catenapb.UnimplementedReplicaServer{})
	// gRPC answers a method its server does not register before any
	// interceptor runs: an older replica's authorization policy never
	// sees the call. A policy that refuses the master is a refusal.
	denyAll := &transport.Policy{Classes: map[string]string{}}
	oldTLS := serveDesc(t, olderReplica(), &catenapb.UnimplementedReplicaServer{}, denyAll.ServerOptions()...)
	denied := serveDesc(t, &catenapb.Replica_ServiceDesc, reachServer{}, denyAll.ServerOptions()...)
	for _, tc := range []struct {
		name    string
		pred    string
		wantErr bool
	}{{"reached", reaches, false}, {"not reached", cannot, true}, {"an older member", old, false},
		{"an older member under an authorization policy", oldTLS, false}, {"a member whose policy refuses the master", denied, true}} {
		r := &Repair{Joins: []Join{{Pred: "b", PredAddr: tc.pred, Member: "c", MemberAddr: "c:1"}}}
		err := exec.CheckJoins(context.Background(), r)
		switch {
		case tc.wantErr && (err == nil || !strings.Contains(err.Error(), "b, which c would join behind, cannot reach it yet")):
			t.Errorf("%s: %v, want an error naming both", tc.name, err)
		case !tc.wantErr && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if err := exec.CheckJoins(context.Background(), &Repair{}); err != nil {
		t.Errorf("a plan without joins: %v", err)
	}
}

// A pair that failed is not asked again for RecheckAfter: the joiner of
// many chains behind one tail costs one call, not one per chain.
func TestJoinCheckRemembersAFailedPair(t *testing.T) {
	pool := transport.NewPool(nil)
	t.Cleanup(pool.Close)
	exec := Executor{Conns: pool, Log: logr.Discard()}
	var calls atomic.Int32
	srv := &countingReach{calls: &calls}
	srv.err.Store(status.Error(codes.Unavailable, "cannot reach c"))
	addr := serveReplica(t, srv)
	var jc JoinCheck
	r := &Repair{Joins: []Join{{Pred: "b", PredAddr: addr, Member: "c", MemberAddr: "c:1"}}}
	for i := range 5 {
		asked, err := jc.Check(context.Background(), exec, r)
		if err == nil || asked != (i == 0) {
			t.Fatalf("check %d: asked %v, %v; want an error, asked only the first time", i, asked, err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d calls for five checks within RecheckAfter, want 1", n)
	}
	srv.reached.Store(true)
	jc.mu.Lock()
	for k, f := range jc.failed {
		f.at = f.at.Add(-RecheckAfter)
		jc.failed[k] = f
	}
	jc.mu.Unlock()
	if asked, err := jc.Check(context.Background(), exec, r); err != nil || !asked || calls.Load() != 2 {
		t.Fatalf("after RecheckAfter: asked %v, %v, %d calls; want it asked again and reached", asked, err, calls.Load())
	}
}

type countingReach struct {
	catenapb.UnimplementedReplicaServer
	calls   *atomic.Int32
	err     atomic.Value // error, unless reached
	reached atomic.Bool
}

func (s *countingReach) Reach(context.Context, *catenapb.ReachRequest) (*catenapb.ReachResponse, error) {
	s.calls.Add(1)
	if err, _ := s.err.Load().(error); err != nil && !s.reached.Load() {
		return nil, err
	}
	return &catenapb.ReachResponse{}, nil
}
