package aggregator

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	"github.com/catena-streams/catena/internal/hugepages"
)

// The checkpoint format (docs/aggregations.md has the full description).
//
// A checkpoint of one shard is a run of chunk records followed by one
// manifest record, all in partition shard%P of the checkpoint stream.
//
//	chunk:    "CKC1" | shard u32 | writer u64 | seq u64 | index u32 | entries u32 | payload
//	manifest: "CKM1" | crc32c(json) u32 | json(manifest)
//
// Integers are big-endian. The payload is a sequence of entries:
//
//	entry:    uvarint len(key) | key | varint windowStart | acc...
//	acc:      Count: uvarint n
//	          Sum, Min, Max: uvarint n | float64 bits (u64) when n > 0
//	          DistinctCount: uvarint len | (uvarint len(v) | v)...
//
// The manifest names its chunks by offset with their CRC-32C. A chunk
// without its manifest (a torn checkpoint) is never read; a chunk or
// manifest whose CRC does not match (a corrupt one) fails validation and
// the previous good checkpoint is used.

var (
	chunkMagic    = [4]byte{'C', 'K', 'C', '1'}
	manifestMagic = [4]byte{'C', 'K', 'M', '1'}
	castagnoli    = crc32.MakeTable(crc32.Castagnoli)
)

const chunkHeaderLen = 4 + 4 + 8 + 8 + 4 + 4

// errCorrupt marks data that fails its checks.
var errCorrupt = errors.New("corrupt")

// chunkHeader identifies a chunk: which checkpoint (writer, seq) of which
// shard, and its place in it.
type chunkHeader struct {
	shard   uint32
	writer  uint64
	seq     uint64
	index   uint32
	entries uint32
}

func appendChunkHeader(b []byte, h chunkHeader) []byte {
	b = append(b, chunkMagic[:]...)
	b = binary.BigEndian.AppendUint32(b, h.shard)
	b = binary.BigEndian.AppendUint64(b, h.writer)
	b = binary.BigEndian.AppendUint64(b, h.seq)
	b = binary.BigEndian.AppendUint32(b, h.index)
	return binary.BigEndian.AppendUint32(b, h.entries)
}

// parseChunk splits a chunk record into header and payload; ok is false
// for records that are not chunks.
func parseChunk(v []byte) (chunkHeader, []byte, bool) {
	if len(v) < chunkHeaderLen || [4]byte(v[:4]) != chunkMagic {
		return chunkHeader{}, nil, false
	}
	h := chunkHeader{
		shard:   binary.BigEndian.Uint32(v[4:]),
		writer:  binary.BigEndian.Uint64(v[8:]),
		seq:     binary.BigEndian.Uint64(v[16:]),
		index:   binary.BigEndian.Uint32(v[24:]),
		entries: binary.BigEndian.Uint32(v[28:]),
	}
	return h, v[chunkHeaderLen:], true
}

// chunkRef is a manifest's reference to one of its chunks.
type chunkRef struct {
	Offset  uint64 `json:"offset"`
	CRC     uint32 `json:"crc"`
	Bytes   int    `json:"bytes"`
	Entries uint32 `json:"entries"`
}

// manifest commits one checkpoint: it is written after every chunk is
// acknowledged, so its presence means the checkpoint is whole.
type manifest struct {
	Shard  uint32 `json:"shard"`
	Writer uint64 `json:"writer"`
	Seq    uint64 `json:"seq"`
	// Snapshot: the chunks hold every group. Otherwise they hold the
	// groups changed since the checkpoint whose manifest is at Base.
	Snapshot    bool   `json:"snapshot"`
	Base        uint64 `json:"base,omitempty"`
	Fingerprint string `json:"fingerprint"`
	// SourceOffset is the next source offset: every record before it is
	// folded into this state.
	SourceOffset uint64     `json:"sourceOffset"`
	Epoch        int64      `json:"epoch"`
	TimeMs       int64      `json:"timeMs"`
	Chunks       []chunkRef `json:"chunks"`
	// Groups is the state's size after this checkpoint (a pre-size hint
	// for restores); Skipped and Lost are the shard's counters.
	Groups  uint64 `json:"groups"`
	Skipped uint64 `json:"skipped"`
	Lost    uint64 `json:"lost,omitempty"`
}

func encodeManifest(m *manifest) []byte {
	js, _ := json.Marshal(m)
	b := make([]byte, 0, 8+len(js))
	b = append(b, manifestMagic[:]...)
	b = binary.BigEndian.AppendUint32(b, crc32.Checksum(js, castagnoli))
	return append(b, js...)
}

// parseManifest decodes a manifest record; ok is false for records that
// are not manifests, err is set for manifests that fail their CRC.
func parseManifest(v []byte) (m *manifest, ok bool, err error) {
	if len(v) < 8 || [4]byte(v[:4]) != manifestMagic {
		return nil, false, nil
	}
	js := v[8:]
	if crc32.Checksum(js, castagnoli) != binary.BigEndian.Uint32(v[4:]) {
		return nil, true, fmt.Errorf("manifest checksum mismatch: %w", errCorrupt)
	}
	m = &manifest{}
	if err := json.Unmarshal(js, m); err != nil {
		return nil, true, fmt.Errorf("manifest does not decode (%v): %w", err, errCorrupt)
	}
	return m, true, nil
}

// appendEntry encodes one group.
func (p *Plan) appendEntry(b []byte, k entryKey, e *entry) []byte {
	b = binary.AppendUvarint(b, uint64(len(k.key)))
	b = append(b, k.key...)
	b = binary.AppendVarint(b, k.window)
	for i, ag := range p.aggregates {
		ac := &e.accs[i]
		switch ag.fn {
		case fnCount:
			b = binary.AppendUvarint(b, uint64(ac.n))
		case fnSum, fnMin, fnMax:
			b = binary.AppendUvarint(b, uint64(ac.n))
			if ac.n > 0 {
				b = binary.BigEndian.AppendUint64(b, math.Float64bits(ac.f))
			}
		case fnDistinct:
			b = binary.AppendUvarint(b, uint64(len(ac.set)))
			for v := range ac.set {
				b = binary.AppendUvarint(b, uint64(len(v)))
				b = append(b, v...)
			}
		}
	}
	return b
}

// decoder reads entries from a payload. Keys are substrings of one
// string copy of the payload (one allocation per chunk, not per key).
type decoder struct {
	b   []byte
	all string
	n   int // len(all)
	err error
}

func newDecoder(payload []byte) *decoder {
	return &decoder{b: payload, all: string(payload), n: len(payload)}
}

// str reads n bytes as a string sharing the payload's copy.
func (d *decoder) str(n uint64) string {
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("length %d past the end: %w", n, errCorrupt)
		return ""
	}
	at := d.n - len(d.b)
	d.b = d.b[n:]
	return d.all[at : at+int(n)]
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = fmt.Errorf("bad varint: %w", errCorrupt)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = fmt.Errorf("bad varint: %w", errCorrupt)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("length %d past the end: %w", n, errCorrupt)
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

// key decodes the next group's key.
func (d *decoder) key() entryKey {
	var k entryKey
	k.key = d.str(d.uvarint())
	k.window = d.varint()
	return k
}

// skipAccs passes over a group's accumulators.
func (d *decoder) skipAccs(p *Plan) {
	for _, ag := range p.aggregates {
		switch ag.fn {
		case fnCount:
			d.uvarint()
		case fnSum, fnMin, fnMax:
			if d.uvarint() > 0 {
				d.bytes(8)
			}
		case fnDistinct:
			n := d.uvarint()
			for j := uint64(0); j < n && d.err == nil; j++ {
				d.bytes(d.uvarint())
			}
		}
	}
}

// entry decodes the next group into e, whose accumulators are accs.
func (d *decoder) entry(p *Plan, e *entry, accs []acc) entryKey {
	k := d.key()
	d.accs(p, e, accs)
	return k
}

// accs decodes a group's accumulators into e.
func (d *decoder) accs(p *Plan, e *entry, accs []acc) {
	e.accs = accs
	for i, ag := range p.aggregates {
		ac := &e.accs[i]
		switch ag.fn {
		case fnCount:
			ac.n = int64(d.uvarint())
		case fnSum, fnMin, fnMax:
			ac.n = int64(d.uvarint())
			if ac.n > 0 {
				if b := d.bytes(8); b != nil {
					ac.f = math.Float64frombits(binary.BigEndian.Uint64(b))
				}
			}
		case fnDistinct:
			n := d.uvarint()
			if d.err == nil && n > uint64(len(d.b)) {
				d.err = fmt.Errorf("distinct set of %d values past the end: %w", n, errCorrupt)
			}
			ac.set = make(map[string]struct{}, n)
			for j := uint64(0); j < n && d.err == nil; j++ {
				ac.set[d.str(d.uvarint())] = struct{}{}
			}
			ac.n = int64(len(ac.set))
		}
	}
}

// slab hands out entries and their accumulators from shared arrays.
type slab struct {
	na   int
	ents []entry
	accs []acc
}

// reserve makes the next n entries come from one array each for entries
// and accumulators, advised for huge pages (a restore knows about how many
// it will decode); the caller ends the advice once they are written.
func (s *slab) reserve(n int) (entries, accs hugepages.Region) {
	s.ents = make([]entry, 0, n)
	s.accs = make([]acc, 0, n*s.na)
	return hugepages.Advise(s.ents[:n]), hugepages.Advise(s.accs[:n*s.na])
}

func (s *slab) next() (*entry, []acc) {
	if len(s.ents) == cap(s.ents) {
		// Arrays double from 16 to 4096 entries: a state of a few groups
		// does not take a large one.
		n := min(max(2*cap(s.ents), 16), 4096)
		s.ents = make([]entry, 0, n)
		s.accs = make([]acc, 0, n*s.na)
	}
	s.ents = s.ents[:len(s.ents)+1]
	n := len(s.accs)
	s.accs = s.accs[:n+s.na]
	return &s.ents[len(s.ents)-1], s.accs[n : n+s.na : n+s.na]
}

// decodeOwned decodes a payload of n entries whose keys share all (one
// string copy of the payload), calling put for the groups own accepts and
// passing over the others: the cores of a restore each read every chunk
// and keep their share of the groups.
func (p *Plan) decodeOwned(payload []byte, all string, n uint32, sl *slab, own func(entryKey) (int, uint64, bool), put func(int, uint64, *entry)) error {
	if uint64(n) > uint64(len(payload)) {
		return fmt.Errorf("%d entries cannot fit in %d bytes: %w", n, len(payload), errCorrupt)
	}
	d := &decoder{b: payload, all: all, n: len(payload)}
	for range n {
		k := d.key()
		part, h, mine := own(k)
		if !mine || d.err != nil {
			d.skipAccs(p)
		} else {
			e, accs := sl.next()
			e.key = k
			d.accs(p, e, accs)
			if d.err == nil {
				put(part, h, e)
			}
		}
		if d.err != nil {
			return d.err
		}
	}
	if len(d.b) != 0 {
		return fmt.Errorf("%d bytes after the last entry: %w", len(d.b), errCorrupt)
	}
	return nil
}

// decodeEntries decodes a whole payload of n entries, calling put for
// each. The entries and their accumulators are carved from two slabs per
// payload: a restore of a million groups makes thousands of allocations,
// not millions (and the collector has as few objects to trace).
func (p *Plan) decodeEntries(payload []byte, n uint32, put func(entryKey, *entry)) error {
	if uint64(n) > uint64(len(payload)) {
		return fmt.Errorf("%d entries cannot fit in %d bytes: %w", n, len(payload), errCorrupt)
	}
	d := newDecoder(payload)
	na := len(p.aggregates)
	ents := make([]entry, n)
	accs := make([]acc, int(n)*na)
	for i := range ents {
		k := d.entry(p, &ents[i], accs[i*na:(i+1)*na:(i+1)*na])
		if d.err != nil {
			return d.err
		}
		ents[i].key = k
		put(k, &ents[i])
	}
	if len(d.b) != 0 {
		return fmt.Errorf("%d bytes after the last entry: %w", len(d.b), errCorrupt)
	}
	return nil
}
