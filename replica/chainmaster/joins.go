package chainmaster

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// JoinCheck is a master's Executor.CheckJoins with a memory of the pairs
// that failed: a pair that failed within RecheckAfter fails again at
// once, without a call, and the chains that ask about a pair while a call
// about it is out share its answer. A replica that returns under
// hundreds of chains is the joiner of each of them, behind one or two
// tails: without it, each chain's reconcile would wait up to
// ReachTimeout for the same answer, holding up the master's workers while
// other chains have failures to handle. The zero value is ready to use;
// it is safe for concurrent use.
type JoinCheck struct {
	calls  singleflight.Group
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
// failed within RecheckAfter. asked says whether the error came from a
// call made for this check (news, worth logging) rather than from memory
// or another chain's call.
func (c *JoinCheck) Check(ctx context.Context, e Executor, r *Repair) (asked bool, err error) {
	for _, j := range r.Joins {
		key := joinPair{j.PredAddr, j.MemberAddr}
		c.mu.Lock()
		f, ok := c.failed[key]
		c.mu.Unlock()
		if ok && time.Since(f.at) < RecheckAfter {
			return false, f.err
		}
		_, err, shared := c.calls.Do(key.pred+"\x00"+key.member, func() (any, error) {
			err := e.CheckJoins(ctx, &Repair{Joins: []Join{j}})
			c.mu.Lock()
			defer c.mu.Unlock()
			for k, f := range c.failed { // forget what is stale
				if time.Since(f.at) >= RecheckAfter {
					delete(c.failed, k)
				}
			}
			if err != nil && ctx.Err() == nil {
				if c.failed == nil {
					c.failed = map[joinPair]failedReach{}
				}
				c.failed[key] = failedReach{at: time.Now(), err: err}
			}
			return nil, err
		})
		if err != nil {
			return !shared, err
		}
	}
	return len(r.Joins) > 0, nil
}
