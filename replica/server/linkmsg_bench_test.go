package server

import (
	"context"
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// echoReplica answers every frame of a replication stream with an ack, and
// does nothing else: what one link message costs in gRPC, apart from what
// a replica does with it.
type echoReplica struct {
	catenapb.UnimplementedReplicaServer
}

func (echoReplica) Replicate(s catenapb.Replica_ReplicateServer) error {
	for {
		f, err := s.Recv()
		if err != nil {
			return nil
		}
		if err := s.Send(&catenapb.ReplicateAck{Epoch: f.GetEpoch(), Body: &catenapb.ReplicateAck_Ack{Ack: f.GetEpoch()}}); err != nil {
			return err
		}
	}
}

// BenchmarkLinkMessages measures the CPU (user and system, the process's
// own: client and server are both in it) that one small message of a
// replication link costs, with 1, 16 and 256 links on one connection each
// sending a commit notice (or a 64 KiB frame, about what an append carries
// at 256 partitions under full load) and waiting for its ack, as a
// partition's link does. It prints µs of CPU per message (each round
// trip is two): the price of the chain protocol's messages, which a link
// shared by many partitions would save (docs/benchmarks.md, 2026-12-06).
func BenchmarkLinkMessages(b *testing.B) {
	for _, tc := range []struct{ links, frameBytes int }{{1, 0}, {16, 0}, {256, 0}, {16, 64 << 10}, {256, 64 << 10}, {16, 1 << 20}} {
		links := tc.links
		var frames [][]byte
		if tc.frameBytes > 0 {
			frames = [][]byte{make([]byte, tc.frameBytes)}
		}
		b.Run(fmt.Sprintf("links=%d/frame=%dKiB", links, tc.frameBytes>>10), func(b *testing.B) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			g := grpc.NewServer(transport.ServerOptions(nil)...)
			catenapb.RegisterReplicaServer(g, echoReplica{})
			go func() { _ = g.Serve(lis) }()
			defer g.Stop()
			conn, err := transport.Dial(lis.Addr().String(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			c := catenapb.NewReplicaClient(conn)
			rounds := max(1, b.N/links)
			var wg sync.WaitGroup
			cpu0, start := processCPU(), time.Now()
			b.ResetTimer()
			for range links {
				wg.Add(1)
				go func() {
					defer wg.Done()
					st, err := c.Replicate(context.Background())
					if err != nil {
						b.Error(err)
						return
					}
					defer func() { _ = st.CloseSend() }()
					for r := range rounds {
						f := &catenapb.ReplicateFrame{Epoch: 1, Stream: "s", Partition: 3, From: "a",
							Body: &catenapb.ReplicateFrame_Commit{Commit: &catenapb.CommitNotice{Committed: uint64(r)}}}
						if frames != nil {
							f.Body = &catenapb.ReplicateFrame_Data{Data: &catenapb.BatchData{Frames: frames, Committed: uint64(r)}}
						}
						if err := st.Send(f); err != nil {
							b.Error(err)
							return
						}
						if _, err := st.Recv(); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			msgs := float64(2 * links * rounds)
			b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/1e3/msgs, "cpu-µs/msg")
			b.ReportMetric(msgs/time.Since(start).Seconds(), "msgs/s")
		})
	}
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
