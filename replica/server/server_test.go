package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/catena-streams/catena/replica/journal"
	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
	"github.com/catena-streams/catena/rpc/transport"
)

// node is one in-process replica server on a loopback port.
type node struct {
	id    string
	addr  string
	srv   *Server
	g     *grpc.Server
	fatal chan error
	fs    *faultfs.FS
	// rc is a client of the running server, for status0: a connection per
	// call, as polling loops make them, was hundreds a second, all kept
	// until the test ended (in the catch-up benchmark, 5 ms of the p99 it
	// measures).
	rc catenapb.ReplicaClient
}

func startNode(t testing.TB, id string, fs *faultfs.FS) *node {
	t.Helper()
	return startNodeAt(t, id, t.TempDir(), fs)
}

// startNodeAt starts a node on dataDir.
func startNodeAt(t testing.TB, id, dataDir string, fs *faultfs.FS) *node {
	t.Helper()
	n := &node{id: id, fatal: make(chan error, 4), fs: fs}
	var opts Options
	if fs != nil {
		opts.FS = fs
	}
	startWith(t, n, dataDir, opts)
	return n
}

// startWith starts n's server on dataDir with opts (ID, data directory,
// logger and fatal hook filled in) on a free port.
func startWith(t testing.TB, n *node, dataDir string, opts Options) {
	t.Helper()
	opts.ID, opts.DataDir, opts.Logger = n.id, dataDir, logr.Discard()
	opts.Fatal = func(err error) { n.fatal <- err }
	srv, err := New(opts)
	if err != nil {
		t.Fatalf("New(%s): %v", n.id, err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n.srv, n.addr = srv, lis.Addr().String()
	n.rc = client(t, n.addr)
	n.g = grpc.NewServer(transport.ServerOptions(nil)...)
	srv.Register(n.g)
	go func() { _ = n.g.Serve(lis) }()
	t.Cleanup(func() {
		n.g.Stop()
		srv.Close()
	})
}

func client(t testing.TB, addr string) catenapb.ReplicaClient {
	t.Helper()
	conn, err := transport.Dial(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return catenapb.NewReplicaClient(conn)
}

// connected is n's client with its connection made (a Status call
// answered on it), for calls with deadlines too short to also cover
// a handshake.
func connected(t testing.TB, n *node) catenapb.ReplicaClient {
	t.Helper()
	c := n.rc
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Status(ctx, &catenapb.StatusRequest{}); err != nil {
		t.Fatalf("connect to %s: %v", n.addr, err)
	}
	return c
}

func members(nodes ...*node) []*catenapb.Member {
	out := make([]*catenapb.Member, len(nodes))
	for i, n := range nodes {
		out[i] = &catenapb.Member{Id: n.id, Addr: n.addr}
	}
	return out
}

var testConfig = &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC}

// configure installs the chain on every node, tail first.
func configure(t *testing.T, epoch uint64, chain ...*node) {
	t.Helper()
	req := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: epoch, Members: members(chain...), Config: testConfig}
	for i := len(chain) - 1; i >= 0; i-- {
		if _, err := client(t, chain[i].addr).Configure(context.Background(), req); err != nil {
			t.Fatalf("configure %s: %v", chain[i].id, err)
		}
	}
}

func records(producer, firstSeq uint64, n int) []*catenapb.AppendRecord {
	out := make([]*catenapb.AppendRecord, n)
	for i := range out {
		out[i] = &catenapb.AppendRecord{Key: []byte(fmt.Sprintf("k%d", i%7)), Value: []byte(fmt.Sprintf("v-%d-%d", producer, firstSeq+uint64(i))), ProducerId: producer, Sequence: firstSeq + uint64(i)}
	}
	return out
}

func status0(t testing.TB, n *node) *catenapb.PartitionStatus {
	t.Helper()
	p := uint32(0)
	// Waited for, with a deadline: a connection attempt on a loaded
	// machine can exceed transport.MinConnectTimeout.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := n.rc.Status(ctx, &catenapb.StatusRequest{Stream: "s", Partition: &p}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("status of %s: %v", n.id, err)
	}
	return resp.GetPartitions()[0]
}

// eventually polls f until it returns nil or the deadline passes.
func eventually(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v: %v", timeout, err)
		}
		<-time.After(10 * time.Millisecond) // poll interval
	}
}

// converged waits until every member holds and has committed the same log.
func converged(t *testing.T, nodes ...*node) *catenapb.PartitionStatus {
	t.Helper()
	var last *catenapb.PartitionStatus
	eventually(t, 10*time.Second, func() error {
		first := status0(t, nodes[0])
		for _, n := range nodes {
			st := status0(t, n)
			if st.GetLogEnd() != first.GetLogEnd() || st.GetCommitted() != st.GetLogEnd() || st.GetChecksum() != first.GetChecksum() {
				return fmt.Errorf("%s: end %d committed %d checksum %08x; %s: end %d checksum %08x", n.id, st.GetLogEnd(), st.GetCommitted(), st.GetChecksum(), nodes[0].id, first.GetLogEnd(), first.GetChecksum())
			}
		}
		last = first
		return nil
	})
	return last
}

func TestChainOfThreeCommitsInOrderAndMembersAgree(t *testing.T) {
	a, b, c := startNode(t, "a", nil), startNode(t, "b", nil), startNode(t, "c", nil)
	configure(t, 1, a, b, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := client(t, a.addr).AppendStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const requests, perRequest = 200, 5
	go func() {
		for i := range requests {
			_ = stream.Send(&catenapb.AppendRequest{Stream: "s", Partition: 0, Epoch: 1, RequestId: uint64(i + 1), Records: records(42, uint64(i*perRequest+1), perRequest)})
		}
		_ = stream.CloseSend()
	}()
	var next uint64
	for i := range requests {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		if resp.GetRequestId() != uint64(i+1) || resp.GetErrorCode() != 0 {
			t.Fatalf("answer %d: id %d code %d %s", i, resp.GetRequestId(), resp.GetErrorCode(), resp.GetErrorMessage())
		}
		for k, off := range resp.GetOffsets() {
			if off != next || resp.GetDuplicate()[k] {
				t.Fatalf("answer %d record %d: offset %d dup %v, want %d (answers in order, offsets dense)", i, k, off, resp.GetDuplicate()[k], next)
			}
			next++
		}
		if resp.GetCommitted() < next {
			t.Fatalf("answered before commit: committed %d, records up to %d", resp.GetCommitted(), next)
		}
	}
	st := converged(t, a, b, c)
	if st.GetLogEnd() != requests*perRequest {
		t.Fatalf("log end %d, want %d", st.GetLogEnd(), requests*perRequest)
	}
	// Every member serves the same committed records, in order.
	for _, n := range []*node{a, b, c} {
		resp, err := client(t, n.addr).Read(ctx, &catenapb.FetchRequest{Stream: "s", Partition: 0, Offset: 0, MaxBytes: 1 << 20})
		if err != nil {
			t.Fatalf("read from %s: %v", n.id, err)
		}
		if len(resp.GetRecords()) == 0 || resp.GetRecords()[0].GetOffset() != 0 {
			t.Fatalf("read from %s returned %d records", n.id, len(resp.GetRecords()))
		}
		for i, r := range resp.GetRecords() {
			if want := fmt.Sprintf("v-42-%d", i+1); r.GetOffset() != uint64(i) || string(r.GetValue()) != want {
				t.Fatalf("%s offset %d: %q, want %q", n.id, r.GetOffset(), r.GetValue(), want)
			}
		}
	}
}

func TestRetryIsStoredOnceWithOriginalOffsets(t *testing.T) {
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	configure(t, 1, a, b)
	ctx := context.Background()
	head := client(t, a.addr)
	first, err := head.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(7, 1, 10)})
	if err != nil {
		t.Fatal(err)
	}
	before := converged(t, a, b)
	// The same records again, plus two new ones and a repeat inside the request.
	retry := append(records(7, 1, 10), records(7, 11, 2)...)
	retry = append(retry, records(7, 11, 1)...)
	second, err := head.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: retry})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if !second.GetDuplicate()[i] || second.GetOffsets()[i] != first.GetOffsets()[i] {
			t.Fatalf("record %d: dup %v offset %d, want duplicate at %d", i, second.GetDuplicate()[i], second.GetOffsets()[i], first.GetOffsets()[i])
		}
	}
	if second.GetDuplicate()[10] || second.GetOffsets()[10] != before.GetLogEnd() || second.GetOffsets()[11] != before.GetLogEnd()+1 {
		t.Fatalf("new records: %v %v", second.GetOffsets()[10:], second.GetDuplicate()[10:])
	}
	if !second.GetDuplicate()[12] || second.GetOffsets()[12] != second.GetOffsets()[10] {
		t.Fatalf("repeat inside the request: dup %v offset %d, want duplicate of %d", second.GetDuplicate()[12], second.GetOffsets()[12], second.GetOffsets()[10])
	}
	if st := converged(t, a, b); st.GetLogEnd() != before.GetLogEnd()+2 {
		t.Fatalf("log end %d, want %d: the retry was stored again", st.GetLogEnd(), before.GetLogEnd()+2)
	}
}

func TestNewHeadDeduplicatesFromItsOwnLog(t *testing.T) {
	// Scenario 4: the head dies after forwarding; the producer retries at the
	// new head, which must recognise the records from the log it holds.
	a, b, c := startNode(t, "a", nil), startNode(t, "b", nil), startNode(t, "c", nil)
	configure(t, 1, a, b, c)
	ctx := context.Background()
	first, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(9, 1, 5)})
	if err != nil {
		t.Fatal(err)
	}
	converged(t, a, b, c)
	configure(t, 2, b, c)
	again, err := client(t, b.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 2, Records: records(9, 1, 5)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if !again.GetDuplicate()[i] || again.GetOffsets()[i] != first.GetOffsets()[i] {
			t.Fatalf("record %d at the new head: dup %v offset %d, want the original %d", i, again.GetDuplicate()[i], again.GetOffsets()[i], first.GetOffsets()[i])
		}
	}
}

func TestRefusals(t *testing.T) {
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	configure(t, 2, a, b)
	ctx := context.Background()
	head, tail := client(t, a.addr), client(t, b.addr)
	if _, err := head.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 2, Records: records(1, 1, 3)}); err != nil {
		t.Fatal(err)
	}
	before := converged(t, a, b)
	big := records(1, 100, 1)
	big[0].Value = make([]byte, partlog.MaxRecordBytes+1)
	tests := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"older epoch configuration", func() error {
			_, err := head.Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Epoch: 1, Members: members(a, b), Config: testConfig})
			return err
		}, codes.FailedPrecondition},
		{"same epoch, other members", func() error {
			_, err := head.Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Epoch: 2, Members: members(b, a), Config: testConfig})
			return err
		}, codes.FailedPrecondition},
		{"duplicate member", func() error {
			_, err := head.Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Epoch: 3, Members: members(a, a), Config: testConfig})
			return err
		}, codes.InvalidArgument},
		{"bad stream name", func() error {
			_, err := head.Configure(ctx, &catenapb.ConfigureRequest{Stream: "Bad_Name", Epoch: 3, Members: members(a), Config: testConfig})
			return err
		}, codes.InvalidArgument},
		{"segment size over 1 GiB", func() error {
			cfg := proto.Clone(testConfig).(*catenapb.StreamConfig)
			cfg.SegmentBytes = partlog.MaxSegmentBytes + 1
			_, err := head.Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Epoch: 3, Members: members(a, b), Config: cfg})
			return err
		}, codes.InvalidArgument},
		{"append at the tail", func() error {
			_, err := tail.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 2, Records: records(1, 50, 1)})
			return err
		}, codes.FailedPrecondition},
		{"append under a stale epoch", func() error {
			_, err := head.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 50, 1)})
			return err
		}, codes.FailedPrecondition},
		{"oversized record", func() error {
			_, err := head.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 2, Records: append(records(1, 60, 2), big...)})
			return err
		}, codes.InvalidArgument},
		{"unknown partition", func() error {
			_, err := head.Append(ctx, &catenapb.AppendRequest{Stream: "s", Partition: 9, Epoch: 2, Records: records(1, 50, 1)})
			return err
		}, codes.NotFound},
		{"empty append", func() error {
			_, err := head.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 2})
			return err
		}, codes.InvalidArgument},
		{"replication link of a stale epoch", func() error {
			return replicateOnce(ctx, tail, &catenapb.ReplicateFrame{Epoch: 1, Stream: "s", From: "a", Body: &catenapb.ReplicateFrame_Hello{Hello: &catenapb.LinkHello{}}}, nil)
		}, codes.FailedPrecondition},
		{"replication link from a non-neighbour", func() error {
			return replicateOnce(ctx, tail, &catenapb.ReplicateFrame{Epoch: 2, Stream: "s", From: "x", Body: &catenapb.ReplicateFrame_Hello{Hello: &catenapb.LinkHello{}}}, nil)
		}, codes.FailedPrecondition},
		{"malformed frame on the link", func() error {
			garbage := &catenapb.ReplicateFrame{Epoch: 2, Stream: "s", From: "a", Body: &catenapb.ReplicateFrame_Data{Data: &catenapb.BatchData{Frames: [][]byte{[]byte("definitely not a batch frame, but long enough to have a header of fifty-two bytes")}}}}
			return replicateOnce(ctx, tail, &catenapb.ReplicateFrame{Epoch: 2, Stream: "s", From: "a", Body: &catenapb.ReplicateFrame_Hello{Hello: &catenapb.LinkHello{}}}, garbage)
		}, codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if status.Code(err) != tc.code {
				t.Fatalf("got %v, want code %v", err, tc.code)
			}
			if status.Convert(err).Message() == "" {
				t.Fatal("error carries no reason")
			}
			for _, n := range []*node{a, b} {
				st := status0(t, n)
				if st.GetLogEnd() != before.GetLogEnd() || st.GetChecksum() != before.GetChecksum() || st.GetEpoch() != 2 {
					t.Fatalf("%s changed: end %d checksum %08x epoch %d, before end %d checksum %08x", n.id, st.GetLogEnd(), st.GetChecksum(), st.GetEpoch(), before.GetLogEnd(), before.GetChecksum())
				}
			}
		})
	}
}

// replicateOnce opens a replication stream with hello, optionally sends one
// more frame, and returns the error that ends the stream.
func replicateOnce(ctx context.Context, c catenapb.ReplicaClient, hello, next *catenapb.ReplicateFrame) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := c.Replicate(ctx)
	if err != nil {
		return err
	}
	if err := s.Send(hello); err != nil {
		return err
	}
	if _, err := s.Recv(); err != nil {
		return err
	}
	if next == nil {
		return nil
	}
	if err := s.Send(next); err != nil {
		return err
	}
	for {
		if _, err := s.Recv(); err != nil {
			return err
		}
	}
}

func TestFsyncFailureStopsWithoutAcknowledging(t *testing.T) {
	fs := faultfs.New()
	a, b := startNode(t, "a", nil), startNode(t, "b", fs)
	configure(t, 1, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 1, 2)}); err != nil {
		t.Fatal(err)
	}
	before := converged(t, a, b)
	fs.FailSyncs(0, -1, syscall.EIO)
	var wg sync.WaitGroup
	wg.Add(1)
	var appendErr error
	go func() {
		defer wg.Done()
		_, appendErr = client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 3, 2)})
	}()
	select {
	case err := <-b.fatal:
		if !errors.Is(err, partlog.ErrFailed) {
			t.Fatalf("fatal error %v does not wrap partlog.ErrFailed", err)
		}
	case <-ctx.Done():
		t.Fatal("the tail did not crash-stop on a failed fsync")
	}
	// The tail never acknowledges: the head's commit stays where it was.
	if st := status0(t, a); st.GetCommitted() != before.GetCommitted() {
		t.Fatalf("head committed %d after the tail's fsync failed, want %d", st.GetCommitted(), before.GetCommitted())
	}
	if st := status0(t, b); st.GetError() == "" {
		t.Fatal("the failed tail reports no error in its status")
	}
	cancel()
	wg.Wait()
	if appendErr == nil {
		t.Fatal("the append was acknowledged although the tail's fsync failed")
	}
}

func TestIntervalDurabilityCommitsWithoutWaitingForFsync(t *testing.T) {
	fs := faultfs.New()
	a := startNode(t, "a", fs)
	cfg := &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_INTERVAL, FsyncIntervalMs: 60000}
	if _, err := client(t, a.addr).Configure(context.Background(), &catenapb.ConfigureRequest{Stream: "s", Epoch: 1, Members: members(a), Config: cfg}); err != nil {
		t.Fatal(err)
	}
	syncsBefore := fs.Syncs()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 1, 3)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetCommitted() != 3 {
		t.Fatalf("committed %d, want 3", resp.GetCommitted())
	}
	if a.srv.store != nil {
		// The journal's writer syncs each group it is given, on its
		// own, whether or not anyone waits: fsyncs are no measure.
		return
	}
	if fs.Syncs() != syncsBefore {
		t.Fatalf("%d fsyncs during an append under interval durability (interval 60s), want none", fs.Syncs()-syncsBefore)
	}
}

func TestReadsByOffsetAndTimestamp(t *testing.T) {
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	configure(t, 1, a, b)
	ctx := context.Background()
	head := client(t, a.addr)
	for i := range 5 {
		recs := records(1, uint64(i*2+1), 2)
		for _, r := range recs {
			r.TimestampMs = int64(1000 * (i + 1))
		}
		if _, err := head.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: recs}); err != nil {
			t.Fatal(err)
		}
	}
	converged(t, a, b)
	tail := client(t, b.addr)
	for _, tc := range []struct {
		spec catenapb.OffsetSpec
		ts   int64
		want uint64
	}{
		{catenapb.OffsetSpec_OFFSET_SPEC_EARLIEST, 0, 0},
		{catenapb.OffsetSpec_OFFSET_SPEC_LATEST, 0, 10},
		{catenapb.OffsetSpec_OFFSET_SPEC_TIMESTAMP, 3000, 4},
		{catenapb.OffsetSpec_OFFSET_SPEC_TIMESTAMP, 2500, 4},
		{catenapb.OffsetSpec_OFFSET_SPEC_TIMESTAMP, 99999, 10},
	} {
		resp, err := tail.ListOffsets(ctx, &catenapb.ListOffsetsRequest{Stream: "s", Spec: tc.spec, TimestampMs: tc.ts})
		if err != nil || resp.GetOffset() != tc.want {
			t.Fatalf("ListOffsets(%v, %d) = %d, %v; want %d", tc.spec, tc.ts, resp.GetOffset(), err, tc.want)
		}
	}
	// A read from inside a batch starts at the requested offset.
	resp, err := tail.Read(ctx, &catenapb.FetchRequest{Stream: "s", Offset: 5})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetRecords()) != 5 || resp.GetRecords()[0].GetOffset() != 5 || resp.GetNextOffset() != 10 {
		t.Fatalf("read from 5: %d records from %d, next %d", len(resp.GetRecords()), resp.GetRecords()[0].GetOffset(), resp.GetNextOffset())
	}
	// A long poll at the end returns when a new record commits.
	done := make(chan *catenapb.FetchResponse, 1)
	go func() {
		r, _ := tail.Read(ctx, &catenapb.FetchRequest{Stream: "s", Offset: 10, MaxWaitMs: 10000})
		done <- r
	}()
	if _, err := head.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 100, 1)}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if len(r.GetRecords()) != 1 || r.GetRecords()[0].GetOffset() != 10 {
			t.Fatalf("long poll returned %v", r.GetRecords())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("long poll did not return the new record")
	}
}

// soleMember runs a replica "m" with its metrics in reg, the sole member
// of stream s's partition 0 at epoch under cfg, served in-process (no
// listener: the tests call it directly).
func soleMember(t *testing.T, epoch uint64, cfg *catenapb.StreamConfig) (*Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	srv, err := New(Options{ID: "m", DataDir: t.TempDir(), Logger: logr.Discard(), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	if _, err := srv.Configure(context.Background(), &catenapb.ConfigureRequest{Stream: "s", Epoch: epoch, Members: []*catenapb.Member{{Id: "m", Addr: "127.0.0.1:1"}}, Config: cfg}); err != nil {
		t.Fatal(err)
	}
	return srv, reg
}

// metricTotals sums each metric family of reg over its labels: counters
// and gauges by value, histograms by sample count.
func metricTotals(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				got[f.GetName()] += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				got[f.GetName()] += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				got[f.GetName()] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return got
}

func TestMetricsAreExported(t *testing.T) {
	srv, reg := soleMember(t, 4, testConfig)
	ctx := context.Background()
	if _, err := srv.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 4, Records: records(1, 1, 3)}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Read(ctx, &catenapb.FetchRequest{Stream: "s"}); err != nil {
		t.Fatal(err)
	}
	// A consumer that has read up to offset 1 of the 3 committed.
	if _, err := srv.HoldRetention(ctx, &catenapb.HoldRetentionRequest{Stream: "s", Consumer: "agg", Offset: 1}); err != nil {
		t.Fatal(err)
	}
	got := metricTotals(t, reg)
	for name, want := range map[string]float64{
		"catena_replica_records_in_total":    3,
		"catena_replica_records_out_total":   3,
		"catena_replica_committed_offset":    3,
		"catena_replica_chain_epoch":         4,
		"catena_replica_log_end_offset":      3,
		"catena_replica_commit_seconds":      1,
		"catena_replica_append_sync_seconds": 1,
	} {
		if got[name] < want {
			t.Errorf("%s = %v, want at least %v", name, got[name], want)
		}
	}
	if got["catena_replica_bytes_in_total"] == 0 || got["catena_replica_bytes_out_total"] == 0 {
		t.Errorf("byte counters not counting: in %v out %v", got["catena_replica_bytes_in_total"], got["catena_replica_bytes_out_total"])
	}
	// Read from the log when scraped: its size on disk is what was
	// appended plus the segment's header.
	if got["catena_replica_log_bytes"] <= got["catena_replica_bytes_in_total"] || got["catena_replica_log_segments"] != 1 {
		t.Errorf("log usage: %v bytes (appended %v) in %v segments", got["catena_replica_log_bytes"], got["catena_replica_bytes_in_total"], got["catena_replica_log_segments"])
	}
	if v, ok := got["catena_replica_log_start_offset"]; !ok || v != 0 {
		t.Errorf("log start offset: %v, %v", v, ok)
	}
	if got["catena_replica_consumer_hold_lag"] != 2 {
		t.Errorf("consumer hold lag = %v, want the 2 committed records past agg's hold at 1", got["catena_replica_consumer_hold_lag"])
	}
}

func TestRestartedHeadHoldsWritesWhileItsSuccessorHoldsMore(t *testing.T) {
	// With pipelined forwarding a machine crash can cost the head writes
	// its successor kept. A reopened head must not assign those offsets
	// again: it refuses writes until its master installs a new epoch.
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	configure(t, 1, a, b)
	ctx := context.Background()
	for i := range 3 {
		if _, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, uint64(i*2+1), 2)}); err != nil {
			t.Fatal(err)
		}
	}
	converged(t, a, b)
	dataDir := a.srv.dataDir
	a.g.Stop()
	a.srv.Close()
	cutLastBatch(t, a)
	srv, err := New(Options{ID: "a", DataDir: dataDir, Logger: logr.Discard(), Fatal: func(error) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if st, _ := srv.Status(ctx, &catenapb.StatusRequest{}); st.GetPartitions()[0].GetLogEnd() != 4 {
		t.Fatalf("reopened head holds %d records, want 4 (the torn batch cut)", st.GetPartitions()[0].GetLogEnd())
	}
	_, err = srv.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 100, 1)})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("append at a head behind its successor: %v, want Unavailable", err)
	}
	if st := status0(t, b); st.GetLogEnd() != 6 {
		t.Fatalf("successor changed: log end %d, want 6", st.GetLogEnd())
	}
}

// reopen restarts a stopped node on its data directory and address.
func reopen(t *testing.T, old *node) *node {
	t.Helper()
	n := &node{id: old.id, fatal: make(chan error, 4)}
	srv, err := New(Options{ID: old.id, DataDir: old.srv.dataDir, Logger: logr.Discard(), Fatal: func(err error) { n.fatal <- err }})
	if err != nil {
		t.Fatalf("reopen %s: %v", old.id, err)
	}
	var lis net.Listener
	eventually(t, 5*time.Second, func() error {
		var err error
		lis, err = net.Listen("tcp", old.addr)
		return err
	})
	n.srv, n.addr, n.rc = srv, old.addr, client(t, old.addr)
	n.g = grpc.NewServer(transport.ServerOptions(nil)...)
	srv.Register(n.g)
	go func() { _ = n.g.Serve(lis) }()
	t.Cleanup(func() {
		n.g.Stop()
		srv.Close()
	})
	return n
}

func stopNode(n *node) {
	n.g.Stop()
	n.srv.Close()
}

func TestReturningHeadTruncatesOrphansAndRejoinsAtTail(t *testing.T) {
	// Scenario 3: the head appends records locally that it never forwards
	// and dies; the new head writes other records at those offsets. The
	// old head returns: the new chain says where its epoch ended, it cuts
	// its orphans there and catches up as the tail of a newer epoch.
	ctx := context.Background()
	a, b, c := startNode(t, "a", nil), startNode(t, "b", nil), startNode(t, "c", nil)
	configure(t, 1, a, b, c)
	for i := range 5 {
		if _, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, uint64(i*2+1), 2)}); err != nil {
			t.Fatal(err)
		}
	}
	converged(t, a, b, c)

	// The successor is unreachable: the head's next batches stay local.
	stopNode(b)
	oldHead := connected(t, a)
	for i := range 2 {
		actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := oldHead.Append(actx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(2, uint64(i*3+1), 3)})
		cancel()
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("append with the successor down: %v, want DeadlineExceeded", err)
		}
	}
	eventually(t, 5*time.Second, func() error {
		if st := status0(t, a); st.GetLogEnd() != 16 || st.GetDurable() != 16 || st.GetCommitted() != 10 {
			return fmt.Errorf("head: end %d durable %d committed %d, want 16/16/10", st.GetLogEnd(), st.GetDurable(), st.GetCommitted())
		}
		return nil
	})
	stopNode(a)

	// The master removes the head; the successor returns at once and is
	// the new head, writing other records at offsets 10..15.
	b = reopen(t, b)
	configure(t, 2, b, c)
	for i := range 4 {
		if _, err := client(t, b.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 2, Records: records(3, uint64(i*2+1), 2)}); err != nil {
			t.Fatalf("append at the new head: %v", err)
		}
	}
	converged(t, b, c)

	// The old head comes back believing epoch 1, where it is head.
	a = reopen(t, a)
	ac := client(t, a.addr)
	st := status0(t, a)
	if st.GetLogEnd() != 16 || st.GetLastLogEpoch() != 1 || st.GetRole() != catenapb.Role_ROLE_HEAD {
		t.Fatalf("returning head: end %d last epoch %d role %v", st.GetLogEnd(), st.GetLastLogEpoch(), st.GetRole())
	}
	if _, err := ac.Truncate(ctx, &catenapb.TruncateRequest{Stream: "s", Partition: 0, To: 10}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("truncate of a chain member: %v, want FailedPrecondition", err)
	}
	// The master installs the current chain on it: it is not a member.
	req := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 2, Members: members(b, c), Config: testConfig}
	if ps, err := ac.Configure(ctx, req); err != nil || ps.GetRole() != catenapb.Role_ROLE_NONE {
		t.Fatalf("configure the returning head out of the chain: %v role %v", err, ps.GetRole())
	}
	// Reads never reach its orphans.
	resp, err := ac.Read(ctx, &catenapb.FetchRequest{Stream: "s", Partition: 0, Offset: 0, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range resp.GetRecords() {
		if r.GetOffset() >= 10 {
			t.Fatalf("returning head served offset %d beyond the committed 10", r.GetOffset())
		}
	}

	ee, err := client(t, b.addr).EpochEnd(ctx, &catenapb.EpochEndRequest{Stream: "s", Partition: 0, Epoch: st.GetLastLogEpoch()})
	if err != nil {
		t.Fatal(err)
	}
	if ee.GetEndOffset() != 10 || ee.GetEpoch() != 1 || ee.GetLogEnd() != 18 || ee.GetChainEpoch() != 2 {
		t.Fatalf("epoch end: %+v, want end 10 epoch 1 log end 18 chain epoch 2", ee)
	}
	// (A restarted replica knows no committed offset until a chain tells
	// it, so the below-committed guard is tested on a live one in
	// TestTruncateAndEpochEndRules.)
	ps, err := ac.Truncate(ctx, &catenapb.TruncateRequest{Stream: "s", Partition: 0, To: ee.GetEndOffset()})
	if err != nil {
		t.Fatal(err)
	}
	if ps.GetLogEnd() != 10 || ps.GetDurable() != 10 || ps.GetLastLogEpoch() != 1 || ps.GetCommitted() > 10 {
		t.Fatalf("after truncate: end %d durable %d last epoch %d committed %d, want 10/10/1/<=10", ps.GetLogEnd(), ps.GetDurable(), ps.GetLastLogEpoch(), ps.GetCommitted())
	}

	// Re-added at the tail under a new epoch, it catches up through the
	// link; every member agrees.
	configure(t, 3, b, c, a)
	if _, err := client(t, b.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 3, Records: records(3, 9, 2)}); err != nil {
		t.Fatalf("append after the rejoin: %v", err)
	}
	final := converged(t, b, c, a)
	if final.GetLogEnd() != 20 {
		t.Fatalf("log end %d, want 20", final.GetLogEnd())
	}
	// Producer 2's orphans are gone; producer 3's records are at 10..19.
	resp, err = ac.Read(ctx, &catenapb.FetchRequest{Stream: "s", Partition: 0, Offset: 10, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetRecords()) != 10 {
		t.Fatalf("read %d records from 10, want 10", len(resp.GetRecords()))
	}
	for i, r := range resp.GetRecords() {
		if want := fmt.Sprintf("v-3-%d", i+1); string(r.GetValue()) != want {
			t.Fatalf("offset %d: %q, want %q", r.GetOffset(), r.GetValue(), want)
		}
	}
	// A retry of producer 2's orphaned records is not mistaken for a
	// duplicate: the de-duplication entries were cut with the log.
	resp2, err := client(t, b.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 3, Records: records(2, 1, 3)})
	if err != nil {
		t.Fatal(err)
	}
	if resp2.GetDuplicate()[0] || resp2.GetOffsets()[0] != 20 {
		t.Fatalf("retry of an orphaned record: offset %d duplicate %v, want a fresh write at 20", resp2.GetOffsets()[0], resp2.GetDuplicate()[0])
	}
	converged(t, b, c, a)
}

func TestTruncateAndEpochEndRules(t *testing.T) {
	ctx := context.Background()
	a := startNode(t, "a", nil)
	configure(t, 1, a)
	ac := client(t, a.addr)
	for i := range 3 { // batches [0,4) [4,8) [8,12) at epoch 1
		if _, err := ac.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, uint64(i*4+1), 4)}); err != nil {
			t.Fatal(err)
		}
	}
	configure(t, 2, a)
	if _, err := ac.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 2, Records: records(1, 13, 4)}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ epoch, end, has uint64 }{{0, 0, 0}, {1, 12, 1}, {2, 16, 2}, {7, 16, 2}} {
		ee, err := ac.EpochEnd(ctx, &catenapb.EpochEndRequest{Stream: "s", Partition: 0, Epoch: tc.epoch})
		if err != nil {
			t.Fatal(err)
		}
		if ee.GetEndOffset() != tc.end || ee.GetEpoch() != tc.has {
			t.Errorf("EpochEnd(%d) = end %d epoch %d, want %d %d", tc.epoch, ee.GetEndOffset(), ee.GetEpoch(), tc.end, tc.has)
		}
	}
	if _, err := ac.EpochEnd(ctx, &catenapb.EpochEndRequest{Stream: "nope", Partition: 0, Epoch: 1}); status.Code(err) != codes.NotFound {
		t.Errorf("EpochEnd of an unknown partition: %v", err)
	}
	if _, err := ac.Truncate(ctx, &catenapb.TruncateRequest{Stream: "s", Partition: 0, To: 14}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("truncate of the sole member: %v, want FailedPrecondition", err)
	}
	// Out of the chain, but everything it holds is committed.
	other := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 3, Members: []*catenapb.Member{{Id: "z", Addr: "127.0.0.1:1"}}, Config: testConfig}
	if _, err := ac.Configure(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := ac.Truncate(ctx, &catenapb.TruncateRequest{Stream: "s", Partition: 0, To: 14}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("truncate below committed: %v, want FailedPrecondition", err)
	}
	// Past the end: nothing to do.
	if ps, err := ac.Truncate(ctx, &catenapb.TruncateRequest{Stream: "s", Partition: 0, To: 99}); err != nil || ps.GetLogEnd() != 16 {
		t.Fatalf("truncate past the end: %v, end %d", err, ps.GetLogEnd())
	}
	if _, err := ac.Truncate(ctx, &catenapb.TruncateRequest{Stream: "nope", Partition: 0, To: 1}); status.Code(err) != codes.NotFound {
		t.Errorf("Truncate of an unknown partition: %v", err)
	}
}

func TestTruncateRoundsDownToABatchBoundary(t *testing.T) {
	// A replica outside the chain that never learned a commit (a tail
	// whose predecessor died before its notice) may be cut anywhere; the
	// cut rounds down to a batch boundary.
	ctx := context.Background()
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	configure(t, 1, a, b)
	ac := client(t, a.addr)
	for i := range 3 {
		if _, err := ac.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, uint64(i*4+1), 4)}); err != nil {
			t.Fatal(err)
		}
	}
	converged(t, a, b)
	// Restart b without its committed record, as a tail that crashed
	// before its first one would be (it learns commits from notices).
	stopNode(a)
	stopNode(b)
	forgetCommitted(t, b.srv.dataDir, partKey{"s", 0})
	b = reopen(t, b)
	bc := client(t, b.addr)
	if st := status0(t, b); st.GetCommitted() != 0 {
		t.Fatalf("reopened tail without its committed record knows committed %d", st.GetCommitted())
	}
	other := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 2, Members: []*catenapb.Member{{Id: "z", Addr: "127.0.0.1:1"}}, Config: testConfig}
	if _, err := bc.Configure(ctx, other); err != nil {
		t.Fatal(err)
	}
	ps, err := bc.Truncate(ctx, &catenapb.TruncateRequest{Stream: "s", Partition: 0, To: 6})
	if err != nil {
		t.Fatal(err)
	}
	if ps.GetLogEnd() != 4 || ps.GetDurable() != 4 {
		t.Fatalf("truncate to 6 inside [4,8): end %d durable %d, want 4", ps.GetLogEnd(), ps.GetDurable())
	}
	// The de-duplication table forgot the cut records: they can be stored again.
	configure(t, 3, b)
	resp, err := bc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 3, Records: records(1, 5, 4)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOffsets()[0] != 4 || resp.GetDuplicate()[0] {
		t.Fatalf("re-append of cut records: offset %d duplicate %v, want a fresh write at 4", resp.GetOffsets()[0], resp.GetDuplicate()[0])
	}
}

// TestHeadRefusesWritesBelowMinChainLength: a chain shorter than the
// stream's min_chain_length keeps serving reads and replication, but its
// head refuses appends with FAILED_PRECONDITION and a message naming the
// shortfall, storing nothing; once the chain is long enough again it takes
// writes.
func TestHeadRefusesWritesBelowMinChainLength(t *testing.T) {
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	cfg := &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC, MinChainLength: 2}
	install := func(epoch uint64, chain ...*node) {
		t.Helper()
		req := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: epoch, Members: members(chain...), Config: cfg}
		for i := len(chain) - 1; i >= 0; i-- {
			if _, err := client(t, chain[i].addr).Configure(context.Background(), req); err != nil {
				t.Fatalf("configure %s: %v", chain[i].id, err)
			}
		}
	}
	ctx := context.Background()
	head := client(t, a.addr)

	install(1, a, b)
	if _, err := head.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(7, 1, 3)}); err != nil {
		t.Fatalf("append to a chain of 2 with min 2: %v", err)
	}
	before := converged(t, a, b)

	install(2, a) // b failed: the chain is installed without it
	_, err := head.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 2, Records: records(7, 4, 3)})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("append to a chain of 1 with min 2: got %v, want FailedPrecondition", err)
	}
	if want := "partition s/0 has 1 of the 2 members required for writes"; !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("refusal %q does not say %q", status.Convert(err).Message(), want)
	}
	if got := errorReason(err); got != contract.ReasonChainTooShort {
		t.Fatalf("refusal carries reason %q, want %q (ingestion acts on it)", got, contract.ReasonChainTooShort)
	}
	if st := status0(t, a); st.GetLogEnd() != before.GetLogEnd() || st.GetCommitted() != before.GetCommitted() {
		t.Fatalf("refused append changed the log: end %d committed %d, want %d", st.GetLogEnd(), st.GetCommitted(), before.GetLogEnd())
	}

	install(3, a, b) // b back at the tail
	resp, err := head.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 3, Records: records(7, 4, 3)})
	if err != nil {
		t.Fatalf("append after the chain regrew: %v", err)
	}
	if resp.GetOffsets()[0] != before.GetLogEnd() || resp.GetDuplicate()[0] {
		t.Fatalf("first record after the refusal at %d (duplicate %v), want %d", resp.GetOffsets()[0], resp.GetDuplicate()[0], before.GetLogEnd())
	}
	converged(t, a, b)
}

func TestDropRules(t *testing.T) {
	ctx := context.Background()
	a := startNode(t, "a", nil)
	configure(t, 2, a)
	ac := client(t, a.addr)
	if _, err := ac.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 2, Records: records(1, 1, 4)}); err != nil {
		t.Fatal(err)
	}
	dir := a.srv.partitionDir("s", 0)

	for _, tc := range []struct {
		name string
		req  *catenapb.DropRequest
		code codes.Code
	}{
		{"a member's copy", &catenapb.DropRequest{Stream: "s", Partition: 0, Epoch: 2}, codes.FailedPrecondition},
		{"under an older epoch than installed", &catenapb.DropRequest{Stream: "s", Partition: 0, Epoch: 1, StreamDeleted: true}, codes.FailedPrecondition},
		{"a bad stream name", &catenapb.DropRequest{Stream: "S/../x", Partition: 0, Epoch: 9}, codes.InvalidArgument},
	} {
		if _, err := ac.Drop(ctx, tc.req); status.Code(err) != tc.code {
			t.Errorf("drop %s: %v, want %v", tc.name, err, tc.code)
		}
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("refused drop (%s) touched the partition: %v", tc.name, err)
		}
		if st := status0(t, a); st.GetLogEnd() != 4 || st.GetError() != "" {
			t.Fatalf("refused drop (%s) changed the partition: %v", tc.name, st)
		}
	}

	// A member of epoch 2 that the master replaced under epoch 3 while it
	// was away (it was never told): dropped, files and all.
	resp, err := ac.Drop(ctx, &catenapb.DropRequest{Stream: "s", Partition: 0, Epoch: 3})
	if err != nil || !resp.GetDropped() {
		t.Fatalf("drop outside the chain: %v %v", resp, err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("dropped partition's directory: %v", err)
	}
	p := uint32(0)
	if _, err := ac.Status(ctx, &catenapb.StatusRequest{Stream: "s", Partition: &p}); status.Code(err) != codes.NotFound {
		t.Fatalf("status after drop: %v, want NotFound", err)
	}
	// Again: nothing to drop, and that is no error (the master retries).
	if resp, err := ac.Drop(ctx, &catenapb.DropRequest{Stream: "s", Partition: 0, Epoch: 3}); err != nil || resp.GetDropped() {
		t.Fatalf("second drop: %v %v", resp, err)
	}
	// The partition can be hosted again, empty: it rejoins as a new copy.
	configure(t, 4, a)
	if st := status0(t, a); st.GetLogEnd() != 0 || st.GetEpoch() != 4 {
		t.Fatalf("re-created partition: %v", st)
	}

	// A deleted stream: even a member's copy goes.
	if _, err := ac.Drop(ctx, &catenapb.DropRequest{Stream: "s", Partition: 0, Epoch: 4, StreamDeleted: true}); err != nil {
		t.Fatalf("drop of a deleted stream's partition: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("deleted stream's partition directory: %v", err)
	}
}

// A Drop takes the partition out of the table before it renames its
// directory away: a Configure meanwhile must not create a new copy in
// that directory (it would be renamed away with the old one, and a
// journal would then name a partition no directory holds).
func TestNoCopyIsCreatedInADirectoryBeingDropped(t *testing.T) {
	ctx := context.Background()
	a := startNode(t, "a", nil)
	configure(t, 2, a)
	ac := client(t, a.addr)
	if _, err := ac.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 2, Records: records(1, 1, 4)}); err != nil {
		t.Fatal(err)
	}
	var during error
	a.srv.beforeDropRename = func() {
		_, during = ac.Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 4, Members: members(a), Config: testConfig})
	}
	if resp, err := ac.Drop(ctx, &catenapb.DropRequest{Stream: "s", Partition: 0, Epoch: 3}); err != nil || !resp.GetDropped() {
		t.Fatalf("drop: %v %v", resp, err)
	}
	a.srv.beforeDropRename = nil
	if status.Code(during) != codes.Unavailable || !strings.Contains(during.Error(), "being dropped") {
		t.Fatalf("configure while the drop renames: %v, want Unavailable (being dropped)", during)
	}
	configure(t, 4, a)
	if st := status0(t, a); st.GetLogEnd() != 0 || st.GetEpoch() != 4 {
		t.Fatalf("re-created partition: %v", st)
	}
	stopNode(a)
	a = reopen(t, a)
	if st := status0(t, a); st.GetLogEnd() != 0 || st.GetEpoch() != 4 || st.GetError() != "" {
		t.Fatalf("re-created partition after a restart: %v", st)
	}
}

func TestRestartRemovesAHalfDroppedPartition(t *testing.T) {
	a := startNode(t, "a", nil)
	configure(t, 1, a)
	// A Drop that renamed the directory and crashed before removing it
	// (with a journal, its drop record durable first, as Drop does).
	dir := a.srv.partitionDir("s", 0)
	if a.srv.store != nil {
		if err := a.srv.store.Drop(journal.PartitionID{Stream: "s", Partition: 0}); err != nil {
			t.Fatal(err)
		}
	}
	stopNode(a)
	gone := filepath.Join(filepath.Dir(dir), droppedPrefix+"00000-1")
	if err := os.Rename(dir, gone); err != nil {
		t.Fatal(err)
	}
	a = reopen(t, a)
	resp, err := client(t, a.addr).Status(context.Background(), &catenapb.StatusRequest{})
	if err != nil || len(resp.GetPartitions()) != 0 {
		t.Fatalf("after restart: %v %v, want no partitions", resp, err)
	}
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Fatalf("half-dropped directory left behind: %v", err)
	}
}

func TestCatchUpOutsideTheChainThenJoinAtTail(t *testing.T) {
	ctx := context.Background()
	a, b, c := startNode(t, "a", nil), startNode(t, "b", nil), startNode(t, "c", nil)
	configure(t, 1, a, b)
	ac, cc := client(t, a.addr), client(t, c.addr)
	seq := uint64(1)
	write := func(batches int) {
		t.Helper()
		for range batches {
			if _, err := ac.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, seq, 50)}); err != nil {
				t.Fatal(err)
			}
			seq += 50
		}
	}
	write(20)

	chainReq := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 1, Members: members(a, b), Config: testConfig}
	for _, tc := range []struct {
		name string
		req  *catenapb.CatchUpRequest
		to   catenapb.ReplicaClient
		code codes.Code
	}{
		{"a member", &catenapb.CatchUpRequest{Chain: chainReq, SourceId: "a", SourceAddr: a.addr}, client(t, b.addr), codes.FailedPrecondition},
		{"a source outside the chain", &catenapb.CatchUpRequest{Chain: chainReq, SourceId: "c", SourceAddr: c.addr}, cc, codes.InvalidArgument},
		{"no chain", &catenapb.CatchUpRequest{SourceId: "b", SourceAddr: b.addr}, cc, codes.InvalidArgument},
	} {
		if _, err := tc.to.CatchUp(ctx, tc.req); status.Code(err) != tc.code {
			t.Errorf("catch up with %s: %v, want %v", tc.name, err, tc.code)
		}
	}
	if st := status0(t, b); st.GetRole() != catenapb.Role_ROLE_TAIL || st.GetEpoch() != 1 {
		t.Fatalf("a refused catch-up changed the tail: %v", st)
	}

	// c copies from the tail while the chain keeps committing without it.
	if _, err := cc.CatchUp(ctx, &catenapb.CatchUpRequest{Chain: chainReq, SourceId: "b", SourceAddr: b.addr}); err != nil {
		t.Fatal(err)
	}
	write(20)
	eventually(t, 10*time.Second, func() error {
		st, head := status0(t, c), status0(t, a)
		if st.GetRole() != catenapb.Role_ROLE_NONE || st.GetDurable() != head.GetCommitted() {
			return fmt.Errorf("c: role %v durable %d; committed %d", st.GetRole(), st.GetDurable(), head.GetCommitted())
		}
		return nil
	})
	// The running copy is in its status, with the log end it began at:
	// the master's agreement with c's log holds past it (chainmaster).
	if cp := status0(t, c).GetCopy(); cp.GetSourceId() != "b" || cp.GetStart() != 0 || cp == nil {
		t.Fatalf("c's status while copying: copy %v, want from b since 0", cp)
	}
	// Idempotent: asking again keeps the copy.
	if _, err := cc.CatchUp(ctx, &catenapb.CatchUpRequest{Chain: chainReq, SourceId: "b", SourceAddr: b.addr}); err != nil {
		t.Fatal(err)
	}

	// It joins at the tail; what arrived since comes through the link.
	write(5)
	configure(t, 2, a, b, c)
	for range 5 {
		if _, err := ac.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 2, Records: records(1, seq, 50)}); err != nil {
			t.Fatal(err)
		}
		seq += 50
	}
	st := converged(t, a, b, c)
	if want := seq - 1; st.GetLogEnd() != want {
		t.Fatalf("log end %d, want %d", st.GetLogEnd(), want)
	}
	// The copy rebuilt c's de-duplication table: a retry of an old
	// sequence at c, were it head, would be recognised. Check it as the
	// head of a chain of its own.
	if st := status0(t, c); st.GetRole() != catenapb.Role_ROLE_TAIL || st.GetCommitted() != seq-1 || st.GetCopy() != nil {
		t.Fatalf("c after joining (no copy left): %v", st)
	}
}

func TestReadFramesServesCommittedFramesOnly(t *testing.T) {
	ctx := context.Background()
	a := startNode(t, "a", nil)
	configure(t, 1, a)
	ac := client(t, a.addr)
	for i := range 3 {
		if _, err := ac.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, uint64(i*4+1), 4)}); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := ac.ReadFrames(ctx, &catenapb.ReadFramesRequest{Stream: "s", Partition: 0, From: 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetFrames()) != 2 || resp.GetCommitted() != 12 {
		t.Fatalf("frames %d committed %d, want 2 frames and 12", len(resp.GetFrames()), resp.GetCommitted())
	}
	h, err := partlog.DecodeHeader(resp.GetFrames()[0])
	if err != nil || h.BaseOffset != 4 || h.Count != 4 {
		t.Fatalf("first frame %+v %v, want [4,8)", h, err)
	}
	// At the committed offset, with no wait: nothing, at once.
	if resp, err := ac.ReadFrames(ctx, &catenapb.ReadFramesRequest{Stream: "s", Partition: 0, From: 12}); err != nil || len(resp.GetFrames()) != 0 {
		t.Fatalf("at the end: %v %v", resp, err)
	}
	if _, err := ac.ReadFrames(ctx, &catenapb.ReadFramesRequest{Stream: "s", Partition: 0, From: 99}); status.Code(err) != codes.OutOfRange {
		t.Fatalf("beyond the log: %v, want OutOfRange", err)
	}
	if _, err := ac.ReadFrames(ctx, &catenapb.ReadFramesRequest{Stream: "nope", Partition: 0}); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown partition: %v", err)
	}
}

func TestStatusReportsHowLongTheSuccessorLinkIsDown(t *testing.T) {
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	configure(t, 1, a, b)
	eventually(t, 5*time.Second, func() error {
		if st := status0(t, a); st.GetSuccessorDownMs() != 0 {
			return fmt.Errorf("link down for %d ms", st.GetSuccessorDownMs())
		}
		return nil
	})
	if st := status0(t, b); st.GetSuccessorDownMs() != 0 {
		t.Fatalf("the tail has no successor, yet reports one down: %v", st)
	}
	stopNode(b) // the successor dies: the head's link breaks
	eventually(t, 5*time.Second, func() error {
		if st := status0(t, a); st.GetSuccessorDownMs() < 200 || st.GetSuccessorError() == "" {
			return fmt.Errorf("link down for %d ms, reason %q", st.GetSuccessorDownMs(), st.GetSuccessorError())
		}
		return nil
	})
	// A new epoch without the dead successor: nothing is reported down.
	configure(t, 2, a)
	if st := status0(t, a); st.GetSuccessorDownMs() != 0 || st.GetSuccessorError() != "" || st.GetSuccessorStalledMs() != 0 {
		t.Fatalf("sole member reports a successor down: %v", st)
	}
}

// A successor that stops acknowledging while the link stays open (paused,
// or its packets dropped) shows as a stalled link, not a down one.
func TestStatusReportsAStalledSuccessor(t *testing.T) {
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	px := startFreezableProxy(t, b.addr)
	req := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 1, Config: testConfig,
		Members: []*catenapb.Member{{Id: "a", Addr: a.addr}, {Id: "b", Addr: px.addr}}}
	ctx := context.Background()
	for _, n := range []*node{b, a} {
		if _, err := client(t, n.addr).Configure(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 1, 2)}); err != nil {
		t.Fatal(err)
	}
	if st := status0(t, a); st.GetSuccessorStalledMs() != 0 || st.GetSuccessorDownMs() != 0 {
		t.Fatalf("every forwarded record is acknowledged, yet the link reports trouble: %v", st)
	}
	ac := connected(t, a)
	px.freeze()
	actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := ac.Append(actx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 3, 2)}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("append through a frozen link: %v, want DeadlineExceeded", err)
	}
	eventually(t, 5*time.Second, func() error {
		st := status0(t, a)
		if st.GetSuccessorStalledMs() < 200 || st.GetSuccessorDownMs() != 0 {
			return fmt.Errorf("stalled %d ms, down %d ms; want a stall of 200 ms or more on a link that is up", st.GetSuccessorStalledMs(), st.GetSuccessorDownMs())
		}
		return nil
	})
}

// freezableProxy forwards TCP connections to a backend until frozen; then
// it keeps them open and passes nothing, as a link whose packets vanish.
type freezableProxy struct {
	addr  string
	mu    sync.Mutex
	gate  chan struct{} // closed while bytes pass; nil before the first freeze
	conns []net.Conn
}

func startFreezableProxy(t *testing.T, backend string) *freezableProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	px := &freezableProxy{addr: lis.Addr().String()}
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if err != nil {
				return
			}
			px.mu.Lock()
			gate := px.gate
			px.mu.Unlock()
			if gate != nil {
				<-gate // the fault: bytes held, nothing closed
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
	go func() {
		for {
			in, err := lis.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", backend)
			if err != nil {
				in.Close()
				continue
			}
			px.mu.Lock()
			px.conns = append(px.conns, in, out)
			px.mu.Unlock()
			go pipe(out, in)
			go pipe(in, out)
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		px.mu.Lock()
		defer px.mu.Unlock()
		if px.gate != nil {
			close(px.gate) // let the held bytes go, so the pipes end
		}
		for _, c := range px.conns {
			c.Close()
		}
	})
	return px
}

// freeze holds every byte from now on; the test's cleanup releases them.
func (px *freezableProxy) freeze() {
	px.mu.Lock()
	defer px.mu.Unlock()
	px.gate = make(chan struct{})
}

// senderFrame encodes records as ingestion does: one frame at epoch 0,
// offset 0.
func senderFrame(t *testing.T, recs []*catenapb.AppendRecord, ts int64) []byte {
	t.Helper()
	out := make([]partlog.Record, len(recs))
	for i, r := range recs {
		out[i] = partlog.Record{TimestampMs: ts + int64(i), ProducerID: r.GetProducerId(), Sequence: r.GetSequence(), Key: r.GetKey(), Value: r.GetValue()}
	}
	f, err := partlog.AppendBatch(nil, 0, 0, out)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestAppendOfASendersFrame: a frame from ingestion is stored with the
// head's epoch and offsets and read back record for record on every member;
// sent again with a new record in it, the stored ones are duplicates at
// their original offsets and only the new one is stored; a malformed frame,
// or a frame together with record messages, is refused and stores nothing.
func TestAppendOfASendersFrame(t *testing.T) {
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	configure(t, 3, a, b)
	ctx := context.Background()
	head := client(t, a.addr)
	recs := records(5, 1, 4)
	first, err := head.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 3, Frame: senderFrame(t, recs, 1000)})
	if err != nil {
		t.Fatal(err)
	}
	for i, off := range first.GetOffsets() {
		if off != uint64(i) || first.GetDuplicate()[i] {
			t.Fatalf("record %d at %d (duplicate %v), want %d", i, off, first.GetDuplicate()[i], i)
		}
	}
	// Sent again after a lost answer, with one more record: only that one is new.
	again := append(records(5, 1, 4), records(5, 5, 1)...)
	second, err := head.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 3, Frame: senderFrame(t, again, 1000)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if !second.GetDuplicate()[i] || second.GetOffsets()[i] != uint64(i) {
			t.Fatalf("resent record %d: offset %d duplicate %v", i, second.GetOffsets()[i], second.GetDuplicate()[i])
		}
	}
	if second.GetDuplicate()[4] || second.GetOffsets()[4] != 4 {
		t.Fatalf("new record: offset %d duplicate %v, want 4, new", second.GetOffsets()[4], second.GetDuplicate()[4])
	}
	before := converged(t, a, b)
	if before.GetLogEnd() != 5 {
		t.Fatalf("log end %d, want 5", before.GetLogEnd())
	}
	for _, n := range []*node{a, b} {
		resp, err := client(t, n.addr).Read(ctx, &catenapb.FetchRequest{Stream: "s", MaxBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetRecords()) != 5 {
			t.Fatalf("%s holds %d records, want 5", n.id, len(resp.GetRecords()))
		}
		for i, r := range resp.GetRecords() {
			if r.GetOffset() != uint64(i) || !bytes.Equal(r.GetValue(), again[i].GetValue()) || r.GetTimestampMs() != 1000+int64(i) {
				t.Fatalf("%s record %d: %+v, want value %q at %d", n.id, i, r, again[i].GetValue(), 1000+i)
			}
		}
	}

	corrupt := senderFrame(t, records(5, 6, 2), 1000)
	corrupt[len(corrupt)-1] ^= 1
	placed := senderFrame(t, records(5, 6, 2), 1000)
	if err := partlog.Reframe(placed, 3, 10); err != nil {
		t.Fatal(err)
	}
	for name, req := range map[string]*catenapb.AppendRequest{
		"frame with a bad checksum":   {Stream: "s", Epoch: 3, Frame: corrupt},
		"frame already given offsets": {Stream: "s", Epoch: 3, Frame: placed},
		"not a frame":                 {Stream: "s", Epoch: 3, Frame: []byte("records")},
		"both a frame and records":    {Stream: "s", Epoch: 3, Frame: senderFrame(t, records(5, 6, 1), 1000), Records: records(5, 7, 1)},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := head.Append(ctx, req)
			if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() == "" {
				t.Fatalf("got %v, want InvalidArgument with a reason", err)
			}
			for _, n := range []*node{a, b} {
				if st := status0(t, n); st.GetLogEnd() != before.GetLogEnd() || st.GetChecksum() != before.GetChecksum() {
					t.Fatalf("%s changed: log end %d checksum %x", n.id, st.GetLogEnd(), st.GetChecksum())
				}
			}
		})
	}
}

// TestReturningSuccessorIsLinkedAtOnce: a successor that was down and is
// configured back into the chain is linked to as soon as it is there, not
// after the reconnect back-off its predecessor's connection built up while
// it was away (a minute here; 0.3-1.3 s in the benchmark that found it,
// every write of the chain waiting for it).
func TestReturningSuccessorIsLinkedAtOnce(t *testing.T) {
	slow := grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: time.Minute, Multiplier: 1, MaxDelay: time.Minute},
		MinConnectTimeout: 5 * time.Second,
	})
	a := &node{id: "a", fatal: make(chan error, 4)}
	startWith(t, a, t.TempDir(), Options{DialOptions: []grpc.DialOption{slow}})
	b := startNode(t, "b", nil)
	configure(t, 1, a, b)
	ctx := context.Background()
	if _, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 1, 3)}); err != nil {
		t.Fatal(err)
	}
	converged(t, a, b)
	stopNode(b)
	conn, err := a.srv.pool.Get(b.addr)
	if err != nil {
		t.Fatal(err)
	}
	// The link keeps trying; once a connection attempt has failed, the
	// next one is a minute away.
	eventually(t, 10*time.Second, func() error {
		if s := conn.GetState(); s != connectivity.TransientFailure {
			return fmt.Errorf("connection to b is %v", s)
		}
		return nil
	})
	b = reopen(t, b)
	configure(t, 2, a, b)
	actx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := client(t, a.addr).Append(actx, &catenapb.AppendRequest{Stream: "s", Epoch: 2, Records: records(1, 4, 3)}); err != nil {
		t.Fatalf("append with the returned successor in the chain: %v", err)
	}
	if st := converged(t, a, b); st.GetLogEnd() != 6 {
		t.Fatalf("log end %d, want 6", st.GetLogEnd())
	}
}

// cutLastBatch loses n's last batch the way a power cut loses unsynced
// data (recovery cuts the torn frame). n must be stopped.
func cutLastBatch(t *testing.T, n *node) {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(n.srv.dataDir, "streams", "s", "00000", "*.seg"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("no segment of %s found: %v", n.id, err)
	}
	last := segs[len(segs)-1]
	fi, err := os.Stat(last)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(last, fi.Size()-5); err != nil {
		t.Fatal(err)
	}
	// With a journal, the batch is in the journal's last group too: the
	// power cut that cost the file the batch cost the journal that
	// group. The logs were closed cleanly (their files whole), so
	// without its journal the replica opens them as they are.
	if err := os.RemoveAll(filepath.Join(n.srv.dataDir, journalDir)); err != nil {
		t.Fatal(err)
	}
}

// A coordinated power cut (SCENARIOS.md 21) leaves the head and the middle
// without the last batch, which the tail had synced. Back at the same
// epoch, the head and middle agree on length, and the middle's link to the
// tail succeeds as soon as new writes make it as long as the tail: the
// tail would then count its old, never-acknowledged records as the new
// ones, and acknowledge them. Every member that reopens a partition from
// its volume must instead wait for a new epoch (the master's decision,
// after it compared the members' logs) before it takes or passes on a
// write, and say so in Status.
func TestRestartedMembersWaitForANewEpoch(t *testing.T) {
	a, b, c := startNode(t, "a", nil), startNode(t, "b", nil), startNode(t, "c", nil)
	configure(t, 1, a, b, c)
	ctx := context.Background()
	for i := range 3 {
		if _, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, uint64(i*2+1), 2)}); err != nil {
			t.Fatal(err)
		}
	}
	converged(t, a, b, c)
	for _, n := range []*node{a, b, c} {
		stopNode(n)
	}
	cutLastBatch(t, a)
	cutLastBatch(t, b)
	a, b, c = reopen(t, a), reopen(t, b), reopen(t, c)
	for _, n := range []*node{a, b, c} {
		if st := status0(t, n); !st.GetRestored() {
			t.Errorf("%s reopened at epoch %d does not report it is waiting for a new epoch", n.id, st.GetEpoch())
		}
	}

	// The head refuses at first anyway (its link handshake is not done);
	// without the rule it takes the write once the handshake is, so keep
	// asking for a while.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); <-tick.C {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := client(t, a.addr).Append(actx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(2, 1, 2)})
		cancel()
		if err == nil {
			r, rerr := client(t, c.addr).Read(ctx, &catenapb.FetchRequest{Stream: "s", Partition: 0, Offset: resp.GetOffsets()[0], MaxBytes: 1 << 20})
			if rerr == nil && len(r.GetRecords()) > 0 {
				t.Fatalf("the restarted head acknowledged offset %d at the old epoch; the tail serves %q there", resp.GetOffsets()[0], r.GetRecords()[0].GetValue())
			}
			t.Fatalf("the restarted head acknowledged offset %d at the old epoch", resp.GetOffsets()[0])
		}
		if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
			t.Fatalf("append at a restarted head: %v, want Unavailable", err)
		}
	}

	// The master's new epoch, with the tail (the longest log) as head and
	// the others cut back to where they agree and caught up, ends it; here
	// the chain is simply installed anew on the tail alone.
	configure(t, 2, c)
	if st := status0(t, c); st.GetRestored() {
		t.Errorf("c still reports restored after epoch 2")
	}
	if _, err := client(t, c.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 2, Records: records(2, 1, 2)}); err != nil {
		t.Fatalf("append at epoch 2: %v", err)
	}
}

// A corrupt chain.json (SCENARIOS.md 28) costs its partition, not the
// replica process: the others open and serve, and the partition refuses
// to serve and says why, as a corrupt log does, so that the master
// replaces that copy.
func TestCorruptChainMetaCostsOnlyItsPartition(t *testing.T) {
	a := startNode(t, "a", nil)
	ctx := context.Background()
	for _, stream := range []string{"s", "t"} {
		req := &catenapb.ConfigureRequest{Stream: stream, Partition: 0, Epoch: 1, Members: members(a), Config: testConfig}
		if _, err := client(t, a.addr).Configure(ctx, req); err != nil {
			t.Fatal(err)
		}
		if _, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: stream, Epoch: 1, Records: records(1, 1, 2)}); err != nil {
			t.Fatal(err)
		}
	}
	stopNode(a)
	meta := filepath.Join(a.srv.dataDir, "streams", "s", "00000", "chain.json")
	if err := os.WriteFile(meta, []byte(`{"epoch": 1, "members": [`), 0o644); err != nil {
		t.Fatal(err)
	}
	a = reopen(t, a)
	if st := status0(t, a); !strings.Contains(st.GetError(), "chain.json") {
		t.Fatalf("partition with a corrupt chain.json reports error %q, want one naming chain.json", st.GetError())
	}
	if _, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(2, 1, 1)}); status.Code(err) == codes.OK {
		t.Fatal("the partition with a corrupt chain.json took a write")
	}
	if _, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "t", Epoch: 1, Records: records(2, 1, 1)}); err != nil {
		t.Fatalf("the other partition does not serve: %v", err)
	}
	// The master replaces the copy: it is dropped, and the replica can
	// hold the partition again, empty.
	if _, err := client(t, a.addr).Drop(ctx, &catenapb.DropRequest{Stream: "s", Partition: 0, Epoch: 1}); err != nil {
		t.Fatalf("drop of the corrupt copy: %v", err)
	}
}

// A retry of an append as large as a batch may be (SCENARIOS.md 27) is
// answered truthfully: every record stored once, acknowledged as a
// duplicate at its offset. The de-duplication window used to be smaller
// than one append, and the retry's first record had left it: the retry
// was refused as "nothing stored" though everything was.
func TestRetryOfTheLargestAppendIsAnsweredTruthfully(t *testing.T) {
	a := startNode(t, "a", nil)
	configure(t, 1, a)
	ctx := context.Background()
	req := &catenapb.AppendRequest{Stream: "s", Epoch: 1}
	for i := range partlog.MaxBatchRecords {
		req.Records = append(req.Records, &catenapb.AppendRecord{Value: []byte{byte(i)}, ProducerId: 5, Sequence: uint64(i + 1)})
	}
	first, err := client(t, a.addr).Append(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := client(t, a.addr).Append(ctx, req)
	if err != nil {
		t.Fatalf("retry of a stored append of %d records: %v", len(req.Records), err)
	}
	for i := range req.Records {
		if !again.GetDuplicate()[i] || again.GetOffsets()[i] != first.GetOffsets()[i] {
			t.Fatalf("record %d: retry answered offset %d duplicate %v, want the original offset %d as a duplicate",
				i, again.GetOffsets()[i], again.GetDuplicate()[i], first.GetOffsets()[i])
		}
	}
	if st := status0(t, a); st.GetLogEnd() != uint64(len(req.Records)) {
		t.Fatalf("log end %d after the retry, want %d: stored twice", st.GetLogEnd(), len(req.Records))
	}
}

// A member's committed offset survives a restart: it is where Truncate's
// guard stands and what its reads serve, so a restarted member that
// forgot it could be cut below committed records, and LATEST read from it
// could go back. Until a new epoch it serves what it knew; past that it
// refuses (another member knows more), rather than wait or answer less.
func TestCommittedSurvivesARestart(t *testing.T) {
	a, b, c := startNode(t, "a", nil), startNode(t, "b", nil), startNode(t, "c", nil)
	configure(t, 1, a, b, c)
	ctx := context.Background()
	for i := range 3 {
		if _, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, uint64(i*2+1), 2)}); err != nil {
			t.Fatal(err)
		}
	}
	converged(t, a, b, c)
	for _, n := range []*node{a, b, c} {
		stopNode(n)
	}
	a, c = reopen(t, a), reopen(t, c)
	if st := status0(t, c); st.GetCommitted() != 6 || !st.GetRestored() {
		t.Fatalf("reopened tail: committed %d restored %v, want 6 true", st.GetCommitted(), st.GetRestored())
	}
	cc := client(t, c.addr)
	latest, err := cc.ListOffsets(ctx, &catenapb.ListOffsetsRequest{Stream: "s", Partition: 0, Spec: catenapb.OffsetSpec_OFFSET_SPEC_LATEST})
	if err != nil || latest.GetOffset() != 6 {
		t.Fatalf("LATEST of the reopened tail: %v, %v; want 6", latest, err)
	}
	if r, err := cc.Read(ctx, &catenapb.FetchRequest{Stream: "s", Partition: 0, Offset: 0, MaxBytes: 1 << 20}); err != nil || len(r.GetRecords()) != 6 {
		t.Fatalf("read of the reopened tail: %d records, %v; want 6", len(r.GetRecords()), err)
	}
	if _, err := cc.Read(ctx, &catenapb.FetchRequest{Stream: "s", Partition: 0, Offset: 6, MaxBytes: 1 << 20, MaxWaitMs: 5000}); status.Code(err) != codes.Unavailable {
		t.Fatalf("long-poll past what a restored member knows: %v, want Unavailable at once", err)
	}

	// Out of the chain, a's committed records are still guarded.
	req := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 2, Members: members(c), Config: testConfig}
	for _, n := range []*node{c, a} {
		if _, err := client(t, n.addr).Configure(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client(t, a.addr).Truncate(ctx, &catenapb.TruncateRequest{Stream: "s", Partition: 0, To: 2}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("truncate of a restarted member below its committed offset: %v, want FailedPrecondition", err)
	}
}

// A member that knows less than the chain's master (its committed file
// lagged a crash, or it is a new head whose predecessor knew more) learns
// the master's committed offset with a new epoch, up to what it holds.
func TestConfigureTeachesTheCommittedOffset(t *testing.T) {
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	configure(t, 1, a, b)
	ctx := context.Background()
	if _, err := client(t, a.addr).Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 1, 4)}); err != nil {
		t.Fatal(err)
	}
	converged(t, a, b)
	stopNode(b)
	forgetCommitted(t, b.srv.dataDir, partKey{"s", 0})
	b = reopen(t, b)
	if st := status0(t, b); st.GetCommitted() != 0 {
		t.Fatalf("reopened without its committed file: committed %d, want 0", st.GetCommitted())
	}
	req := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 2, Members: members(b, a), Config: testConfig, Committed: 9}
	for _, n := range []*node{a, b} {
		if _, err := client(t, n.addr).Configure(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if st := status0(t, b); st.GetCommitted() != 4 {
		t.Fatalf("new head told committed 9 while holding 4: committed %d, want 4", st.GetCommitted())
	}
}

// Retention never deletes what is not yet on every member: a head whose
// successor is away keeps every uncommitted segment, whatever the limits,
// so the successor can still be sent them.
func TestRetentionKeepsWhatIsNotOnEveryMember(t *testing.T) {
	a, b := startNode(t, "a", nil), startNode(t, "b", nil)
	cfg := &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC, SegmentBytes: 1 << 20,
		RetentionBytes: 1 << 20, HardRetentionBytes: 1 << 20}
	req := &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 1, Members: members(a, b), Config: cfg}
	ctx := context.Background()
	for _, n := range []*node{b, a} {
		if _, err := client(t, n.addr).Configure(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	stopNode(b)
	value := bytes.Repeat([]byte("x"), 64<<10)
	// One connection, made before the short deadlines: a new one per call
	// would spend them on its handshake, and an append never sent leaves a
	// gap in the log.
	ac := connected(t, a)
	for i := range 48 { // 3 MiB: three segments
		actx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err := ac.Append(actx, &catenapb.AppendRequest{Stream: "s", Epoch: 1,
			Records: []*catenapb.AppendRecord{{Value: value, ProducerId: 1, Sequence: uint64(i + 1)}}})
		cancel()
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("append %d without a successor: %v, want DeadlineExceeded (stored, not committed)", i, err)
		}
	}
	// An append whose caller gave up at 50 ms may land a moment later (its
	// fsync outlasted the deadline on a loaded machine, as in CI once).
	eventually(t, 10*time.Second, func() error {
		if st := status0(t, a); st.GetLogEnd() != 48 || st.GetCommitted() != 0 {
			return fmt.Errorf("head: end %d committed %d, want 48 0", st.GetLogEnd(), st.GetCommitted())
		}
		return nil
	})
	a.srv.enforceRetention()
	if st := status0(t, a); st.GetLogStart() != 0 {
		t.Fatalf("retention deleted uncommitted records: the head's log starts at %d", st.GetLogStart())
	}

	b = reopen(t, b)
	req.Epoch = 2
	for _, n := range []*node{b, a} {
		if _, err := client(t, n.addr).Configure(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, func() error {
		if st := status0(t, a); st.GetCommitted() != 48 {
			return fmt.Errorf("head committed %d, want 48", st.GetCommitted())
		}
		return nil
	})
	// Now on both, it may go.
	a.srv.enforceRetention()
	if st := status0(t, a); st.GetLogStart() == 0 {
		t.Fatalf("retention kept committed records past every limit: the head's log starts at 0")
	}
}

// A Stream's durability and retention can change while its partitions are
// open: the master sends the new config under the same epoch, and the
// members apply it at once, not at their next restart.
func TestLiveConfigChangesApplyToOpenPartitions(t *testing.T) {
	ctx := context.Background()
	a := startNode(t, "a", nil)
	cfg := &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC, SegmentBytes: 1 << 20}
	install := func(cfg *catenapb.StreamConfig) {
		t.Helper()
		if _, err := client(t, a.addr).Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 1, Members: members(a), Config: cfg}); err != nil {
			t.Fatal(err)
		}
	}
	install(cfg)
	p := a.srv.partitions[partKey{"s", 0}]

	// fsync -> interval: records are acknowledged at append and fsynced on
	// the interval, which means fsynced.
	interval := proto.CloneOf(cfg)
	interval.Durability, interval.FsyncIntervalMs = catenapb.Durability_DURABILITY_INTERVAL, 20
	install(interval)
	appendLarge(t, a, 1, 4)
	eventually(t, 5*time.Second, func() error {
		if d, n := p.log.DurableOffset(), p.log.NextOffset(); d != n {
			return fmt.Errorf("under interval durability the log is fsynced to %d of %d", d, n)
		}
		return nil
	})

	// Retention set on a stream that had none trims at the next round.
	appendLarge(t, a, 1, 8)
	retained := proto.CloneOf(interval)
	retained.RetentionBytes = 1
	install(retained)
	a.srv.enforceRetention()
	if st := status0(t, a); st.GetLogStart() == 0 {
		t.Fatalf("retention of 1 byte set live: the log still starts at 0 (ends at %d)", st.GetLogEnd())
	}

	// interval -> fsync: appends wait for their fsync again.
	back := proto.CloneOf(retained)
	back.Durability, back.FsyncIntervalMs = catenapb.Durability_DURABILITY_FSYNC, 0
	install(back)
	appendLarge(t, a, 1, 1)
	if d, n := p.log.DurableOffset(), p.log.NextOffset(); d != n {
		t.Fatalf("back under fsync durability an acknowledged append is fsynced to %d of %d", d, n)
	}

	// A larger segment size: the open segment takes appends past the old
	// size; back to the smaller one, the next append rolls it.
	segments := func() int {
		t.Helper()
		names, err := filepath.Glob(filepath.Join(a.srv.dataDir, "streams", "s", "00000", "*.seg"))
		if err != nil {
			t.Fatal(err)
		}
		return len(names)
	}
	larger := proto.CloneOf(back)
	larger.RetentionBytes, larger.SegmentBytes = 0, 8<<20
	install(larger)
	appendLarge(t, a, 1, 1) // a fresh segment if the last append filled one
	before := segments()
	appendLarge(t, a, 1, 6) // 1.8 MiB: past 1 MiB, within 8 MiB
	if n := segments(); n != before {
		t.Fatalf("with 8 MiB segments, 1.8 MiB of appends made %d segments of %d", n, before)
	}
	smaller := proto.CloneOf(larger)
	smaller.SegmentBytes = 1 << 20
	install(smaller)
	appendLarge(t, a, 1, 1)
	if n := segments(); n != before+1 {
		t.Fatalf("back to 1 MiB segments, the append after it left %d segments, want %d (the open one rolled)", n, before+1)
	}
}

// A request that carries a producer's later records before its earlier
// ones (ingestion merged a retry behind a request sent after it) must not
// be stored in that order: the head refuses it whole, as it refuses a
// sequence below one already stored.
func TestARequestThatReordersAProducerIsRefused(t *testing.T) {
	a := startNode(t, "a", nil)
	configure(t, 1, a)
	ctx := context.Background()
	ac := client(t, a.addr)
	if _, err := ac.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 1, 2)}); err != nil {
		t.Fatal(err)
	}
	recs := append(records(1, 5, 2), records(1, 3, 2)...) // 5, 6, then 3, 4
	_, err := ac.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: recs})
	if status.Code(err) != codes.OutOfRange {
		t.Fatalf("append of sequences 5, 6, 3, 4: %v, want OutOfRange", err)
	}
	if st := status0(t, a); st.GetLogEnd() != 2 {
		t.Fatalf("log end %d after a refused append, want 2 (nothing stored)", st.GetLogEnd())
	}
	// Duplicates among them are fine: 1, 2 stored, then 3.
	resp, err := ac.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: append(records(1, 1, 2), records(1, 3, 1)...)})
	if err != nil || !resp.GetDuplicate()[0] || resp.GetDuplicate()[2] || resp.GetOffsets()[2] != 2 {
		t.Fatalf("append of 1, 2 (stored) and 3: %v %v", resp, err)
	}
}

// TestIntervalDurabilityWakesOnlyForAppends: under interval durability a
// partition fsyncs what was appended at most once an interval, and one
// nobody writes to does not wake at all. A ticker per partition woke every
// one each interval: with 256 partitions and a 1 ms interval the replicas
// spent more on the wake-ups than an fsync per append costs.
func TestIntervalDurabilityWakesOnlyForAppends(t *testing.T) {
	srv, reg := soleMember(t, 1, &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_INTERVAL, FsyncIntervalMs: 1})
	ctx := context.Background()
	syncs := func() float64 { return metricTotals(t, reg)["catena_replica_append_sync_seconds"] }
	if _, err := srv.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(1, 1, 3)}); err != nil {
		t.Fatal(err)
	}
	p := srv.partitions[partKey{"s", 0}]
	eventually(t, 5*time.Second, func() error {
		if d, n := p.log.DurableOffset(), p.log.NextOffset(); d != n {
			return fmt.Errorf("fsynced to %d of %d", d, n)
		}
		return nil
	})
	after := syncs()
	// A window with nothing appended: absence cannot be waited for, only
	// watched for a hundred intervals.
	time.Sleep(100 * time.Millisecond)
	if n := syncs() - after; n > 1 {
		t.Errorf("%.0f syncs in 100 intervals with nothing appended, want none", n)
	}
}

// A replica's restart opens sealed segments from their summaries without
// reading their frames, and reads them afterwards: damage there found
// then stops the partition being served, as damage found at the start
// did before (docs/storage-format.md §13).
func TestARestartFindsDamageInASealedSegmentAfterOpening(t *testing.T) {
	a := startNode(t, "a", nil)
	ctx := context.Background()
	fillSegments(t, a, 3)
	stopNode(a)
	dir := filepath.Join(a.srv.dataDir, "streams", "s", "00000")
	segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	sums, _ := filepath.Glob(filepath.Join(dir, "*.seg.sum"))
	if len(segs) < 3 || len(sums) != len(segs)-1 {
		t.Fatalf("setup: segments %v, summaries %v", segs, sums)
	}
	b, err := os.ReadFile(segs[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x40 // in a record's value: its frame's CRC fails
	if err := os.WriteFile(segs[0], b, 0o644); err != nil {
		t.Fatal(err)
	}

	a = reopen(t, a)
	eventually(t, 10*time.Second, func() error {
		// Found by the reads after the start, not by the start's scan
		// ("sealed segment: ..."), which the summaries spared.
		if e := status0(t, a).GetError(); !strings.Contains(e, "corrupt") || !strings.Contains(e, filepath.Base(segs[0])) || strings.Contains(e, "sealed segment:") {
			return fmt.Errorf("partition error %q", e)
		}
		return nil
	})
	if _, err := a.rc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(2, 1, 1)}, grpc.WaitForReady(true)); status.Code(err) == codes.OK {
		t.Fatal("the damaged partition took a write")
	}
}

// A sealed segment that does not read back after a restart (a bad stretch
// of the disk) is read again from where verification got to; once it
// reads, the partition serves on, and if it never does, the partition is
// not served: what the replica cannot read back it must not serve.
func TestASealedSegmentThatDoesNotReadBackIsTriedAgain(t *testing.T) {
	defer func(d time.Duration) { verifyRetryMin = d }(verifyRetryMin)
	verifyRetryMin = 10 * time.Millisecond
	for _, tc := range []struct {
		name     string
		failures int // reads of each bad stretch that fail (-1: all)
		segments int // segments with a bad stretch, from the first
		serves   bool
	}{{"a passing fault", 2, 1, true}, {"a lasting fault", -1, 1, false}, {"a passing fault in each of six segments", 1, 6, true}} {
		t.Run(tc.name, func(t *testing.T) {
			fs := faultfs.New()
			dir := t.TempDir()
			a := startNodeAt(t, "a", dir, fs)
			ctx := context.Background()
			fillSegments(t, a, 8)
			stopNode(a)
			pdir := filepath.Join(dir, "streams", "s", "00000")
			names, err := fs.ReadDir(pdir) // the logs are in fs
			if err != nil {
				t.Fatal(err)
			}
			var segs []string
			for _, n := range names {
				if strings.HasSuffix(n, ".seg") {
					segs = append(segs, filepath.Join(pdir, n))
				}
			}
			if len(segs) < 7 {
				t.Fatalf("setup: %d segments", len(segs))
			}
			for _, s := range segs[:tc.segments] {
				fs.FailReadsIn(s, 400<<10, 500<<10, tc.failures, syscall.EIO)
			}

			a = startNodeAt(t, "a", dir, fs)
			if tc.serves {
				eventually(t, 10*time.Second, func() error {
					for _, s := range segs[:len(segs)-1] {
						b, err := fs.ReadFile(s + ".sum")
						if err != nil || len(b) < 6 || b[5]&1 == 0 {
							return fmt.Errorf("segment %s not verified yet (%v)", filepath.Base(s), err)
						}
					}
					return nil
				})
				if e := status0(t, a).GetError(); e != "" {
					t.Fatalf("partition error %q after a passing read fault", e)
				}
				if _, err := a.rc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(2, 1, 1)}, grpc.WaitForReady(true)); err != nil {
					t.Fatalf("append after a passing read fault: %v", err)
				}
				return
			}
			eventually(t, 10*time.Second, func() error {
				if e := status0(t, a).GetError(); !strings.Contains(e, "do not read back") {
					return fmt.Errorf("partition error %q", e)
				}
				return nil
			})
			if _, err := a.rc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(2, 1, 1)}, grpc.WaitForReady(true)); status.Code(err) == codes.OK {
				t.Fatal("the partition that does not read back took a write")
			}
		})
	}
}

// fillSegments makes node a the sole member of stream s's partition 0, in
// segments of 1 MiB, and appends about mib MiB of 1 KiB records to it.
func fillSegments(t *testing.T, a *node, mib int) {
	t.Helper()
	ctx := context.Background()
	// One connection for all the calls, waited for: a connection attempt
	// is bounded by transport.MinConnectTimeout (1 s), which a loaded CI
	// machine running this package under the race detector has exceeded
	// when each call dialled its own.
	c := a.rc
	cfg := &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC, SegmentBytes: 1 << 20}
	if _, err := c.Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Partition: 0, Epoch: 1, Members: members(a), Config: cfg}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	value := bytes.Repeat([]byte("v"), 1000)
	for i := range 10 * mib {
		recs := make([]*catenapb.AppendRecord, 100)
		for j := range recs {
			recs[j] = &catenapb.AppendRecord{Value: value, ProducerId: 1, Sequence: uint64(i*100 + j + 1)}
		}
		if _, err := c.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: recs}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	}
}

// A restart opens every partition on disk, several at once: each with
// its log as it was, and each that cannot be served (its chain
// metadata or its holds unreadable) kept, refusing to serve, without
// stopping the others.
func TestARestartOpensEveryPartition(t *testing.T) {
	const parts = 12
	dir := t.TempDir()
	a := startNodeAt(t, "a", dir, nil)
	ctx := context.Background()
	cfg := &catenapb.StreamConfig{Partitions: parts, Durability: catenapb.Durability_DURABILITY_FSYNC}
	for p := range uint32(parts) {
		if _, err := a.rc.Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Partition: p, Epoch: 1, Members: members(a), Config: cfg}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
		if _, err := a.rc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Partition: p, Epoch: 1, Records: records(1, 1, int(p)+1)}, grpc.WaitForReady(true)); err != nil {
			t.Fatal(err)
		}
	}
	stopNode(a)
	pdir := func(p int) string { return filepath.Join(dir, "streams", "s", fmt.Sprintf("%05d", p)) }
	if err := os.WriteFile(filepath.Join(pdir(5), metaFile), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pdir(9), holdsFile), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}

	a = startNodeAt(t, "a", dir, nil)
	resp, err := a.rc.Status(ctx, &catenapb.StatusRequest{Stream: "s"}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint32]*catenapb.PartitionStatus{}
	for _, st := range resp.GetPartitions() {
		got[st.GetPartition()] = st
	}
	if len(got) != parts {
		t.Fatalf("%d partitions after the restart, want %d", len(got), parts)
	}
	for p := range uint32(parts) {
		st := got[p]
		switch failed := st.GetError() != ""; {
		case p == 5 || p == 9:
			if !failed {
				t.Errorf("partition %d with damaged files serves", p)
			}
		case failed:
			t.Errorf("partition %d: %s", p, st.GetError())
		case st.GetLogEnd() != uint64(p)+1:
			t.Errorf("partition %d: log end %d, want %d", p, st.GetLogEnd(), p+1)
		}
	}
}
