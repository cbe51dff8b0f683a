package ingest

import (
	"context"
	"sync"
	"time"
)

// sequencer admits each producer's requests into the partition queues in
// the producer's order. A producer numbers its records 1, 2, 3... and keeps
// several requests in flight; gRPC may hand them to handlers in any order,
// and records of one key must reach their partition in the order they were
// produced. Each request names the last sequence of its still-unanswered
// predecessor (ProduceRequest.prev_sequence); it waits (briefly) until a
// request holding that sequence has been admitted. Requests naming none
// (the first, retries, a producer whose previous request was answered)
// pass at once, and the partition log's de-duplication answers retries.
type sequencer struct {
	mu        sync.Mutex
	producers map[uint64]*producerOrder
	lastSweep time.Time
}

type producerOrder struct {
	next     uint64 // one past the highest sequence admitted
	changed  chan struct{}
	lastUsed time.Time
}

const (
	// admitWait bounds how long a request waits for an earlier one of its
	// producer; past it, the earlier one is taken to be lost.
	admitWait = 2 * time.Second
	// producerIdle is how long an idle producer's order is remembered.
	producerIdle = 10 * time.Minute
)

func newSequencer() *sequencer {
	return &sequencer{producers: map[uint64]*producerOrder{}}
}

// admit waits until the request whose predecessor ends at sequence prev
// (zero: none) may go, and returns a func to call once its records, up to
// sequence last, are queued.
func (s *sequencer) admit(ctx context.Context, producer, prev, last uint64) func() {
	now := time.Now()
	s.mu.Lock()
	s.sweep(now)
	po := s.producers[producer]
	if po == nil {
		po = &producerOrder{changed: make(chan struct{})}
		s.producers[producer] = po
	}
	po.lastUsed = now
	var timer *time.Timer
	for prev != 0 && prev >= po.next {
		if timer == nil {
			timer = time.NewTimer(admitWait)
			defer timer.Stop()
		}
		ch := po.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			// The predecessor is lost (its sender gave up); go on.
			s.mu.Lock()
			po.next = max(po.next, prev+1)
			continue
		case <-ctx.Done():
			return func() {}
		}
		s.mu.Lock()
	}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		if last+1 > po.next {
			po.next = last + 1
			close(po.changed)
			po.changed = make(chan struct{})
		}
		s.mu.Unlock()
	}
}

// sweep forgets idle producers, at most once a minute. Callers hold s.mu.
func (s *sequencer) sweep(now time.Time) {
	if now.Sub(s.lastSweep) < time.Minute {
		return
	}
	s.lastSweep = now
	for id, po := range s.producers {
		if now.Sub(po.lastUsed) > producerIdle {
			delete(s.producers, id)
		}
	}
}
