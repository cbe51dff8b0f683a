// Package kafka is ingestion's Kafka listener: it speaks the Kafka wire
// protocol to unchanged Kafka clients and serves each request through the
// ingestion server it runs beside. Kafka topics are Catena streams, Kafka
// partitions are partitions and Kafka offsets are Catena offsets; every
// partition is led by the one broker this listener advertises (any
// ingestion node reaches every chain). The wire format is franz-go's kmsg;
// docs/kafka.md lists the APIs and versions served and what differs from
// Kafka.
package kafka

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/catena-streams/catena/ingest"
	"github.com/catena-streams/catena/ingest/groups"
)

const (
	// DefaultMaxRequestBytes bounds one request (Kafka's
	// socket.request.max.bytes default is 100 MiB).
	DefaultMaxRequestBytes = 100 << 20
	// maxInFlight is how many requests of one connection may be in hand
	// at once (read, not yet answered); the next waits.
	maxInFlight = 64
	// brokerID is the node id of the one broker the listener advertises.
	brokerID = 0
	// ClusterID is what Metadata reports as the cluster's id.
	ClusterID = "catena"
)

// Options configure a listener.
type Options struct {
	// Ingest serves every request.
	Ingest *ingest.Server
	// Advertise is the host:port clients are told to connect to (the
	// broker of every partition). Empty: the listener's own address, with
	// the machine's host name for an unspecified host.
	Advertise string
	// TLS, when set, wraps every connection (the server side of it).
	TLS    *tls.Config
	Logger logr.Logger
	// MaxRequestBytes bounds one request (0: DefaultMaxRequestBytes); a
	// larger one closes its connection, as Kafka does.
	MaxRequestBytes int
	// Authorize, when set, is asked before each operation, with the
	// Ingest method it amounts to (catenapb.Ingest_Produce_FullMethodName
	// and so on) and its request; ctx carries the caller's TLS identity as
	// a gRPC peer, so the same policy as the gRPC listener's applies
	// (transport.Policy.Check). A refusal answers the operation with an
	// authorization error and stores nothing.
	Authorize func(ctx context.Context, method string, req any) error
	// Groups coordinates the consumer groups; whoever made it runs it
	// (Coordinator.Run). Nil: the listener's own coordinator, storing
	// committed offsets in the internal stream OffsetsStream through
	// Ingest, run until Close.
	Groups *groups.Coordinator
	// OffsetsStream is the stream Groups stores committed offsets in
	// (groups.DefaultOffsetsStream when empty): internal, as Kafka's
	// __consumer_offsets, so Kafka clients may not produce to it or
	// delete it.
	OffsetsStream string
	// Membership, when set, is the ingestion nodes serving the same
	// deployment, this one among them, each advertised as a broker at its
	// host and this listener's port (every node listens on the same one):
	// Metadata lists them all and spreads partition leadership over them,
	// and FindCoordinator names each group's coordinator among them. The
	// same Membership must be Groups' (groups.Options.Membership), and its
	// Self this listener's advertised host. Nil: the listener is the one
	// broker (node 0), leader of every partition and coordinator of every
	// group.
	Membership *groups.Membership
	// Registerer receives the listener's metrics (nil: not exported).
	Registerer prometheus.Registerer
	// BrokerHost, with Membership, is the name a node is advertised under,
	// from its host among the peers (nil: that host). On Kubernetes the
	// peers are pod IPs and a client checking the broker's TLS name needs
	// a name: the pod's under a headless Service.
	BrokerHost func(peer string) string
}

// Server is a Kafka listener.
type Server struct {
	opts       Options
	ing        *ingest.Server
	log        logr.Logger
	host       string
	port       int32
	maxRequest int
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	mu         sync.Mutex
	listeners  []net.Listener
	conns      map[net.Conn]struct{}
	groups     *groups.Coordinator
	// offsetsStream is Options.OffsetsStream or its default.
	offsetsStream string
	metrics       *metrics
}

// New returns a listener for opts; Serve starts it.
func New(opts Options) (*Server, error) {
	if opts.Ingest == nil {
		return nil, errors.New("the Kafka listener needs an ingestion server")
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{opts: opts, ing: opts.Ingest, log: opts.Logger, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}, maxRequest: opts.MaxRequestBytes, metrics: newMetrics()}
	if s.maxRequest <= 0 {
		s.maxRequest = DefaultMaxRequestBytes
	}
	s.offsetsStream = cmp.Or(opts.OffsetsStream, groups.DefaultOffsetsStream)
	s.groups = opts.Groups
	if s.groups == nil {
		s.groups = groups.New(groups.Options{Offsets: &groups.StreamOffsets{Ingest: opts.Ingest, Stream: s.offsetsStream, Logger: opts.Logger.WithName("groups")}, Logger: opts.Logger.WithName("groups")})
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.groups.Run(ctx, groups.TickInterval)
		}()
	}
	if opts.Advertise != "" {
		if err := s.setAdvertised(opts.Advertise); err != nil {
			cancel()
			return nil, fmt.Errorf("--kafka-advertise %q: %w", opts.Advertise, err)
		}
	}
	if m := opts.Membership; m != nil && (opts.Advertise == "" || s.brokerHost(m.Self().Host) != s.host) {
		cancel()
		return nil, fmt.Errorf("the listener advertises %q but is %q among the group coordinators: a listener with peers advertises its own host", s.host, s.brokerHost(m.Self().Host))
	}
	if err := s.metrics.register(opts.Registerer); err != nil {
		cancel()
		return nil, fmt.Errorf("register the Kafka listener's metrics: %w", err)
	}
	return s, nil
}

func (s *Server) setAdvertised(hostport string) error {
	host, port, err := SplitBrokerAddress(hostport)
	if err != nil {
		return err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return fmt.Errorf("port %q is not a port number", port)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		if host, err = os.Hostname(); err != nil {
			return fmt.Errorf("no host to advertise: %w", err)
		}
	}
	s.host, s.port = host, int32(p)
	return nil
}

// SplitBrokerAddress splits a broker address, HOST:PORT with HOST a
// name, an IPv4 address or an IPv6 address in brackets (an IPv4 address
// may have them too: the operator passes [$(POD_IP)]:PORT, whichever
// family the pod's address is), saying what is wrong when it is not one.
func SplitBrokerAddress(hostport string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(hostport)
	if err != nil {
		return "", "", fmt.Errorf("%w: want HOST:PORT, with an IPv6 address in brackets ([fd00::1]:9092)", err)
	}
	return host, port, nil
}

// broker is one broker the listener advertises.
type broker struct {
	id   int32
	host string
	port int32
}

// brokers are the brokers the listener advertises, this one first.
func (s *Server) brokers() []broker {
	self := broker{id: brokerID, host: s.host, port: s.port}
	m := s.opts.Membership
	if m == nil {
		return []broker{self}
	}
	self.id = m.Self().ID
	all := []broker{self}
	for _, p := range m.Peers() {
		if p.ID != self.id {
			all = append(all, broker{id: p.ID, host: s.brokerHost(p.Host), port: s.port})
		}
	}
	return all
}

// brokerHost is the name the node at peer is advertised under.
func (s *Server) brokerHost(peer string) string {
	if s.opts.BrokerHost == nil {
		return peer
	}
	return s.opts.BrokerHost(peer)
}

// coordinator is the broker coordinating group.
func (s *Server) coordinator(group string) broker {
	if s.opts.Membership == nil {
		return broker{id: brokerID, host: s.host, port: s.port}
	}
	p, _ := s.opts.Membership.Owner(group)
	return broker{id: p.ID, host: s.brokerHost(p.Host), port: s.port}
}

// Advertised is the broker address clients are told to use.
func (s *Server) Advertised() string {
	return net.JoinHostPort(s.host, strconv.Itoa(int(s.port)))
}

// Serve accepts connections on lis until Close. Without Options.Advertise
// it advertises lis's address.
func (s *Server) Serve(lis net.Listener) error {
	s.mu.Lock()
	if s.host == "" {
		if err := s.setAdvertised(lis.Addr().String()); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	s.listeners = append(s.listeners, lis)
	s.mu.Unlock()
	for {
		c, err := lis.Accept()
		if err != nil {
			if s.ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
		if s.opts.TLS != nil {
			c = tls.Server(c, s.opts.TLS)
		}
		s.mu.Lock()
		if s.ctx.Err() != nil {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.serveConn(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// Close stops accepting, closes every connection and waits for their
// handlers.
func (s *Server) Close() {
	s.mu.Lock()
	s.cancel()
	for _, l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// answer is one request's place in its connection's answers: they are
// written in the order the requests came, as Kafka clients expect.
type answer struct {
	done  chan struct{}
	bytes []byte // the whole response with its size; nil: none (acks=0)
}

// conn is one client connection.
type conn struct {
	srv     *Server
	c       net.Conn
	log     logr.Logger
	ctx     context.Context // cancelled when the connection ends
	answers chan *answer
	// lastCommit is closed when the connection's latest OffsetCommit is
	// done (read and written by the reader goroutine only).
	lastCommit chan struct{}
	// working counts the goroutines computing answers (later), which the
	// connection waits for before it ends, so that Close returns only
	// once nothing uses the ingestion server on a client's behalf.
	working sync.WaitGroup
}

func (s *Server) serveConn(nc net.Conn) {
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	defer nc.Close()
	s.metrics.conns.Inc()
	defer s.metrics.conns.Dec()
	cn := &conn{srv: s, c: nc, log: s.log.WithValues("client", nc.RemoteAddr().String()), answers: make(chan *answer, maxInFlight)}
	if tc, ok := nc.(*tls.Conn); ok {
		hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
		err := tc.HandshakeContext(hctx)
		hcancel()
		if err != nil {
			cn.log.V(1).Info("Kafka client's TLS handshake failed", "err", err.Error())
			return
		}
		// The caller's identity travels as a gRPC peer, so that the
		// ingestion policy judges it as it judges gRPC callers.
		ctx = peer.NewContext(ctx, &peer.Peer{Addr: nc.RemoteAddr(), AuthInfo: credentials.TLSInfo{State: tc.ConnectionState()}})
	}
	cn.ctx = ctx
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		cn.writeAnswers(cancel)
	}()
	err := cn.readRequests()
	// The client is gone (or broke the protocol): what it asked for can
	// no longer be answered, so stop waiting for it.
	cancel()
	close(cn.answers)
	<-writerDone
	cn.working.Wait()
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && ctx.Err() == nil {
		cn.log.Info("Closed a Kafka connection", "reason", err.Error())
	}
}

// writeAnswers writes each answer once it is ready, in request order.
func (cn *conn) writeAnswers(cancel context.CancelFunc) {
	w := bufio.NewWriterSize(cn.c, 64<<10)
	failed := false
	for a := range cn.answers {
		select {
		case <-a.done:
		default:
			// Not ready: what is buffered must not wait for it.
			if !failed && w.Buffered() > 0 {
				if err := w.Flush(); err != nil {
					failed = true
					cancel()
					cn.c.Close()
				}
			}
			select {
			case <-a.done:
			case <-cn.ctx.Done():
				failed = true
			}
		}
		if failed || a.bytes == nil {
			continue
		}
		if _, err := w.Write(a.bytes); err != nil {
			failed = true
			cancel()
			cn.c.Close()
			continue
		}
		if len(cn.answers) == 0 {
			if err := w.Flush(); err != nil {
				failed = true
				cancel()
				cn.c.Close()
			}
		}
	}
	if !failed {
		_ = w.Flush()
	}
}

// header is a request's header (Kafka request header v1 or v2).
type header struct {
	key         int16
	version     int16
	correlation int32
	clientID    string
	// start is when the request was read whole.
	start time.Time
}

// readRequests reads requests until the client goes or breaks the protocol.
func (cn *conn) readRequests() error {
	r := bufio.NewReaderSize(cn.c, 64<<10)
	var size [4]byte
	for {
		if _, err := io.ReadFull(r, size[:]); err != nil {
			return err
		}
		n := int(int32(binary.BigEndian.Uint32(size[:])))
		if n < 8 || n > cn.srv.maxRequest {
			return fmt.Errorf("request of %d bytes (the limit is %d)", n, cn.srv.maxRequest)
		}
		// The buffer grows as the bytes arrive: a header that claims
		// 100 MiB costs nothing until they come.
		var body bytes.Buffer
		body.Grow(min(n, 1<<20))
		if _, err := io.CopyN(&body, r, int64(n)); err != nil {
			return err
		}
		if err := cn.handle(body.Bytes()); err != nil {
			return err
		}
	}
}

// handle parses one request and starts answering it; an error closes the
// connection (what Kafka does with a request it cannot parse).
func (cn *conn) handle(buf []byte) error {
	h := header{key: int16(binary.BigEndian.Uint16(buf)), version: int16(binary.BigEndian.Uint16(buf[2:])), correlation: int32(binary.BigEndian.Uint32(buf[4:])), start: time.Now()}
	rest := buf[8:]
	if len(rest) < 2 {
		return errors.New("request header is truncated")
	}
	idLen := int(int16(binary.BigEndian.Uint16(rest)))
	rest = rest[2:]
	if idLen > 0 {
		if idLen > len(rest) {
			return errors.New("request header's client id is truncated")
		}
		h.clientID, rest = string(rest[:idLen]), rest[idLen:]
	}
	api, ok := supported[h.key]
	if h.key == kmsg.ApiVersions.Int16() && (!ok || h.version > api.max) {
		// An ApiVersions the listener does not know is answered at v0
		// with the versions it does (KIP-511), whatever its body.
		cn.srv.metrics.took(h)
		h.version = 0
		cn.reply(h, cn.apiVersionsUnsupported())
		return nil
	}
	if !ok {
		return fmt.Errorf("API key %d (%s) is not served (it is absent from ApiVersions)", h.key, kmsg.NameForKey(h.key))
	}
	if h.version < api.min || h.version > api.max {
		return fmt.Errorf("%s v%d is not served (v%d-v%d are)", kmsg.NameForKey(h.key), h.version, api.min, api.max)
	}
	req := kmsg.RequestForKey(h.key)
	req.SetVersion(h.version)
	if req.IsFlexible() {
		var err error
		if rest, err = skipTags(rest); err != nil {
			return fmt.Errorf("request header: %w", err)
		}
	}
	if err := req.ReadFrom(rest); err != nil {
		return fmt.Errorf("%s v%d: malformed request: %w", kmsg.NameForKey(h.key), h.version, err)
	}
	cn.srv.metrics.took(h)
	return cn.dispatch(h, req)
}

// skipTags skips a flexible header's tagged fields.
func skipTags(b []byte) ([]byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, errors.New("tagged fields are truncated")
	}
	b = b[k:]
	for range n {
		if _, k = binary.Uvarint(b); k <= 0 {
			return nil, errors.New("tag is truncated")
		}
		b = b[k:]
		size, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < size {
			return nil, errors.New("tag is truncated")
		}
		b = b[k+int(size):]
	}
	return b, nil
}

// later queues an answer that fn computes in a goroutine of its own; fn's
// nil response means none is sent.
func (cn *conn) later(h header, fn func(ctx context.Context) kmsg.Response) {
	a := &answer{done: make(chan struct{})}
	cn.answers <- a
	cn.working.Add(1)
	go func() {
		defer cn.working.Done()
		defer close(a.done)
		resp := fn(cn.ctx)
		if resp != nil {
			a.bytes = encode(h, resp)
		}
		if cn.ctx.Err() == nil {
			// Else the client is gone and nothing is sent.
			cn.srv.metrics.answered(h, resp)
		}
	}()
}

// reply queues an answer that is ready now.
func (cn *conn) reply(h header, resp kmsg.Response) {
	a := &answer{done: make(chan struct{}), bytes: encode(h, resp)}
	cn.srv.metrics.answered(h, resp)
	close(a.done)
	cn.answers <- a
}

// encode frames a response: size, correlation id, the header's tagged
// fields when flexible (never for ApiVersions, whose response header is
// always v0), then the body.
func encode(h header, resp kmsg.Response) []byte {
	resp.SetVersion(h.version)
	b := make([]byte, 8, 256)
	binary.BigEndian.PutUint32(b[4:], uint32(h.correlation))
	if resp.IsFlexible() && h.key != kmsg.ApiVersions.Int16() {
		b = append(b, 0)
	}
	b = resp.AppendTo(b)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// randomProducerID draws a producer id for InitProducerId: positive, below
// 2^47 (catenaProducer puts the epoch beside it), never 0. Ids are random
// rather than counted so that every ingestion node, and every restart of
// one, can give them out without coordination.
func randomProducerID() (int64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, err
	}
	return int64(binary.LittleEndian.Uint64(b[:])>>17) | 1, nil
}
