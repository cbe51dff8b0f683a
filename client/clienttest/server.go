// Package clienttest provides an in-memory Ingest server for tests of the
// client package and of tools built on it. It implements the Ingest
// service over real gRPC on a loopback port, with idempotent produce
// (de-duplication by producer id and sequence) and fault injection.
package clienttest

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
	"github.com/catena-streams/catena/rpc/producestream"
)

// MaxRecordBytes bounds key+value of one record (ResourceExhausted above).
const MaxRecordBytes = 1 << 20

// Server is a fake ingestion endpoint.
type Server struct {
	catenapb.UnimplementedIngestServer

	Addr string

	grpc *grpc.Server
	lis  net.Listener

	mu       sync.Mutex
	streams  map[string]*stream
	dedup    map[dedupKey]loc
	requests []*catenapb.ProduceRequest
	// fault injection
	failNext    []error // RPC errors returned by the next Produce calls, before storing
	dropNext    int     // the next Produce calls store, then answer Unavailable
	recordHook  func(req *catenapb.ProduceRequest, i int, attempt int) (codes.Code, string)
	seqAttempts map[dedupKey]int
	produceGate chan struct{}
	subBreak    chan struct{}
	// admitted: per producer, one past the highest request number stored
	// (ingestion's order, ProduceRequest.prev_request); admittedCh is
	// closed and replaced when it moves.
	admitted   map[uint64]uint64
	admittedCh chan struct{}
	// countless: answers leave out the stream's partition count, as an
	// older ingestion node's do.
	countless bool
	// unaryOnly: ProduceStream is Unimplemented, as on an ingestion node
	// older than it.
	unaryOnly bool
	// delayNext Produce calls wait delay, ignoring their deadline.
	delayNext int
	delay     time.Duration
	// produceBreak is closed (and replaced) to end open ProduceStreams;
	// produceOpen holds a channel per open one, closed once it ended.
	produceBreak chan struct{}
	produceOpen  map[chan struct{}]bool
	// produceStreams counts the ProduceStreams opened.
	produceStreams int
}

type dedupKey struct{ producer, seq uint64 }

type loc struct {
	partition uint32
	offset    uint64
}

type stream struct {
	parts   [][]*catenapb.Record
	changed chan struct{} // closed and replaced on every append
	epoch   uint64
	// holds and trims are per partition; see holds.go.
	holds []map[string]uint64
	trims [][]*catenapb.ForcedTrim
}

// TB is what Start needs of a test.
type TB interface {
	Helper()
	Fatalf(string, ...any)
	Cleanup(func())
}

// Start starts a server on 127.0.0.1:0; it stops when the test ends.
func Start(tb TB) *Server {
	tb.Helper()
	return StartWith(tb)
}

// StartWith is Start with gRPC server options (TLS credentials, say).
func StartWith(tb TB, opts ...grpc.ServerOption) *Server {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	s := &Server{
		Addr:        lis.Addr().String(),
		lis:         lis,
		grpc:        grpc.NewServer(opts...),
		streams:     map[string]*stream{},
		dedup:       map[dedupKey]loc{},
		seqAttempts: map[dedupKey]int{},
		subBreak:    make(chan struct{}),

		produceBreak: make(chan struct{}),
		produceOpen:  map[chan struct{}]bool{},
	}
	catenapb.RegisterIngestServer(s.grpc, s)
	go s.grpc.Serve(lis)
	tb.Cleanup(s.Stop)
	return s
}

// Stop stops the server, cancelling open streams.
func (s *Server) Stop() { s.grpc.Stop() }

// AddStream adds a stream with n partitions.
func (s *Server) AddStream(name string, partitions int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streams[name] = &stream{parts: make([][]*catenapb.Record, partitions), changed: make(chan struct{}), epoch: 1}
}

// AnswerWithoutPartitionCount makes Produce answers leave out the stream's
// partition count (on) or give it (off), as older and newer ingestion
// nodes do.
func (s *Server) AnswerWithoutPartitionCount(on bool) {
	s.mu.Lock()
	s.countless = on
	s.mu.Unlock()
}

// FailProduce makes the next len(errs) Produce calls fail with errs (in
// order) without storing anything.
func (s *Server) FailProduce(errs ...error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failNext = append(s.failNext, errs...)
}

// DropResponses makes the next n Produce calls store their records and then
// answer Unavailable, as if the response was lost.
func (s *Server) DropResponses(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropNext += n
}

// SetRecordHook installs a per-record error injector: a non-OK code
// rejects record i of req (attempt counts sends of that producer/sequence,
// from 1).
func (s *Server) SetRecordHook(h func(req *catenapb.ProduceRequest, i int, attempt int) (codes.Code, string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recordHook = h
}

// DelayProduce makes the next n Produce calls wait d before they store,
// whatever their deadline: their answers come after their callers gave up.
func (s *Server) DelayProduce(n int, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delayNext, s.delay = n, d
}

// GateProduce blocks Produce calls until the returned release is called.
func (s *Server) GateProduce() (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.produceGate = ch
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.produceGate = nil
			s.mu.Unlock()
			close(ch)
		})
	}
}

// WithoutProduceStream makes ProduceStream Unimplemented (on), as on an
// ingestion node older than it, or serves it (off, the default).
func (s *Server) WithoutProduceStream(on bool) {
	s.mu.Lock()
	s.unaryOnly = on
	s.mu.Unlock()
}

// BreakProduceStreams ends every open ProduceStream with Unavailable and
// returns once they ended; the requests in flight on them stay unanswered
// (stored or not).
func (s *Server) BreakProduceStreams() {
	s.mu.Lock()
	close(s.produceBreak)
	s.produceBreak = make(chan struct{})
	var open []chan struct{}
	for ch := range s.produceOpen {
		open = append(open, ch)
	}
	s.mu.Unlock()
	for _, ch := range open {
		<-ch
	}
}

// ProduceStreams is how many ProduceStreams were opened.
func (s *Server) ProduceStreams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.produceStreams
}

// ProduceStream serves each request as Produce does (rpc/producestream).
func (s *Server) ProduceStream(st catenapb.Ingest_ProduceStreamServer) error {
	s.mu.Lock()
	if s.unaryOnly {
		s.mu.Unlock()
		return status.Error(codes.Unimplemented, "unknown method ProduceStream for service catena.v1.Ingest")
	}
	s.produceStreams++
	brk := s.produceBreak
	ended := make(chan struct{})
	s.produceOpen[ended] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.produceOpen, ended)
		s.mu.Unlock()
		close(ended)
	}()
	bs := &breakable{Ingest_ProduceStreamServer: st}
	done := make(chan error, 1)
	go func() { done <- producestream.Serve(bs, s.Produce, nil) }()
	select {
	case err := <-done:
		return err
	case <-brk:
		bs.breakOff()
		return status.Error(codes.Unavailable, "produce stream broken by the test")
	}
}

// breakable is a ProduceStream that sends nothing once broken off: the
// requests in flight when a test breaks it stay unanswered.
type breakable struct {
	catenapb.Ingest_ProduceStreamServer
	mu     sync.Mutex
	broken bool
}

func (b *breakable) Recv() (*catenapb.ProduceRequest, error) {
	req, err := b.Ingest_ProduceStreamServer.Recv()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.broken {
		return nil, status.Error(codes.Unavailable, "produce stream broken by the test")
	}
	return req, err
}

func (b *breakable) Send(resp *catenapb.ProduceResponse) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.broken {
		return status.Error(codes.Unavailable, "produce stream broken by the test")
	}
	return b.Ingest_ProduceStreamServer.Send(resp)
}

func (b *breakable) breakOff() {
	b.mu.Lock()
	b.broken = true
	b.mu.Unlock()
}

// BreakSubscriptions ends every open Subscribe stream with Unavailable.
func (s *Server) BreakSubscriptions() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.subBreak)
	s.subBreak = make(chan struct{})
}

// Requests returns copies of the Produce requests received so far.
func (s *Server) Requests() []*catenapb.ProduceRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// Records returns a copy of the stored records of a partition.
func (s *Server) Records(name string, partition int) []*catenapb.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[name]
	if st == nil || partition >= len(st.parts) {
		return nil
	}
	return slices.Clone(st.parts[partition])
}

// Append stores records directly (test setup), returning their offsets.
func (s *Server) Append(name string, partition int, recs ...*catenapb.Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[name]
	for _, r := range recs {
		r = proto.Clone(r).(*catenapb.Record)
		r.Partition = uint32(partition)
		r.Offset = uint64(len(st.parts[partition]))
		if r.TimestampMs == 0 {
			r.TimestampMs = time.Now().UnixMilli()
		}
		st.parts[partition] = append(st.parts[partition], r)
	}
	close(st.changed)
	st.changed = make(chan struct{})
}

func notFound(name string) error {
	return status.Errorf(codes.NotFound, "stream %q not found", name)
}

func (s *Server) lookup(name string, partition uint32) (*stream, error) {
	st := s.streams[name]
	if st == nil {
		return nil, notFound(name)
	}
	if int(partition) >= len(st.parts) {
		return nil, status.Errorf(codes.InvalidArgument, "stream %q has %d partitions, no partition %d", name, len(st.parts), partition)
	}
	return st, nil
}

// Produce implements catenapb.IngestServer.
func (s *Server) Produce(ctx context.Context, req *catenapb.ProduceRequest) (*catenapb.ProduceResponse, error) {
	s.mu.Lock()
	gate := s.produceGate
	s.requests = append(s.requests, proto.Clone(req).(*catenapb.ProduceRequest))
	var delay time.Duration
	if s.delayNext > 0 {
		s.delayNext--
		delay = s.delay
	}
	s.mu.Unlock()
	time.Sleep(delay)
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Admit in the producer's order, as ingestion does (briefly: a lost
	// predecessor is given up on).
	giveUp := time.After(2 * time.Second)
	for req.PrevRequest != 0 && req.PrevRequest >= s.admitted[req.ProducerId] {
		if s.admittedCh == nil {
			s.admittedCh = make(chan struct{})
		}
		ch := s.admittedCh
		s.mu.Unlock()
		select {
		case <-ch:
		case <-giveUp:
			s.mu.Lock()
			s.admitLocked(req.ProducerId, req.PrevRequest)
			s.mu.Unlock()
		case <-ctx.Done():
			s.mu.Lock()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		s.mu.Lock()
	}
	s.admitLocked(req.ProducerId, req.Request)
	if len(s.failNext) > 0 {
		err := s.failNext[0]
		s.failNext = s.failNext[1:]
		return nil, err
	}
	st := s.streams[req.Stream]
	if st == nil {
		return nil, notFound(req.Stream)
	}
	resp := &catenapb.ProduceResponse{Results: make([]*catenapb.ProduceResult, len(req.Records)), Partitions: uint32(len(st.parts))}
	if s.countless {
		resp.Partitions = 0
	}
	appended := false
	for i, r := range req.Records {
		res := &catenapb.ProduceResult{}
		resp.Results[i] = res
		k := dedupKey{req.ProducerId, r.Sequence}
		attempt := 0
		if req.ProducerId != 0 {
			s.seqAttempts[k]++
			attempt = s.seqAttempts[k]
		}
		if s.recordHook != nil {
			if c, msg := s.recordHook(req, i, attempt); c != codes.OK {
				res.ErrorCode, res.ErrorMessage = int32(c), msg
				continue
			}
		}
		if req.ProducerId != 0 {
			if l, ok := s.dedup[k]; ok {
				res.Partition, res.Offset, res.Duplicate = l.partition, l.offset, true
				continue
			}
		}
		if len(r.Key)+len(r.Value) > MaxRecordBytes {
			res.ErrorCode, res.ErrorMessage = int32(codes.ResourceExhausted), fmt.Sprintf("record of %d bytes exceeds the maximum of %d", len(r.Key)+len(r.Value), MaxRecordBytes)
			continue
		}
		var p uint32
		if r.Partition != nil {
			p = *r.Partition
			if int(p) >= len(st.parts) {
				res.ErrorCode, res.ErrorMessage = int32(codes.InvalidArgument), fmt.Sprintf("stream %q has no partition %d", req.Stream, p)
				continue
			}
		} else {
			p = contract.PartitionFor(r.Key, uint32(len(st.parts)))
		}
		ts := r.TimestampMs
		if ts == 0 {
			ts = time.Now().UnixMilli()
		}
		off := uint64(len(st.parts[p]))
		st.parts[p] = append(st.parts[p], &catenapb.Record{
			Key: slices.Clone(r.Key), Value: slices.Clone(r.Value), TimestampMs: ts, Partition: p, Offset: off,
			Headers: cloneHeaders(r.Headers),
		})
		appended = true
		if req.ProducerId != 0 {
			s.dedup[k] = loc{p, off}
		}
		res.Partition, res.Offset = p, off
	}
	if appended {
		close(st.changed)
		st.changed = make(chan struct{})
	}
	if s.dropNext > 0 {
		s.dropNext--
		return nil, status.Error(codes.Unavailable, "injected: response lost")
	}
	return resp, nil
}

// admitLocked records that a producer's request num was admitted.
func (s *Server) admitLocked(producer, num uint64) {
	if s.admitted == nil {
		s.admitted = map[uint64]uint64{}
	}
	if num+1 > s.admitted[producer] {
		s.admitted[producer] = num + 1
		if s.admittedCh != nil {
			close(s.admittedCh)
			s.admittedCh = nil
		}
	}
}

// read returns committed records from offset (up to maxBytes) and the
// channel to wait on for more.
func (s *Server) read(name string, partition uint32, offset uint64, maxBytes uint32) (*catenapb.FetchResponse, <-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.lookup(name, partition)
	if err != nil {
		return nil, nil, err
	}
	log := st.parts[partition]
	end := uint64(len(log))
	if offset > end {
		return nil, nil, status.Errorf(codes.OutOfRange, "offset %d is past the committed end %d", offset, end)
	}
	if maxBytes == 0 {
		maxBytes = 1 << 20
	}
	resp := &catenapb.FetchResponse{Committed: end, NextOffset: offset}
	size := 0
	for o := offset; o < end; o++ {
		r := log[o]
		if len(resp.Records) > 0 && size+len(r.Key)+len(r.Value) > int(maxBytes) {
			break
		}
		size += len(r.Key) + len(r.Value)
		resp.Records = append(resp.Records, r)
		resp.NextOffset = o + 1
	}
	return resp, st.changed, nil
}

// Fetch implements catenapb.IngestServer.
func (s *Server) Fetch(ctx context.Context, req *catenapb.FetchRequest) (*catenapb.FetchResponse, error) {
	var timeout <-chan time.Time
	if req.MaxWaitMs > 0 {
		t := time.NewTimer(time.Duration(req.MaxWaitMs) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	for {
		resp, changed, err := s.read(req.Stream, req.Partition, req.Offset, req.MaxBytes)
		if err != nil || len(resp.Records) > 0 || timeout == nil {
			return resp, err
		}
		select {
		case <-changed:
		case <-timeout:
			return resp, nil
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}

// Subscribe implements catenapb.IngestServer.
func (s *Server) Subscribe(req *catenapb.SubscribeRequest, srv catenapb.Ingest_SubscribeServer) error {
	off := req.Offset
	s.mu.Lock()
	brk := s.subBreak
	s.mu.Unlock()
	for {
		resp, changed, err := s.read(req.Stream, req.Partition, off, req.MaxBytes)
		if err != nil {
			return err
		}
		if len(resp.Records) > 0 {
			if err := srv.Send(resp); err != nil {
				return err
			}
			off = resp.NextOffset
			continue
		}
		select {
		case <-changed:
		case <-brk:
			return status.Error(codes.Unavailable, "injected: subscription broken")
		case <-srv.Context().Done():
			return nil
		}
	}
}

// ListOffsets implements catenapb.IngestServer.
func (s *Server) ListOffsets(ctx context.Context, req *catenapb.ListOffsetsRequest) (*catenapb.ListOffsetsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.lookup(req.Stream, req.Partition)
	if err != nil {
		return nil, err
	}
	log := st.parts[req.Partition]
	switch req.Spec {
	case catenapb.OffsetSpec_OFFSET_SPEC_EARLIEST:
		return &catenapb.ListOffsetsResponse{Offset: 0}, nil
	case catenapb.OffsetSpec_OFFSET_SPEC_LATEST:
		return &catenapb.ListOffsetsResponse{Offset: uint64(len(log))}, nil
	case catenapb.OffsetSpec_OFFSET_SPEC_TIMESTAMP:
		for _, r := range log {
			if r.TimestampMs >= req.TimestampMs {
				return &catenapb.ListOffsetsResponse{Offset: r.Offset}, nil
			}
		}
		return &catenapb.ListOffsetsResponse{Offset: uint64(len(log))}, nil
	}
	return nil, status.Errorf(codes.InvalidArgument, "unknown offset spec %v", req.Spec)
}

// DescribeStream implements catenapb.IngestServer: every partition has a
// three-member chain r1 -> r2 -> r3 with r3 absent from the reports.
func (s *Server) DescribeStream(ctx context.Context, req *catenapb.DescribeStreamRequest) (*catenapb.StreamDescription, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[req.Stream]
	if st == nil {
		return nil, notFound(req.Stream)
	}
	cfg := &catenapb.StreamConfig{Partitions: uint32(len(st.parts)), Durability: catenapb.Durability_DURABILITY_FSYNC}
	d := &catenapb.StreamDescription{Stream: req.Stream, Config: cfg}
	members := []*catenapb.Member{{Id: "r1", Addr: "127.0.0.1:7101"}, {Id: "r2", Addr: "127.0.0.1:7102"}, {Id: "r3", Addr: "127.0.0.1:7103"}}
	for p, log := range st.parts {
		end := uint64(len(log))
		pd := &catenapb.PartitionDescription{Partition: uint32(p), Epoch: st.epoch, Members: members}
		roles := []catenapb.Role{catenapb.Role_ROLE_HEAD, catenapb.Role_ROLE_MIDDLE}
		for i, m := range members[:2] {
			ps := &catenapb.PartitionStatus{
				Stream: req.Stream, Partition: uint32(p), ReplicaId: m.Id, Epoch: st.epoch, Members: members,
				Role: roles[i], LogEnd: end, Durable: end, Committed: end, Checksum: 0xc0ffee00 + uint32(p), Config: cfg,
			}
			if i == 1 && p == 0 {
				ps.Error = "injected: disk slow"
			}
			pd.Replicas = append(pd.Replicas, ps)
		}
		d.Partitions = append(d.Partitions, pd)
	}
	return d, nil
}

// ListStreams implements catenapb.IngestServer.
func (s *Server) ListStreams(ctx context.Context, req *catenapb.ListStreamsRequest) (*catenapb.ListStreamsResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &catenapb.ListStreamsResponse{}
	for name := range s.streams {
		resp.Streams = append(resp.Streams, name)
	}
	slices.Sort(resp.Streams)
	return resp, nil
}

func cloneHeaders(hs []*catenapb.RecordHeader) []*catenapb.RecordHeader {
	var out []*catenapb.RecordHeader
	for _, h := range hs {
		out = append(out, &catenapb.RecordHeader{Key: h.GetKey(), Value: slices.Clone(h.GetValue())})
	}
	return out
}
