package chainmaster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/probe"
	"github.com/catena-streams/catena/rpc/transport"
)

// Observer watches a set of replicas for a chain master, the operator's
// and catena dev's alike. Each replica has its own prober, which asks for
// its Status (every stream, every partition) every Interval on a deadline
// of its own, so a paused or cut-off replica holds up nobody's probes; the
// failure detector (Detector) turns the probes into each replica's health.
// Masters read a Snapshot whenever they decide, instead of probing while
// they decide: the cost of a pool's observation is one call per replica per
// interval however many chains it holds, and deciding never waits on a
// replica.
type Observer struct {
	probes *probe.Set[*catenapb.StatusResponse]
	opts   ObserverOptions
	now    func() time.Time

	mu       sync.Mutex
	detector *Detector
	// ndKey names the fresh answers nd was computed from: masters take a
	// snapshot in every decision, and reading every partition of every
	// answer again when no answer changed cost the operator half of its
	// CPU in a failover of hundreds of chains.
	ndKey string
	nd    map[string]time.Duration
}

// neighbourDown is ReplicaNeighbourDown of s's fresh answers, computed
// again only when they changed; o.mu is held. The map is shared by the
// snapshots taken from the same answers: it is read-only.
func (o *Observer) neighbourDown(s Snapshot) map[string]time.Duration {
	ids := make([]string, 0, len(s.Answered))
	for id := range s.Answered {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "%s@%d;", id, s.askedOK[id].UnixNano())
	}
	if key := b.String(); key != o.ndKey || o.nd == nil {
		o.ndKey, o.nd = key, ReplicaNeighbourDown(s.AnsweredReports())
	}
	return o.nd
}

// ObserverOptions configure an Observer.
type ObserverOptions struct {
	// FailureTimeout is the detector's (see Detector).
	FailureTimeout time.Duration
	// Interval is the time between the starts of two probes of one replica
	// (a probe that takes longer is followed at once by the next).
	Interval time.Duration
	// CallTimeout bounds each probe (0: FailureTimeout): an answer that
	// takes long still proves the replica alive.
	CallTimeout time.Duration
	// Fresh is how long after it arrived an answer counts as the
	// replica's current one (0: two intervals and 100 ms), plus twice the
	// time the replica's answers take (smoothed): a replica that answers
	// slowly but steadily stays answered. A replica
	// without a fresh answer is in doubt: Unknown until the detector's
	// timeout or its neighbours' evidence makes it Failed.
	Fresh time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Defaults of ObserverOptions left zero.
const (
	defaultObserverFailureTimeout = 3 * time.Second
	defaultObserverInterval       = 100 * time.Millisecond
)

// NewObserver returns an observer without replicas; SetReplicas gives it
// some.
func NewObserver(conns *transport.Pool, opts ObserverOptions) *Observer {
	if opts.FailureTimeout <= 0 {
		opts.FailureTimeout = defaultObserverFailureTimeout
	}
	if opts.Interval <= 0 {
		opts.Interval = defaultObserverInterval
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = opts.FailureTimeout
	}
	if opts.Fresh <= 0 {
		opts.Fresh = 2*opts.Interval + 100*time.Millisecond
	}
	o := &Observer{opts: opts, now: opts.Now, detector: NewDetector(opts.FailureTimeout)}
	if o.now == nil {
		o.now = time.Now
	}
	o.probes = probe.NewSet(conns, askStatus, probe.Options{Interval: opts.Interval, CallTimeout: opts.CallTimeout, Now: o.now})
	return o
}

// Options are the observer's options, defaults filled in.
func (o *Observer) Options() ObserverOptions { return o.opts }

// SetReplicas makes the observer probe exactly addrs (replica id to
// address): probes start for new replicas or new addresses, and stop for
// replicas no longer listed (the detector forgets nothing: a replica that
// comes back is judged on its history).
func (o *Observer) SetReplicas(addrs map[string]string) { o.probes.SetTargets(addrs) }

// AddReplicas makes the observer probe addrs too, keeping the others.
func (o *Observer) AddReplicas(addrs map[string]string) { o.probes.AddTargets(addrs) }

// Replicas is the set of replicas probed, with their addresses.
func (o *Observer) Replicas() map[string]string { return o.probes.Targets() }

// Stop ends every probe; the observer probes nothing afterwards.
func (o *Observer) Stop() { o.probes.Stop() }

// Started and Exited tell the detector of a process start or exit the
// master saw (catena dev runs the processes; the operator does not know).
func (o *Observer) Started(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.detector.Started(id, o.now())
}

// Exited: see Started.
func (o *Observer) Exited(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.detector.Exited(id)
}

// Poke has every replica probed now, not at its next interval: a master
// that just acted wants to see the outcome.
func (o *Observer) Poke() { o.probes.Poke() }

// askStatus makes one Status probe. NotFound is an answer (the replica
// hosts nothing); an answer from another replica than the one asked for
// (its address reused by another process) is none.
func askStatus(ctx context.Context, conn *grpc.ClientConn, id string) (*catenapb.StatusResponse, error) {
	resp, err := catenapb.NewReplicaClient(conn).Status(ctx, &catenapb.StatusRequest{})
	if status.Code(err) == codes.NotFound {
		return &catenapb.StatusResponse{ReplicaId: id}, nil
	}
	if err != nil {
		return nil, err
	}
	if resp.GetReplicaId() != id {
		return nil, status.Errorf(codes.FailedPrecondition, "%s answered as %q", id, resp.GetReplicaId())
	}
	return resp, nil
}

// Snapshot is what a master knows of its replicas at one moment.
type Snapshot struct {
	// At is when it was taken.
	At time.Time
	// Reports are the latest answer of each replica, possibly old (see
	// Answered).
	Reports map[string]*catenapb.StatusResponse
	// Answered are the replicas whose latest answer is fresh: their
	// latest completed probe answered, less than the freshness window ago.
	Answered map[string]bool
	// Health is the detector's verdict on every replica probed.
	Health map[string]chainplan.Health
	// NeighbourDown is, for each replica, the longest a neighbour that
	// answered reports it cannot reach it, in any chain (a replica is one
	// process: it fails for all its chains at once). Read-only: snapshots
	// of the same answers share it.
	NeighbourDown map[string]time.Duration
	// SilentFor is how long each replica has not answered, as the
	// detector counts it.
	SilentFor map[string]time.Duration
	// Complete: every replica has been probed at least once since it was
	// added (answered or not). A master decides nothing from an
	// incomplete snapshot: a replica not asked yet is not one that has
	// nothing.
	Complete bool
	// askedOK is when each replica's latest answer was asked for.
	askedOK map[string]time.Time
}

// After reports whether the snapshot shows the outcome of what a master
// did before t: every replica that answers answered a probe asked for at t
// or later. Replicas in doubt (no fresh answer) are not waited for.
func (s Snapshot) After(t time.Time) bool {
	for id := range s.Answered {
		if s.askedOK[id].Before(t) {
			return false
		}
	}
	return true
}

// AnsweredReports are the fresh answers only.
func (s Snapshot) AnsweredReports() map[string]*catenapb.StatusResponse {
	out := make(map[string]*catenapb.StatusResponse, len(s.Answered))
	for id := range s.Answered {
		out[id] = s.Reports[id]
	}
	return out
}

// Snapshot records a detector round at now from the probes' latest
// outcomes and returns what the master knows.
func (o *Observer) Snapshot() Snapshot {
	results := o.probes.Results()
	stopped := o.probes.Stopped()
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	s := Snapshot{
		At: now, Reports: map[string]*catenapb.StatusResponse{}, Answered: map[string]bool{},
		Health: map[string]chainplan.Health{}, SilentFor: map[string]time.Duration{},
		askedOK: map[string]time.Time{}, Complete: true,
	}
	ids := make([]string, 0, len(results))
	heard := map[string]time.Time{}
	for id, r := range results {
		ids = append(ids, id)
		if !r.Probed() {
			s.Complete = false
		}
		if !r.Answered {
			continue
		}
		s.Reports[id] = r.Resp
		s.askedOK[id] = r.AskedOK
		// Every answer proves the replica alive when it was asked, fresh
		// or not: the detector learns of it even when no snapshot was
		// taken while it was fresh.
		o.detector.Heard(id, r.AskedOK)
		if r.Fresh(now, o.opts.Fresh) {
			s.Answered[id] = true
			heard[id] = r.AskedOK
		}
	}
	if stopped {
		s.Complete = false // it sees nothing any more
	}
	o.detector.Round(now, ids, heard)
	s.NeighbourDown = o.neighbourDown(s)
	for _, id := range ids {
		s.Health[id] = o.detector.Health(id, now, s.NeighbourDown[id])
		s.SilentFor[id] = o.detector.SilentFor(id, now)
	}
	return s
}

// Refresh has every replica probed now and waits until the snapshot shows
// what happened before the call (Snapshot.After), or ctx ends, or the
// observer stops; it returns the snapshot then, and whether it shows that. A replica that stops
// answering holds it up for at most the freshness window.
func (o *Observer) Refresh(ctx context.Context) (Snapshot, bool) {
	from := o.now()
	o.Poke()
	for {
		s := o.Snapshot()
		if s.After(from) {
			return s, true
		}
		if o.probes.Stopped() || ctx.Err() != nil {
			return s, false
		}
		select {
		case <-ctx.Done():
		case <-time.After(refreshPoll):
		}
	}
}

// refreshPoll is how often Refresh looks again: answers arrive in
// milliseconds on a healthy pool.
const refreshPoll = 2 * time.Millisecond

// ReplicaNeighbourDown is NeighbourDown over every partition of every
// stream the answers hold: for each replica, the longest any neighbour in
// any of its chains reports it cannot reach it.
func ReplicaNeighbourDown(resps map[string]*catenapb.StatusResponse) map[string]time.Duration {
	byPart := IndexReports(resps)
	out := map[string]time.Duration{}
	for _, reports := range byPart {
		// Only the partition's latest epoch witnesses: a returning
		// replica still at an old epoch retries its old links and says
		// nothing of the chain as it is.
		latest := LatestReport(reports).GetEpoch()
		current := map[string]*catenapb.PartitionStatus{}
		for id, ps := range reports {
			if ps.GetEpoch() == latest {
				current[id] = ps
			}
		}
		for id, d := range NeighbourDown(current) {
			out[id] = max(out[id], d)
		}
	}
	return out
}

// PartitionKey names one partition of one stream.
type PartitionKey struct {
	Stream    string
	Partition uint32
}

// IndexReports arranges Status answers by partition, then replica.
func IndexReports(resps map[string]*catenapb.StatusResponse) map[PartitionKey]map[string]*catenapb.PartitionStatus {
	out := map[PartitionKey]map[string]*catenapb.PartitionStatus{}
	for id, resp := range resps {
		for _, ps := range resp.GetPartitions() {
			k := PartitionKey{ps.GetStream(), ps.GetPartition()}
			if out[k] == nil {
				out[k] = map[string]*catenapb.PartitionStatus{}
			}
			out[k][id] = ps
		}
	}
	return out
}
