// Package transport is the one place where Catena sets up gRPC connections
// and servers. Every link (producer and consumer to ingestion, member to
// member, operator to member) goes through it, so mutual TLS is a setting
// here and never a change in protocol code.
package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver/dns"
)

// MaxMessageBytes bounds one gRPC message in either direction. Batches are
// bounded well below it (partlog.MaxFrameBytes); the margin covers framing.
const MaxMessageBytes = 64 << 20

// ServerOptions returns the options every Catena gRPC server uses.
func ServerOptions(tlsConfig *tls.Config) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxMessageBytes),
		grpc.MaxSendMsgSize(MaxMessageBytes),
		// Large windows keep a pipelined replication link from stalling on
		// flow control at 100+ MiB/s.
		grpc.InitialWindowSize(8 << 20),
		grpc.InitialConnWindowSize(16 << 20),
		// What a server reads goes into the process pool, uncleared.
		experimental.BufferPool(processPool),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
	if tlsConfig != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsConfig)))
	}
	return opts
}

// DialOptions returns the options every Catena gRPC client uses.
func DialOptions(tlsConfig *tls.Config) []grpc.DialOption {
	creds := insecure.NewCredentials()
	if tlsConfig != nil {
		creds = credentials.NewTLS(tlsConfig)
	}
	return []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes)),
		grpc.WithInitialWindowSize(8 << 20),
		grpc.WithInitialConnWindowSize(16 << 20),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		// A member comes back on the same address within moments of a
		// crash (its master restarts it), and until a connection to it is
		// up again its predecessor cannot link to it and commits wait.
		// gRPC's default reconnect back-off (1 s doubling to 2 min) would
		// dominate repair time; retry sooner, and never wait more than
		// reconnectMaxDelay.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: reconnectBaseDelay, Multiplier: 1.6, Jitter: 0.2, MaxDelay: reconnectMaxDelay},
			MinConnectTimeout: MinConnectTimeout,
		}),
	}
}

// A replica pod that returns on Kubernetes keeps its DNS name but not its
// address. gRPC's DNS resolver re-resolves a name at most every 30 s by
// default, so a predecessor's link to a returned member could keep dialling
// the old address for up to half a minute after the member was back and
// configured: the chain's master then sees the link silent and reorders
// the chain again (seen in the end-to-end suite). Re-resolving at most
// once a second costs one DNS query per failed connection attempt.
const minResolutionInterval = time.Second

func init() {
	dns.SetMinResolutionInterval(minResolutionInterval)
}

// MinConnectTimeout bounds one connection attempt (TCP, TLS and HTTP/2
// handshakes) when the back-off is shorter. Peers are in the same cluster,
// where a handshake takes milliseconds; an attempt that takes a second is
// almost always to an address nobody holds any more: a replica pod that
// came back on another node keeps its DNS name, but for a few seconds the
// name can still resolve to the old pod's address (the headless Service
// publishes a terminating pod, DNS answers are cached), and many pod
// networks drop packets to an address no pod has rather than refuse them.
// Each failed attempt re-resolves the name (minResolutionInterval), so a
// stale answer costs one attempt. It must stay well below the operator's
// failure timeout, which reorders a chain whose link stays silent that
// long: with gRPC's default of 20 s (5 s before this), a predecessor
// dialling a returned member's old address had its link declared cut, and
// was itself removed, on every such return between nodes (seen on the
// three-node test cluster).
const MinConnectTimeout = time.Second

// Reconnect back-off of every client connection.
const (
	reconnectBaseDelay = 50 * time.Millisecond
	reconnectMaxDelay  = 2 * time.Second
)

// WaitReady waits until conn's connection is up (TCP, TLS and HTTP/2
// handshakes done), asking it to connect if it is idle. It returns ctx's
// error, with the connection's state (connecting, or transient_failure
// between attempts), when ctx ends first.
func WaitReady(ctx context.Context, conn *grpc.ClientConn) error {
	conn.Connect()
	for {
		st := conn.GetState()
		switch st {
		case connectivity.Ready:
			return nil
		case connectivity.Shutdown:
			return errors.New("the connection is closed")
		}
		if !conn.WaitForStateChange(ctx, st) {
			return fmt.Errorf("%w (connection %s)", ctx.Err(), strings.ToLower(st.String()))
		}
	}
}

// Dial opens a client connection (lazily connecting) to addr, with
// DialOptions and then extra.
func Dial(addr string, tlsConfig *tls.Config, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(addr, append(DialOptions(tlsConfig), extra...)...)
	if err != nil {
		return nil, fmt.Errorf("failed to set up connection to %s: %w", addr, err)
	}
	return conn, nil
}

// Pool shares one connection per peer address; gRPC multiplexes calls and
// streams over it.
type Pool struct {
	tls   *tls.Config
	extra []grpc.DialOption
	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewPool returns an empty pool dialling with tlsConfig (nil: plaintext)
// and DialOptions, then extra.
func NewPool(tlsConfig *tls.Config, extra ...grpc.DialOption) *Pool {
	return &Pool{tls: tlsConfig, extra: extra, conns: map[string]*grpc.ClientConn{}}
}

// Get returns the connection to addr, creating it on first use.
func (p *Pool) Get(addr string) (*grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.conns[addr]; ok {
		return c, nil
	}
	c, err := Dial(addr, p.tls, p.extra...)
	if err != nil {
		return nil, err
	}
	p.conns[addr] = c
	return c, nil
}

// Close closes every connection.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, c := range p.conns {
		_ = c.Close()
		delete(p.conns, addr)
	}
}
