package client_test

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/producestream"
)

// nullIngest acknowledges every record without storing it: it isolates
// the producer's own cost.
type nullIngest struct {
	catenapb.UnimplementedIngestServer
	mu   sync.Mutex
	next uint64
	// unary: no ProduceStream, as an ingestion node older than it.
	unary bool
}

func (n *nullIngest) ProduceStream(st catenapb.Ingest_ProduceStreamServer) error {
	if n.unary {
		return status.Error(codes.Unimplemented, "no ProduceStream")
	}
	return producestream.Serve(st, n.Produce, nil)
}

func (n *nullIngest) Produce(_ context.Context, req *catenapb.ProduceRequest) (*catenapb.ProduceResponse, error) {
	n.mu.Lock()
	base := n.next
	n.next += uint64(len(req.Records))
	n.mu.Unlock()
	res := make([]catenapb.ProduceResult, len(req.Records))
	resp := &catenapb.ProduceResponse{Results: make([]*catenapb.ProduceResult, len(req.Records))}
	for i := range res {
		res[i].Offset = base + uint64(i)
		resp.Results[i] = &res[i]
	}
	return resp, nil
}

func BenchmarkProducerSend1KiB(b *testing.B) {
	c := nullServer(b, false)
	p := client.NewProducer(c, "s", client.ProducerOptions{})
	val := make([]byte, 1024)
	key := []byte("key")
	ctx := context.Background()
	b.SetBytes(1024)
	b.ReportAllocs()
	b.ResetTimer()
	var last *client.Future
	for range b.N {
		last = p.Send(ctx, client.Record{Key: key, Value: val})
	}
	if err := p.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := last.Wait(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	p.Close()
}

// nullServer serves nullIngest on a free loopback port until b ends.
func nullServer(b *testing.B, unary bool) *client.Client {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := grpc.NewServer()
	catenapb.RegisterIngestServer(s, &nullIngest{unary: unary})
	go s.Serve(lis)
	b.Cleanup(s.Stop)
	c, err := client.Dial(context.Background(), lis.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// BenchmarkProducerSendSync1KiB is one record at a time, each waited for
// (no linger, one request in flight): the producer's share of a
// synchronous write's latency, on its ProduceStream, and with unary calls
// (an ingestion node without the stream). BenchmarkProduceCall1KiB is the
// same request as a bare unary gRPC call, without the producer.
func BenchmarkProducerSendSync1KiB(b *testing.B) {
	for _, unary := range []bool{false, true} {
		name := "stream"
		if unary {
			name = "unary"
		}
		b.Run(name, func(b *testing.B) {
			c := nullServer(b, unary)
			p := client.NewProducer(c, "s", client.ProducerOptions{Linger: -1, MaxInFlight: 1})
			defer p.Close()
			rec := client.Record{Key: []byte("key"), Value: make([]byte, 1024)}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.SendSync(ctx, rec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkProduceCall1KiB(b *testing.B) {
	c := nullServer(b, true)
	ic := c.Ingest()
	ctx := context.Background()
	var seq uint64
	b.ReportAllocs()
	for b.Loop() {
		seq++
		req := &catenapb.ProduceRequest{Stream: "s", ProducerId: 1, Records: []*catenapb.ProduceRecord{{Key: []byte("key"), Value: make([]byte, 1024), Sequence: seq}}}
		if _, err := ic.Produce(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
