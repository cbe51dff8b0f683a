package aggregator

import (
	"hash/maphash"
	"math"
	"sort"
	"strings"

	"github.com/catena-streams/catena/internal/hugepages"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// entryKey is one group: a key, and the start of its window (0 without
// windows).
type entryKey struct {
	key    string
	window int64
}

// acc is one aggregate's accumulator. n counts the values folded (for
// Count: the records); f is the sum, minimum or maximum; set holds the
// distinct values.
type acc struct {
	n   int64
	f   float64
	set map[string]struct{}
}

// entry is the state of one group: its key, an accumulator per aggregate,
// in the plan's order, and whether it changed since the last checkpoint.
type entry struct {
	key   entryKey
	dirty bool
	accs  []acc
}

// stateParts is the number of tables a State's groups are spread over (by
// key hash), so that a restore fills them from several cores at once.
const stateParts = 1 << partBits

// State is one shard's per-key aggregates, the changes since its last
// checkpoint, and the counters that are part of the state (so a restored
// shard reports the same figures).
type State struct {
	plan  *Plan
	seed  maphash.Seed
	parts [stateParts]table
	// dirty are the groups changed since the last checkpoint (each with
	// its dirty flag set), in the order they first changed.
	dirty []*entry
	slab  slab
	found []span // Fold's scratch
	// Skipped counts records that were not folded: no key, or a value that
	// is not a JSON object where the plan reads fields.
	Skipped uint64
}

// NewState makes an empty state for plan; sizeHint pre-sizes the tables.
func NewState(plan *Plan, sizeHint int) *State {
	s, _ := newState(plan, sizeHint, false)
	return s
}

// newState is NewState, with every part's slots in one array, advised for
// huge pages when advise is set (a restore's tables are tens of megabytes,
// filled at once); the caller ends the advice once they are written.
func newState(plan *Plan, sizeHint int, advise bool) (*State, hugepages.Region) {
	s := &State{plan: plan, seed: maphash.MakeSeed(), slab: slab{na: len(plan.aggregates)}, found: make([]span, 1+len(plan.aggregates))}
	size := tableSize(sizeHint / stateParts)
	slots := make([]slot, stateParts*size)
	var r hugepages.Region
	if advise {
		r = hugepages.Advise(slots)
	}
	for i := range s.parts {
		s.parts[i].slots = slots[i*size : (i+1)*size : (i+1)*size]
	}
	return s, r
}

// hash is a group's part and its hash, computed once per lookup: the part
// is picked by the key alone (so every window of a key is in one part),
// the slot by the key and the window.
func (s *State) hash(k entryKey) (int, uint64) {
	h := maphash.String(s.seed, k.key)
	part := int(h % stateParts)
	if k.window != 0 {
		h = mixWindow(h, k.window)
	}
	return part, h
}

// mixWindow combines a key's hash with a window start (a finalizer from
// SplitMix64, so windows a fixed step apart spread over the slots).
func mixWindow(h uint64, window int64) uint64 {
	x := h ^ uint64(window)*0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

func (s *State) get(k entryKey) *entry {
	p, h := s.hash(k)
	return s.parts[p].find(h, k)
}

// all yields every group.
func (s *State) all(yield func(entryKey, *entry) bool) {
	for i := range s.parts {
		if !s.parts[i].each(func(e *entry) bool { return yield(e.key, e) }) {
			return
		}
	}
}

// Len is the number of groups (keys, or key-window pairs).
func (s *State) Len() int {
	n := 0
	for i := range s.parts {
		n += s.parts[i].n
	}
	return n
}

// Dirty is the number of groups changed since the last checkpoint.
func (s *State) Dirty() int { return len(s.dirty) }

// takeDirty returns the groups changed since the last checkpoint and
// starts a new set.
func (s *State) takeDirty() []*entry {
	out := s.dirty
	for _, e := range out {
		e.dirty = false
	}
	s.dirty = nil
	return out
}

// Fold adds one record. It reports whether the record was folded (false:
// counted as skipped).
func (s *State) Fold(key, value []byte, timestampMs int64) bool {
	found := s.found[:0]
	if s.plan.needsJSON {
		found = s.found[:1+len(s.plan.aggregates)]
		clear(found)
		if !scanObject(value, s.plan.fields, found) {
			if s.plan.keyField != nil {
				s.Skipped++
				return false
			}
			clear(found) // the record key groups it; field aggregates skip it
		}
	}
	var k string
	if s.plan.keyField != nil {
		v := found[0]
		if v.kind == jsonMissing || v.kind == jsonNull {
			s.Skipped++
			return false
		}
		k = v.text()
	} else {
		if len(key) == 0 {
			s.Skipped++
			return false
		}
		k = string(key)
	}
	ek := entryKey{key: k}
	if w := s.plan.windowMs; w > 0 {
		ek.window = timestampMs - mod(timestampMs, w)
	}
	p, h := s.hash(ek)
	e := s.parts[p].find(h, ek)
	if e == nil {
		ne, accs := s.slab.next()
		ne.key, ne.accs = ek, accs
		s.parts[p].set(h, ne)
		e = ne
	}
	for i, a := range s.plan.aggregates {
		ac := &e.accs[i]
		switch a.fn {
		case fnCount:
			ac.n++
		case fnSum, fnMin, fnMax:
			x, ok := found[1+i].float()
			if !ok || math.IsInf(x, 0) {
				continue
			}
			switch {
			case a.fn == fnSum:
				ac.f += x
			case ac.n == 0:
				ac.f = x
			case a.fn == fnMin:
				ac.f = math.Min(ac.f, x)
			default:
				ac.f = math.Max(ac.f, x)
			}
			ac.n++
		case fnDistinct:
			v := found[1+i]
			if v.kind == jsonMissing || v.kind == jsonNull {
				continue
			}
			if ac.set == nil {
				ac.set = map[string]struct{}{}
			}
			ac.set[v.text()] = struct{}{}
			ac.n = int64(len(ac.set))
		}
	}
	if !e.dirty {
		e.dirty = true
		s.dirty = append(s.dirty, e)
	}
	return true
}

// mod is the non-negative remainder, so that windows of timestamps before
// 1970 still start at multiples of the window.
func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// merge folds partial b (of the same group, from another shard) into a.
func (p *Plan) merge(a, b *entry) {
	for i, ag := range p.aggregates {
		x, y := &a.accs[i], &b.accs[i]
		switch ag.fn {
		case fnCount:
			x.n += y.n
		case fnSum:
			x.f += y.f
			x.n += y.n
		case fnMin, fnMax:
			switch {
			case y.n == 0:
			case x.n == 0:
				x.f = y.f
			case ag.fn == fnMin:
				x.f = math.Min(x.f, y.f)
			default:
				x.f = math.Max(x.f, y.f)
			}
			x.n += y.n
		case fnDistinct:
			if len(y.set) > 0 && x.set == nil {
				x.set = make(map[string]struct{}, len(y.set))
			}
			for v := range y.set {
				x.set[v] = struct{}{}
			}
			x.n = int64(len(x.set))
		}
	}
}

// values renders an entry as the API's values.
func (p *Plan) values(e *entry) []*catenapb.AggValue {
	out := make([]*catenapb.AggValue, len(p.aggregates))
	for i, ag := range p.aggregates {
		ac := e.accs[i]
		v := &catenapb.AggValue{Name: ag.name, Function: ag.fn.String()}
		switch ag.fn {
		case fnCount, fnDistinct:
			v.Value = &catenapb.AggValue_IntValue{IntValue: ac.n}
		case fnSum:
			v.Value = &catenapb.AggValue_FloatValue{FloatValue: ac.f}
		case fnMin, fnMax:
			if ac.n > 0 {
				v.Value = &catenapb.AggValue_FloatValue{FloatValue: ac.f}
			}
		}
		out[i] = v
	}
	return out
}

// groups returns the groups of key (every window of it), in window order.
func (s *State) groups(key string, fromMs, toMs int64) []entryKey {
	if !s.plan.Windowed() {
		if s.get(entryKey{key: key}) != nil {
			return []entryKey{{key: key}}
		}
		return nil
	}
	var out []entryKey
	p, _ := s.hash(entryKey{key: key})
	s.parts[p].each(func(e *entry) bool {
		if ek := e.key; ek.key == key && ek.window >= fromMs && (toMs == 0 || ek.window < toMs) {
			out = append(out, ek)
		}
		return true
	})
	sort.Slice(out, func(i, j int) bool { return out[i].window < out[j].window })
	return out
}

// keys returns the distinct keys with prefix after after, in order, at
// most limit+1 of them (the extra one says there are more).
func (s *State) keys(prefix, after string, limit int) []string {
	seen := map[string]struct{}{}
	var out []string
	for ek := range s.all {
		k := ek.key
		if !strings.HasPrefix(k, prefix) || k <= after {
			continue
		}
		if _, ok := seen[k]; ok {
			continue
		}
		seen[k] = struct{}{}
		out = append(out, k)
	}
	sort.Strings(out)
	if len(out) > limit+1 {
		out = out[:limit+1]
	}
	return out
}
