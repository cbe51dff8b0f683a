package aggregator

import (
	"context"
	"errors"
	"sync"
)

// memLog is an in-memory checkpoint stream for tests. failAfter, when
// positive, lets that many more records be stored and then fails every
// append (a worker dying mid-checkpoint).
type memLog struct {
	mu        sync.Mutex
	parts     map[uint32][][]byte
	failAfter int
	failing   bool
}

var errDead = errors.New("worker died")

func newMemLog() *memLog { return &memLog{parts: map[uint32][][]byte{}} }

func (l *memLog) Append(_ context.Context, partition uint32, values [][]byte) ([]uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var offs []uint64
	for _, v := range values {
		if l.failing {
			return nil, errDead
		}
		if l.failAfter > 0 {
			l.failAfter--
			if l.failAfter == 0 {
				l.failing = true
			}
		}
		offs = append(offs, uint64(len(l.parts[partition])))
		l.parts[partition] = append(l.parts[partition], append([]byte(nil), v...))
	}
	return offs, nil
}

func (l *memLog) Read(ctx context.Context, partition uint32, from uint64, fn func(uint64, []byte) error) error {
	l.mu.Lock()
	recs := l.parts[partition]
	l.mu.Unlock()
	for off := from; off < uint64(len(recs)); off++ {
		if err := fn(off, recs[off]); err != nil {
			return err
		}
	}
	return ctx.Err()
}

func (l *memLog) Start(context.Context, uint32) (uint64, error) { return 0, nil }

// heal lets appends succeed again (the replacement worker's log).
func (l *memLog) heal() {
	l.mu.Lock()
	l.failAfter, l.failing = 0, false
	l.mu.Unlock()
}

func (l *memLog) corrupt(partition uint32, off uint64, at int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.parts[partition][off]
	r[at%len(r)] ^= 0x40
}
