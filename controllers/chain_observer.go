package controllers

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/replica/chainmaster"
	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// Timing of the pools' observation.
const (
	// observeInterval is how often each replica of a pool is asked for
	// its Status.
	observeInterval = 100 * time.Millisecond
	// wakeInterval is how often the observer looks for chains to wake: a
	// replica judged failed wakes its chains at most this long after. A
	// look is cheap (the chains come from the cache, their digests are
	// hashes), cheaper than a probe.
	wakeInterval = 50 * time.Millisecond
)

// poolObservers keeps one chainmaster.Observer per ReplicaPool, the same
// observer catena dev runs: each replica of the pool is probed on its own
// cadence and deadline, outside any reconcile, and the chain reconciles
// decide from the latest snapshot without calling a replica to look. A
// manager Runnable (elected with the controllers) keeps the set of pools
// and of their replicas current, and wakes the chains whose view changed:
// a member's health, or what the members report of their chain (epoch,
// membership, role, link reports), not mere offsets, which the chains'
// periodic resync records.
type poolObservers struct {
	Client      client.Client
	Conns       *transport.Pool
	ReplicaAddr ReplicaAddrFunc
	// FailureTimeout is the detector's.
	FailureTimeout time.Duration
	// Wake receives a chain whose view changed; Urgent one whose
	// membership holds a failed replica, HeadFailed one whose head
	// failed. A removal is what writes wait for, so it is reconciled
	// before the rest (confirmations, growth, resyncs): when a replica
	// under hundreds of chains goes dark, the last of them is reordered
	// sooner. Heads go first: a chain whose middle or tail is removed
	// completes its producers' writes as soon as the predecessor links
	// to its new successor, while one whose head is removed makes them
	// wait further, for ingestion to learn the new head and send again.
	Wake, Urgent, HeadFailed chan event.GenericEvent

	// Now is the clock of the observers (nil: time.Now); the chain
	// reconciles stamp their actions with it too.
	Now func() time.Time

	mu     sync.Mutex
	pools  map[types.NamespacedName]*observedPool
	closed bool // Start returned: observers made now are stopped at once
}

// observedPool is one pool's observer and the view each of its chains was
// last woken for.
type observedPool struct {
	obs     *chainmaster.Observer
	digests map[string]uint64
}

func newPoolObservers(c client.Client, conns *transport.Pool, addr ReplicaAddrFunc, timeout time.Duration, now func() time.Time) *poolObservers {
	return &poolObservers{
		Client: c, Conns: conns, ReplicaAddr: addr, FailureTimeout: timeout, Now: now,
		Wake: make(chan event.GenericEvent, 1024), Urgent: make(chan event.GenericEvent, 1024), HeadFailed: make(chan event.GenericEvent, 1024),
		pools: map[types.NamespacedName]*observedPool{},
	}
}

// observer returns the pool's observer, started on demand, probing at
// least addrs (the loop narrows the set to the pool's pods and its chains'
// members).
func (p *poolObservers) observer(pool types.NamespacedName, addrs map[string]string) *chainmaster.Observer {
	p.mu.Lock()
	op := p.pools[pool]
	if op == nil {
		op = &observedPool{
			obs: chainmaster.NewObserver(p.Conns, chainmaster.ObserverOptions{
				FailureTimeout: p.FailureTimeout, Interval: observeInterval, Now: p.Now,
			}),
			digests: map[string]uint64{},
		}
		if p.closed {
			// A reconcile finishing after shutdown: it sees an observer
			// that sees nothing (Snapshot.Complete is false).
			op.obs.Stop()
			p.mu.Unlock()
			return op.obs
		}
		p.pools[pool] = op
	}
	p.mu.Unlock()
	op.obs.AddReplicas(addrs)
	return op.obs
}

// Start runs the loop until ctx ends, then stops every probe.
func (p *poolObservers) Start(ctx context.Context) error {
	t := time.NewTicker(wakeInterval)
	defer t.Stop()
	defer func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.closed = true
		for k, op := range p.pools {
			op.obs.Stop()
			delete(p.pools, k)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := p.round(ctx); err != nil {
			log.FromContext(ctx).Error(err, "Observing the replica pools failed; trying again")
		}
	}
}

// round updates every pool's replica set and wakes the chains whose view
// changed.
func (p *poolObservers) round(ctx context.Context) error {
	var pools streamsv1alpha1.ReplicaPoolList
	if err := p.Client.List(ctx, &pools, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("failed to list ReplicaPools: %w", err)
	}
	seen := map[types.NamespacedName]bool{}
	for i := range pools.Items {
		pool := &pools.Items[i]
		key := client.ObjectKeyFromObject(pool)
		seen[key] = true
		var chains streamsv1alpha1.ReplicationChainList
		if err := p.Client.List(ctx, &chains, client.InNamespace(pool.Namespace), client.MatchingFields{chainPoolIndex: pool.Name}, client.UnsafeDisableDeepCopy); err != nil {
			return fmt.Errorf("failed to list the ReplicationChains of pool %s: %w", key, err)
		}
		members := make([][]streamsv1alpha1.ChainMember, 0, len(chains.Items))
		for _, c := range chains.Items {
			members = append(members, c.Status.Members)
		}
		addrs := poolReplicaAddrs(pool, p.ReplicaAddr, members...)
		obs := p.observer(key, addrs)
		obs.SetReplicas(addrs)
		snap := obs.Snapshot()
		if !snap.Complete {
			continue
		}
		idx := chainmaster.IndexReports(snap.AnsweredReports())
		p.mu.Lock()
		op := p.pools[key]
		p.mu.Unlock()
		live := map[string]bool{}
		for i := range chains.Items {
			c := &chains.Items[i]
			live[c.Name] = true
			if c.Spec.Partition == nil {
				continue
			}
			reports := idx[chainmaster.PartitionKey{Stream: c.Spec.Stream, Partition: uint32(*c.Spec.Partition)}]
			d := chainDigest(snap.Health, reports, c)
			if op.digests[c.Name] == d {
				continue
			}
			op.digests[c.Name] = d
			wake := &streamsv1alpha1.ReplicationChain{}
			wake.Namespace, wake.Name = c.Namespace, c.Name
			to := p.Wake
			switch failed, head := failedMember(snap.Health, reports, c); {
			case head:
				to = p.HeadFailed
			case failed:
				to = p.Urgent
			}
			select {
			case to <- event.GenericEvent{Object: wake}:
			case <-ctx.Done():
				return nil
			}
		}
		for name := range op.digests {
			if !live[name] {
				delete(op.digests, name)
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, op := range p.pools {
		if !seen[key] {
			op.obs.Stop()
			delete(p.pools, key)
		}
	}
	return nil
}

// chainDigest sums up what a chain's master decides from, except offsets:
// the health of the replicas that matter to the chain, and each member's
// report of the chain (epoch, membership, role, errors and link reports,
// whether it lacks what the chain committed: when a member has caught up).
// A change wakes the chain's reconcile; offsets alone do not (the chain's
// resync records them), or every write would wake every chain, and neither
// does the health of a replica the chain has no use for, or a replica
// going dark would wake every chain of its pool, not only its own.
//
// The replicas that matter are the chain's members (as the chain records
// them and as their reports name them) and the replicas holding a copy;
// every replica of the pool when the chain is short of its replication
// factor (its master picks a spare from them) or not placed yet.
//
// It is a sum of one hash per fact, so that no map needs sorting: the
// observer computes it for every chain of a pool every round.
func chainDigest(health map[string]chainplan.Health, reports map[string]*catenapb.PartitionStatus, chain *streamsv1alpha1.ReplicationChain) uint64 {
	var h maphash.Hash
	h.SetSeed(digestSeed)
	var sum uint64
	healthOf := func(id string) {
		hv, ok := health[id]
		if !ok {
			hv = chainplan.Unknown
		}
		h.Reset()
		h.WriteByte('h')
		h.WriteString(id)
		h.WriteByte(0)
		digestUint(&h, uint64(hv))
		sum += h.Sum64()
	}
	if len(chain.Status.Members) < int(chain.Spec.ReplicationFactor) {
		for id := range health {
			healthOf(id)
		}
	}
	for _, m := range chain.Status.Members {
		healthOf(m.Name)
	}
	var committed uint64
	for _, ps := range reports {
		committed = max(committed, ps.GetCommitted())
	}
	for id, ps := range reports {
		healthOf(id)
		h.Reset()
		h.WriteByte('r')
		h.WriteString(id)
		h.WriteByte(0)
		digestUint(&h, ps.GetEpoch())
		digestUint(&h, uint64(ps.GetRole()))
		digestUint(&h, ps.GetLastLogEpoch())
		for _, m := range ps.GetMembers() {
			h.WriteString(m.GetId())
			h.WriteByte(0)
		}
		var flags uint64
		for i, set := range []bool{ps.GetSuccessorDownMs() > 0, ps.GetSuccessorStalledMs() > 0, ps.GetHeadUnreachableMs() > 0, ps.GetRestored(),
			ps.GetDurable() < ps.GetCommittedNotice(), ps.GetDurable() < committed} {
			if set {
				flags |= 1 << i
			}
		}
		digestUint(&h, flags)
		h.WriteString(ps.GetError())
		sum += h.Sum64()
		for _, m := range ps.GetMembers() {
			healthOf(m.GetId())
		}
	}
	return sum
}

// digestSeed seeds the chain digests: they are compared within one process
// only.
var digestSeed = maphash.MakeSeed()

func digestUint(h *maphash.Hash, v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	h.Write(b[:])
}

// failedMember reports whether a member of the chain as it runs is judged
// failed (the chain waits for its removal: writes are stalled on that
// member), and whether its head is. The chain as it runs is the newest of
// the record and what the members report (chainmaster.Current), the one
// the chain's master plans from: a chain whose removal is recorded is no
// longer urgent, even before the cache shows the record.
func failedMember(health map[string]chainplan.Health, reports map[string]*catenapb.PartitionStatus, chain *streamsv1alpha1.ReplicationChain) (failed, head bool) {
	cur, ok := chainmaster.Current(chainRecord(chain), reports)
	if !ok {
		return false, false
	}
	for _, m := range cur.Members {
		if health[m] == chainplan.Failed {
			failed = true
		}
	}
	return failed, failed && health[cur.Members[0]] == chainplan.Failed
}
