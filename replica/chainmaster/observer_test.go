package chainmaster

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// statusReplica answers Status as id; while hung, its answers wait until
// it is released (a paused process).
type statusReplica struct {
	catenapb.UnimplementedReplicaServer
	id    string
	delay time.Duration // every answer takes this long

	mu      sync.Mutex
	hung    chan struct{} // closed to release; nil: answering
	asked   int
	reports []*catenapb.PartitionStatus
}

func (r *statusReplica) Status(ctx context.Context, _ *catenapb.StatusRequest) (*catenapb.StatusResponse, error) {
	r.mu.Lock()
	r.asked++
	hung, reports, delay := r.hung, r.reports, r.delay
	r.mu.Unlock()
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if hung != nil {
		select {
		case <-hung:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &catenapb.StatusResponse{ReplicaId: r.id, Partitions: reports}, nil
}

func (r *statusReplica) hang() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hung = make(chan struct{})
}

func (r *statusReplica) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hung != nil {
		close(r.hung)
		r.hung = nil
	}
}

func (r *statusReplica) probes() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.asked
}

func serveStatus(t *testing.T, r *statusReplica) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	catenapb.RegisterReplicaServer(g, r)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(func() {
		r.release()
		g.Stop()
	})
	return lis.Addr().String()
}

// waitFor polls cond until it holds or the test's patience ends.
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

func TestObserverProbesEachReplicaOnItsOwn(t *testing.T) {
	a, b, c := &statusReplica{id: "a"}, &statusReplica{id: "b"}, &statusReplica{id: "c"}
	addrs := map[string]string{"a": serveStatus(t, a), "b": serveStatus(t, b), "c": serveStatus(t, c)}
	conns := transport.NewPool(nil)
	defer conns.Close()
	o := NewObserver(conns, ObserverOptions{FailureTimeout: time.Second, Interval: 20 * time.Millisecond})
	defer o.Stop()

	if s := o.Snapshot(); !s.Complete || len(s.Health) != 0 {
		t.Fatalf("an observer without replicas: complete %v, health %v", s.Complete, s.Health)
	}
	o.SetReplicas(addrs)
	waitFor(t, "a complete snapshot", func() bool { return o.Snapshot().Complete })
	s := o.Snapshot()
	for id := range addrs {
		if !s.Answered[id] || s.Health[id] != chainplan.Alive {
			t.Fatalf("%s: answered %v, health %v; want a fresh answer and Alive", id, s.Answered[id], s.Health[id])
		}
	}

	// b hangs: a and c go on being probed meanwhile, b's last answer goes
	// stale (Unknown), then the failure timeout makes it Failed.
	b.hang()
	hungAt := time.Now()
	before := a.probes()
	waitFor(t, "b's answer to go stale", func() bool { return !o.Snapshot().Answered["b"] })
	if time.Since(hungAt) < 20*time.Millisecond {
		t.Fatalf("b was stale %s after it hung, before its fresh window could end", time.Since(hungAt))
	}
	if got := o.Snapshot().Health["b"]; got != chainplan.Unknown && time.Since(hungAt) < time.Second {
		t.Fatalf("b in doubt: health %v, want Unknown before the timeout", got)
	}
	if a.probes() <= before {
		t.Fatalf("a was not probed while b hung")
	}
	waitFor(t, "b to fail", func() bool { return o.Snapshot().Health["b"] == chainplan.Failed })
	// Silence counts from when b's last answer was asked for, up to an
	// interval before it hung.
	if d := time.Since(hungAt); d < time.Second-20*time.Millisecond {
		t.Fatalf("b failed %s after it hung, before the 1s failure timeout", d)
	}
	s = o.Snapshot()
	if !s.Answered["a"] || !s.Answered["c"] || s.Health["a"] != chainplan.Alive {
		t.Fatalf("a and c must stay answered and Alive: %+v", s.Health)
	}
	if s.Reports["b"] == nil {
		t.Fatalf("b's last report must be kept while it is silent")
	}

	// Released, b answers again and is Alive.
	b.release()
	waitFor(t, "b to answer again", func() bool { return o.Snapshot().Health["b"] == chainplan.Alive })

	// Removed replicas are no longer probed.
	o.SetReplicas(map[string]string{"a": addrs["a"], "b": addrs["b"]})
	if _, ok := o.Snapshot().Health["c"]; ok {
		t.Fatalf("c was removed but is still judged")
	}
	time.Sleep(30 * time.Millisecond)
	n := c.probes()
	time.Sleep(100 * time.Millisecond)
	if c.probes() != n {
		t.Fatalf("c was probed %d times after it was removed", c.probes()-n)
	}
}

func TestObserverRefreshShowsWhatHappenedSince(t *testing.T) {
	a := &statusReplica{id: "a"}
	addr := serveStatus(t, a)
	conns := transport.NewPool(nil)
	defer conns.Close()
	// A long interval: only Refresh's poke makes a new probe soon.
	o := NewObserver(conns, ObserverOptions{FailureTimeout: time.Second, Interval: time.Hour})
	defer o.Stop()
	o.SetReplicas(map[string]string{"a": addr})
	waitFor(t, "a complete snapshot", func() bool { return o.Snapshot().Complete })

	a.mu.Lock()
	a.reports = []*catenapb.PartitionStatus{{Stream: "s", Partition: 0, Epoch: 7}}
	a.mu.Unlock()
	acted := time.Now()
	if s := o.Snapshot(); s.After(acted) || len(s.Reports["a"].GetPartitions()) != 0 {
		t.Fatalf("a snapshot from before the change claims to show it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, current := o.Refresh(ctx)
	if !current || !s.After(acted) || s.Reports["a"].GetPartitions()[0].GetEpoch() != 7 {
		t.Fatalf("Refresh returned a snapshot without the change: %v", s.Reports["a"])
	}
}

func TestObserverRefreshReturnsWhenAReplicaHangs(t *testing.T) {
	a := &statusReplica{id: "a"}
	addr := serveStatus(t, a)
	conns := transport.NewPool(nil)
	defer conns.Close()
	o := NewObserver(conns, ObserverOptions{FailureTimeout: time.Second, Interval: 10 * time.Millisecond, CallTimeout: 100 * time.Millisecond})
	defer o.Stop()
	o.SetReplicas(map[string]string{"a": addr})
	waitFor(t, "a complete snapshot", func() bool { return o.Snapshot().Complete })
	a.hang()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	s, current := o.Refresh(ctx)
	if ctx.Err() != nil || !current {
		t.Fatalf("Refresh waited for the caller's deadline instead of the probe's")
	}
	if !s.After(start) {
		t.Fatalf("Refresh returned before a probe asked after it completed")
	}
}

// A replica whose answers take much longer than the freshness window, but
// come steadily, stays answered and Alive: slowness is not silence.
func TestObserverKeepsASlowSteadyReplicaAnswered(t *testing.T) {
	slow := &statusReplica{id: "slow", delay: 250 * time.Millisecond}
	addr := serveStatus(t, slow)
	conns := transport.NewPool(nil)
	defer conns.Close()
	// Fresh would be 2×20 ms + 100 ms = 140 ms without the allowance for
	// the replica's own latency.
	o := NewObserver(conns, ObserverOptions{FailureTimeout: time.Second, Interval: 20 * time.Millisecond})
	defer o.Stop()
	o.SetReplicas(map[string]string{"slow": addr})
	waitFor(t, "a complete snapshot", func() bool { return o.Snapshot().Complete })
	// Let its smoothed latency settle over a few answers.
	waitFor(t, "a few slow answers", func() bool { return slow.probes() >= 4 })
	for range 100 {
		if s := o.Snapshot(); !s.Answered["slow"] || s.Health["slow"] != chainplan.Alive {
			t.Fatalf("a replica answering every 250 ms: answered %v, health %v", s.Answered["slow"], s.Health["slow"])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestObserverIgnoresAnotherReplicaAtTheAddress(t *testing.T) {
	impostor := &statusReplica{id: "other"}
	addr := serveStatus(t, impostor)
	conns := transport.NewPool(nil)
	defer conns.Close()
	o := NewObserver(conns, ObserverOptions{FailureTimeout: time.Second, Interval: 10 * time.Millisecond})
	defer o.Stop()
	o.SetReplicas(map[string]string{"a": addr})
	waitFor(t, "a complete snapshot", func() bool { return o.Snapshot().Complete })
	if s := o.Snapshot(); s.Answered["a"] || s.Reports["a"] != nil {
		t.Fatalf("an answer from replica %q was taken as a's", impostor.id)
	}
}

func TestReplicaNeighbourDownCountsEveryChain(t *testing.T) {
	chain := func(ids ...string) []*catenapb.Member {
		var ms []*catenapb.Member
		for _, id := range ids {
			ms = append(ms, &catenapb.Member{Id: id})
		}
		return ms
	}
	// b follows a in partition 0 and c in partition 1 of s; a reports its
	// link to b down in partition 0 only. b is down for both chains: it is
	// one process.
	resps := map[string]*catenapb.StatusResponse{
		"a": {ReplicaId: "a", Partitions: []*catenapb.PartitionStatus{
			{Stream: "s", Partition: 0, Members: chain("a", "b", "c"), SuccessorDownMs: 800},
			{Stream: "s", Partition: 1, Members: chain("c", "b", "a")},
		}},
		"c": {ReplicaId: "c", Partitions: []*catenapb.PartitionStatus{
			{Stream: "s", Partition: 0, Members: chain("a", "b", "c")},
			{Stream: "s", Partition: 1, Members: chain("c", "b", "a"), SuccessorDownMs: 300},
		}},
	}
	got := ReplicaNeighbourDown(resps)
	if got["b"] != 800*time.Millisecond || len(got) != 1 {
		t.Fatalf("ReplicaNeighbourDown = %v, want b: 800ms only", got)
	}

	// A returning replica still at an old epoch retries its old link to
	// c: no evidence against c, whose chain has moved on.
	resps["d"] = &catenapb.StatusResponse{ReplicaId: "d", Partitions: []*catenapb.PartitionStatus{
		{Stream: "s", Partition: 2, Epoch: 1, Members: chain("d", "c"), SuccessorDownMs: 5000},
	}}
	resps["c"].Partitions = append(resps["c"].Partitions, &catenapb.PartitionStatus{Stream: "s", Partition: 2, Epoch: 2, Members: chain("c")})
	if got := ReplicaNeighbourDown(resps); got["c"] != 0 {
		t.Fatalf("a report from an old epoch counted against c: %v", got)
	}
}
