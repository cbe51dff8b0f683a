package transport

import "testing"

func TestBufferPool(t *testing.T) {
	p := &bufferPool{}
	for _, tc := range []struct {
		size, wantCap int
	}{
		{0, 256}, {1, 256}, {256, 256}, {257, 512}, {4096, 4096}, {600 << 10, 1 << 20},
		{64 << 20, 64 << 20}, {64<<20 + 1, 64<<20 + 1},
	} {
		b := p.Get(tc.size)
		if len(*b) != tc.size || cap(*b) != tc.wantCap {
			t.Errorf("Get(%d): len %d cap %d, want len %d cap %d", tc.size, len(*b), cap(*b), tc.size, tc.wantCap)
		}
		p.Put(b)
	}
	// A returned buffer serves a later request of its tier, at the length
	// asked for.
	b := p.Get(3000)
	(*b)[0] = 7
	p.Put(b)
	c := p.Get(2100)
	if len(*c) != 2100 || cap(*c) != 4096 {
		t.Errorf("Get(2100) after Put: len %d cap %d", len(*c), cap(*c))
	}
	// Buffers of a capacity that is not a tier are not kept.
	odd := make([]byte, 1000)
	p.Put(&odd)
	if d := p.Get(1000); cap(*d) != 1024 {
		t.Errorf("a 1000-byte buffer was pooled in the 1 KiB tier (cap %d)", cap(*d))
	}
}
