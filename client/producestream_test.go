package client_test

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/client"
)

func TestProducerSendsItsRequestsOnOneStream(t *testing.T) {
	srv, c := setup(t, 2)
	p := client.NewProducer(c, "s", client.ProducerOptions{Linger: -1, MaxInFlight: 4})
	defer p.Close()
	for i := range 20 {
		if _, err := p.SendSync(context.Background(), client.Record{Key: []byte(fmt.Sprint(i)), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(srv.Requests()); n != 20 {
		t.Fatalf("%d requests, want 20", n)
	}
	if n := srv.ProduceStreams(); n != 1 {
		t.Fatalf("%d produce streams for 20 requests, want 1", n)
	}
}

func TestProducerFallsBackToUnaryCallsWithoutTheStream(t *testing.T) {
	// An ingestion node older than ProduceStream, in a rolling upgrade.
	srv, c := setup(t, 1)
	srv.WithoutProduceStream(true)
	p := client.NewProducer(c, "s", client.ProducerOptions{Linger: -1})
	defer p.Close()
	for i := range 3 {
		a, err := p.SendSync(context.Background(), client.Record{Value: []byte(fmt.Sprint(i))})
		if err != nil || a.Offset != uint64(i) {
			t.Fatalf("record %d: ack %+v, %v", i, a, err)
		}
	}
	if n := len(srv.Requests()); n != 3 {
		t.Fatalf("%d requests, want 3: the first is not sent twice", n)
	}
}

func TestAProducerOnUnaryCallsTriesTheStreamAgain(t *testing.T) {
	// The rolling upgrade goes on: the node that lacked ProduceStream is
	// replaced by one that serves it, behind the same address.
	defer client.SetUnaryRecheck(50 * time.Millisecond)()
	srv, c := setup(t, 1)
	srv.WithoutProduceStream(true)
	p := client.NewProducer(c, "s", client.ProducerOptions{Linger: -1})
	defer p.Close()
	send := func(i int) {
		t.Helper()
		a, err := p.SendSync(context.Background(), client.Record{Value: []byte(fmt.Sprint(i))})
		if err != nil || a.Offset != uint64(i) {
			t.Fatalf("record %d: ack %+v, %v", i, a, err)
		}
	}
	send(0)
	send(1)
	srv.WithoutProduceStream(false)
	time.Sleep(100 * time.Millisecond) // past the recheck: what is under test
	send(2)
	send(3)
	if n := srv.ProduceStreams(); n != 1 {
		t.Fatalf("%d produce streams after the recheck, want 1 carrying the last two records", n)
	}
	if n := len(srv.Requests()); n != 4 {
		t.Fatalf("%d requests, want 4: none sent twice", n)
	}
}

func TestARequestsFailureDoesNotEndTheStream(t *testing.T) {
	srv, c := setup(t, 1)
	srv.FailProduce(status.Error(codes.InvalidArgument, "refused for the test"))
	p := client.NewProducer(c, "s", client.ProducerOptions{Linger: -1})
	defer p.Close()
	_, err := p.SendSync(context.Background(), client.Record{Value: []byte("refused")})
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || st.Message() != "refused for the test" {
		t.Fatalf("refused record: %v, want its request's status", err)
	}
	if _, err := p.SendSync(context.Background(), client.Record{Value: []byte("next")}); err != nil {
		t.Fatal(err)
	}
	if n := srv.ProduceStreams(); n != 1 {
		t.Fatalf("%d produce streams, want the first to carry both requests", n)
	}
}

func TestRequestsInFlightOnABrokenStreamAreRetriedOnTheNext(t *testing.T) {
	srv, c := setup(t, 1)
	p := client.NewProducer(c, "s", client.ProducerOptions{Linger: -1, MaxInFlight: 4, RetryBackoff: time.Millisecond})
	defer p.Close()
	if _, err := p.SendSync(context.Background(), client.Record{Value: []byte("first")}); err != nil {
		t.Fatal(err)
	}
	// Held at the server, some stored and some not when the stream breaks.
	release := srv.GateProduce()
	var fs []*client.Future
	for i := range 8 {
		fs = append(fs, p.Send(context.Background(), client.Record{Value: []byte(fmt.Sprint(i))}))
	}
	eventually(t, func() bool { return len(srv.Requests()) >= 2 })
	srv.BreakProduceStreams()
	release()
	acks := waitAll(t, fs)
	if n := srv.ProduceStreams(); n < 2 {
		t.Fatalf("%d produce streams, want the retries on a new one", n)
	}
	stored := srv.Records("s", 0)
	if len(stored) != 9 {
		t.Fatalf("%d records stored, want 9: each once", len(stored))
	}
	for i, a := range acks {
		if got := string(stored[a.Offset].GetValue()); got != fmt.Sprint(i) {
			t.Fatalf("record %d acknowledged at offset %d, which holds %q", i, a.Offset, got)
		}
	}
}

func TestAnAttemptTimedOutOnTheStreamIsRetried(t *testing.T) {
	// The first attempt's answer comes after the producer gave up on it
	// and sent the retry: it is the retry's answer that counts, and the
	// late one goes to no one, not to a later call.
	srv, c := setup(t, 1)
	// The timeout must also hold every later call's round trip on a busy
	// machine under -race (a retried one is answered as a duplicate): 400
	// ms, the slow answer three times that.
	p := client.NewProducer(c, "s", client.ProducerOptions{Linger: -1, RequestTimeout: 400 * time.Millisecond, RetryBackoff: time.Millisecond})
	defer p.Close()
	srv.DelayProduce(1, 1200*time.Millisecond)
	a, err := p.SendSync(context.Background(), client.Record{Value: []byte("slow")})
	if err != nil || a.Offset != 0 {
		t.Fatalf("ack %+v, %v; want offset 0", a, err)
	}
	if n := len(srv.Requests()); n < 2 {
		t.Fatalf("%d attempts, want the first timed out and retried", n)
	}
	// Later calls, while the first attempt's late answer arrives.
	for i := 1; i <= 5; i++ {
		a, err := p.SendSync(context.Background(), client.Record{Value: []byte(fmt.Sprint(i))})
		if err != nil || a.Offset != uint64(i) || a.Duplicate {
			t.Fatalf("record %d: ack %+v, %v; want offset %d, not a duplicate", i, a, err, i)
		}
		time.Sleep(240 * time.Millisecond)
	}
	if stored := srv.Records("s", 0); len(stored) != 6 {
		t.Fatalf("%d records stored, want 6", len(stored))
	}
}

func TestAnAttemptDoesNotWaitPastItsDeadlineForTheStreamToOpen(t *testing.T) {
	// A peer that takes the connection and never speaks gRPC keeps the
	// connection attempt, and with it the stream's opening, waiting for
	// gRPC's connect timeout (20 s); each attempt must give up at its own
	// deadline instead, and the record at its retry timeout.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	c, err := client.Dial(context.Background(), lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := client.NewProducer(c, "s", client.ProducerOptions{Linger: -1, RequestTimeout: 100 * time.Millisecond, RetryTimeout: time.Second, RetryBackoff: 10 * time.Millisecond})
	start := time.Now()
	_, err = p.SendSync(context.Background(), client.Record{Value: []byte("v")})
	if err == nil {
		t.Fatal("a record to a peer that never answers was acknowledged")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the record failed after %v (%v), want about its 1 s retry timeout", took, err)
	}
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waits for the stream's opening")
	}
}
