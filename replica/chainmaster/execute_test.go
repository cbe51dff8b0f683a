package chainmaster

import (
	"context"
	"net"
	"strings"
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
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(transport.ServerOptions(nil)...)
	catenapb.RegisterReplicaServer(g, srv)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
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
	old := serveReplica(t, &catenapb.UnimplementedReplicaServer{})
	for _, tc := range []struct {
		name    string
		pred    string
		wantErr bool
	}{{"reached", reaches, false}, {"not reached", cannot, true}, {"an older member", old, false}} {
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
