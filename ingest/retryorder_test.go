package ingest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
)

// orderedHead is a fake sole member that keeps a partition as the real
// head does in what these tests look at: it answers a record it stored
// already with its offset, and refuses (OUT_OF_RANGE, nothing stored) an
// append that would take a producer's sequences back. It can refuse
// appends as a chain below its minimum length does, and hold an append
// until the test lets it go.
type orderedHead struct {
	*chainMember
	mu       sync.Mutex
	tooShort int           // appends still to refuse as CHAIN_TOO_SHORT
	gate     chan struct{} // non-nil: the next append waits for it to close
	received chan struct{} // an append arrived (buffered, may drop)
	offsetOf map[[2]uint64]uint64
	highest  map[uint64]uint64
	stored   []uint64 // sequences, in offset order
}

func newOrderedHead(t *testing.T) (*orderedHead, string) {
	h := &orderedHead{chainMember: &chainMember{id: "head"}, received: make(chan struct{}, 64),
		offsetOf: map[[2]uint64]uint64{}, highest: map[uint64]uint64{}}
	addr := serveReplica(t, h)
	h.view(1, []*catenapb.Member{{Id: "head", Addr: addr}})
	return h, addr
}

func (h *orderedHead) AppendStream(stream catenapb.Replica_AppendStreamServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		select {
		case h.received <- struct{}{}:
		default:
		}
		h.mu.Lock()
		gate := h.gate
		h.gate = nil
		h.mu.Unlock()
		if gate != nil {
			<-gate
		}
		resp, end := h.append(req)
		if err := stream.Send(resp); err != nil {
			return err
		}
		if end {
			return nil // as the real head: a short chain ends the stream
		}
	}
}

func (h *orderedHead) append(req *catenapb.AppendRequest) (resp *catenapb.AppendResponse, end bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	refuse := func(code codes.Code, reason, msg string) *catenapb.AppendResponse {
		return &catenapb.AppendResponse{RequestId: req.GetRequestId(), ErrorCode: int32(code), ErrorMessage: msg, ErrorReason: reason}
	}
	if h.tooShort > 0 {
		h.tooShort--
		return refuse(codes.FailedPrecondition, contract.ReasonChainTooShort, "partition s/0 has 1 of the 2 members required for writes; nothing was stored"), true
	}
	_, recs, err := partlog.DecodeBatch(req.GetFrame())
	if err != nil {
		return refuse(codes.InvalidArgument, "", err.Error()), false
	}
	highest := map[uint64]uint64{}
	for _, r := range recs {
		if _, dup := h.offsetOf[[2]uint64{r.ProducerID, r.Sequence}]; dup {
			continue
		}
		top := max(h.highest[r.ProducerID], highest[r.ProducerID])
		if r.Sequence < top {
			return refuse(codes.OutOfRange, "", fmt.Sprintf("producer %d: sequence %d after %d; nothing was stored", r.ProducerID, r.Sequence, top)), false
		}
		highest[r.ProducerID] = r.Sequence
	}
	resp = &catenapb.AppendResponse{RequestId: req.GetRequestId(), Epoch: 1}
	for _, r := range recs {
		k := [2]uint64{r.ProducerID, r.Sequence}
		off, dup := h.offsetOf[k]
		if !dup {
			off = uint64(len(h.stored))
			h.offsetOf[k] = off
			h.stored = append(h.stored, r.Sequence)
			h.highest[r.ProducerID] = max(h.highest[r.ProducerID], r.Sequence)
		}
		resp.Offsets = append(resp.Offsets, off)
		resp.Duplicate = append(resp.Duplicate, dup)
	}
	resp.Committed = uint64(len(h.stored))
	return resp, false
}

func (h *orderedHead) storedSeqs() []uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.stored)
}

// queued is how many chunks wait in partition s/0's queue.
func queued(s *Server) int {
	a := s.appenderFor("s", 0)
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.queue)
}

// TestARetryAfterAShortChainKeepsTheProducersOrder: a head whose chain is
// below its minimum length refuses the append in flight, and ingestion
// fails its records at once (the producer retries them). The producer's
// later requests, queued behind that append or sent after the failure,
// must not reach the partition before the retry: the head would store
// them and then refuse the retry, whose records come earlier in the
// producer's order (OUT_OF_RANGE), and the producer would lose records it
// was only ever asked to retry. They wait for it instead, and are stored
// after it without being retried themselves. `bench-compare`'s tail
// failover refused records this way: the head's replacement was still
// copying, so killing the tail left the chain one member short for 17 ms.
func TestARetryAfterAShortChainKeepsTheProducersOrder(t *testing.T) {
	head, addr := newOrderedHead(t)
	s := startIngestion(t, []string{addr})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	const producer = 7
	part := uint32(0)
	request := func(n, prev uint64) *catenapb.ProduceRequest {
		return &catenapb.ProduceRequest{Stream: "s", ProducerId: producer, Request: n, PrevRequest: prev,
			Records: []*catenapb.ProduceRecord{{Value: []byte(fmt.Sprint("record ", n)), Sequence: n, Partition: &part}}}
	}
	type outcome struct {
		n    uint64
		code codes.Code
		msg  string
	}
	produce := func(req *catenapb.ProduceRequest) outcome {
		resp, err := s.Produce(ctx, req)
		if err != nil {
			return outcome{n: req.GetRequest(), code: status.Code(err), msg: err.Error()}
		}
		r := resp.GetResults()[0]
		return outcome{n: req.GetRequest(), code: codes.Code(r.GetErrorCode()), msg: r.GetErrorMessage()}
	}
	async := func(req *catenapb.ProduceRequest) <-chan outcome {
		ch := make(chan outcome, 1)
		go func() { ch <- produce(req) }()
		return ch
	}
	waitQueued := func(n int) {
		t.Helper()
		for queued(s) < n {
			select {
			case <-ctx.Done():
				t.Fatalf("%d chunks queued, want %d", queued(s), n)
			case <-time.After(time.Millisecond):
			}
		}
	}

	// Request 1 reaches the head and waits there; 2 and 3 queue behind it.
	gate := make(chan struct{})
	head.mu.Lock()
	head.gate, head.tooShort = gate, 1
	head.mu.Unlock()
	first := async(request(1, 0))
	select {
	case <-head.received:
	case <-ctx.Done():
		t.Fatal("request 1 never reached the head")
	}
	later := []<-chan outcome{async(request(2, 1)), async(request(3, 2))}
	waitQueued(2)
	// The chain is short for request 1 only: it has regrown by the time
	// ingestion could send the next append.
	close(gate)
	if got := <-first; got.code != codes.FailedPrecondition {
		t.Fatalf("request 1: %v %q; want FAILED_PRECONDITION, the short chain's refusal", got.code, got.msg)
	}
	// A request the producer sends before its retry of 1 waits too.
	later = append(later, async(request(4, 0)))
	waitQueued(3)
	if got := head.storedSeqs(); len(got) != 0 {
		t.Fatalf("the head stored sequences %v before the retry of 1", got)
	}

	// The producer retries request 1, as it does: the same request number
	// and sequence, naming no predecessor.
	if o := produce(request(1, 0)); o.code != codes.OK {
		t.Fatalf("retry of request 1: %v %q; want it stored", o.code, o.msg)
	}
	for _, ch := range later {
		if o := <-ch; o.code != codes.OK {
			t.Errorf("request %d, parked behind request 1's retry: %v %q; want it stored", o.n, o.code, o.msg)
		}
	}
	if got, want := head.storedSeqs(), []uint64{1, 2, 3, 4}; !slices.Equal(got, want) {
		t.Fatalf("the head stored sequences %v, want %v", got, want)
	}
}

// TestAnExpiredChunkHoldsBackItsProducersLaterOnes: the other way
// ingestion fails records the producer retries is the deadline, when no
// head took them in time; a producer's later chunks (with later
// deadlines) would survive and be stored first. They are parked instead,
// taken back from the request in flight, until the retries come in order.
// Other producers are not touched, nor are ingestion's own sequences (no
// producer to retry them), and a producer that never retries is held back
// for retryOrderHold only.
func TestAnExpiredChunkHoldsBackItsProducersLaterOnes(t *testing.T) {
	const own = 99
	a := &appender{srv: &Server{ownProducer: own}, stream: "s", wake: make(chan struct{}, 1)}
	now := time.Now()
	chunkAt := func(producer, first uint64, n int, deadline time.Time) *chunk {
		c := testChunk(producer, first, n, 10)
		c.deadline, c.done = deadline, make(chan struct{})
		return c
	}
	code := func(c *chunk) codes.Code {
		select {
		case <-c.done:
			return status.Code(c.err)
		default:
			return codes.OK // not failed
		}
	}
	// taken is the first sequences of the chunks of each request take
	// makes until the queue has nothing it may send.
	taken := func() (out [][2]uint64) {
		for s := a.take(); s != nil; s = a.take() {
			for _, c := range s.chunks {
				p, first := chunkProducer(c)
				out = append(out, [2]uint64{p, first})
			}
		}
		return out
	}
	past, future := now.Add(-time.Second), now.Add(time.Minute)
	c1, c2, other := chunkAt(1, 1, 2, past), chunkAt(1, 3, 2, future), chunkAt(2, 1, 2, future)
	c3, other2 := chunkAt(1, 5, 2, future), chunkAt(2, 3, 1, future)
	mine1, mine2 := chunkAt(own, 1, 1, past), chunkAt(own, 2, 1, future)
	s := &sent{id: 1, chunks: []*chunk{c1, c2, other, mine1}}
	if err := a.build(s); err != nil {
		t.Fatal(err)
	}
	a.queue = []*chunk{c3, other2, mine2}

	inflight := a.expire([]*sent{s}, now, status.Error(codes.Unavailable, "head gone"))
	for _, tc := range []struct {
		name string
		c    *chunk
		want codes.Code
	}{
		{"the expired chunk", c1, codes.Unavailable},
		{"ingestion's own expired chunk", mine1, codes.Unavailable},
		{"its producer's later chunk in flight", c2, codes.OK},
		{"its producer's later chunk queued", c3, codes.OK},
	} {
		if got := code(tc.c); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if len(inflight) != 1 || len(inflight[0].chunks) != 1 || inflight[0].chunks[0] != other || inflight[0].count() != 2 {
		t.Fatalf("in flight after expiry: %+v, want the request rebuilt with producer 2's chunk alone", inflight)
	}
	if got, want := taken(), [][2]uint64{{2, 3}, {own, 2}}; !slices.Equal(got, want) {
		t.Fatalf("sent after expiry %v, want %v: producer 1's later chunks parked", got, want)
	}

	// Producer 1's chunks go again once its retry is queued, in its order.
	a.enqueue(chunkAt(1, 7, 1, future)) // sent before the retry: parked too
	if got := taken(); len(got) != 0 {
		t.Fatalf("sent %v before producer 1's retry", got)
	}
	a.enqueue(chunkAt(1, 1, 2, future))
	if got, want := taken(), [][2]uint64{{1, 1}, {1, 3}, {1, 5}, {1, 7}}; !slices.Equal(got, want) {
		t.Fatalf("sent after the retry %v, want %v", got, want)
	}
	if len(a.held) != 0 {
		t.Errorf("producer 1 still held back after its retry came: %+v", a.held[1])
	}

	// A retry can be queued already when its original expires (the
	// producer's deadline is the chunk's, and expiry waits for the session
	// to end): it counts as come.
	orig := chunkAt(4, 1, 2, past)
	s = &sent{id: 2, chunks: []*chunk{orig}}
	if err := a.build(s); err != nil {
		t.Fatal(err)
	}
	a.enqueue(chunkAt(4, 3, 2, future))
	a.enqueue(chunkAt(4, 1, 2, future))
	if inflight := a.expire([]*sent{s}, now, status.Error(codes.Unavailable, "head gone")); len(inflight) != 0 {
		t.Fatalf("%d requests still in flight, want none", len(inflight))
	}
	if got := code(orig); got != codes.Unavailable {
		t.Errorf("the expired original: %v, want UNAVAILABLE", got)
	}
	if got, want := taken(), [][2]uint64{{4, 1}, {4, 3}}; !slices.Equal(got, want) || len(a.held) != 0 {
		t.Errorf("sent %v (%d producers held), want %v and none held", got, len(a.held), want)
	}

	// A retry queued behind another one, whose original failed later (by
	// its deadline, queued and parked): it is come once the first retry
	// is, and what the producer sends after it is not parked.
	f1 := chunkAt(5, 1, 2, past)
	s = &sent{id: 3, chunks: []*chunk{f1}}
	if err := a.build(s); err != nil {
		t.Fatal(err)
	}
	e := chunkAt(5, 3, 2, past)
	a.enqueue(e)
	a.enqueue(chunkAt(5, 3, 2, future)) // its retry, there already
	a.expire([]*sent{s}, now, status.Error(codes.Unavailable, "head gone"))
	if code(f1) != codes.Unavailable || code(e) != codes.Unavailable {
		t.Fatalf("the expired chunks: %v and %v, want UNAVAILABLE", code(f1), code(e))
	}
	a.enqueue(chunkAt(5, 1, 2, future))
	a.enqueue(chunkAt(5, 5, 1, future))
	if got, want := taken(), [][2]uint64{{5, 1}, {5, 3}, {5, 5}}; !slices.Equal(got, want) || len(a.held) != 0 {
		t.Errorf("sent %v (%d producers held), want %v and none held", got, len(a.held), want)
	}

	// A later chunk in flight with the one that expired goes back into the
	// queue behind a retry already queued there, not ahead of it.
	f, x := chunkAt(6, 1, 2, past), chunkAt(6, 10, 1, future)
	s = &sent{id: 4, chunks: []*chunk{f, x}}
	if err := a.build(s); err != nil {
		t.Fatal(err)
	}
	a.enqueue(chunkAt(6, 1, 2, future)) // the producer's retry of f
	if inflight := a.expire([]*sent{s}, now, status.Error(codes.Unavailable, "head gone")); len(inflight) != 0 {
		t.Fatalf("%d requests still in flight, want none", len(inflight))
	}
	if got, want := taken(), [][2]uint64{{6, 1}, {6, 10}}; !slices.Equal(got, want) || code(x) != codes.OK {
		t.Errorf("sent %v (the later chunk: %v), want %v", got, code(x), want)
	}

	// A producer that resends in order itself (Kafka's) has its later
	// chunks refused, not parked: it sends the retry only once they are
	// answered.
	k1, k2 := chunkAt(7, 1, 1, past), chunkAt(7, 2, 1, future)
	k1.inOrder, k2.inOrder = true, true
	s = &sent{id: 5, chunks: []*chunk{k1}}
	if err := a.build(s); err != nil {
		t.Fatal(err)
	}
	a.enqueue(k2)
	a.expire([]*sent{s}, now, status.Error(codes.Unavailable, "head gone"))
	k3 := chunkAt(7, 3, 1, future)
	k3.inOrder = true
	a.enqueue(k3)
	if code(k1) != codes.Unavailable || code(k2) != codes.Aborted || code(k3) != codes.Aborted {
		t.Errorf("in-order producer: the expired chunk %v, the later one queued %v, one arriving %v; want UNAVAILABLE, ABORTED, ABORTED",
			code(k1), code(k2), code(k3))
	}
	for _, first := range []uint64{1, 2, 3} {
		c := chunkAt(7, first, 1, future)
		c.inOrder = true
		a.enqueue(c)
	}
	if got, want := taken(), [][2]uint64{{7, 1}, {7, 2}, {7, 3}}; !slices.Equal(got, want) {
		t.Errorf("in-order producer's resends: sent %v, want %v", got, want)
	}

	// A producer that gives up on its failed records is held back for
	// retryOrderHold, not for as long as it keeps sending.
	a.holdBack([]*chunk{chunkAt(3, 1, 1, past)}, status.Error(codes.Unavailable, "head gone"), nil)
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.parkedLocked(chunkAt(3, 2, 1, future), now.Add(retryOrderHold/2)) {
		t.Errorf("producer 3's later chunk within the hold is not parked")
	}
	if a.parkedLocked(chunkAt(3, 3, 1, future), now.Add(retryOrderHold+time.Second)) {
		t.Errorf("producer 3's later chunk after the hold is still parked")
	}
}

// TestARefusedProducerFailsOnlyItsOwnRecords: the head refuses an append
// whole (nothing stored) when any of its records may not be stored, such
// as a retry that arrives after a later record of its producer. Ingestion
// merges the chunks of several producers' requests into one append, and
// failed every one of them with that refusal: the other producers' records
// failed for good (OUT_OF_RANGE is not retried), with an error about
// someone else's sequence. The chunks of a refused append are sent again
// one at a time, so that only the chunk at fault fails.
func TestARefusedProducerFailsOnlyItsOwnRecords(t *testing.T) {
	head, addr := newOrderedHead(t)
	s := startIngestion(t, []string{addr})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	part := uint32(0)
	produce := func(producer, seq uint64) (codes.Code, string) {
		resp, err := s.Produce(ctx, &catenapb.ProduceRequest{Stream: "s", ProducerId: producer,
			Records: []*catenapb.ProduceRecord{{Value: []byte(fmt.Sprint(producer, "/", seq)), Sequence: seq, Partition: &part}}})
		if err != nil {
			return status.Code(err), err.Error()
		}
		r := resp.GetResults()[0]
		return codes.Code(r.GetErrorCode()), r.GetErrorMessage()
	}
	if code, msg := produce(1, 5); code != codes.OK {
		t.Fatalf("producer 1, sequence 5: %v %q", code, msg)
	}
	<-head.received // that append's

	// An append in flight at the head; two producers' chunks queue behind
	// it and go out together.
	gate := make(chan struct{})
	head.mu.Lock()
	head.gate = gate
	head.mu.Unlock()
	type outcome struct {
		code codes.Code
		msg  string
	}
	async := func(producer, seq uint64) <-chan outcome {
		ch := make(chan outcome, 1)
		go func() { c, m := produce(producer, seq); ch <- outcome{c, m} }()
		return ch
	}
	first := async(3, 1)
	<-head.received
	late, other := async(1, 3), async(2, 1) // producer 1's sequence 3 comes after its 5
	for queued(s) < 2 {
		select {
		case <-ctx.Done():
			t.Fatalf("the two chunks never queued (%d queued)", queued(s))
		case <-time.After(time.Millisecond):
		}
	}
	close(gate)
	if o := <-first; o.code != codes.OK {
		t.Fatalf("producer 3: %v %q", o.code, o.msg)
	}
	if o := <-late; o.code != codes.OutOfRange {
		t.Errorf("producer 1's late sequence 3: %v %q, want OUT_OF_RANGE", o.code, o.msg)
	}
	if o := <-other; o.code != codes.OK {
		t.Errorf("producer 2's record, merged with producer 1's refused one: %v %q, want it stored", o.code, o.msg)
	}
	if got, want := head.storedSeqs(), []uint64{5, 1, 1}; !slices.Equal(got, want) {
		t.Errorf("the head stored sequences %v, want %v", got, want)
	}
}
