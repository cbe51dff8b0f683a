package transport_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/catena-streams/catena/rpc/transport"
)

// silentListener accepts connections and never says a word: what a
// connection attempt meets at an address that a pod network forwards into
// a void, or a peer wedged before its handshake.
func silentListener(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = lis.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	return lis.Addr().String()
}

// A name that first resolves to an address nobody answers at (a replica
// pod that came back on another node, while DNS still gives its old
// address) must not hold the connection: the attempt gives up, the name is
// resolved again, and the connection reaches the new address.
func TestAStaleAddressIsGivenUpAndTheNameResolvedAgain(t *testing.T) {
	srv := grpc.NewServer(transport.ServerOptions(nil)...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	stale, live := silentListener(t), lis.Addr().String()
	var resolves atomic.Int32
	r := manual.NewBuilderWithScheme("stale")
	r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: stale}}})
	r.ResolveNowCallback = func(resolver.ResolveNowOptions) {
		if resolves.Add(1) == 1 {
			go r.UpdateState(resolver.State{Addresses: []resolver.Address{{Addr: live}}})
		}
	}
	conn, err := transport.Dial("stale:///replica-1", nil, grpc.WithResolvers(r))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("no answer from the name's new address: %v (resolved again %d times)", err, resolves.Load())
	}
	if resolves.Load() == 0 {
		t.Fatal("answered without resolving the name again")
	}
	t.Logf("reached the new address after %v (one attempt at the stale one, bounded by %v)", time.Since(start), transport.MinConnectTimeout)
}
