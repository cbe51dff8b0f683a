package ingest

import (
	"context"
	"fmt"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/replica/server"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// replicaNode is an in-process replica server on a loopback port.
type replicaNode struct {
	id, addr string
	srv      *server.Server
}

func startReplica(t *testing.T, id string) *replicaNode {
	t.Helper()
	srv, err := server.New(server.Options{ID: id, DataDir: t.TempDir(), Logger: logr.Discard(), Fatal: func(err error) { t.Errorf("replica %s stopped: %v", id, err) }})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(transport.ServerOptions(nil)...)
	srv.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(func() {
		g.Stop()
		srv.Close()
	})
	return &replicaNode{id: id, addr: lis.Addr().String(), srv: srv}
}

func replicaClient(t *testing.T, addr string) catenapb.ReplicaClient {
	t.Helper()
	conn, err := transport.Dial(addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return catenapb.NewReplicaClient(conn)
}

// startIngest serves ingestion over the replicas and returns a client of it.
func startIngest(t *testing.T, replicas ...*replicaNode) *client.Client {
	t.Helper()
	var addrs []string
	for _, r := range replicas {
		addrs = append(addrs, r.addr)
	}
	ing, err := New(Options{Replicas: addrs, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(transport.ServerOptions(nil)...)
	ing.Register(g)
	go func() { _ = g.Serve(lis) }()
	c, err := client.Dial(context.Background(), lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		g.Stop()
		ing.Close()
	})
	return c
}

// holdsOn reports a replica's holds of s/partition as consumer@offset.
func holdsOn(t *testing.T, r *replicaNode, partition uint32) []string {
	t.Helper()
	resp, err := replicaClient(t, r.addr).Status(context.Background(), &catenapb.StatusRequest{Stream: "s", Partition: &partition})
	if err != nil {
		t.Fatalf("status of %s: %v", r.id, err)
	}
	out := []string{}
	for _, h := range resp.GetPartitions()[0].GetHolds() {
		out = append(out, fmt.Sprintf("%s@%d", h.GetConsumer(), h.GetOffset()))
	}
	return out
}

func TestConsumerOffsetsFanOutToEveryChainMember(t *testing.T) {
	ctx := context.Background()
	a, b, c := startReplica(t, "a"), startReplica(t, "b"), startReplica(t, "c")
	cfg := &catenapb.StreamConfig{Partitions: 2, Durability: catenapb.Durability_DURABILITY_FSYNC}
	chains := [][]*replicaNode{{a, b, c}, {b, c}}
	for p, chain := range chains {
		var ms []*catenapb.Member
		for _, r := range chain {
			ms = append(ms, &catenapb.Member{Id: r.id, Addr: r.addr})
		}
		for i := len(chain) - 1; i >= 0; i-- {
			req := &catenapb.ConfigureRequest{Stream: "s", Partition: uint32(p), Epoch: 1, Members: ms, Config: cfg}
			if _, err := replicaClient(t, chain[i].addr).Configure(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
	}
	cl := startIngest(t, a, b, c)

	if err := cl.CommitConsumerOffset(ctx, "s", 0, "ns/agg", 7); err != nil {
		t.Fatal(err)
	}
	if err := cl.CommitConsumerOffset(ctx, "s", 1, "ns/agg", 3); err != nil {
		t.Fatal(err)
	}
	// Answered OK: every member of the chain already holds it.
	for _, r := range chains[0] {
		if got := holdsOn(t, r, 0); !reflect.DeepEqual(got, []string{"ns/agg@7"}) {
			t.Errorf("%s holds %v of partition 0, want ns/agg@7", r.id, got)
		}
	}
	for _, r := range chains[1] {
		if got := holdsOn(t, r, 1); !reflect.DeepEqual(got, []string{"ns/agg@3"}) {
			t.Errorf("%s holds %v of partition 1, want ns/agg@3", r.id, got)
		}
	}
	// A commit may move the hold back (a restore from an older checkpoint).
	if err := cl.CommitConsumerOffset(ctx, "s", 0, "ns/agg", 2); err != nil {
		t.Fatal(err)
	}
	if err := cl.CommitConsumerOffset(ctx, "s", 0, "other", 9); err != nil {
		t.Fatal(err)
	}

	list, err := cl.ListConsumers(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(list.GetPartitions()); n != 2 {
		t.Fatalf("%d partitions listed, want 2", n)
	}
	got := map[uint32][]string{}
	for _, p := range list.GetPartitions() {
		for _, h := range p.GetHolds() {
			got[p.GetPartition()] = append(got[p.GetPartition()], fmt.Sprintf("%s@%d", h.GetConsumer(), h.GetOffset()))
		}
		if len(p.GetDisagreeing()) != 0 {
			t.Errorf("partition %d: members %v disagree", p.GetPartition(), p.GetDisagreeing())
		}
	}
	if want := map[uint32][]string{0: {"ns/agg@2", "other@9"}, 1: {"ns/agg@3"}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("listed holds %v, want %v", got, want)
	}

	// Bad input is refused before any member is asked.
	for _, tc := range []struct {
		name      string
		stream    string
		partition uint32
		consumer  string
		code      codes.Code
	}{
		{"a bad consumer name", "s", 0, "Bad Name", codes.InvalidArgument},
		{"an empty consumer name", "s", 0, "", codes.InvalidArgument},
		{"an unknown stream", "nope", 0, "ns/agg", codes.NotFound},
		{"an unknown partition", "s", 2, "ns/agg", codes.NotFound},
	} {
		if err := cl.CommitConsumerOffset(ctx, tc.stream, tc.partition, tc.consumer, 1); status.Code(err) != tc.code {
			t.Errorf("commit with %s: %v, want %v", tc.name, err, tc.code)
		}
	}
	if err := cl.DeleteConsumer(ctx, "s", "Bad Name"); status.Code(err) != codes.InvalidArgument {
		t.Errorf("delete with a bad name: %v, want InvalidArgument", err)
	}
	if err := cl.DeleteConsumer(ctx, "nope", "ns/agg"); status.Code(err) != codes.NotFound {
		t.Errorf("delete on an unknown stream: %v, want NotFound", err)
	}
	for _, r := range chains[0] {
		if got := holdsOn(t, r, 0); !reflect.DeepEqual(got, []string{"ns/agg@2", "other@9"}) {
			t.Errorf("%s holds %v of partition 0 after refused calls", r.id, got)
		}
	}

	// Delete releases the consumer on every member of every partition.
	if err := cl.DeleteConsumer(ctx, "s", "ns/agg"); err != nil {
		t.Fatal(err)
	}
	for p, chain := range chains {
		want := []string{}
		if p == 0 {
			want = []string{"other@9"}
		}
		for _, r := range chain {
			if got := holdsOn(t, r, uint32(p)); !reflect.DeepEqual(got, want) {
				t.Errorf("%s holds %v of partition %d after delete, want %v", r.id, got, p, want)
			}
		}
	}
	if err := cl.DeleteConsumer(ctx, "s", "ns/agg"); err != nil {
		t.Fatalf("deleting again: %v", err)
	}
}

func TestConsumerCommitFailsWhenAMemberCannotStoreIt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := startReplica(t, "a")
	b := startReplica(t, "b")
	cfg := &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC}
	// The chain names a member that no replica serves: a hold cannot be
	// stored on every member, so the commit must not answer OK.
	ms := []*catenapb.Member{{Id: "a", Addr: a.addr}, {Id: "gone", Addr: b.addr}}
	if _, err := replicaClient(t, a.addr).Configure(ctx, &catenapb.ConfigureRequest{Stream: "s", Epoch: 1, Members: ms, Config: cfg}); err != nil {
		t.Fatal(err)
	}
	cl := startIngest(t, a)
	err := cl.CommitConsumerOffset(ctx, "s", 0, "agg", 1)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("commit with a member that does not host the partition: %v, want Unavailable", err)
	}
}

func TestMergeConsumers(t *testing.T) {
	m := func(ids ...string) []*catenapb.Member {
		out := make([]*catenapb.Member, len(ids))
		for i, id := range ids {
			out[i] = &catenapb.Member{Id: id}
		}
		return out
	}
	ps := func(part uint32, start, committed uint64, holds map[string]uint64, trims ...*catenapb.ForcedTrim) *catenapb.PartitionStatus {
		st := &catenapb.PartitionStatus{Stream: "s", Partition: part, LogStart: start, Committed: committed, ForcedTrims: trims}
		for c, o := range holds {
			st.Holds = append(st.Holds, &catenapb.ConsumerHold{Consumer: c, Offset: o})
		}
		return st
	}
	sr := &streamRoute{name: "s", partitions: []*partitionRoute{{epoch: 1, members: m("a", "b", "c")}, nil}}
	trim := &catenapb.ForcedTrim{Consumer: "x", HoldOffset: 1, LogStart: 10, TimeMs: 5}
	reports := map[string]*catenapb.StatusResponse{
		"a": {Partitions: []*catenapb.PartitionStatus{ps(0, 10, 20, map[string]uint64{"x": 1, "y": 12}, trim)}},
		"b": {Partitions: []*catenapb.PartitionStatus{ps(0, 8, 21, map[string]uint64{"x": 1, "y": 12})}},
		"c": {Partitions: []*catenapb.PartitionStatus{ps(0, 9, 19, map[string]uint64{"x": 1, "y": 11})}},
		"d": {Partitions: []*catenapb.PartitionStatus{ps(0, 0, 0, map[string]uint64{"z": 0})}}, // not a member
	}
	got := mergeConsumers(sr, reports)
	if len(got.GetPartitions()) != 2 {
		t.Fatalf("partitions %v, want 2", got.GetPartitions())
	}
	p0 := got.GetPartitions()[0]
	var holds []string
	for _, h := range p0.GetHolds() {
		holds = append(holds, fmt.Sprintf("%s@%d", h.GetConsumer(), h.GetOffset()))
	}
	if want := []string{"x@1", "y@11"}; !reflect.DeepEqual(holds, want) {
		t.Errorf("holds %v, want %v (the lowest per consumer, members only)", holds, want)
	}
	if p0.GetLogStart() != 10 || p0.GetCommitted() != 21 {
		t.Errorf("log start %d committed %d, want the highest: 10, 21", p0.GetLogStart(), p0.GetCommitted())
	}
	if len(p0.GetForcedTrims()) != 1 || p0.GetForcedTrims()[0].GetConsumer() != "x" {
		t.Errorf("forced trims %v, want x's", p0.GetForcedTrims())
	}
	if !reflect.DeepEqual(p0.GetDisagreeing(), []string{"c"}) {
		t.Errorf("disagreeing %v, want [c]", p0.GetDisagreeing())
	}
	if p1 := got.GetPartitions()[1]; len(p1.GetHolds()) != 0 || p1.GetPartition() != 1 {
		t.Errorf("partition without a route: %v", p1)
	}
}
