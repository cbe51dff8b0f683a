package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
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
	// its Status, and how often the observer looks for chains to wake.
	observeInterval = 100 * time.Millisecond
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
	// Wake receives a chain whose view changed.
	Wake chan event.GenericEvent

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
	digests map[string]string
}

func newPoolObservers(c client.Client, conns *transport.Pool, addr ReplicaAddrFunc, timeout time.Duration, now func() time.Time) *poolObservers {
	return &poolObservers{
		Client: c, Conns: conns, ReplicaAddr: addr, FailureTimeout: timeout, Now: now,
		Wake: make(chan event.GenericEvent, 1024), pools: map[types.NamespacedName]*observedPool{},
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
			digests: map[string]string{},
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
	t := time.NewTicker(observeInterval)
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
			d := chainDigest(snap.Health, idx[chainmaster.PartitionKey{Stream: c.Spec.Stream, Partition: uint32(*c.Spec.Partition)}])
			if op.digests[c.Name] == d {
				continue
			}
			op.digests[c.Name] = d
			wake := &streamsv1alpha1.ReplicationChain{}
			wake.Namespace, wake.Name = c.Namespace, c.Name
			select {
			case p.Wake <- event.GenericEvent{Object: wake}:
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
// the health of every replica of the pool, and each member's report of the
// chain (epoch, membership, role, errors and link reports). A change wakes
// the chain's reconcile; offsets alone do not (the chain's resync records
// them), or every write would wake every chain.
func chainDigest(health map[string]chainplan.Health, reports map[string]*catenapb.PartitionStatus) string {
	var b strings.Builder
	ids := make([]string, 0, len(health))
	for id := range health {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		fmt.Fprintf(&b, "%s=%d;", id, health[id])
	}
	ids = ids[:0]
	for id := range reports {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		ps := reports[id]
		fmt.Fprintf(&b, "|%s e%d r%d l%d", id, ps.GetEpoch(), ps.GetRole(), ps.GetLastLogEpoch())
		for _, m := range ps.GetMembers() {
			fmt.Fprintf(&b, " %s", m.GetId())
		}
		fmt.Fprintf(&b, " d%t s%t h%t x%t err=%q", ps.GetSuccessorDownMs() > 0, ps.GetSuccessorStalledMs() > 0,
			ps.GetHeadUnreachableMs() > 0, ps.GetRestored(), ps.GetError())
	}
	return b.String()
}
