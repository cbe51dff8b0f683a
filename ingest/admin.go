package ingest

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// StreamAdmin creates and deletes streams for clients, where the deployment
// lets them: catena dev, the chain master of its own streams. On Kubernetes
// there is none: a stream is a Stream object.
type StreamAdmin interface {
	// CreateStream creates stream with partitions partitions, returning a
	// gRPC status error (InvalidArgument, AlreadyExists) when it does not.
	CreateStream(ctx context.Context, stream string, partitions int) error
	// DeleteStream deletes stream and every copy of its records (NotFound
	// when it does not exist).
	DeleteStream(ctx context.Context, stream string) error
}

// errNoStreamAdmin answers CreateStream and DeleteStream without a
// StreamAdmin.
var errNoStreamAdmin = status.Error(codes.FailedPrecondition,
	"this ingestion node cannot create or delete streams: on Kubernetes a stream is a Stream object (kubectl apply, or delete the Stream)")

// CreateStream creates a stream through Options.Streams, then describes it
// once ingestion has discovered its chains.
func (s *Server) CreateStream(ctx context.Context, req *catenapb.CreateStreamRequest) (*catenapb.StreamDescription, error) {
	if s.admin == nil {
		return nil, errNoStreamAdmin
	}
	if err := s.admin.CreateStream(ctx, req.GetStream(), int(req.GetPartitions())); err != nil {
		return nil, err
	}
	return s.DescribeStream(ctx, &catenapb.DescribeStreamRequest{Stream: req.GetStream()})
}

// DeleteStream deletes a stream through Options.Streams.
func (s *Server) DeleteStream(ctx context.Context, req *catenapb.DeleteStreamRequest) (*catenapb.DeleteStreamResponse, error) {
	if s.admin == nil {
		return nil, errNoStreamAdmin
	}
	if err := s.admin.DeleteStream(ctx, req.GetStream()); err != nil {
		return nil, err
	}
	// Forget it at once: a produce right after must not find its chains.
	select {
	case <-s.disc.requestRefresh():
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &catenapb.DeleteStreamResponse{}, nil
}
