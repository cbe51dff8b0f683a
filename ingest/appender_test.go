package ingest

import (
	"bytes"
	"slices"
	"testing"

	"github.com/catena-streams/catena/replica/partlog"
)

func testChunk(producer, firstSeq uint64, n, valueSize int) *chunk {
	c := &chunk{}
	for i := range n {
		v := bytes.Repeat([]byte{byte(i)}, valueSize)
		c.recs = append(c.recs, partlog.Record{Key: []byte{'k', byte(i)}, Value: v, TimestampMs: 1_700_000_000_000 + int64(i), ProducerID: producer, Sequence: firstSeq + uint64(i)})
		c.bytes += len(v) + 2
	}
	return c
}

// TestBuildSendsChunksAsOneFrame: a request's chunks become one frame at
// epoch 0, offset 0, whose records are the chunks' in queue order, and an
// answered request's frame memory is used again for the next one.
func TestBuildSendsChunksAsOneFrame(t *testing.T) {
	a := &appender{stream: "s", partition: 2}
	s := &sent{id: 7, chunks: []*chunk{testChunk(9, 1, 3, 100), testChunk(9, 4, 2, 1000)}}
	if err := a.build(s); err != nil {
		t.Fatal(err)
	}
	if s.count() != 5 || s.req.GetRequestId() != 7 || s.req.GetPartition() != 2 || len(s.req.GetRecords()) != 0 {
		t.Fatalf("request %v for %d records", s.req, s.count())
	}
	h, recs, err := partlog.DecodeBatch(s.req.GetFrame())
	if err != nil {
		t.Fatal(err)
	}
	if h.Epoch != 0 || h.BaseOffset != 0 || len(recs) != 5 {
		t.Fatalf("frame at epoch %d, offset %d with %d records", h.Epoch, h.BaseOffset, len(recs))
	}
	var want []partlog.Record
	for _, c := range s.chunks {
		want = append(want, c.recs...)
	}
	for i, r := range recs {
		w := want[i]
		if r.Sequence != w.Sequence || r.ProducerID != 9 || r.TimestampMs != w.TimestampMs || !bytes.Equal(r.Key, w.Key) || !bytes.Equal(r.Value, w.Value) {
			t.Fatalf("record %d: %+v, want %+v", i, r, w)
		}
	}
	for _, r := range a.scratch[:cap(a.scratch)] {
		if r.Value != nil {
			t.Fatal("the scratch slice keeps a request's records alive")
		}
	}

	first := s.req.GetFrame()
	a.recycle(first)
	next := &sent{id: 8, chunks: []*chunk{testChunk(9, 6, 3, 1000)}} // larger, within the power of two
	if err := a.build(next); err != nil {
		t.Fatal(err)
	}
	if f := next.req.GetFrame(); &f[:1][0] != &first[:1][0] {
		t.Fatal("the next frame did not reuse the answered one's memory")
	}
	if len(a.spare) != 0 {
		t.Fatalf("%d spare frames after reuse, want 0", len(a.spare))
	}
}

// TestRecycleKeepsTheLargest: at most maxSpareFrames frames are kept, the
// largest ones.
func TestRecycleKeepsTheLargest(t *testing.T) {
	a := &appender{}
	for _, n := range []int{10, 1000, 100, 5000, 0} {
		a.recycle(make([]byte, 0, n))
	}
	if len(a.spare) != maxSpareFrames {
		t.Fatalf("%d spares, want %d", len(a.spare), maxSpareFrames)
	}
	for _, b := range a.spare {
		if cap(b) < 1000 {
			t.Fatalf("kept a frame of %d bytes over larger ones", cap(b))
		}
	}
	if b := a.buffer(2000); cap(b) != 5000 || len(b) != 0 {
		t.Fatalf("buffer(2000) = len %d cap %d, want the 5000-byte spare", len(b), cap(b))
	}
	if b := a.buffer(3000); cap(b) != 4096 {
		t.Fatalf("buffer(3000) with no spare that large = cap %d, want 4096", cap(b))
	}
}

// TestQueueKeepsEachProducersOrder: a producer's retry of an unanswered
// request arrives after the request it sent next. Queued in arrival order
// and merged into one append, the head would store the later records
// first. The queue keeps each producer's chunks in sequence order, and a
// request never carries a producer's sequences going back.
func TestQueueKeepsEachProducersOrder(t *testing.T) {
	a := &appender{stream: "s", wake: make(chan struct{}, 1)}
	b := testChunk(1, 10, 5, 10) // sent second, queued first
	other := testChunk(2, 1, 3, 10)
	retry := testChunk(1, 1, 5, 10) // the retry of the first request
	a.enqueue(b)
	a.enqueue(other)
	a.enqueue(retry)
	var seqs []uint64
	for s := a.take(); s != nil; s = a.take() {
		last := map[uint64]uint64{}
		for _, c := range s.chunks {
			for _, r := range c.recs {
				if l, ok := last[r.ProducerID]; ok && r.Sequence < l {
					t.Fatalf("request %d carries producer %d's sequence %d after %d", s.id, r.ProducerID, r.Sequence, l)
				}
				last[r.ProducerID] = r.Sequence
				if r.ProducerID == 1 {
					seqs = append(seqs, r.Sequence)
				}
			}
		}
	}
	if want := []uint64{1, 2, 3, 4, 5, 10, 11, 12, 13, 14}; !slices.Equal(seqs, want) {
		t.Fatalf("producer 1's records go out as %v, want %v", seqs, want)
	}

	// Where the queue cannot help (overlapping chunks), a request ends
	// before a chunk that would take a producer back.
	a.enqueue(testChunk(1, 20, 3, 10)) // 20, 21, 22
	a.enqueue(testChunk(1, 21, 1, 10)) // 21: first sequence not below the queued 20
	n := 0
	for s := a.take(); s != nil; s = a.take() {
		n++
	}
	if n != 2 {
		t.Fatalf("20-22 and 21 went out in %d requests, want 2", n)
	}
}

// TestTakeBoundsABatchsHeaders: chunks that each fit a batch's header
// bound are not merged past it; the head would refuse the append and
// every chunk in it would fail, other producers' included.
func TestTakeBoundsABatchsHeaders(t *testing.T) {
	a := &appender{stream: "s", wake: make(chan struct{}, 1)}
	for p := uint64(1); p <= 2; p++ {
		c := testChunk(p, 1, 1, 10)
		c.recs[0].Headers = make([]partlog.Header, 40000)
		c.headers = 40000
		a.enqueue(c)
	}
	for s := a.take(); s != nil; s = a.take() {
		if err := a.build(s); err != nil {
			t.Fatalf("request %d: %v", s.id, err)
		}
	}
}
