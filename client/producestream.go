package client

import (
	"context"
	"errors"
	"io"
	"math"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/producestream"
)

// produceStream is a producer's Ingest.ProduceStream: its requests' attempts
// and their answers, matched by call_id (rpc/producestream). It lasts until
// the connection or the server ends it; the producer then opens another for
// the next attempt.
type produceStream struct {
	ctx    context.Context
	cancel context.CancelFunc
	ready  chan struct{} // closed once opening ended: stream set, or err
	stream catenapb.Ingest_ProduceStreamClient
	sendMu sync.Mutex // gRPC allows one sender at a time

	mu       sync.Mutex
	calls    uint64
	waiting  map[uint64]chan produceAnswer
	answered bool  // the server has answered on it: it serves the method
	err      error // why it ended; nil while it is up
}

type produceAnswer struct {
	resp *catenapb.ProduceResponse
	err  error
}

// unaryRecheck is how long a producer sends unary calls after ingestion
// said it does not serve ProduceStream, before it tries the stream again:
// in a rolling upgrade the node it reaches (or the next one behind the same
// address) soon does. A variable for tests.
var unaryRecheck = time.Minute

// monoStart is the origin of Producer.unaryUntil: times since it are read
// on the monotonic clock, which a step of the wall clock does not move.
var monoStart = time.Now()

// produce sends req once and waits for its answer: on the producer's
// ProduceStream, or as a unary Produce where ingestion does not serve the
// stream (a node older than it, in a rolling upgrade), which it then keeps
// to for unaryRecheck.
func (p *Producer) produce(ctx context.Context, req *catenapb.ProduceRequest) (*catenapb.ProduceResponse, error) {
	if time.Since(monoStart) < time.Duration(p.unaryUntil.Load()) {
		return p.c.ingest.Produce(ctx, req)
	}
	s, err := p.produceStream(ctx)
	if err == nil {
		var resp *catenapb.ProduceResponse
		if resp, err = s.call(ctx, req); err == nil {
			return resp, nil
		}
	}
	// The method's own absence, said by a gRPC server before any answer:
	// not an HTTP proxy's 404 for a moment, which gRPC reports as
	// Unimplemented too (conn.go redials on those).
	if status.Code(err) == codes.Unimplemented && !notGRPCServer(err) && (s == nil || !s.hasAnswered()) {
		p.unaryUntil.Store(int64(time.Since(monoStart) + unaryRecheck))
		return p.c.ingest.Produce(ctx, req)
	}
	return nil, err
}

// produceStream returns the open stream, opening one if there is none or
// it ended, and waits at most for ctx for it to open: opening waits for
// the connection, which to an unreachable address lasts its connect
// timeout, longer than an attempt may.
func (p *Producer) produceStream(ctx context.Context) (*produceStream, error) {
	p.psMu.Lock()
	s := p.ps
	if s == nil || s.ended() {
		sctx, cancel := context.WithCancel(p.ctx)
		s = &produceStream{ctx: sctx, cancel: cancel, ready: make(chan struct{}), waiting: map[uint64]chan produceAnswer{}}
		p.ps = s
		go p.runProduceStream(s)
	}
	p.psMu.Unlock()
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if s.stream == nil {
		return nil, s.failure()
	}
	return s, nil
}

// runProduceStream opens s, then hands its answers out until it ends.
func (p *Producer) runProduceStream(s *produceStream) {
	st, err := p.c.ingest.ProduceStream(s.ctx)
	if err != nil {
		s.end(err)
		close(s.ready)
	} else {
		s.stream = st
		close(s.ready)
		s.receive()
	}
	p.psMu.Lock()
	if p.ps == s {
		p.ps = nil
	}
	p.psMu.Unlock()
}

// receive hands each answer to its caller until the stream ends, then
// fails every call still waiting.
func (s *produceStream) receive() {
	for {
		ans, err := s.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = status.Error(codes.Unavailable, "catena: the produce stream was closed by ingestion")
			}
			s.end(err)
			return
		}
		s.mu.Lock()
		s.answered = true
		ch := s.waiting[ans.GetCallId()]
		delete(s.waiting, ans.GetCallId())
		s.mu.Unlock()
		if ch != nil { // nil: its caller gave up waiting
			resp, err := producestream.Result(ans)
			ch <- produceAnswer{resp, err}
		}
	}
}

// end ends the stream: the waiting calls, and every later one, fail with
// what err means for a request that was on it (failure).
func (s *produceStream) end(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	failed := s.failureLocked()
	for id, ch := range s.waiting {
		ch <- produceAnswer{err: failed}
		delete(s.waiting, id)
	}
	s.mu.Unlock()
	s.cancel()
}

// failure is what the stream's end means for a request that was on it.
func (s *produceStream) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failureLocked()
}

// failureLocked: a refusal of the caller, or the method's absence, holds
// for every request, as it would have for a unary call; anything else (the
// connection, a stopping node, a message the server could not take) ended
// this stream, not the request, which is sent again on a new one.
func (s *produceStream) failureLocked() error {
	switch status.Code(s.err) {
	case codes.PermissionDenied, codes.Unauthenticated, codes.Unimplemented, codes.Unavailable, codes.Canceled:
		return s.err
	}
	return status.Errorf(codes.Unavailable, "catena: the produce stream ended: %v", s.err)
}

func (s *produceStream) ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err != nil
}

func (s *produceStream) hasAnswered() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.answered
}

// call sends one attempt of req and waits for its answer, the stream's end
// or ctx. It sets req's call_id and timeout_ms.
func (s *produceStream) call(ctx context.Context, req *catenapb.ProduceRequest) (*catenapb.ProduceResponse, error) {
	ch := make(chan produceAnswer, 1)
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.failure()
	}
	s.calls++
	id := s.calls
	s.waiting[id] = ch
	s.mu.Unlock()
	forget := func() {
		s.mu.Lock()
		delete(s.waiting, id)
		s.mu.Unlock()
	}
	req.CallId, req.TimeoutMs = id, 0
	if d, ok := ctx.Deadline(); ok {
		req.TimeoutMs = uint32(min(max(time.Until(d).Milliseconds(), 1), math.MaxUint32))
	}
	// A send waits for gRPC's flow control, on the stream's context: one
	// still blocked when ctx ends would hold this call, and every call
	// queued behind it, past their deadlines. The stream is ended instead
	// (what is on it is sent again on a new one).
	stop := context.AfterFunc(ctx, func() {
		s.end(status.Error(codes.Unavailable, "catena: a produce request could not be sent on the stream in time"))
	})
	s.sendMu.Lock()
	err := s.stream.Send(req)
	s.sendMu.Unlock()
	stop()
	if err != nil && !errors.Is(err, io.EOF) {
		forget()
		if s.ended() {
			// Ended while this send waited (its deadline, above): what
			// that means for the request, not the send's own error.
			return nil, s.failure()
		}
		// Not sent (too large, say); the stream goes on, and if it is
		// broken its Recv says so. io.EOF: it ended, and receive learns
		// why from Recv.
		return nil, err
	}
	select {
	case a := <-ch:
		return a.resp, a.err
	case <-ctx.Done():
		forget()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// closeProduceStream ends the producer's stream, once nothing is in flight.
func (p *Producer) closeProduceStream() {
	p.psMu.Lock()
	s := p.ps
	p.ps = nil
	p.psMu.Unlock()
	if s == nil {
		return
	}
	select {
	case <-s.ready:
		if s.stream != nil {
			s.sendMu.Lock()
			_ = s.stream.CloseSend()
			s.sendMu.Unlock()
		}
	default: // still opening: cancelling ends that
	}
	s.end(status.Error(codes.Canceled, "catena: producer closed"))
}
