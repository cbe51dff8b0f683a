package client_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/client/clienttest"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// switchingAddr is one address whose new connections go to one of two
// backends: what a Service's ClusterIP looks like from a pod before and
// after kube-proxy programs it, when the unprogrammed address reaches
// some other server (an egress proxy, an address reused).
type switchingAddr struct {
	addr  string
	wrong atomic.Bool
	wg    sync.WaitGroup
}

func newSwitchingAddr(t *testing.T, right, wrong string) *switchingAddr {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &switchingAddr{addr: lis.Addr().String()}
	s.wrong.Store(true)
	s.wg.Go(func() {
		for {
			in, err := lis.Accept()
			if err != nil {
				return
			}
			to := right
			if s.wrong.Load() {
				to = wrong
			}
			out, err := net.Dial("tcp", to)
			if err != nil {
				in.Close()
				continue
			}
			s.wg.Go(func() { _, _ = io.Copy(out, in); out.Close() })
			s.wg.Go(func() { _, _ = io.Copy(in, out); in.Close() })
		}
	})
	t.Cleanup(func() { lis.Close() })
	return s
}

// startHTTP2NotFound starts a cleartext HTTP/2 server that answers every
// request 404, as the egress proxy behind an unprogrammed ClusterIP did.
func startHTTP2NotFound(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), Protocols: new(http.Protocols)}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().String()
}

// A client whose connection reached a server that is not a gRPC server
// (HTTP/2 answers 404: gRPC reports Unimplemented, and the connection
// itself stays up, so gRPC never resolves or connects again) must not be
// stuck with it: once the address leads to the ingestion node, calls
// succeed. Found in the e2e suite, where an Aggregation's workers dialed
// the source's Service before kube-proxy knew it and got Unimplemented
// for the rest of the run.
func TestClientLeavesAServerThatIsNotGRPC(t *testing.T) {
	for name, read := range map[string]func(context.Context, *client.Client) error{
		"fetch": func(ctx context.Context, c *client.Client) error {
			r, err := c.Fetch(ctx, "s", 0, 0, 0, 0)
			if err == nil && len(r.Messages) != 1 {
				return fmt.Errorf("fetch read %d records, want 1", len(r.Messages))
			}
			return err
		},
		"subscribe": func(ctx context.Context, c *client.Client) error {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			sub, err := c.Subscribe(ctx, "s", 0, client.AtOffset(0))
			if err != nil {
				return err
			}
			defer sub.Close()
			_, err = sub.Next()
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			srv := clienttest.Start(t)
			srv.AddStream("s", 1)
			srv.Append("s", 0, &catenapb.Record{Value: []byte("v")})
			front := newSwitchingAddr(t, srv.Addr, startHTTP2NotFound(t))

			c, err := client.Dial(context.Background(), front.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			if err := read(ctx, c); status.Code(err) != codes.Unimplemented {
				t.Fatalf("read through the wrong server = %v, want Unimplemented", err)
			}
			front.wrong.Store(false)
			var last error
			eventually(t, func() bool {
				last = read(ctx, c)
				return last == nil
			})
		})
	}
}
