package chainmaster

import (
	"context"
	"sync"
	"time"
)

// JoinCheck is a master's Executor.CheckJoins with a memory of the pairs
// that failed: a pair that failed within RecheckAfter fails again at
// once, without a call. A replica that returns under hundreds of chains
// is the joiner of each of them, behind one or two tails: without it,
// each chain's reconcile would wait up to ReachTimeout for the same
// answer, holding up the master's workers while other chains have
// failures to handle. The zero value is ready to use; it is safe for
// concurrent use.
type JoinCheck struct {
	mu     sync.Mutex
	failed map[joinPair]failedReach
}

type joinPair struct{ pred, member string }

type failedReach struct {
	at  time.Time
	err error
}

// RecheckAfter is how long a pair that failed is not asked again.
const RecheckAfter = time.Second

// Check is e.CheckJoins(ctx, r), answered from memory for a pair that
// failed within RecheckAfter. asked says whether it called a replica
// (an error then is news, worth logging; one from memory is not).
func (c *JoinCheck) Check(ctx context.Context, e Executor, r *Repair) (asked bool, err error) {
	now := time.Now()
	c.mu.Lock()
	for _, j := range r.Joins {
		if f, ok := c.failed[joinPair{j.PredAddr, j.MemberAddr}]; ok && now.Sub(f.at) < RecheckAfter {
			c.mu.Unlock()
			return false, f.err
		}
	}
	c.mu.Unlock()
	for _, j := range r.Joins {
		one := &Repair{Joins: []Join{j}}
		err := e.CheckJoins(ctx, one)
		c.mu.Lock()
		if c.failed == nil {
			c.failed = map[joinPair]failedReach{}
		}
		key := joinPair{j.PredAddr, j.MemberAddr}
		if err != nil && ctx.Err() == nil {
			c.failed[key] = failedReach{at: time.Now(), err: err}
		} else {
			delete(c.failed, key)
		}
		c.mu.Unlock()
		if err != nil {
			return true, err
		}
	}
	return len(r.Joins) > 0, nil
}
