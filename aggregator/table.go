package aggregator

import "math/bits"

// table is one part of a State's groups: an open-addressing hash table
// with linear probing, indexed by the 64-bit hash State computes once per
// group (Go's maps would hash the key a second time, after the hash that
// picked the part). A slot holds the hash and the entry, which holds its
// key, so a probe compares hashes and reads an entry only on a match.
// Groups are never removed, so there are no tombstones.
type table struct {
	slots []slot
	n     int
}

// slot is a group's hash with the top bit set (0: empty) and its entry.
type slot struct {
	h uint64
	e *entry
}

const (
	slotUsed = uint64(1) << 63
	// partBits are the low bits of a key's hash that pick its part; the
	// slot index uses the bits above them.
	partBits = 4
)

// tableSize is the power-of-two slot count that holds n groups at most
// three quarters full.
func tableSize(n int) int {
	want := (4*n + 2) / 3 // ceil(4n/3)
	if want < 8 {
		want = 8
	}
	return 1 << bits.Len(uint(want-1))
}

func newTable(n int) table { return table{slots: make([]slot, tableSize(n))} }

// probe returns the slot holding k (hash h), or the empty slot where it
// would go. The table must have an empty slot.
func (t *table) probe(h uint64, k entryKey) *slot {
	h |= slotUsed
	mask := uint64(len(t.slots) - 1)
	for i := (h >> partBits) & mask; ; i = (i + 1) & mask {
		if s := &t.slots[i]; s.h == 0 || s.h == h && s.e.key == k {
			return s
		}
	}
}

// find returns the entry of k, whose hash is h, or nil.
func (t *table) find(h uint64, k entryKey) *entry {
	if len(t.slots) == 0 {
		return nil
	}
	return t.probe(h, k).e // nil in an empty slot
}

// set stores e (hash h) in place of the entry of the same key, or as a
// new group.
func (t *table) set(h uint64, e *entry) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	s := t.probe(h, e.key)
	if s.h == 0 {
		s.h = h | slotUsed
		t.n++
	}
	s.e = e
}

// grow doubles the slots.
func (t *table) grow() { t.resize(max(2*len(t.slots), 8)) }

// resize makes the slots n (a power of two, more than the groups),
// placing each group again by its stored hash.
func (t *table) resize(n int) {
	old := t.slots
	t.slots = make([]slot, n)
	mask := uint64(len(t.slots) - 1)
	for _, s := range old {
		if s.h == 0 {
			continue
		}
		i := (s.h >> partBits) & mask
		for t.slots[i].h != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
}

// each yields every group of the table.
func (t *table) each(yield func(*entry) bool) bool {
	for _, s := range t.slots {
		if s.h != 0 && !yield(s.e) {
			return false
		}
	}
	return true
}

// pendingGroup is a decoded group waiting to be put in its table.
type pendingGroup struct {
	h uint64
	e *entry
}

// fillBuckets is how many ranges of slots fill sorts groups into: with
// 2^11, a range of a table of 2^17 slots is 64 slots (1 KiB), so the
// inserts of one range hit the same few cache lines and pages.
const fillBits = 11

// fill sets every group of groups, a later group of a key replacing an
// earlier one as set does, but in the order of their slots: one stable
// counting sort by the top bits of the slot index, then sets that sweep
// the table once instead of jumping across it. scratch is sorting room,
// returned for the next fill.
func (t *table) fill(groups, scratch []pendingGroup) []pendingGroup {
	if len(groups) == 0 {
		return scratch
	}
	// The table is sized for the groups it will hold (a restore knows
	// them from the manifest), not for len(groups): a key repeats in
	// every checkpoint that changed it. Should it grow midway, the rest
	// is set in the old size's order: slower, not wrong.
	slotBits := bits.Len(uint(len(t.slots) - 1))
	shift := max(slotBits-fillBits, 0)
	mask := uint64(len(t.slots) - 1)
	bucket := func(h uint64) uint64 { return (((h | slotUsed) >> partBits) & mask) >> shift }
	var counts [1<<fillBits + 1]int
	for _, g := range groups {
		counts[bucket(g.h)+1]++
	}
	for i := 1; i < len(counts); i++ {
		counts[i] += counts[i-1]
	}
	if cap(scratch) < len(groups) {
		scratch = make([]pendingGroup, len(groups))
	}
	sorted := scratch[:len(groups)]
	for _, g := range groups {
		b := bucket(g.h)
		sorted[counts[b]] = g
		counts[b]++
	}
	for _, g := range sorted {
		t.set(g.h, g.e)
	}
	clear(sorted) // no entry kept alive by the scratch
	return scratch
}
