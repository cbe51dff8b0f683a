// Package heard records when each peer process was last heard from, for
// failure detection that judges a process, not one of its streams: a
// replica that answers any partition's stream is reachable, however long
// one partition's answer waits.
package heard

import (
	"sync"
	"sync/atomic"
	"time"
)

// Table maps a peer (by address) to when it was last heard from. Times are
// monotonic: a step of the wall clock neither hides a silent peer nor makes
// a live one look silent. The zero Table is not ready; use New.
type Table struct {
	start time.Time // monotonic origin
	peers sync.Map  // key -> *atomic.Int64, nanoseconds since start (+1, so that 0 is never)
}

// New returns an empty table.
func New() *Table { return &Table{start: time.Now()} }

// Mark records that key was heard from now.
func (t *Table) Mark(key string) {
	v, ok := t.peers.Load(key)
	if !ok {
		v, _ = t.peers.LoadOrStore(key, new(atomic.Int64))
	}
	v.(*atomic.Int64).Store(int64(time.Since(t.start)) + 1)
}

// Last is when key was last heard from (zero: never).
func (t *Table) Last(key string) time.Time {
	v, ok := t.peers.Load(key)
	if !ok {
		return time.Time{}
	}
	n := v.(*atomic.Int64).Load()
	if n == 0 {
		return time.Time{}
	}
	return t.start.Add(time.Duration(n - 1))
}

// SilentSince is how long key has been silent counted from from (when it
// began to owe an answer): from, or its last answer if later. Never
// negative.
func (t *Table) SilentSince(key string, from time.Time) time.Duration {
	if last := t.Last(key); last.After(from) {
		from = last
	}
	return max(time.Since(from), 0)
}
