package server

import (
	"context"
	"net"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// Reach answers once this replica's pooled connection to req's replica,
// the one its links to that replica use, is up (TCP, TLS and HTTP/2), or
// UNAVAILABLE with the reason when it is not by the call's deadline. The
// connection's reconnect back-off is reset first: the replica asked about
// is one the master found answering.
func (s *Server) Reach(ctx context.Context, req *catenapb.ReachRequest) (*catenapb.ReachResponse, error) {
	host, port, err := net.SplitHostPort(req.GetAddr())
	if err != nil || host == "" {
		return nil, status.Errorf(codes.InvalidArgument, "address %q of replica %q is not host:port", req.GetAddr(), req.GetId())
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "address %q of replica %q has no valid port", req.GetAddr(), req.GetId())
	}
	conn, err := s.pool.Get(req.GetAddr())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "replica %q at %s: %v", req.GetId(), req.GetAddr(), err)
	}
	conn.ResetConnectBackoff()
	// Give up a little before the caller does, so that it gets the
	// reason rather than its own deadline.
	wait := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithDeadline(ctx, dl.Add(-min(100*time.Millisecond, time.Until(dl)/4)))
		defer cancel()
	}
	if err := transport.WaitReady(wait, conn); err != nil {
		return nil, status.Errorf(codes.Unavailable, "replica %s cannot reach replica %q at %s: %v", s.id, req.GetId(), req.GetAddr(), err)
	}
	return &catenapb.ReachResponse{}, nil
}
