package server

import (
	"slices"
	"sort"

	"github.com/catena-streams/catena/replica/partlog"
)

// Idempotence: every record carries its producer id and sequence in the log
// (partlog.Record), so every member, not only the head, maintains this table
// as it appends, and a member that becomes head already knows which
// submissions it holds. After a restart the table is rebuilt from the tail of
// the log (dedupRebuildRecords).
const (
	// dedupWindowPerProducer is how many recent sequences per producer and
	// partition are remembered at least (up to twice as many are). Producers keep a handful of requests in
	// flight, so a retry always falls well inside it.
	dedupWindowPerProducer = 4096
	// dedupMaxProducers bounds the table per partition; the producer seen
	// least recently is forgotten first.
	dedupMaxProducers = 10000
	// dedupRebuildRecords is how far back the table is rebuilt at start-up.
	dedupRebuildRecords = 1 << 20
)

// producerWindow holds a producer's recent sequences in one partition,
// sorted by sequence. Producers send increasing sequences, so an add is
// nearly always an append; the slice is compacted once it holds twice the
// window, which keeps adds amortised O(1) and lookups a binary search.
type producerWindow struct {
	entries  []seqEntry
	minSeq   uint64 // sequences below this were evicted (or never seen)
	lastSeen uint64 // log offset of the last record, for producer eviction
}

type seqEntry struct {
	seq, offset uint64
}

// find returns the index of seq in w.entries, or where it would go.
func (w *producerWindow) find(seq uint64) (int, bool) {
	i := sort.Search(len(w.entries), func(i int) bool { return w.entries[i].seq >= seq })
	return i, i < len(w.entries) && w.entries[i].seq == seq
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
		return w.entries[i].offset, true, false, false
	}
	if seq < w.minSeq {
		return 0, false, true, false
	}
	return 0, false, false, i < len(w.entries)
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
		w = &producerWindow{entries: make([]seqEntry, 0, 64)}
		t.producers[producer] = w
	}
	w.lastSeen = offset
	if n := len(w.entries); n == 0 || seq > w.entries[n-1].seq {
		w.entries = append(w.entries, seqEntry{seq, offset})
	} else {
		i, ok := w.find(seq)
		if ok {
			return
		}
		w.entries = slices.Insert(w.entries, i, seqEntry{seq, offset})
	}
	if n := len(w.entries); n > 2*dedupWindowPerProducer {
		drop := n - dedupWindowPerProducer
		w.minSeq = max(w.minSeq, w.entries[drop-1].seq+1)
		w.entries = append(w.entries[:0], w.entries[drop:]...)
	}
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
		w.entries = slices.DeleteFunc(w.entries, func(e seqEntry) bool { return e.offset >= end })
		if len(w.entries) == 0 && w.minSeq == 0 {
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
