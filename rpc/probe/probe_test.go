package probe

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/catena-streams/catena/rpc/transport"
)

func TestSetIntervalReachesAProberWaitingOutTheOldOne(t *testing.T) {
	conns := transport.NewPool(nil)
	defer conns.Close()
	probed := make(chan struct{}, 64)
	// An hour between probes: without the change of interval, the first
	// probe would be the only one this test ever sees.
	s := NewSet(conns, func(context.Context, *grpc.ClientConn, string) (int, error) { return 1, nil }, Options{
		Interval: time.Hour, CallTimeout: time.Second,
		Probed: func(string) { probed <- struct{}{} },
	})
	defer s.Stop()
	s.SetTargets(map[string]string{"r-0": "127.0.0.1:1"})
	waitProbes(t, probed, 1, "the first probe")

	s.SetInterval(5 * time.Millisecond)
	if got := s.Interval(); got != 5*time.Millisecond {
		t.Fatalf("Interval() = %v after SetInterval(5ms)", got)
	}
	waitProbes(t, probed, 3, "probes on the new interval")
}

// waitProbes waits for n probes, failing after a deadline.
func waitProbes(t *testing.T, probed <-chan struct{}, n int, what string) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for range n {
		select {
		case <-probed:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
