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
	stream catenapb.Ingest_ProduceStreamClient
	cancel context.CancelFunc
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

// produce sends req once and waits for its answer: on the producer's
// ProduceStream, or as a unary Produce where ingestion does not serve the
// stream (a node older than it, in a rolling upgrade; the producer then
// stays with unary calls).
func (p *Producer) produce(ctx context.Context, req *catenapb.ProduceRequest) (*catenapb.ProduceResponse, error) {
	if p.unary.Load() {
		return p.c.ingest.Produce(ctx, req)
	}
	s, err := p.produceStream()
	if err != nil {
		return nil, err
	}
	resp, err := s.call(ctx, req)
	if status.Code(err) == codes.Unimplemented && !s.hasAnswered() {
		p.unary.Store(true)
		return p.c.ingest.Produce(ctx, req)
	}
	return resp, err
}

// produceStream returns the open stream, opening one if there is none.
func (p *Producer) produceStream() (*produceStream, error) {
	p.psMu.Lock()
	defer p.psMu.Unlock()
	if s := p.ps; s != nil && !s.ended() {
		return s, nil
	}
	ctx, cancel := context.WithCancel(p.ctx)
	st, err := p.c.ingest.ProduceStream(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	s := &produceStream{stream: st, cancel: cancel, waiting: map[uint64]chan produceAnswer{}}
	p.ps = s
	go func() {
		s.receive()
		p.psMu.Lock()
		if p.ps == s {
			p.ps = nil
		}
		p.psMu.Unlock()
	}()
	return s, nil
}

// receive hands each answer to its caller until the stream ends, then
// fails every call still waiting with why it ended.
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

// end fails the waiting calls with err, and every later one.
func (s *produceStream) end(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	for id, ch := range s.waiting {
		ch <- produceAnswer{err: s.err}
		delete(s.waiting, id)
	}
	s.mu.Unlock()
	s.cancel()
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
	if err := s.err; err != nil {
		s.mu.Unlock()
		return nil, err
	}
	s.calls++
	id := s.calls
	s.waiting[id] = ch
	s.mu.Unlock()
	req.CallId, req.TimeoutMs = id, 0
	if d, ok := ctx.Deadline(); ok {
		req.TimeoutMs = uint32(min(max(time.Until(d).Milliseconds(), 1), math.MaxUint32))
	}
	s.sendMu.Lock()
	err := s.stream.Send(req)
	s.sendMu.Unlock()
	if err != nil && !errors.Is(err, io.EOF) {
		// Not sent, and the stream is done; io.EOF: it ended, and
		// receive learns why from Recv.
		s.end(err)
	}
	select {
	case a := <-ch:
		return a.resp, a.err
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.waiting, id)
		s.mu.Unlock()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// closeProduceStream ends the producer's stream, once nothing is in flight.
func (p *Producer) closeProduceStream() {
	p.psMu.Lock()
	s := p.ps
	p.ps = nil
	p.psMu.Unlock()
	if s != nil {
		s.sendMu.Lock()
		_ = s.stream.CloseSend()
		s.sendMu.Unlock()
		s.end(status.Error(codes.Canceled, "catena: producer closed"))
	}
}
