package server

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// Reach answers when the replica can connect to the one asked about, and
// says why not (UNAVAILABLE) when it cannot by the deadline: what the
// chain's master asks a tail before a replica joins behind it.
func TestReach(t *testing.T) {
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	ctx := context.Background()
	if _, err := connected(t, a).Reach(ctx, &catenapb.ReachRequest{Id: "b", Addr: b.addr}); err != nil {
		t.Fatalf("a reaches b: %v", err)
	}

	// An address nobody listens on any more.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := lis.Addr().String()
	lis.Close()
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = connected(t, a).Reach(cctx, &catenapb.ReachRequest{Id: "c", Addr: gone})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a reaches an address nobody listens on: %v, want UNAVAILABLE, before the caller's deadline", err)
	}
	if !strings.Contains(err.Error(), `"c"`) || !strings.Contains(err.Error(), gone) {
		t.Fatalf("the refusal does not name the replica and its address: %v", err)
	}

	for _, addr := range []string{"", "b", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:99999", ":7071"} {
		_, err := connected(t, a).Reach(ctx, &catenapb.ReachRequest{Id: "b", Addr: addr})
		if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() == "" {
			t.Errorf("Reach %q: %v, want INVALID_ARGUMENT with a reason", addr, err)
		}
	}
}
