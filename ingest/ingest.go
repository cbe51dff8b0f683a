// Package ingest is the ingestion role: it routes each produced record by
// key hash (or an explicit partition) to its partition, sends it to the head
// of that partition's chain, and answers the producer only once the chain
// has committed it (every member holds it durably). It also routes reads to
// chain members, which serve committed records only.
package ingest

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/internal/heard"
	"github.com/catena-streams/catena/internal/writetrace"
	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
	"github.com/catena-streams/catena/rpc/headers"
	"github.com/catena-streams/catena/rpc/producestream"
	"github.com/catena-streams/catena/rpc/transport"
)

const (
	// statusTimeout bounds one discovery round.
	statusTimeout = 2 * time.Second
	// statusProbeTimeout bounds each replica's answer within a round: a
	// paused or restarting replica must not hold up re-learning a chain
	// (appenders wait for the round after a head fails); the others'
	// reports name every chain it belongs to.
	statusProbeTimeout = 300 * time.Millisecond
	// statusStraggleGrace is how long a discovery round waits for the
	// remaining replicas once one has answered.
	statusStraggleGrace = 100 * time.Millisecond
	// defaultProduceTimeout bounds a produce call whose context has no deadline.
	defaultProduceTimeout = 30 * time.Second
	// maxAppendBytes splits a partition's share of a produce request into
	// appends of at most this many key and value bytes.
	maxAppendBytes = 4 << 20
	// retryMin and retryMax bound the back-off between attempts to reach
	// a partition's head (or a member to read from). The cap is what a
	// head failover costs beyond the reconfiguration itself: with 500 ms,
	// an appender that had failed six times in a row sat out a 320 ms
	// back-off while the new head was already serving, and the write gap
	// of a killed head measured 63-673 ms (make bench-compare). Each retry
	// waits for a discovery round first, and rounds are shared by every
	// partition, so a lower cap does not multiply them.
	retryMin = 10 * time.Millisecond
	retryMax = 100 * time.Millisecond
	// subscribeWait is the long-poll of each read behind Subscribe.
	subscribeWait     = 5 * time.Second
	maxProduceRecords = 100000
)

// Options configure the ingestion server.
type Options struct {
	// Replicas are addresses of replica processes to learn chains from; the
	// members they report are learned in turn.
	Replicas []string
	// RefreshInterval between discovery rounds (default 1s).
	RefreshInterval time.Duration
	// StallAfter is how long an append may go unanswered before its
	// appender looks for a moved chain and reports a silent head (0:
	// 150 ms; tests that must see no report on a loaded machine lengthen
	// it).
	StallAfter time.Duration
	TLS        *tls.Config
	Logger     logr.Logger
	// Registerer receives the ingestion metrics (nil: not exported).
	Registerer prometheus.Registerer
	// Streams, when set, lets clients create and delete streams
	// (CreateStream, DeleteStream); nil refuses them.
	Streams StreamAdmin
}

// Server implements catenapb.IngestServer.
type Server struct {
	catenapb.UnimplementedIngestServer

	logger  logr.Logger
	admin   StreamAdmin
	metrics *metrics
	// stallAfter is Options.StallAfter, defaulted.
	stallAfter time.Duration
	pool       *transport.Pool
	disc       *discovery
	seq        *sequencer
	ctx        context.Context
	cancel     context.CancelFunc
	done       chan struct{}

	// draining is closed by Drain.
	draining  chan struct{}
	drainOnce sync.Once

	appendersMu sync.Mutex
	appenders   map[appenderKey]*appender

	// heads is when each head process (by address) last answered an
	// append on any partition's stream: reachability is the process's,
	// not a partition's (see appender.silence).
	heads *heard.Table
	// reports gathers the appenders' reports of unreachable heads into one
	// call per successor.
	reports *headReporter

	// name identifies this ingestion node to replicas (its host name).
	name string

	// Records produced without a producer id are given this one, so that
	// ingestion's own retries are idempotent too.
	ownProducer uint64
	ownMu       sync.Mutex
	ownSeq      uint64
	keyless     sync.Map // stream name -> *keylessPicker
}

// New starts discovery and returns the server.
func New(opts Options) (*Server, error) {
	writetrace.SetRole("ingest")
	if len(opts.Replicas) == 0 {
		return nil, errors.New("ingestion needs at least one replica address")
	}
	if opts.RefreshInterval <= 0 {
		opts.RefreshInterval = time.Second
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("failed to draw a producer id: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		logger:      opts.Logger,
		admin:       opts.Streams,
		metrics:     newMetrics(opts.Registerer),
		stallAfter:  cmp.Or(opts.StallAfter, stallAfter),
		pool:        transport.NewPool(opts.TLS),
		ctx:         ctx,
		cancel:      cancel,
		done:        make(chan struct{}),
		draining:    make(chan struct{}),
		seq:         newSequencer(),
		appenders:   map[appenderKey]*appender{},
		heads:       heard.New(),
		ownProducer: binary.LittleEndian.Uint64(b[:]) | 1,
	}
	if host, err := os.Hostname(); err == nil && host != "" {
		s.name = host
	} else {
		s.name = fmt.Sprintf("ingest-%x", s.ownProducer)
	}
	s.reports = newHeadReporter(s)
	s.disc = &discovery{srv: s, seeds: opts.Replicas, interval: opts.RefreshInterval, updated: make(chan struct{}), kick: make(chan struct{}, 1), table: buildRoutes(nil, opts.Replicas), last: map[string]lastReport{}}
	s.disc.refresh(ctx)
	go func() {
		defer close(s.done)
		s.disc.loop(ctx)
	}()
	return s, nil
}

// Register adds the Ingest service to a gRPC server.
func (s *Server) Register(g *grpc.Server) { catenapb.RegisterIngestServer(g, s) }

// Close stops discovery and closes connections.
func (s *Server) Close() {
	s.cancel()
	<-s.done
	s.reports.wait()
	s.pool.Close()
}

// stream returns the route of a stream, refreshing once if unknown.
func (s *Server) stream(ctx context.Context, name string) (*streamRoute, error) {
	if name == "" {
		return nil, status.Error(codes.InvalidArgument, "stream name is required")
	}
	if sr := s.disc.current().streams[name]; sr != nil {
		return sr, nil
	}
	select {
	case <-s.disc.requestRefresh():
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if sr := s.disc.current().streams[name]; sr != nil {
		return sr, nil
	}
	return nil, status.Errorf(codes.NotFound, "stream %q not found", name)
}

// PartitionFor maps a key to a partition: FNV-1a of the key modulo the
// partition count (contract.PartitionFor). Records with equal keys share a
// partition, hence an order.
func PartitionFor(key []byte, partitions uint32) uint32 {
	return contract.PartitionFor(key, partitions)
}

// routeRecords maps each record of a request to its partition: the one it
// names, else its key's (PartitionFor), else one partition for all of the
// request's records without key or partition: pickKeyless's answer for
// their size (values plus each record's overhead; called at most once). Sticky, as Kafka's producers
// are: spread record by record, every request waited for every partition's
// chain, and each chain got a share of every request instead of whole ones.
func routeRecords(recs []*catenapb.ProduceRecord, n uint32, pickKeyless func(bytes int) uint32) []uint32 {
	const keyless = ^uint32(0) // placeholder: Produce refuses partitions >= n
	out := make([]uint32, len(recs))
	keylessBytes := 0
	for i, r := range recs {
		switch {
		case r.Partition != nil:
			out[i] = r.GetPartition()
		case len(r.GetKey()) > 0:
			out[i] = PartitionFor(r.GetKey(), n)
		default:
			// As stored, roughly: records with empty values move the
			// picker on too.
			keylessBytes += len(r.GetValue()) + partlog.MaxRecordOverhead
			out[i] = keyless
		}
	}
	if keylessBytes == 0 {
		return out
	}
	p := pickKeyless(keylessBytes)
	for i := range out {
		if out[i] == keyless {
			out[i] = p
		}
	}
	return out
}

// stickyBytes is how many bytes of keyless records (as routeRecords counts
// them) go to one partition of a stream before the next takes over. Sticking past one request (Kafka's
// producers stick for a batch) matters at moderate rates: with a new
// partition per request, all four partitions' chains of the benchmarks were
// busy at 10-12k records/s of 1 KiB, each with small appends, and the
// writes, forwards and fsyncs of all of them (twelve fsync streams on three
// replica processes) were what the CPU spent its time on. With 256 KiB the
// producers' p50/p99 there fell from 14-17/39-70 ms to 6-11/17-38 ms; 1 MiB
// was no better at that rate and 5% slower at full speed. At full speed the
// partitions still share the load: more than stickyBytes arrives during one
// chain round trip.
var stickyBytes = 256 << 10

// keylessPicker spreads one stream's keyless records over its partitions,
// stickyBytes at a time, in turn.
type keylessPicker struct {
	mu      sync.Mutex
	current uint32
	given   int // bytes given to current
}

func (k *keylessPicker) pick(n uint32, bytes int) uint32 {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.given >= stickyBytes {
		k.current, k.given = k.current+1, 0
	}
	k.given += bytes
	return k.current % n
}

// keylessPickerFor returns the stream's picker, making it on first use.
func (s *Server) keylessPickerFor(stream string) *keylessPicker {
	if k, ok := s.keyless.Load(stream); ok {
		return k.(*keylessPicker)
	}
	k, _ := s.keyless.LoadOrStore(stream, &keylessPicker{})
	return k.(*keylessPicker)
}

type group struct {
	partition uint32
	idx       []int // request indices, in order
}

// Produce stores records and answers once each is committed.
func (s *Server) Produce(ctx context.Context, req *catenapb.ProduceRequest) (*catenapb.ProduceResponse, error) {
	return s.produce(ctx, req)
}

// ProduceStream serves a producer's requests on one stream, each as
// Produce serves it (rpc/producestream).
func (s *Server) ProduceStream(stream catenapb.Ingest_ProduceStreamServer) error {
	return producestream.Serve(stream, s.Produce, s.draining)
}

// Drain makes produce streams end at their next request, once the ones in
// flight are answered, so that their producers continue on another node;
// called as the node begins to stop. Idempotent.
func (s *Server) Drain() { s.drainOnce.Do(func() { close(s.draining) }) }

func (s *Server) produce(ctx context.Context, req *catenapb.ProduceRequest) (*catenapb.ProduceResponse, error) {
	p, err := s.Enqueue(ctx, req)
	if err != nil {
		return nil, err
	}
	return p.Wait(ctx)
}

// Pending is a produce request whose records are queued at their
// partitions' appenders, in the order Enqueue was called.
type Pending struct {
	srv       *Server
	stream    string
	start     time.Time
	n         uint32
	partition []uint32
	queued    []*chunk
	owners    [][]int
}

// Enqueue validates req and queues its records at their partitions'
// appenders, then returns without waiting for them to commit. Records that
// one caller enqueues one call after another reach each partition's head in
// that order, whatever order Wait is called in: a listener that reads a
// connection's requests one by one (the Kafka listener) keeps the order of
// its requests without holding the next one back until the last is
// answered. An error means nothing was queued.
func (s *Server) Enqueue(ctx context.Context, req *catenapb.ProduceRequest) (*Pending, error) {
	return s.enqueue(ctx, req, false)
}

// EnqueueInOrder is Enqueue for a producer that resends a partition's
// batches in order itself after one fails, as Kafka's idempotent producers
// do: once ingestion has failed some of its records at a partition, its
// later records there are refused (ABORTED, retried) instead of parked
// behind the retry (heldBack), since such a producer sends the retry only
// once every request in flight is answered.
func (s *Server) EnqueueInOrder(ctx context.Context, req *catenapb.ProduceRequest) (*Pending, error) {
	return s.enqueue(ctx, req, true)
}

// enqueue queues req's records; the records of a request it refuses are
// counted as produce errors here, and those refused later by Wait, so
// that every caller's (Produce's, the Kafka listener's) count.
func (s *Server) enqueue(ctx context.Context, req *catenapb.ProduceRequest, inOrder bool) (*Pending, error) {
	p, err := s.enqueueRecords(ctx, req, inOrder)
	if err != nil {
		stream := req.GetStream()
		if s.disc.current().streams[stream] == nil {
			// A name a client made up must not make a series.
			stream = ""
		}
		s.metrics.countProduceErrors(stream, len(req.GetRecords()), nil, err)
	}
	return p, err
}

func (s *Server) enqueueRecords(ctx context.Context, req *catenapb.ProduceRequest, inOrder bool) (*Pending, error) {
	start := time.Now()
	sr, err := s.stream(ctx, req.GetStream())
	if err != nil {
		return nil, err
	}
	recs := req.GetRecords()
	n := uint32(len(sr.partitions))
	if len(recs) == 0 {
		return &Pending{srv: s, stream: req.GetStream(), start: start, n: n}, nil
	}
	if len(recs) > maxProduceRecords {
		return nil, status.Errorf(codes.InvalidArgument, "produce carries %d records, above the limit of %d per request; nothing was stored", len(recs), maxProduceRecords)
	}
	limit := int(sr.config.GetMaxRecordBytes())
	if limit <= 0 || limit > partlog.MaxRecordBytes {
		limit = partlog.MaxRecordBytes
	}
	// Validate everything before storing anything.
	for i, r := range recs {
		if sz := storedBytes(r); sz > limit {
			return nil, status.Errorf(codes.InvalidArgument, "record %d is %d bytes (key, value and headers), above stream %q's limit of %d bytes; nothing was stored", i, sz, req.GetStream(), limit)
		}
		if len(r.GetHeaders()) > partlog.MaxBatchHeaders {
			return nil, status.Errorf(codes.InvalidArgument, "record %d has %d headers, above the limit of %d; nothing was stored", i, len(r.GetHeaders()), partlog.MaxBatchHeaders)
		}
		for _, h := range r.GetHeaders() {
			// Read back in a protobuf string, which must be UTF-8: a key
			// that is not would make every read of the partition fail.
			if !utf8.ValidString(h.GetKey()) {
				return nil, status.Errorf(codes.InvalidArgument, "record %d has a header key that is not UTF-8 (%q); nothing was stored", i, h.GetKey())
			}
		}
		if r.Partition != nil && r.GetPartition() >= n {
			return nil, status.Errorf(codes.InvalidArgument, "record %d names partition %d, but stream %q has %d partitions; nothing was stored", i, r.GetPartition(), req.GetStream(), n)
		}
	}
	// Headers go only to a stream whose chains' members can all store
	// them: a member of a version before headers refuses their frames,
	// and a chain would stall on it in a rolling upgrade. (Every chain of
	// the stream, as a keyless record's partition is picked later; and
	// before ingestion's own sequences are drawn, under their lock.)
	if slices.ContainsFunc(recs, func(r *catenapb.ProduceRecord) bool { return len(r.GetHeaders()) > 0 }) {
		for p, pr := range sr.partitions {
			if pr == nil {
				continue
			}
			if err := s.canStoreHeaders(ctx, req.GetStream(), uint32(p), pr.members); err != nil {
				return nil, err
			}
		}
	}
	producer := req.GetProducerId()
	seqs := make([]uint64, len(recs))
	if producer == 0 {
		// Ingestion's own sequences are drawn and queued under one lock,
		// so each partition receives them in increasing order. The lock
		// is let go once they are queued, not when they commit.
		producer = s.ownProducer
		s.ownMu.Lock()
		defer s.ownMu.Unlock()
		base := s.ownSeq
		s.ownSeq += uint64(len(recs))
		for i := range seqs {
			seqs[i] = base + uint64(i) + 1
		}
	} else {
		for i, r := range recs {
			seqs[i] = r.GetSequence()
		}
	}
	now := time.Now().UnixMilli()

	groups := map[uint32]*group{}
	picker := s.keylessPickerFor(req.GetStream())
	partitionOf := routeRecords(recs, n, func(bytes int) uint32 { return picker.pick(n, bytes) })
	var order []*group
	for i, p := range partitionOf {
		g := groups[p]
		if g == nil {
			g = &group{partition: p}
			groups[p] = g
			order = append(order, g)
		}
		g.idx = append(g.idx, i)
	}

	deadline := time.Now().Add(defaultProduceTimeout)
	if d, ok := ctx.Deadline(); ok {
		deadline = d
	}
	// Queue in the producer's order; Wait waits for the heads' answers.
	prev := req.GetPrevSequence()
	if req.GetProducerId() == 0 {
		prev = 0 // ingestion's own ids: no producer order to keep
	}
	prevReq := req.GetPrevRequest()
	if req.GetProducerId() == 0 {
		prevReq = 0
	}
	release := s.seq.admit(ctx, producer, admission{prevSeq: prev, lastSeq: slices.Max(seqs), prevReq: prevReq, req: req.GetRequest()})
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	p := &Pending{srv: s, stream: req.GetStream(), start: start, n: n, partition: partitionOf}
	for _, g := range order {
		a := s.appenderFor(req.GetStream(), g.partition)
		for _, idx := range splitChunks(g.idx, recs) {
			c := &chunk{recs: make([]partlog.Record, len(idx)), queued: start, deadline: deadline, done: make(chan struct{}), inOrder: inOrder}
			for k, i := range idx {
				r := recs[i]
				ts := r.GetTimestampMs()
				if ts == 0 {
					ts = now
				}
				c.recs[k] = partlog.Record{Key: r.GetKey(), Value: r.GetValue(), TimestampMs: ts, ProducerID: producer, Sequence: seqs[i], Headers: headers.ToLog(r.GetHeaders())}
				// An upper bound of what the record adds to a frame beyond
				// MaxRecordOverhead: in a frame with headers every record
				// has at least its count.
				c.bytes += len(r.GetKey()) + len(r.GetValue()) + partlog.EncodedHeadersLen(c.recs[k].Headers)
				c.headers += len(r.GetHeaders())
			}
			a.enqueue(c)
			p.queued = append(p.queued, c)
			p.owners = append(p.owners, idx)
		}
	}
	release()
	return p, nil
}

// Wait waits until every record of the request is committed or failed, and
// answers as Produce does. A cancelled ctx stops the wait, not the appends.
func (p *Pending) Wait(ctx context.Context) (*catenapb.ProduceResponse, error) {
	results := make([]*catenapb.ProduceResult, len(p.partition))
	resultBuf := make([]catenapb.ProduceResult, len(p.partition))
	failed := false
	for ci, c := range p.queued {
		select {
		case <-c.done:
		case <-ctx.Done():
			err := status.FromContextError(ctx.Err()).Err()
			p.srv.metrics.countProduceErrors(p.stream, len(p.partition), nil, err)
			return nil, err
		}
		for k, i := range p.owners[ci] {
			res := &resultBuf[i]
			res.Partition = p.partition[i]
			if c.err != nil {
				st := status.Convert(c.err)
				res.ErrorCode, res.ErrorMessage = int32(st.Code()), st.Message()
			} else {
				res.Offset, res.Duplicate = c.offsets[k], c.dups[k]
			}
			results[i] = res
		}
		failed = failed || c.err != nil
	}
	resp := &catenapb.ProduceResponse{Results: results, Partitions: p.n}
	if failed {
		p.srv.metrics.countProduceErrors(p.stream, len(results), resp, nil)
	} else if len(p.queued) > 0 {
		p.srv.metrics.produceSeconds.WithLabelValues(p.stream).Observe(time.Since(p.start).Seconds())
	}
	return resp, nil
}

// committedSeen is the highest committed offset of a partition this
// ingestion acknowledged records up to (0: none).
func (s *Server) committedSeen(stream string, partition uint32) uint64 {
	s.appendersMu.Lock()
	a := s.appenders[appenderKey{stream, partition}]
	s.appendersMu.Unlock()
	if a == nil {
		return 0
	}
	return a.committed.Load()
}

// appenderFor returns the partition's appender, starting it on first use.
func (s *Server) appenderFor(stream string, partition uint32) *appender {
	key := appenderKey{stream, partition}
	s.appendersMu.Lock()
	defer s.appendersMu.Unlock()
	a := s.appenders[key]
	if a == nil {
		a = newAppender(s, stream, partition)
		s.appenders[key] = a
	}
	return a
}

type appenderKey struct {
	stream    string
	partition uint32
}

// OneAppend reports whether records, all of one partition, go to its head
// as one append: stored together or not at all, at consecutive offsets.
func OneAppend(recs []*catenapb.ProduceRecord) bool {
	idx := make([]int, len(recs))
	for i := range idx {
		idx[i] = i
	}
	return len(splitChunks(idx, recs)) == 1
}

// splitChunks splits a partition's records into appends of bounded size
// (bytes, records and headers).
func splitChunks(idx []int, recs []*catenapb.ProduceRecord) [][]int {
	var out [][]int
	start, size, inChunk := 0, 0, 0
	for k, i := range idx {
		sz := storedBytes(recs[i]) + 64 + 10*len(recs[i].GetHeaders())
		nh := len(recs[i].GetHeaders())
		if k > start && (size+sz > maxAppendBytes || k-start >= partlog.MaxBatchRecords || inChunk+nh > partlog.MaxBatchHeaders) {
			out = append(out, idx[start:k])
			start, size, inChunk = k, 0, 0
		}
		size += sz
		inChunk += nh
	}
	return append(out, idx[start:])
}

// canStoreHeaders checks that every member of a partition's chain reported
// it can store record headers. A member not heard from yet (ingestion just
// started, its answer slow) is waited for, a discovery round at a time,
// within ctx and headersWait; one that answered without the feature runs
// an older version: refused at once.
func (s *Server) canStoreHeaders(ctx context.Context, stream string, partition uint32, members []*catenapb.Member) error {
	deadline := time.Now().Add(headersWait)
	for {
		missing, known, ok := s.disc.current().supports(members, contract.FeatureRecordHeaders)
		if ok {
			return nil
		}
		if known || time.Now().After(deadline) {
			return status.Errorf(codes.FailedPrecondition, "replica %s of partition %s/%d has not reported that it can store record headers (a version before them, or not answering): upgrade every replica before sending headers; nothing was stored", missing, stream, partition)
		}
		select {
		case <-s.disc.requestRefresh():
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// headersWait bounds how long a produce with headers waits to hear from
// a chain member that has not reported yet.
const headersWait = 10 * time.Second

// storedBytes is what a record counts toward its stream's record size
// limit: its key, value and every header's key and value.
func storedBytes(r *catenapb.ProduceRecord) int {
	n := len(r.GetKey()) + len(r.GetValue())
	for _, h := range r.GetHeaders() {
		n += len(h.GetKey()) + len(h.GetValue())
	}
	return n
}
