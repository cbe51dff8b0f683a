package server

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// appendStreamDepth bounds the requests appended but not yet answered on
// one AppendStream; past it the head stops reading the stream, which
// pushes back on the sender through gRPC flow control.
const appendStreamDepth = 256

type pendingAppend struct {
	p       *partition
	resp    *catenapb.AppendResponse
	epoch   uint64
	waitEnd uint64
	err     error
	start   time.Time
}

// AppendStream appends requests in the order they arrive and answers each,
// in the same order, once committed. A request that fails for a reason a
// retry may cure (not head, other epoch, stopping) is answered with its
// error and ends the stream, so that no later request of the sender can be
// stored ahead of the retry: per-partition order is the sender's order.
func (s *Server) AppendStream(stream catenapb.Replica_AppendStreamServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	queue := make(chan pendingAppend, appendStreamDepth)
	recvErr := make(chan error, 1)
	go func() {
		defer close(queue)
		recvErr <- s.receiveAppends(ctx, stream, queue)
	}()
	// The handler returns when the answers are done: after the last queued
	// request, or at the first failure. Returning ends the stream, which
	// also ends the receiver.
	if err := s.answerAppends(ctx, stream, queue); err != nil {
		return err
	}
	select {
	case err := <-recvErr:
		return err
	default:
		return nil
	}
}

// receiveAppends appends each request as it arrives and queues its answer.
func (s *Server) receiveAppends(ctx context.Context, stream catenapb.Replica_AppendStreamServer, queue chan<- pendingAppend) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		pa := pendingAppend{start: time.Now()}
		pa.p, pa.err = s.lookup(req.GetStream(), req.GetPartition())
		if pa.err == nil {
			pa.p.mu.Lock()
			pa.resp, pa.epoch, pa.waitEnd, pa.err = pa.p.appendLocked(req)
			pa.p.mu.Unlock()
		}
		if pa.err != nil {
			pa.resp = &catenapb.AppendResponse{RequestId: req.GetRequestId()}
		}
		select {
		case queue <- pa:
		case <-ctx.Done():
			return ctx.Err()
		}
		if pa.err != nil && !permanent(pa.err) {
			return nil // it is answered, then the stream ends
		}
	}
}

// answerAppends sends each queued answer once its records are committed.
func (s *Server) answerAppends(ctx context.Context, stream catenapb.Replica_AppendStreamServer, queue <-chan pendingAppend) error {
	for pa := range queue {
		if pa.err == nil {
			pa.p.mu.Lock()
			if err := pa.p.waitCommitted(ctx, pa.epoch, pa.waitEnd); err != nil {
				pa.err = err
			} else {
				pa.resp.Committed = pa.p.committed
				pa.p.mu.Unlock()
				pa.p.m.commitSeconds.Observe(time.Since(pa.start).Seconds())
			}
		}
		if pa.err != nil {
			st := status.Convert(pa.err)
			pa.resp = &catenapb.AppendResponse{RequestId: pa.resp.GetRequestId(), ErrorCode: int32(st.Code()), ErrorMessage: st.Message(), ErrorReason: errorReason(pa.err)}
		}
		if err := stream.Send(pa.resp); err != nil {
			return err
		}
		if pa.err != nil && !permanent(pa.err) {
			return nil
		}
	}
	return nil
}
