package client_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/client/clienttest"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
)

// sendAndSee sends r synchronously and returns the last record of the
// last request srv received: r as it went on the wire.
func sendAndSee(t *testing.T, p *client.Producer, srv *clienttest.Server, r client.Record) *catenapb.ProduceRecord {
	t.Helper()
	if _, err := p.SendSync(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	reqs := srv.Requests()
	last := reqs[len(reqs)-1]
	return last.Records[len(last.Records)-1]
}

// partitionsOf returns the distinct partitions a request's records name
// (-1 for records that name none).
func partitionsOf(r *catenapb.ProduceRequest) map[int64]int {
	out := map[int64]int{}
	for _, rec := range r.Records {
		p := int64(-1)
		if rec.Partition != nil {
			p = int64(*rec.Partition)
		}
		out[p]++
	}
	return out
}

// Once an answer tells the producer the stream's partition count, it
// routes records itself and a backlog leaves as whole per-partition
// batches: a request carries a few partitions' records, not a thin slice
// of every partition's.
func TestProducerBatchesPerPartitionOnceItKnowsTheCount(t *testing.T) {
	const parts = 64
	srv, c := setup(t, parts)
	p := client.NewProducer(c, "s", client.ProducerOptions{MaxBatchBytes: 16 << 10, PartitionBatchBytes: 4 << 10, MaxInFlight: 1})
	defer p.Close()
	ctx := context.Background()
	if _, err := p.SendSync(ctx, client.Record{Key: []byte("first"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	release := srv.GateProduce()
	val := make([]byte, 1000)
	var fs []*client.Future
	for i := range 8 * parts {
		fs = append(fs, p.Send(ctx, client.Record{Key: []byte(fmt.Sprint("k", i%(4*parts))), Value: val}))
	}
	release()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	acks := waitAll(t, fs)
	for i, a := range acks {
		if want := contract.PartitionFor([]byte(fmt.Sprint("k", i%(4*parts))), parts); a.Partition != want {
			t.Fatalf("record %d stored in partition %d, its key's is %d", i, a.Partition, want)
		}
	}
	// Batches of 4 KiB hold three of these records, and each partition
	// has eight: whole batches average well above two records a
	// partition per request. Slices of a backlog in send order (what
	// ingestion's routing gets) average about one: 16 records over 64
	// partitions. The first request after SendSync's is left out: it was
	// cut while the records were still being sent (whenever the
	// producer's loop ran, which a loaded machine decides) and waited at
	// the gate; every later one was cut after all of them were sent.
	reqs := srv.Requests()[2:]
	pairs, recs := 0, 0
	for i, r := range reqs {
		ps := partitionsOf(r)
		if _, ok := ps[-1]; ok {
			t.Fatalf("request %d carries records the producer did not route, after it learned the count", i)
		}
		pairs += len(ps)
		recs += len(r.Records)
	}
	if perPartition := float64(recs) / float64(pairs); perPartition < 2.5 {
		t.Fatalf("requests carry %.1f records per partition, want whole batches (about 3)", perPartition)
	}
}

// Each key's records are stored in the order they were sent, while the
// producer switches from ingestion's routing to its own, with several
// requests in flight.
func TestProducerKeepsEachKeysOrderWhenItStartsRouting(t *testing.T) {
	const parts = 16
	srv, c := setup(t, parts)
	p := client.NewProducer(c, "s", client.ProducerOptions{MaxBatchBytes: 8 << 10, PartitionBatchBytes: 2 << 10, MaxInFlight: 6})
	ctx := context.Background()
	release := srv.GateProduce()
	var fs []*client.Future
	send := func(n int) {
		for i := range n {
			fs = append(fs, p.Send(ctx, client.Record{Key: []byte(fmt.Sprint("k", i%40)), Value: []byte(fmt.Sprint(len(fs)))}))
		}
	}
	send(3000) // before any answer: unrouted, most still queued when it comes
	release()
	if _, err := fs[0].Wait(); err != nil {
		t.Fatal(err)
	}
	send(3000)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	waitAll(t, fs)
	routed := 0
	for _, r := range srv.Requests() {
		for _, rec := range r.Records {
			if rec.Partition != nil {
				routed++
			}
		}
	}
	if routed == 0 {
		t.Fatal("the producer never routed a record itself")
	}
	for part := range parts {
		last := map[string]int{}
		for _, rec := range srv.Records("s", part) {
			var n int
			fmt.Sscan(string(rec.Value), &n)
			if prev, ok := last[string(rec.Key)]; ok && n < prev {
				t.Fatalf("partition %d: key %s's record %d stored after its record %d", part, rec.Key, n, prev)
			}
			last[string(rec.Key)] = n
		}
	}
}

// A refused request (a stream re-created with fewer partitions refuses the
// ones past its count) stops the producer's own routing until the next
// answer.
func TestProducerStopsRoutingWhenARequestIsRefused(t *testing.T) {
	srv, c := setup(t, 4)
	p := client.NewProducer(c, "s", client.ProducerOptions{})
	defer p.Close()
	ctx := context.Background()
	if _, err := p.SendSync(ctx, client.Record{Key: []byte("a"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	srv.FailProduce(status.Error(codes.InvalidArgument, "record 0 names partition 3, but stream \"s\" has 2 partitions; nothing was stored"))
	if _, err := p.SendSync(ctx, client.Record{Key: []byte("b"), Value: []byte("v")}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("refused record: %v", err)
	}
	if _, err := p.SendSync(ctx, client.Record{Key: []byte("c"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	reqs := srv.Requests()
	if last := reqs[len(reqs)-1]; last.Records[0].Partition != nil {
		t.Fatalf("after a refusal the producer still routes: %v", last.Records[0])
	}
	if second := reqs[1]; second.Records[0].Partition == nil {
		t.Fatal("after the first answer the producer did not route")
	}
}

// An answer without the partition count (an older ingestion node, behind
// the same address in a rolling upgrade, orders requests by sequence only)
// stops the producer's routing until an answer gives the count again.
func TestProducerStopsRoutingForAnOlderIngestion(t *testing.T) {
	srv, c := setup(t, 4)
	p := client.NewProducer(c, "s", client.ProducerOptions{})
	defer p.Close()
	send := func(key string) *catenapb.ProduceRecord {
		t.Helper()
		return sendAndSee(t, p, srv, client.Record{Key: []byte(key), Value: []byte("v")})
	}
	send("a")
	if r := send("b"); r.Partition == nil {
		t.Fatal("after an answer with the count the producer did not route")
	}
	srv.AnswerWithoutPartitionCount(true)
	send("c") // routed still: the producer learns from this answer
	if r := send("d"); r.Partition != nil {
		t.Fatal("after an answer without the count the producer still routes")
	}
	srv.AnswerWithoutPartitionCount(false)
	send("e")
	if r := send("f"); r.Partition == nil {
		t.Fatal("the count came back and the producer did not route again")
	}
}

// A producer of records without key or partition leaves their routing to
// ingestion (whose sticky partition is shared by every producer) until it
// is sent one with a key; from then on it routes every record itself.
func TestProducerRoutesOnlyOnceItHasAKeyedRecord(t *testing.T) {
	srv, c := setup(t, 4)
	p := client.NewProducer(c, "s", client.ProducerOptions{})
	defer p.Close()
	for range 3 {
		if sendAndSee(t, p, srv, client.Record{Value: []byte("v")}).Partition != nil {
			t.Fatal("a keyless producer routed its records itself")
		}
	}
	if sendAndSee(t, p, srv, client.Record{Key: []byte("k"), Value: []byte("v")}).Partition == nil {
		t.Fatal("a keyed record after the count was known was not routed")
	}
	if sendAndSee(t, p, srv, client.Record{Value: []byte("v")}).Partition == nil {
		t.Fatal("once routing, a keyless record was left to ingestion")
	}
}
