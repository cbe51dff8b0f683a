package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/client/clienttest"
	"github.com/catena-streams/catena/rpc/catenapb"
)

func setup(t *testing.T, partitions int) (*clienttest.Server, *client.Client) {
	t.Helper()
	srv := clienttest.Start(t)
	srv.AddStream("s", partitions)
	c, err := client.Dial(context.Background(), srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return srv, c
}

func waitAll(t *testing.T, fs []*client.Future) []client.Ack {
	t.Helper()
	acks := make([]client.Ack, len(fs))
	for i, f := range fs {
		select {
		case <-f.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("future %d not resolved", i)
		}
		a, err := f.Wait()
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		acks[i] = a
	}
	return acks
}

func TestProducerBatching(t *testing.T) {
	srv, c := setup(t, 1)
	p := client.NewProducer(c, "s", client.ProducerOptions{Linger: time.Hour, MaxBatchRecords: 100})
	defer p.Close()
	// First let the producer learn the partition count: the batch open
	// when it does is sent as it is (before any batch it routes itself),
	// which would make one more, shorter request below.
	first := p.Send(context.Background(), client.Record{Value: []byte("first")})
	if err := p.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Wait(); err != nil {
		t.Fatal(err)
	}
	var fs []*client.Future
	for i := range 1000 {
		fs = append(fs, p.Send(context.Background(), client.Record{Value: []byte(fmt.Sprint(i))}))
	}
	if err := p.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitAll(t, fs)
	reqs := srv.Requests()[1:]
	if len(reqs) != 10 {
		t.Fatalf("1000 records with MaxBatchRecords=100 took %d requests, want 10", len(reqs))
	}
	for _, r := range reqs {
		if len(r.Records) != 100 || r.ProducerId != p.ID() || r.ProducerId == 0 {
			t.Fatalf("request with %d records, producer %d (want 100, %d)", len(r.Records), r.ProducerId, p.ID())
		}
	}
}

func TestProducerBatchingByBytesAndLinger(t *testing.T) {
	srv, c := setup(t, 1)
	p := client.NewProducer(c, "s", client.ProducerOptions{Linger: 5 * time.Millisecond, MaxBatchBytes: 10 << 10})
	defer p.Close()
	val := make([]byte, 1000)
	var fs []*client.Future
	for range 200 {
		fs = append(fs, p.Send(context.Background(), client.Record{Value: val}))
	}
	// No Flush: the linger alone must send the tail.
	waitAll(t, fs)
	reqs := srv.Requests()
	if len(reqs) > 40 {
		t.Fatalf("200 records took %d requests; batching is not happening", len(reqs))
	}
	for _, r := range reqs {
		n := 0
		for _, rec := range r.Records {
			n += len(rec.Value)
		}
		if n > 10<<10 {
			t.Fatalf("request of %d value bytes exceeds MaxBatchBytes", n)
		}
	}
}

func TestProducerSequencesIncrease(t *testing.T) {
	srv, c := setup(t, 3)
	p := client.NewProducer(c, "s", client.ProducerOptions{MaxBatchRecords: 7})
	var fs []*client.Future
	for i := range 100 {
		fs = append(fs, p.Send(context.Background(), client.Record{Key: []byte(fmt.Sprint("k", i)), Value: []byte("v")}))
	}
	p.Close()
	waitAll(t, fs)
	seen := map[uint64]bool{}
	for _, r := range srv.Requests() {
		prev := uint64(0)
		for _, rec := range r.Records {
			if rec.Sequence <= prev || seen[rec.Sequence] {
				t.Fatalf("sequence %d not strictly increasing / unique", rec.Sequence)
			}
			prev = rec.Sequence
			seen[rec.Sequence] = true
		}
	}
	for i := 1; i < len(fs); i++ {
		if fs[i].Sequence() <= fs[i-1].Sequence() {
			t.Fatalf("future sequences not increasing at %d", i)
		}
	}
}

func TestProducerRetryAfterUnavailableIsIdempotent(t *testing.T) {
	srv, c := setup(t, 1)
	// First attempt: stored, but the response is lost.
	srv.DropResponses(1)
	p := client.NewProducer(c, "s", client.ProducerOptions{Linger: time.Hour, RetryBackoff: time.Millisecond})
	defer p.Close()
	var fs []*client.Future
	for i := range 5 {
		fs = append(fs, p.Send(context.Background(), client.Record{Value: []byte(fmt.Sprint(i))}))
	}
	if err := p.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	acks := waitAll(t, fs)
	reqs := srv.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2 (attempt + retry)", len(reqs))
	}
	for i := range reqs[0].Records {
		a, b := reqs[0].Records[i], reqs[1].Records[i]
		if reqs[0].ProducerId != reqs[1].ProducerId || a.Sequence != b.Sequence || string(a.Value) != string(b.Value) {
			t.Fatalf("retry changed producer id or sequence: %v vs %v", reqs[0], reqs[1])
		}
	}
	for i, a := range acks {
		if !a.Duplicate || a.Offset != uint64(i) {
			t.Fatalf("ack %d = %+v, want duplicate at offset %d", i, a, i)
		}
	}
	if n := len(srv.Records("s", 0)); n != 5 {
		t.Fatalf("%d records stored, want 5 (no duplicates)", n)
	}
}

func TestProducerRetryAfterRPCUnavailable(t *testing.T) {
	srv, c := setup(t, 1)
	srv.FailProduce(status.Error(codes.Unavailable, "no head"), status.Error(codes.Unavailable, "no head"))
	p := client.NewProducer(c, "s", client.ProducerOptions{RetryBackoff: time.Millisecond})
	defer p.Close()
	a, err := p.SendSync(context.Background(), client.Record{Key: []byte("k"), Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	if a.Duplicate || a.Offset != 0 || string(a.Key) != "k" || a.Stream != "s" {
		t.Fatalf("ack %+v", a)
	}
	reqs := srv.Requests()
	if len(reqs) != 3 || reqs[2].Records[0].Sequence != reqs[0].Records[0].Sequence {
		t.Fatalf("want 3 attempts with one sequence, got %d", len(reqs))
	}
}

func TestProducerPerRecordErrors(t *testing.T) {
	srv, c := setup(t, 2)
	srv.SetRecordHook(func(req *catenapb.ProduceRequest, i, attempt int) (codes.Code, string) {
		switch v := string(req.Records[i].Value); {
		case v == "bad":
			return codes.InvalidArgument, "bad record"
		case v == "flaky" && attempt == 1:
			return codes.FailedPrecondition, "epoch changed"
		case v == "gone":
			return codes.NotFound, "partition gone"
		}
		return codes.OK, ""
	})
	p := client.NewProducer(c, "s", client.ProducerOptions{Linger: time.Hour, RetryBackoff: time.Millisecond})
	defer p.Close()
	ctx := context.Background()
	vals := []string{"ok1", "bad", "flaky", "gone", "ok2"}
	var fs []*client.Future
	for _, v := range vals {
		fs = append(fs, p.Send(ctx, client.Record{Value: []byte(v), Partition: client.PartitionOf(1)}))
	}
	fs = append(fs, p.Send(ctx, client.Record{Value: []byte("nopart"), Partition: client.PartitionOf(9)}))
	fs = append(fs, p.Send(ctx, client.Record{Value: make([]byte, clienttest.MaxRecordBytes+1)}))
	p.Flush(ctx)
	want := []codes.Code{codes.OK, codes.InvalidArgument, codes.OK, codes.NotFound, codes.OK, codes.InvalidArgument, codes.ResourceExhausted}
	for i, f := range fs {
		a, err := f.Wait()
		if got := status.Code(err); got != want[i] {
			t.Fatalf("record %d: code %v (%v), want %v", i, got, err, want[i])
		}
		var re *client.RecordError
		if err != nil && !errors.As(err, &re) {
			t.Fatalf("record %d: error %T is not a RecordError", i, err)
		}
		if err == nil && a.Partition != 1 {
			t.Fatalf("record %d: partition %d, want 1", i, a.Partition)
		}
	}
	if _, err := fs[1].Wait(); !strings.Contains(err.Error(), "bad record") {
		t.Fatalf("error message lost: %q", err)
	}
	// Only the flaky record was retried, alone, with its sequence.
	sent := map[uint64]int{}
	for _, r := range srv.Requests() {
		for _, rec := range r.Records {
			sent[rec.Sequence]++
		}
	}
	for i, f := range fs {
		want := 1
		if i == 2 { // "flaky"
			want = 2
		}
		if sent[f.Sequence()] != want {
			t.Fatalf("record %d (seq %d) sent %d times, want %d", i, f.Sequence(), sent[f.Sequence()], want)
		}
	}
	if got := len(srv.Records("s", 1)); got != 3 {
		t.Fatalf("partition 1 has %d records, want 3", got)
	}
}

func TestProducerNonRetryableRPCError(t *testing.T) {
	_, c := setup(t, 1)
	p := client.NewProducer(c, "nope", client.ProducerOptions{})
	defer p.Close()
	_, err := p.SendSync(context.Background(), client.Record{Value: []byte("x")})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), `stream "nope" not found`) {
		t.Fatalf("err = %v", err)
	}
}

func TestProducerRetryTimeout(t *testing.T) {
	srv, c := setup(t, 1)
	srv.SetRecordHook(func(*catenapb.ProduceRequest, int, int) (codes.Code, string) {
		return codes.Unavailable, "chain reconfiguring"
	})
	p := client.NewProducer(c, "s", client.ProducerOptions{RetryTimeout: 150 * time.Millisecond, RetryBackoff: 5 * time.Millisecond})
	defer p.Close()
	start := time.Now()
	_, err := p.SendSync(context.Background(), client.Record{Value: []byte("x")})
	var te *client.RetryTimeoutError
	if !errors.As(err, &te) || status.Code(err) != codes.Unavailable || te.Attempts < 2 {
		t.Fatalf("err = %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("gave up after %v", el)
	}
}

func TestProducerFutureOrder(t *testing.T) {
	srv, c := setup(t, 1)
	p := client.NewProducer(c, "s", client.ProducerOptions{MaxInFlight: 1, MaxBatchRecords: 16})
	var fs []*client.Future
	for i := range 500 {
		fs = append(fs, p.Send(context.Background(), client.Record{Value: []byte(fmt.Sprint(i))}))
	}
	p.Close()
	acks := waitAll(t, fs)
	for i, a := range acks {
		if a.Offset != uint64(i) {
			t.Fatalf("ack %d has offset %d", i, a.Offset)
		}
	}
	// With several requests in flight each future still gets its own record.
	p2 := client.NewProducer(c, "s", client.ProducerOptions{MaxInFlight: 8, MaxBatchRecords: 16})
	fs = fs[:0]
	for i := range 500 {
		fs = append(fs, p2.Send(context.Background(), client.Record{Value: []byte(fmt.Sprint("b", i))}))
	}
	p2.Close()
	recs := srv.Records("s", 0)
	for i, a := range waitAll(t, fs) {
		if got := string(recs[a.Offset].Value); got != fmt.Sprint("b", i) {
			t.Fatalf("future %d resolved to offset %d holding %q", i, a.Offset, got)
		}
	}
}

func TestProducerInFlightPipelining(t *testing.T) {
	srv, c := setup(t, 1)
	release := srv.GateProduce()
	defer release()
	p := client.NewProducer(c, "s", client.ProducerOptions{MaxInFlight: 3, MaxBatchRecords: 1, Linger: -1})
	var fs []*client.Future
	for range 10 {
		fs = append(fs, p.Send(context.Background(), client.Record{Value: []byte("x")}))
	}
	// Three requests reach the (blocked) server; no more.
	eventually(t, func() bool { return len(srv.Requests()) >= 3 })
	if n := len(srv.Requests()); n != 3 {
		t.Fatalf("%d requests in flight, want 3", n)
	}
	release()
	waitAll(t, fs)
	p.Close()
}

func TestProducerFlushAndClose(t *testing.T) {
	_, c := setup(t, 1)
	p := client.NewProducer(c, "s", client.ProducerOptions{Linger: time.Hour})
	f1 := p.Send(context.Background(), client.Record{Value: []byte("a")})
	select {
	case <-f1.Done():
		t.Fatal("resolved before flush with an hour of linger")
	default:
	}
	if err := p.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-f1.Done():
	default:
		t.Fatal("Flush returned before the future resolved")
	}
	f2 := p.Send(context.Background(), client.Record{Value: []byte("b")})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if a, err := f2.Wait(); err != nil || a.Offset != 1 {
		t.Fatalf("record sent before Close: %+v %v", a, err)
	}
	if _, err := p.Send(context.Background(), client.Record{}).Wait(); !errors.Is(err, client.ErrProducerClosed) {
		t.Fatalf("send after close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Flush honours its context.
	srv2 := clienttest.Start(t)
	srv2.AddStream("s", 1)
	release := srv2.GateProduce()
	defer release()
	c2, _ := client.Dial(context.Background(), srv2.Addr)
	defer c2.Close()
	p2 := client.NewProducer(c2, "s", client.ProducerOptions{})
	p2.Send(context.Background(), client.Record{Value: []byte("x")})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := p2.Flush(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("flush with blocked server: %v", err)
	}
	release()
	p2.Close()
}

func TestProducerBackpressure(t *testing.T) {
	srv, c := setup(t, 1)
	release := srv.GateProduce()
	defer release()
	p := client.NewProducer(c, "s", client.ProducerOptions{MaxBufferedBytes: 4096})
	defer p.Close()
	f1 := p.Send(context.Background(), client.Record{Value: make([]byte, 3000)})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := p.Send(ctx, client.Record{Value: make([]byte, 3000)}).Wait(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send beyond the buffer: %v", err)
	}
	release()
	if _, err := f1.Wait(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendSync(context.Background(), client.Record{Value: make([]byte, 3000)}); err != nil {
		t.Fatal(err)
	}
}

func TestProducerIDRandom(t *testing.T) {
	_, c := setup(t, 1)
	a := client.NewProducer(c, "s", client.ProducerOptions{})
	b := client.NewProducer(c, "s", client.ProducerOptions{})
	defer a.Close()
	defer b.Close()
	if a.ID() == 0 || a.ID() == b.ID() {
		t.Fatalf("producer ids %d %d", a.ID(), b.ID())
	}
}

// eventually polls cond until it holds or a deadline passes.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatal("condition not reached before the deadline")
		}
	}
}

func TestAProducerSendsABurstOnceItsCallerPauses(t *testing.T) {
	srv, c := setup(t, 1)
	p := client.NewProducer(c, "s", client.ProducerOptions{Linger: 5 * time.Second, LingerIdle: 200 * time.Millisecond})
	defer p.Close()
	ctx := context.Background()
	if _, err := p.SendSync(ctx, client.Record{Value: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	// Records that keep coming gather for as long as they do...
	start := time.Now()
	var fs []*client.Future
	for i := range 10 {
		fs = append(fs, p.Send(ctx, client.Record{Value: []byte(fmt.Sprint(i))}))
		time.Sleep(10 * time.Millisecond)
	}
	// ...and leave once the caller pauses, not when Linger is up.
	waitAll(t, fs)
	if took := time.Since(start); took >= 5*time.Second {
		t.Fatalf("the burst waited %v, its whole linger", took)
	}
	reqs := srv.Requests()
	if len(reqs) != 2 || len(reqs[1].Records) != 10 {
		t.Fatalf("%d requests (the last of %d records), want the burst's 10 records in one", len(reqs), len(reqs[len(reqs)-1].Records))
	}
}
