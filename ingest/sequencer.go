package ingest

import (
	"context"
	"sync"
	"time"
)

// sequencer admits each producer's requests into the partition queues in
// the producer's order. A producer keeps several requests in flight; gRPC
// may hand them to handlers in any order, and records of one key must
// reach their partition in the order they were produced. Each request
// names its still-unanswered predecessor and waits (briefly) until that
// one has been admitted: by its number (ProduceRequest.prev_request), or,
// from producers that do not number requests, by its last sequence
// (prev_sequence: the request holding it is admitted once a request
// ending at or past it is, which assumes each request's sequences are
// above its predecessor's). Requests naming none (the first, retries, a
// producer whose previous request was answered) pass at once, and the
// partition log's de-duplication answers retries.
type sequencer struct {
	mu        sync.Mutex
	producers map[uint64]*producerOrder
	lastSweep time.Time
}

type producerOrder struct {
	next     uint64 // one past the highest sequence admitted
	nextReq  uint64 // one past the highest request number admitted
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

// admission is what a request says of its place in its producer's order.
type admission struct {
	prevSeq uint64 // prev_sequence (used when prevReq is zero)
	lastSeq uint64 // its highest sequence
	prevReq uint64 // prev_request
	req     uint64 // its number (zero: not numbered)
}

// waits reports whether a must still wait for its predecessor.
func (po *producerOrder) waits(a admission) bool {
	if a.prevReq != 0 {
		return a.prevReq >= po.nextReq
	}
	return a.prevSeq != 0 && a.prevSeq >= po.next
}

// admit waits until the request a describes may go, and returns a func to
// call once its records are queued.
func (s *sequencer) admit(ctx context.Context, producer uint64, a admission) func() {
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
	for po.waits(a) {
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
			if a.prevReq != 0 {
				po.nextReq = max(po.nextReq, a.prevReq+1)
			} else {
				po.next = max(po.next, a.prevSeq+1)
			}
			continue
		case <-ctx.Done():
			return func() {}
		}
		s.mu.Lock()
	}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		moved := false
		if a.lastSeq+1 > po.next {
			po.next, moved = a.lastSeq+1, true
		}
		if a.req+1 > po.nextReq {
			po.nextReq, moved = a.req+1, true
		}
		if moved {
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
