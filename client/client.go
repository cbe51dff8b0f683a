// Package client is the Go client of Catena: a connection to an ingestion
// endpoint (Dial), a pipelined idempotent Producer, and consumer calls
// (Fetch, Subscribe, ListOffsets, Describe, ListStreams).
//
// Every call goes to the Ingest service of one ingestion endpoint; the
// endpoint routes records by key to partitions and reads committed data
// from the partition chains.
package client

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// DefaultAddr is the default ingestion endpoint.
const DefaultAddr = "127.0.0.1:7070"

// maxRecvMsgBytes bounds one response (fetch/subscribe batches).
const maxRecvMsgBytes = 64 << 20

// Option configures Dial.
type Option func(*dialConfig)

type dialConfig struct {
	tls         *tls.Config
	extra       []grpc.DialOption
	userAgent   string
	keepalive   time.Duration
	maxRecvSize int
}

// WithTLS switches the connection to TLS with cfg (set Certificates in cfg
// for mutual TLS). Without it connections are insecure (development only).
func WithTLS(cfg *tls.Config) Option {
	return func(c *dialConfig) { c.tls = cfg }
}

// WithDialOptions appends raw gRPC dial options (tests, interceptors).
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *dialConfig) { c.extra = append(c.extra, opts...) }
}

// WithUserAgent sets the gRPC user agent prefix.
func WithUserAgent(ua string) Option {
	return func(c *dialConfig) { c.userAgent = ua }
}

// Client is a connection to one ingestion endpoint. It is safe for
// concurrent use; create Producers and Subscriptions from it.
type Client struct {
	addr   string
	conn   *endpointConn
	ingest catenapb.IngestClient
	// tlsWatch is the TLS credentials of its connections (nil: plaintext,
	// or NewFromConn).
	tlsWatch *handshakeWatch
}

// Dial connects to the ingestion endpoint at addr (host:port). The
// connection is established lazily and re-established automatically; a
// dead endpoint surfaces as codes.Unavailable on the first call.
func Dial(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if addr == "" {
		addr = DefaultAddr
	}
	cfg := dialConfig{userAgent: "catena-go", keepalive: 30 * time.Second, maxRecvSize: maxRecvMsgBytes}
	for _, o := range opts {
		o(&cfg)
	}
	var watch *handshakeWatch
	if cfg.tls != nil {
		watch = newHandshakeWatch(cfg.tls)
	}
	conn, err := newConn(addr, &cfg, watch)
	if err != nil {
		return nil, fmt.Errorf("catena: dial %s: %w", addr, err)
	}
	conn.Connect()
	ec := &endpointConn{redial: func() (*grpc.ClientConn, error) { return newConn(addr, &cfg, watch) }, cur: conn, dialed: time.Now()}
	return &Client{addr: addr, conn: ec, ingest: catenapb.NewIngestClient(ec), tlsWatch: watch}, nil
}

// newConn is the single transport setup of the package: every connection
// is created here so that TLS/mTLS policy lives in one place.
func newConn(addr string, cfg *dialConfig, watch *handshakeWatch) (*grpc.ClientConn, error) {
	var creds credentials.TransportCredentials = insecure.NewCredentials()
	if watch != nil {
		creds = watch
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithUserAgent(cfg.userAgent),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(cfg.maxRecvSize)),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                cfg.keepalive,
			Timeout:             10 * time.Second,
			PermitWithoutStream: false,
		}),
	}
	opts = append(opts, cfg.extra...)
	return grpc.NewClient(addr, opts...)
}

// NewFromConn wraps an existing gRPC connection (the caller keeps
// ownership of its transport setup). Close closes conn.
func NewFromConn(conn *grpc.ClientConn) *Client {
	ec := &endpointConn{cur: conn}
	return &Client{addr: conn.Target(), conn: ec, ingest: catenapb.NewIngestClient(ec)}
}

// Addr is the endpoint address given to Dial.
func (c *Client) Addr() string { return c.addr }

// Ingest exposes the raw generated stub for calls this package does not wrap.
func (c *Client) Ingest() catenapb.IngestClient { return c.ingest }

// Close closes the connection. Producers must be closed first.
func (c *Client) Close() error {
	err := c.conn.Close()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// TLSRefusedError fails a call because this client's own TLS handshake with
// the endpoint failed over certificates: the server's was not trusted, or
// the server refused this client's during the handshake. It is a
// configuration error that no retry mends, so producers and consumers
// return it at once. Err is the call's error (its gRPC status is
// Unavailable); Handshake is why the handshake failed.
type TLSRefusedError struct {
	Err, Handshake error
}

func (e *TLSRefusedError) Error() string {
	return fmt.Sprintf("catena: TLS handshake refused: %v", e.Handshake)
}

func (e *TLSRefusedError) Unwrap() error { return e.Err }

// RefusedByTLS reports whether err is a TLSRefusedError.
func RefusedByTLS(err error) bool {
	var t *TLSRefusedError
	return errors.As(err, &t)
}

// refusedByTLS wraps err, an Unavailable error of a call, when the last
// handshake of this client failed over certificates. An endpoint that
// relays another hop's TLS failure (ingestion's link to a replica) is not
// this: it is retried like any other Unavailable.
func (c *Client) refusedByTLS(err error) error {
	if c.tlsWatch == nil || status.Code(err) != codes.Unavailable {
		return nil
	}
	if h := c.tlsWatch.refusal(); h != nil {
		return &TLSRefusedError{Err: err, Handshake: h}
	}
	return nil
}

// handshakeWatch is the client's TLS credentials, remembering whether the
// latest handshake failed over certificates. Its clones share what it
// remembers.
type handshakeWatch struct {
	credentials.TransportCredentials
	state *handshakeState
}

type handshakeState struct {
	mu   sync.Mutex
	last error
}

func newHandshakeWatch(cfg *tls.Config) *handshakeWatch {
	return &handshakeWatch{TransportCredentials: credentials.NewTLS(cfg), state: &handshakeState{}}
}

func (w *handshakeWatch) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := w.TransportCredentials.ClientHandshake(ctx, authority, raw)
	w.state.mu.Lock()
	defer w.state.mu.Unlock()
	switch {
	case err == nil:
		w.state.last = nil
	case certificateRefusal(err):
		w.state.last = err
	}
	return conn, info, err
}

func (w *handshakeWatch) Clone() credentials.TransportCredentials {
	return &handshakeWatch{TransportCredentials: w.TransportCredentials.Clone(), state: w.state}
}

func (w *handshakeWatch) refusal() error {
	w.state.mu.Lock()
	defer w.state.mu.Unlock()
	return w.state.last
}

// certificateRefusal: a handshake error over certificates (this side's
// verification of the server's, or an alert from the server), not a
// dropped connection or a timeout.
func certificateRefusal(err error) bool {
	var verify *tls.CertificateVerificationError
	var alert tls.AlertError
	return errors.As(err, &verify) || errors.As(err, &alert)
}
