package server

import (
	"testing"

	"github.com/catena-streams/catena/replica/partlog"
)

func TestDedupTable(t *testing.T) {
	type step struct {
		op                 string // "add", "lookup", "truncate"
		producer, seq, off uint64
		wantFound, wantOld bool
		wantOutOfOrder     bool
		wantOff            uint64
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"unknown producer is new", []step{
			{op: "lookup", producer: 7, seq: 1},
		}},
		{"stored sequence is found with its offset", []step{
			{op: "add", producer: 7, seq: 1, off: 10},
			{op: "add", producer: 7, seq: 2, off: 11},
			{op: "lookup", producer: 7, seq: 1, wantFound: true, wantOff: 10},
			{op: "lookup", producer: 7, seq: 2, wantFound: true, wantOff: 11},
			{op: "lookup", producer: 7, seq: 3},
		}},
		{"producer zero is never de-duplicated", []step{
			{op: "add", producer: 0, seq: 1, off: 10},
			{op: "lookup", producer: 0, seq: 1},
		}},
		{"producers are independent", []step{
			{op: "add", producer: 1, seq: 5, off: 1},
			{op: "lookup", producer: 2, seq: 5},
		}},
		{"re-adding keeps the first offset", []step{
			{op: "add", producer: 1, seq: 5, off: 1},
			{op: "add", producer: 1, seq: 5, off: 9},
			{op: "lookup", producer: 1, seq: 5, wantFound: true, wantOff: 1},
		}},
		{"gaps are fine, a lower unseen sequence is out of order", []step{
			{op: "add", producer: 1, seq: 4, off: 0},
			{op: "add", producer: 1, seq: 10, off: 1},
			{op: "lookup", producer: 1, seq: 4, wantFound: true, wantOff: 0},
			{op: "lookup", producer: 1, seq: 11},
			{op: "lookup", producer: 1, seq: 5, wantOutOfOrder: true},
		}},
		{"truncation forgets records at and past the cut", []step{
			{op: "add", producer: 1, seq: 1, off: 5},
			{op: "add", producer: 1, seq: 2, off: 6},
			{op: "truncate", off: 6},
			{op: "lookup", producer: 1, seq: 1, wantFound: true, wantOff: 5},
			{op: "lookup", producer: 1, seq: 2},
			{op: "add", producer: 1, seq: 2, off: 6},
			{op: "lookup", producer: 1, seq: 2, wantFound: true, wantOff: 6},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDedupTable()
			for i, s := range tc.steps {
				switch s.op {
				case "add":
					d.add(s.producer, s.seq, s.off)
				case "truncate":
					d.truncate(s.off)
				case "lookup":
					off, found, old, ooo := d.lookup(s.producer, s.seq)
					if found != s.wantFound || old != s.wantOld || ooo != s.wantOutOfOrder || (found && off != s.wantOff) {
						t.Fatalf("step %d lookup(%d, %d) = (%d, %v, %v, %v), want (%d, %v, %v, %v)", i, s.producer, s.seq, off, found, old, ooo, s.wantOff, s.wantFound, s.wantOld, s.wantOutOfOrder)
					}
				}
			}
		})
	}
}

// A producer whose every record lands between other producers' records
// needs a run per record: its window is bounded by runs.
func TestDedupWindowEvictsOldestRunsAndRefusesThem(t *testing.T) {
	d := newDedupTable()
	// Up to twice the window is kept; one more compacts down to the window.
	n := uint64(2*dedupWindowRuns + 1)
	for seq := uint64(1); seq <= n; seq++ {
		if _, found, _, _ := d.lookup(3, 1); seq <= 2*dedupWindowRuns && seq > 1 && !found {
			t.Fatalf("seq 1 forgotten after only %d adds", seq-1)
		}
		d.add(3, seq, seq*2)
	}
	evicted := n - dedupWindowRuns
	// The oldest are gone and reported as too old to tell apart.
	for seq := uint64(1); seq <= evicted; seq++ {
		if _, found, old, _ := d.lookup(3, seq); found || !old {
			t.Fatalf("seq %d: found=%v tooOld=%v, want evicted and too old", seq, found, old)
		}
	}
	for seq := evicted + 1; seq <= n; seq++ {
		if off, found, _, _ := d.lookup(3, seq); !found || off != seq*2 {
			t.Fatalf("seq %d: found=%v off=%d, want %d", seq, found, off, seq*2)
		}
	}
}

// Consecutive sequences at consecutive offsets are one run: the window
// covers twice the largest append, whatever the record count.
func TestDedupWindowCoversSequencesOfRuns(t *testing.T) {
	d := newDedupTable()
	n := uint64(2*dedupWindowSequences + 1)
	for seq := uint64(1); seq <= n; seq++ {
		d.add(4, seq, 100+seq)
	}
	if w := d.producers[4]; len(w.runs) != 1 {
		t.Fatalf("%d consecutive records are held as %d runs, want 1", n, len(w.runs))
	}
	for _, seq := range []uint64{1, n - dedupWindowSequences} {
		if _, found, old, _ := d.lookup(4, seq); found || !old {
			t.Fatalf("seq %d: found=%v tooOld=%v, want evicted and too old", seq, found, old)
		}
	}
	for _, seq := range []uint64{n - dedupWindowSequences + 1, n - partlog.MaxBatchRecords, n} {
		if off, found, _, _ := d.lookup(4, seq); !found || off != 100+seq {
			t.Fatalf("seq %d: found=%v off=%d, want %d", seq, found, off, 100+seq)
		}
	}
	// A truncation inside the run cuts it there.
	d.truncate(100 + n - 10)
	if _, found, _, _ := d.lookup(4, n-10); found {
		t.Fatal("a sequence at the cut is still found")
	}
	if off, found, _, _ := d.lookup(4, n-11); !found || off != 100+n-11 {
		t.Fatalf("the sequence before the cut: found=%v off=%d", found, off)
	}
}

func TestDedupEvictsLeastRecentProducer(t *testing.T) {
	d := newDedupTable()
	for p := uint64(1); p <= dedupMaxProducers; p++ {
		d.add(p, 1, p) // producer 1 has the lowest offset: least recent
	}
	d.add(dedupMaxProducers+1, 1, dedupMaxProducers+1)
	if _, found, _, _ := d.lookup(1, 1); found {
		t.Fatal("least recent producer should have been evicted")
	}
	if _, found, _, _ := d.lookup(2, 1); !found {
		t.Fatal("producer 2 should still be tracked")
	}
	if len(d.producers) != dedupMaxProducers {
		t.Fatalf("tracking %d producers, want %d", len(d.producers), dedupMaxProducers)
	}
}

func TestDedupAddBatch(t *testing.T) {
	d := newDedupTable()
	d.addBatch([]partlog.Record{{Offset: 4, ProducerID: 9, Sequence: 1}, {Offset: 5, ProducerID: 9, Sequence: 2}, {Offset: 6}})
	if off, found, _, _ := d.lookup(9, 2); !found || off != 5 {
		t.Fatalf("lookup = %d, %v; want 5, true", off, found)
	}
}
