package server

import (
	"slices"
	"sort"

	"github.com/catena-streams/catena/replica/partlog"
)

// Idempotence: every record carries its producer id and sequence in the log
// (partlog.Record), so every member, not only the head, maintains this table
// as it appends, and a member that becomes head already knows which
// submissions it holds. After a restart the table is loaded from the
// partition's snapshot and the records after it (dedupsnap.go), or, without
// a snapshot that fits the log, rebuilt from the tail of the log
// (dedupRebuildRecords).
const (
	// dedupWindowSequences is how many of a producer's most recent
	// sequences per partition are remembered at least (up to twice as
	// many are): twice the largest append, so that a retry of any request
	// a producer can have had in flight finds every record it stored.
	dedupWindowSequences = 2 * partlog.MaxBatchRecords
	// dedupWindowRuns bounds the memory of one producer's window (up to
	// twice as many runs are kept). A run is a stretch of consecutive
	// sequences at consecutive offsets, so a request is one run, or a few
	// when the head split it; only a producer whose every record lands
	// between other producers' needs a run per record, and its window then
	// covers this many sequences.
	dedupWindowRuns = 4096
	// dedupMaxProducers bounds the table per partition; the producer seen
	// least recently is forgotten first.
	dedupMaxProducers = 10000
	// dedupRebuildRecords is how far back the table is rebuilt at start-up
	// without a snapshot, and how far below the log end a snapshot may be.
	dedupRebuildRecords = 1 << 20
)

// producerWindow holds a producer's recent sequences in one partition as
// runs sorted by sequence. Producers send increasing sequences, so an add
// nearly always extends the last run or starts a new one; the runs are
// compacted once they exceed twice the window, which keeps adds amortised
// O(1) and lookups a binary search.
type producerWindow struct {
	runs     []seqRun
	minSeq   uint64 // sequences below this were evicted (or never seen)
	lastSeen uint64 // log offset of the last record, for producer eviction
}

// seqRun: sequences seq .. seq+n-1 are stored at offsets offset ..
// offset+n-1.
type seqRun struct {
	seq, offset, n uint64
}

func (r seqRun) end() uint64 { return r.seq + r.n }

// find returns the index of the run holding seq, or of the first run
// after it.
func (w *producerWindow) find(seq uint64) (int, bool) {
	i := sort.Search(len(w.runs), func(i int) bool { return w.runs[i].end() > seq })
	return i, i < len(w.runs) && w.runs[i].seq <= seq
}

// trim keeps at least dedupWindowSequences sequences and dedupWindowRuns
// runs once either is exceeded twice over.
func (w *producerWindow) trim() {
	if n := len(w.runs); n > 2*dedupWindowRuns {
		w.minSeq = max(w.minSeq, w.runs[n-dedupWindowRuns].seq)
	}
	if last := w.runs[len(w.runs)-1].end(); last-w.runs[0].seq > 2*dedupWindowSequences {
		w.minSeq = max(w.minSeq, last-dedupWindowSequences)
	}
	if w.minSeq <= w.runs[0].seq {
		return
	}
	i, in := w.find(w.minSeq)
	if in {
		r := &w.runs[i]
		cut := w.minSeq - r.seq
		r.seq, r.offset, r.n = r.seq+cut, r.offset+cut, r.n-cut
	}
	w.runs = append(w.runs[:0], w.runs[i:]...)
}

type dedupTable struct {
	producers map[uint64]*producerWindow
}

func newDedupTable() *dedupTable {
	return &dedupTable{producers: map[uint64]*producerWindow{}}
}

// lookup returns the offset at which (producer, seq) was stored; whether
// the sequence is too old to tell (evicted from the window); and whether it
// is out of order: never stored, but below a sequence that was. A
// producer's records reach a partition in sequence order (ingestion keeps
// it), so such a record is a late retry of one that failed, and storing it
// now would put it after records produced later.
func (t *dedupTable) lookup(producer, seq uint64) (offset uint64, found, tooOld, outOfOrder bool) {
	if producer == 0 {
		return 0, false, false, false
	}
	w := t.producers[producer]
	if w == nil {
		return 0, false, false, false
	}
	i, ok := w.find(seq)
	if ok {
		r := w.runs[i]
		return r.offset + (seq - r.seq), true, false, false
	}
	if seq < w.minSeq {
		return 0, false, true, false
	}
	return 0, false, false, i < len(w.runs)
}

// add records that (producer, seq) is stored at offset.
func (t *dedupTable) add(producer, seq, offset uint64) {
	if producer == 0 {
		return
	}
	w := t.producers[producer]
	if w == nil {
		if len(t.producers) >= dedupMaxProducers {
			t.evictOldest()
		}
		w = &producerWindow{runs: make([]seqRun, 0, 8)}
		t.producers[producer] = w
	}
	w.lastSeen = offset
	n := len(w.runs)
	switch {
	case n > 0 && seq == w.runs[n-1].end() && offset == w.runs[n-1].offset+w.runs[n-1].n:
		w.runs[n-1].n++
	case n == 0 || seq >= w.runs[n-1].end():
		w.runs = append(w.runs, seqRun{seq: seq, offset: offset, n: 1})
	default:
		i, ok := w.find(seq)
		if ok {
			return // stored already: the first offset stands
		}
		w.runs = slices.Insert(w.runs, i, seqRun{seq: seq, offset: offset, n: 1})
	}
	w.trim()
}

// addBatch records every idempotent record of a decoded batch.
func (t *dedupTable) addBatch(recs []partlog.Record) {
	for i := range recs {
		t.add(recs[i].ProducerID, recs[i].Sequence, recs[i].Offset)
	}
}

// truncate forgets entries at offsets >= end (after a log truncation).
func (t *dedupTable) truncate(end uint64) {
	for id, w := range t.producers {
		w.runs = slices.DeleteFunc(w.runs, func(r seqRun) bool { return r.offset >= end })
		for i := range w.runs {
			if r := &w.runs[i]; r.offset+r.n > end {
				r.n = end - r.offset
			}
		}
		if len(w.runs) == 0 && w.minSeq == 0 {
			delete(t.producers, id)
		}
	}
}

func (t *dedupTable) evictOldest() {
	var victim uint64
	var oldest uint64 = ^uint64(0)
	for id, w := range t.producers {
		if w.lastSeen < oldest {
			oldest, victim = w.lastSeen, id
		}
	}
	delete(t.producers, victim)
}
