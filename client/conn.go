package client

import (
	"context"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// minRedialInterval spaces out new connections made because the old one
// answered as something other than a gRPC server.
const minRedialInterval = time.Second

// endpointConn is the client's connection to its ingestion endpoint: a
// gRPC connection that is replaced when the server behind it turns out
// not to be a gRPC server at all.
//
// gRPC resolves and connects again only when a connection breaks. A
// connection that reached the wrong server (a Service address that
// kube-proxy had not programmed yet and that led out of the node to a
// proxy, an address since given to something else, a load balancer's
// error page) stays up, and every call fails with an HTTP status mapped
// to a gRPC code, for as long as the process runs. A fresh connection
// resolves the address again and, once it leads to the endpoint, works.
type endpointConn struct {
	// redial makes a new connection to the same address (nil: the
	// connection was handed in by the caller and is never replaced).
	redial func() (*grpc.ClientConn, error)

	mu     sync.Mutex
	cur    *grpc.ClientConn
	dialed time.Time
	closed bool
}

var _ grpc.ClientConnInterface = (*endpointConn)(nil)

func (e *endpointConn) current() *grpc.ClientConn {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cur
}

// Invoke implements grpc.ClientConnInterface.
func (e *endpointConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	cc := e.current()
	err := cc.Invoke(ctx, method, args, reply, opts...)
	e.observe(cc, err)
	return err
}

// NewStream implements grpc.ClientConnInterface. A server that is not
// gRPC shows itself on the stream's first receive, so receives are
// observed too.
func (e *endpointConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cc := e.current()
	s, err := cc.NewStream(ctx, desc, method, opts...)
	if err != nil {
		e.observe(cc, err)
		return nil, err
	}
	return &observedStream{ClientStream: s, observe: func(err error) { e.observe(cc, err) }}, nil
}

// observe replaces cc when err says its server does not speak gRPC and cc
// is still the current connection, at most once per minRedialInterval.
func (e *endpointConn) observe(cc *grpc.ClientConn, err error) {
	if err == nil || e.redial == nil || !notGRPCServer(err) {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed || e.cur != cc || time.Since(e.dialed) < minRedialInterval {
		return
	}
	next, derr := e.redial()
	if derr != nil {
		return // the address no longer parses; keep what there is
	}
	next.Connect()
	old := e.cur
	e.cur, e.dialed = next, time.Now()
	_ = old.Close()
}

// Close closes the current connection; nothing is dialed after it.
func (e *endpointConn) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	return e.cur.Close()
}

// notGRPCServer reports whether err is gRPC's report of an answer that
// did not come from a gRPC server: an HTTP status or content type where a
// gRPC response was expected. gRPC maps such answers to ordinary codes
// (404 to Unimplemented, 503 to Unavailable) and tells them apart only in
// the message, which grpc-go has worded this way since 2019.
func notGRPCServer(err error) bool {
	msg := status.Convert(err).Message()
	return strings.Contains(msg, "unexpected HTTP status code received from server") ||
		strings.Contains(msg, "received unexpected content-type") ||
		strings.Contains(msg, "malformed header: missing HTTP content-type")
}

// observedStream passes a stream's receive errors to observe.
type observedStream struct {
	grpc.ClientStream
	observe func(error)
}

func (s *observedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.observe(err)
	}
	return err
}
