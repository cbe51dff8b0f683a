package controllers

import (
	"context"
	"fmt"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// Epoch ranges.
//
// A chain's new membership is installed under a new epoch, and two masters
// must never install two memberships under the same epoch: the members of
// one chain would run two chains that each believe they are the one. The
// operator used to guarantee it by writing every new epoch to the
// ReplicationChain (with optimistic locking) before installing it. That is
// one API write per chain on the path of a failover, and with hundreds of
// chains on a pool the API server's time per write was what bounded the
// repair (docs/benchmarks.md, "The operator at scale").
//
// Instead each operator draws epochs from ranges it reserves in the pool's
// status (status.epochsReserved, with optimistic locking): one write per
// rangeSize reconfigurations of the pool's chains, none per chain. Ranges of
// two operators never overlap, and each range starts above the epochs it is
// drawn for, so an epoch drawn is unique to one decision; a later decision
// of a chain always has a higher epoch (a chain's plans are made one at a
// time, each above every epoch its members report, and a new operator's
// range lies above its predecessor's). The chain's record is written right
// after the install; an operator that dies in between leaves members running
// an epoch newer than the record, which the next one adopts as the chain
// (chainmaster.Current).

// epochRangeSize is how many epochs one reservation covers.
const epochRangeSize = 1024

// epochRanges hands out the epochs the chain controller installs new
// memberships under, per pool.
type epochRanges struct {
	client client.Client
	// reader reads a pool past the cache after a conflict.
	reader client.Reader
	size   uint64

	mu sync.Mutex
	// pools by UID: a pool deleted and created again under its name starts
	// from zero, and so does its range.
	pools map[types.UID]*epochRange
}

// epochRange is one operator's unused part of a pool's reserved range:
// next..last (none when next > last).
type epochRange struct {
	mu         sync.Mutex
	next, last uint64
}

// take draws the first epoch of the range that is at least min.
func (r *epochRange) take(min uint64) (uint64, bool) {
	e := max(r.next, min)
	if r.next == 0 || e > r.last {
		return 0, false
	}
	r.next = e + 1
	return e, true
}

// reservation is the range to reserve after reserved (the pool's
// status.epochsReserved) for a plan that needs an epoch of at least min.
func reservation(reserved, min, size uint64) (lo, hi uint64) {
	lo = max(reserved+1, min, 1)
	return lo, lo + max(size, 1) - 1
}

func newEpochRanges(c client.Client, reader client.Reader) *epochRanges {
	return &epochRanges{client: c, reader: reader, size: epochRangeSize, pools: map[types.UID]*epochRange{}}
}

// draw returns an epoch of at least min for a new membership of a chain on
// pool, reserving a new range first when this operator's is used up. The
// chains of one pool wait for one reservation; other pools do not.
func (e *epochRanges) draw(ctx context.Context, pool *streamsv1alpha1.ReplicaPool, min uint64) (uint64, error) {
	e.mu.Lock()
	rng := e.pools[pool.UID]
	if rng == nil {
		rng = &epochRange{}
		e.pools[pool.UID] = rng
	}
	e.mu.Unlock()

	rng.mu.Lock()
	defer rng.mu.Unlock()
	if epoch, ok := rng.take(min); ok {
		return epoch, nil
	}
	p := pool.DeepCopy()
	const attempts = 5
	for attempt := 1; ; attempt++ {
		before := p.DeepCopy()
		lo, hi := reservation(uint64(max(p.Status.EpochsReserved, 0)), min, e.size)
		p.Status.EpochsReserved = int64(hi)
		err := e.client.Status().Patch(ctx, p, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
		if err == nil {
			rng.next, rng.last = lo+1, hi
			return lo, nil
		}
		if !apierrors.IsConflict(err) || attempt == attempts {
			return 0, fmt.Errorf("failed to reserve chain epochs on pool %s: %w", pool.Name, err)
		}
		// Another operator reserved a range meanwhile, or the cache is
		// behind: read the pool as it is and reserve above it.
		p = &streamsv1alpha1.ReplicaPool{}
		if err := e.reader.Get(ctx, client.ObjectKeyFromObject(pool), p); err != nil {
			return 0, fmt.Errorf("failed to read pool %s to reserve chain epochs: %w", pool.Name, err)
		}
		if p.UID != pool.UID {
			return 0, fmt.Errorf("failed to reserve chain epochs on pool %s: it was replaced", pool.Name)
		}
	}
}
