package server

import "github.com/catena-streams/catena/replica/partlog"

// Idempotence: every record carries its producer id and sequence in the log
// (partlog.Record), so every member, not only the head, maintains this table
// as it appends, and a member that becomes head already knows which
// submissions it holds. After a restart the table is rebuilt from the tail of
// the log (dedupRebuildRecords).
const (
	// dedupWindowPerProducer is how many recent sequences per producer and
	// partition are remembered. Producers keep a handful of requests in
	// flight, so a retry always falls well inside it.
	dedupWindowPerProducer = 4096
	// dedupMaxProducers bounds the table per partition; the producer seen
	// least recently is forgotten first.
	dedupMaxProducers = 10000
	// dedupRebuildRecords is how far back the table is rebuilt at start-up.
	dedupRebuildRecords = 1 << 20
)

type producerWindow struct {
	seqs     map[uint64]uint64 // sequence -> offset
	ring     []uint64          // sequences in insertion order, for eviction
	next     int
	minSeq   uint64 // sequences below this were evicted (or never seen)
	lastSeen uint64 // log offset of the last record, for producer eviction
}

type dedupTable struct {
	producers map[uint64]*producerWindow
}

func newDedupTable() *dedupTable {
	return &dedupTable{producers: map[uint64]*producerWindow{}}
}

// lookup returns the offset at which (producer, seq) was stored, and whether
// the sequence is too old to tell (evicted from the window).
func (t *dedupTable) lookup(producer, seq uint64) (offset uint64, found, tooOld bool) {
	if producer == 0 {
		return 0, false, false
	}
	w := t.producers[producer]
	if w == nil {
		return 0, false, false
	}
	if off, ok := w.seqs[seq]; ok {
		return off, true, false
	}
	return 0, false, seq < w.minSeq
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
		w = &producerWindow{seqs: make(map[uint64]uint64, 64), ring: make([]uint64, 0, 64)}
		t.producers[producer] = w
	}
	if _, dup := w.seqs[seq]; dup {
		return
	}
	if len(w.ring) < dedupWindowPerProducer {
		w.ring = append(w.ring, seq)
	} else {
		old := w.ring[w.next]
		delete(w.seqs, old)
		if old+1 > w.minSeq {
			w.minSeq = old + 1
		}
		w.ring[w.next] = seq
		w.next = (w.next + 1) % dedupWindowPerProducer
	}
	w.seqs[seq] = offset
	w.lastSeen = offset
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
		for seq, off := range w.seqs {
			if off >= end {
				delete(w.seqs, seq)
			}
		}
		if len(w.seqs) == 0 {
			delete(t.producers, id)
			continue
		}
		// Keep the ring in insertion order, oldest first, without the
		// forgotten sequences, so later evictions stay exact.
		kept := make([]uint64, 0, len(w.seqs))
		for i := range w.ring {
			seq := w.ring[(w.next+i)%len(w.ring)]
			if _, ok := w.seqs[seq]; ok {
				kept = append(kept, seq)
			}
		}
		w.ring, w.next = kept, 0
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
