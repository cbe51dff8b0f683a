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
	"strings"
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
	conn, err := newConn(addr, &cfg)
	if err != nil {
		return nil, fmt.Errorf("catena: dial %s: %w", addr, err)
	}
	conn.Connect()
	ec := &endpointConn{redial: func() (*grpc.ClientConn, error) { return newConn(addr, &cfg) }, cur: conn, dialed: time.Now()}
	return &Client{addr: addr, conn: ec, ingest: catenapb.NewIngestClient(ec)}, nil
}

// newConn is the single transport setup of the package: every connection
// is created here so that TLS/mTLS policy lives in one place.
func newConn(addr string, cfg *dialConfig) (*grpc.ClientConn, error) {
	var creds credentials.TransportCredentials
	if cfg.tls != nil {
		creds = credentials.NewTLS(cfg.tls)
	} else {
		creds = insecure.NewCredentials()
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

// RefusedByTLS reports whether err is a connection that failed over
// certificates (the server's not trusted, or the server refused the
// client's or wanted one): a configuration error no retry mends, which
// producers and consumers report at once instead of retrying. gRPC reports it as Unavailable, told apart only by
// its message, where crypto/tls and crypto/x509 name themselves. A
// handshake that fails otherwise (EOF, a timeout: a server restarting)
// stays retryable.
func RefusedByTLS(err error) bool {
	st := status.Convert(err)
	if st.Code() != codes.Unavailable {
		return false
	}
	m := st.Message()
	return strings.Contains(m, "tls: ") || strings.Contains(m, "x509: ")
}
