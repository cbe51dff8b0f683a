package transport

import (
	"math/bits"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
)

// bufferPool is the gRPC buffer pool of every Catena server and client: a
// sync.Pool per power of two, handing out buffers without clearing them.
//
// gRPC's default pool clears every buffer it hands out, over its whole
// capacity: receiving a 600 KiB append cleared a 1 MiB buffer first. That
// was 5% of the CPU of the produce path at full speed (profiled), for
// nothing: gRPC asks for a buffer of exactly the bytes it is about to read
// or encode into it and overwrites all of them (its own transport uses an
// uncleared pool for the same reason).
type bufferPool struct {
	tiers [maxPoolShift - minPoolShift + 1]sync.Pool
}

// Buffers from 256 B to 64 MiB (MaxMessageBytes) are pooled; others are
// allocated.
const (
	minPoolShift = 8
	maxPoolShift = 26
)

// processPool is the pool of every gRPC server, connection and codec of a
// process that links this package. The proto codec and every connection
// dialled take gRPC's default pool, which init sets; a server takes the
// default that gRPC captured when its own package was initialised, before
// this init ran, so ServerOptions names the pool explicitly.
var processPool = &bufferPool{}

func init() { experimental.SetDefaultBufferPool(processPool) }

var _ mem.BufferPool = (*bufferPool)(nil)

// testHookGet, when set (by tests), sees every Get; atomic, as servers of
// earlier tests may still be reading.
var testHookGet atomic.Pointer[func(size int)]

// tier is the index of the smallest power of two holding size, or -1.
func tier(size int) int {
	if size <= 1<<minPoolShift {
		return 0
	}
	shift := bits.Len(uint(size - 1))
	if shift > maxPoolShift {
		return -1
	}
	return shift - minPoolShift
}

// Get returns a buffer of length size, its contents undefined.
func (p *bufferPool) Get(size int) *[]byte {
	if hook := testHookGet.Load(); hook != nil {
		(*hook)(size)
	}
	t := tier(size)
	if t < 0 {
		b := make([]byte, size)
		return &b
	}
	if b, ok := p.tiers[t].Get().(*[]byte); ok {
		*b = (*b)[:size]
		return b
	}
	b := make([]byte, size, 1<<(t+minPoolShift))
	return &b
}

// Put keeps a buffer for reuse if its capacity is one of the tiers.
func (p *bufferPool) Put(b *[]byte) {
	c := cap(*b)
	t := tier(c)
	if t < 0 || c != 1<<(t+minPoolShift) {
		return
	}
	p.tiers[t].Put(b)
}
