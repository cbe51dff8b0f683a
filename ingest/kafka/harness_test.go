package kafka

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/grpc"

	"github.com/catena-streams/catena/ingest"
	"github.com/catena-streams/catena/ingest/groups"
	"github.com/catena-streams/catena/replica/server"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// cluster is three in-process replicas holding stream "s" (chains of all
// three, fsync on every member), an ingestion server over them and a Kafka
// listener in front of it, all on loopback.
type cluster struct {
	t        *testing.T
	replicas []string
	ing      *ingest.Server
	kafka    *Server
	addr     string
	// grpcAddr serves Ingest and Groups; groups is the coordinator of both
	// listeners.
	grpcAddr string
	groups   *groups.Coordinator
	members  []*catenapb.Member
	// seeds, when set, are the brokers clients start from instead of addr.
	seeds []string
}

// configure creates stream on every replica with cfg, at epoch 1, tail
// first.
func (c *cluster) configure(stream string, cfg *catenapb.StreamConfig) {
	c.t.Helper()
	for p := range int(cfg.GetPartitions()) {
		for i := len(c.members) - 1; i >= 0; i-- {
			conn, err := transport.Dial(c.members[i].GetAddr(), nil)
			if err != nil {
				c.t.Fatal(err)
			}
			_, err = catenapb.NewReplicaClient(conn).Configure(context.Background(), &catenapb.ConfigureRequest{Stream: stream, Partition: uint32(p), Epoch: 1, Members: c.members, Config: cfg})
			conn.Close()
			if err != nil {
				c.t.Fatal(err)
			}
		}
	}
}

func startCluster(t *testing.T, partitions int, tweak ...func(*Options)) *cluster {
	t.Helper()
	return startClusterWith(t, partitions, clusterOptions{}, tweak...)
}

// clusterOptions change the processes startClusterWith starts.
type clusterOptions struct {
	// replica is applied to each replica's options, ingest to
	// ingestion's.
	replica func(*server.Options)
	ingest  func(*ingest.Options)
}

// startClusterWith is startCluster with co applied.
func startClusterWith(t *testing.T, partitions int, co clusterOptions, tweak ...func(*Options)) *cluster {
	t.Helper()
	var members []*catenapb.Member
	for _, id := range []string{"a", "b", "c"} {
		ro := server.Options{ID: id, DataDir: t.TempDir(), Logger: logr.Discard(), Fatal: func(err error) { t.Errorf("replica %s stopped: %v", id, err) }}
		if co.replica != nil {
			co.replica(&ro)
		}
		srv, err := server.New(ro)
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
		members = append(members, &catenapb.Member{Id: id, Addr: lis.Addr().String()})
	}
	c := &cluster{t: t, members: members}
	// "s" is the stream the tests use; groups.DefaultOffsetsStream holds
	// the groups' committed offsets (no StreamAdmin here to create it).
	c.configure("s", &catenapb.StreamConfig{Partitions: uint32(partitions), Durability: catenapb.Durability_DURABILITY_FSYNC})
	c.configure(groups.DefaultOffsetsStream, &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC})
	for _, m := range members {
		c.replicas = append(c.replicas, m.GetAddr())
	}
	io := ingest.Options{Replicas: c.replicas, Logger: logr.Discard()}
	if co.ingest != nil {
		co.ingest(&io)
	}
	var err error
	if c.ing, err = ingest.New(io); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.ing.Close)
	// Serve once ingestion has discovered the streams: a request before
	// would be answered UNKNOWN_TOPIC_OR_PARTITION (clients retry it; the
	// tests' raw requests do not).
	for _, stream := range []string{"s", groups.DefaultOffsetsStream} {
		waitFor(t, 30*time.Second, "ingestion to discover stream "+stream, func() bool {
			_, err := c.ing.Stream(context.Background(), stream)
			return err == nil
		})
	}
	// One coordinator for the Kafka listener and the Groups gRPC service,
	// as catena ingest has.
	c.groups = groups.New(groups.Options{Offsets: &groups.StreamOffsets{Ingest: c.ing}, Logger: testr.New(t).WithName("groups")})
	runCoordinator(t, c.groups)
	gs := grpc.NewServer(transport.ServerOptions(nil)...)
	c.ing.Register(gs)
	(&groups.Service{Coordinator: c.groups, Ingest: c.ing}).Register(gs)
	glis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(glis) }()
	t.Cleanup(gs.Stop)
	c.grpcAddr = glis.Addr().String()
	opts := Options{Ingest: c.ing, Logger: testr.New(t), Groups: c.groups}
	for _, f := range tweak {
		f(&opts)
	}
	if c.kafka, err = New(opts); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.kafka.Serve(lis) }()
	t.Cleanup(c.kafka.Close)
	c.addr = lis.Addr().String()
	return c
}

// runCoordinator runs coord until the test ends, as catena ingest does.
func runCoordinator(t *testing.T, coord *groups.Coordinator) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		coord.Run(ctx, groups.TickInterval)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// client is a franz-go client of the listener.
func (c *cluster) client(opts ...kgo.Opt) *kgo.Client {
	c.t.Helper()
	seeds := c.seeds
	if len(seeds) == 0 {
		seeds = []string{c.addr}
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.RetryTimeout(20 * time.Second)}, opts...)...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(cl.Close)
	return cl
}

// committed is partition p's committed offset as ingestion lists it.
func (c *cluster) committed(p uint32) uint64 {
	c.t.Helper()
	resp, err := c.ing.ListOffsets(context.Background(), &catenapb.ListOffsetsRequest{Stream: "s", Partition: p, Spec: catenapb.OffsetSpec_OFFSET_SPEC_LATEST})
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.GetOffset()
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitCommitted waits until partition p's committed offset, as ingestion
// lists it, is want: members learn of a commit as (not before) its
// producer is answered. It fails on any other value after 10 s.
func (c *cluster) waitCommitted(p uint32, want uint64) {
	c.t.Helper()
	got := c.committed(p)
	for deadline := time.Now().Add(10 * time.Second); got != want && time.Now().Before(deadline); got = c.committed(p) {
		time.Sleep(10 * time.Millisecond)
	}
	if got != want {
		c.t.Fatalf("partition %d holds %d records, want %d", p, got, want)
	}
}
