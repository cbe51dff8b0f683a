package probe

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/catena-streams/catena/rpc/transport"
)

// countingAsk answers every probe at once and counts them.
func countingAsk(n *atomic.Int64) Ask[int64] {
	return func(context.Context, *grpc.ClientConn, string) (int64, error) {
		return n.Add(1), nil
	}
}

// waitFor polls cond until it holds or a deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSetIntervalReachesAProberWaitingOutTheOldOne(t *testing.T) {
	conns := transport.NewPool(nil)
	defer conns.Close()
	var asked atomic.Int64
	// An hour between probes: without the change of interval, the first
	// probe would be the only one this test ever sees.
	s := NewSet(conns, countingAsk(&asked), Options{Interval: time.Hour, CallTimeout: time.Second})
	defer s.Stop()
	s.SetTargets(map[string]string{"r-0": "127.0.0.1:1"})
	waitFor(t, "the first probe", func() bool { return s.Results()["r-0"].Probed() })
	first := asked.Load()

	s.SetInterval(5 * time.Millisecond)
	if got := s.Interval(); got != 5*time.Millisecond {
		t.Fatalf("Interval() = %v after SetInterval(5ms)", got)
	}
	waitFor(t, "probes on the new interval", func() bool { return asked.Load() >= first+3 })
}
