package client_test

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// nullIngest acknowledges every record without storing it: it isolates
// the producer's own cost.
type nullIngest struct {
	catenapb.UnimplementedIngestServer
	mu   sync.Mutex
	next uint64
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
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := grpc.NewServer()
	catenapb.RegisterIngestServer(s, &nullIngest{})
	go s.Serve(lis)
	defer s.Stop()
	c, err := client.Dial(context.Background(), lis.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
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
