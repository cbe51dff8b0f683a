package server

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/internal/writetrace"
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
	// early: answer once more, as soon as the offsets are assigned
	// (AppendRequest.answer_assigned).
	early bool
	// cuts is how many times the log had been cut at the append.
	cuts uint64
}

// AppendStream appends requests in the order they arrive and answers each,
// in the same order, once committed; a request that asks for it is also
// answered as soon as its offsets are assigned, ahead of the earlier
// requests' commits, so that the sender can complete it on the tail's
// Completions (docs/architecture.md, "Completion at the tail"). A request that fails for a reason a
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
		pa := pendingAppend{start: time.Now(), early: req.GetAnswerAssigned()}
		pa.p, pa.err = s.lookup(req.GetStream(), req.GetPartition())
		if pa.err == nil {
			pa.p.mu.Lock()
			pa.cuts = pa.p.truncations.Load()
			pa.resp, pa.epoch, pa.waitEnd, pa.err = pa.p.appendLocked(req)
			pa.p.mu.Unlock()
			if writetrace.On() && pa.err == nil {
				writetrace.MarkAt(writetrace.HeadReceived, pa.p.index, pa.waitEnd, pa.start)
				writetrace.Mark(writetrace.HeadWritten, pa.p.index, pa.waitEnd)
			}
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

// answerAppends sends each queued answer once its records are committed,
// in order, and the early answer of each that asks for one as soon as it
// is queued. At most appendStreamDepth wait for their commit: past it the
// queue, and then the stream, push back.
func (s *Server) answerAppends(ctx context.Context, stream catenapb.Replica_AppendStreamServer, queue <-chan pendingAppend) error {
	var waiting []pendingAppend
	for {
		// Answer, in order, what is committed or failed.
		var changed, stop <-chan struct{}
		for len(waiting) > 0 {
			pa := &waiting[0]
			if pa.err == nil {
				pa.p.mu.Lock()
				done, ch, err := pa.p.commitState(pa.epoch, pa.waitEnd, pa.cuts)
				committed := pa.p.committed
				pa.p.mu.Unlock()
				if err == nil && !done {
					changed, stop = ch, pa.p.stop
					break
				}
				if pa.err = err; err == nil {
					pa.resp.Committed = committed
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
			waiting[0] = pendingAppend{}
			waiting = waiting[1:]
		}
		if queue == nil && len(waiting) == 0 {
			return nil
		}
		in := queue
		if len(waiting) >= appendStreamDepth {
			in = nil
		}
		select {
		case pa, ok := <-in:
			if !ok {
				queue = nil
				continue
			}
			pa.resp.Epoch = pa.epoch
			if pa.err == nil && pa.early {
				early := &catenapb.AppendResponse{RequestId: pa.resp.GetRequestId(), Offsets: pa.resp.GetOffsets(), Duplicate: pa.resp.GetDuplicate(),
					Assigned: true, Epoch: pa.epoch}
				if err := stream.Send(early); err != nil {
					return err
				}
			}
			waiting = append(waiting, pa)
		case <-changed:
		case <-stop:
			// commitState reports it at the next look.
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// Completions streams the partition's committed offset under the epoch
// asked for: at once, then each time it grows, until the replica moves to
// another epoch (FAILED_PRECONDITION: the caller re-learns the chain) or
// the caller goes.
func (s *Server) Completions(req *catenapb.CompletionsRequest, stream catenapb.Replica_CompletionsServer) error {
	p, err := s.lookup(req.GetStream(), req.GetPartition())
	if err != nil {
		return err
	}
	ctx := stream.Context()
	sent, first := uint64(0), true
	for {
		p.mu.Lock()
		if err := p.usable(); err != nil {
			p.mu.Unlock()
			return err
		}
		if epoch := p.meta.Epoch; epoch != req.GetEpoch() {
			p.mu.Unlock()
			return status.Errorf(codes.FailedPrecondition, "partition %s/%d is at epoch %d, not %d", p.stream, p.index, epoch, req.GetEpoch())
		}
		committed, ch := p.committed, p.changed
		p.mu.Unlock()
		if committed > sent || first {
			writetrace.Mark(writetrace.CompletionSent, p.index, committed)
			if err := stream.Send(&catenapb.Completion{Epoch: req.GetEpoch(), Committed: committed}); err != nil {
				return err
			}
			sent, first = committed, false
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-p.stop:
			return status.Errorf(codes.Unavailable, "replica %s is shutting down", s.id)
		}
	}
}
