package transport

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
)

func TestBufferPool(t *testing.T) {
	p := &bufferPool{}
	for _, tc := range []struct {
		size, wantCap int
	}{
		{0, 256}, {1, 256}, {256, 256}, {257, 512}, {4096, 4096}, {600 << 10, 1 << 20},
		{64 << 20, 64 << 20}, {64<<20 + 1, 64<<20 + 1},
	} {
		b := p.Get(tc.size)
		if len(*b) != tc.size || cap(*b) != tc.wantCap {
			t.Errorf("Get(%d): len %d cap %d, want len %d cap %d", tc.size, len(*b), cap(*b), tc.size, tc.wantCap)
		}
		p.Put(b)
	}
	// A returned buffer serves a later request of its tier, at the length
	// asked for.
	b := p.Get(3000)
	(*b)[0] = 7
	p.Put(b)
	c := p.Get(2100)
	if len(*c) != 2100 || cap(*c) != 4096 {
		t.Errorf("Get(2100) after Put: len %d cap %d", len(*c), cap(*c))
	}
	// Buffers of a capacity that is not a tier are not kept.
	odd := make([]byte, 1000)
	p.Put(&odd)
	if d := p.Get(1000); cap(*d) != 1024 {
		t.Errorf("a 1000-byte buffer was pooled in the 1 KiB tier (cap %d)", cap(*d))
	}
}

// A server made with ServerOptions reads what it receives into the process
// pool. gRPC captures its default pool for servers when its own package is
// initialised, before SetDefaultBufferPool in this package's init runs, so
// without the explicit option every server read each HTTP/2 data frame
// into gRPC's pool, which clears every buffer it hands out: 10% of
// ingestion's CPU samples in a profile at full speed (2026-12-05; end to
// end within the machine's noise), though the comment above said every
// server used this pool.
func TestServersReadIntoTheProcessPool(t *testing.T) {
	var gets atomic.Int64
	count := func(int) { gets.Add(1) }
	testHookGet.Store(&count)
	t.Cleanup(func() { testHookGet.Store(nil) })

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(ServerOptions(nil)...)
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	// The client reads into a pool of its own: only the server's reads
	// (and the client's encoding of the request) come from the process
	// pool.
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		experimental.WithBufferPool(mem.NopBufferPool{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Connect first, so that the count below is the call's alone.
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health check: %v", err)
	}

	// A 1 MiB request arrives in HTTP/2 data frames of at most 16 KiB: 64
	// or more reads by the server.
	before := gets.Load()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: strings.Repeat("x", 1<<20)})
	if err == nil {
		t.Fatal("a check of an unknown service passed")
	}
	if n := gets.Load() - before; n < 64 {
		t.Errorf("%d buffers were taken from the process pool for a 1 MiB request, want at least 64 (one per data frame the server read)", n)
	}
}
