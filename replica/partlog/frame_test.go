package partlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"testing"
)

func testRecords(n, valueSize int, ts0 int64) []Record {
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = Record{
			TimestampMs: ts0 + int64(i%7) - 3, // not monotonic on purpose
			ProducerID:  uint64(i % 3),
			Sequence:    uint64(i) * 1000,
			Key:         []byte{byte(i), 'k'},
			Value:       bytes.Repeat([]byte{byte(i)}, valueSize),
		}
	}
	return recs
}

func mustFrame(t testing.TB, epoch, base uint64, recs []Record) []byte {
	t.Helper()
	f, err := AppendBatch(nil, epoch, base, recs)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestCodecRoundTrip(t *testing.T) {
	tests := []struct {
		name  string
		epoch uint64
		base  uint64
		recs  []Record
	}{
		{"one empty record", 1, 0, []Record{{}}},
		{"typical", 7, 1000, testRecords(64, 100, 1_700_000_000_000)},
		{"negative timestamps", 1, 5, []Record{{TimestampMs: -5}, {TimestampMs: -100}, {TimestampMs: 3}}},
		{"timestamp extremes wrap", 1, 0, []Record{{TimestampMs: math.MaxInt64}, {TimestampMs: math.MinInt64}, {TimestampMs: 0}}},
		{"big varints", math.MaxUint64, MaxOffset - 2, []Record{
			{ProducerID: math.MaxUint64, Sequence: math.MaxUint64, Key: []byte("k")},
			{ProducerID: 1 << 63, Value: []byte("v")},
		}},
		{"max record", 1, 0, []Record{{Key: make([]byte, 10), Value: make([]byte, MaxRecordBytes-10)}}},
		{"headers on some records", 1, 0, []Record{
			{Key: []byte("k"), Headers: []Header{{Key: []byte("trace"), Value: []byte("abc")}, {Key: []byte("trace"), Value: nil}}},
			{Value: []byte("v")},
			{Headers: []Header{{Key: nil, Value: []byte("anonymous")}}},
		}},
		{"max record with headers", 1, 0, []Record{{Key: make([]byte, 10), Value: make([]byte, MaxRecordBytes-30), Headers: []Header{{Key: make([]byte, 5), Value: make([]byte, 15)}}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prefix := []byte("prefix")
			out, err := AppendBatch(append([]byte(nil), prefix...), tc.epoch, tc.base, tc.recs)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out[:len(prefix)], prefix) {
				t.Fatal("AppendBatch clobbered dst")
			}
			frame := out[len(prefix):]
			h, recs, err := DecodeBatch(frame)
			if err != nil {
				t.Fatal(err)
			}
			if h.Epoch != tc.epoch || h.BaseOffset != tc.base || int(h.Count) != len(tc.recs) ||
				int(h.FrameLen) != len(frame) || h.Type != FrameTypeBatch || h.End() != tc.base+uint64(len(tc.recs)) {
				t.Fatalf("header %+v", h)
			}
			maxTs := tc.recs[0].TimestampMs
			for i, r := range recs {
				want := tc.recs[i]
				maxTs = max(maxTs, want.TimestampMs)
				if r.Offset != tc.base+uint64(i) || r.TimestampMs != want.TimestampMs || r.ProducerID != want.ProducerID ||
					r.Sequence != want.Sequence || !bytes.Equal(r.Key, want.Key) || !bytes.Equal(r.Value, want.Value) ||
					len(r.Headers) != len(want.Headers) {
					t.Fatalf("record %d: got %+v want %+v", i, r, want)
				}
				for j, hd := range r.Headers {
					if !bytes.Equal(hd.Key, want.Headers[j].Key) || !bytes.Equal(hd.Value, want.Headers[j].Value) {
						t.Fatalf("record %d header %d: got %q=%q want %q=%q", i, j, hd.Key, hd.Value, want.Headers[j].Key, want.Headers[j].Value)
					}
				}
			}
			if h.FirstTimestamp != tc.recs[0].TimestampMs || h.MaxTimestamp != maxTs {
				t.Fatalf("timestamps %d %d", h.FirstTimestamp, h.MaxTimestamp)
			}
			again := mustFrame(t, h.Epoch, h.BaseOffset, recs)
			if !bytes.Equal(again, frame) {
				t.Fatal("re-encoding differs")
			}
			hh, err := DecodeHeader(frame)
			if err != nil || hh != h {
				t.Fatalf("DecodeHeader = %+v, %v", hh, err)
			}
		})
	}
}

func TestAppendBatchLimits(t *testing.T) {
	big := make([]byte, MaxRecordBytes/2+1)
	tests := []struct {
		name string
		base uint64
		recs []Record
		want error
	}{
		{"empty batch", 0, nil, ErrBadFrame},
		{"too many records", 0, make([]Record, MaxBatchRecords+1), ErrFrameTooLarge},
		{"record too large", 0, []Record{{Key: big, Value: big}}, ErrFrameTooLarge},
		{"value alone too large", 0, []Record{{Value: make([]byte, MaxRecordBytes+1)}}, ErrFrameTooLarge},
		{"frame too large", 0, func() []Record {
			r := make([]Record, 17)
			for i := range r {
				r[i].Value = make([]byte, MaxRecordBytes)
			}
			return r
		}(), ErrFrameTooLarge},
		{"offset overflow", MaxOffset, []Record{{}}, ErrBadFrame},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := []byte("keep")
			out, err := AppendBatch(dst, 1, tc.base, tc.recs)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if string(out) != "keep" {
				t.Fatal("dst changed on error")
			}
		})
	}
}

// rawFrame builds a frame from explicit header fields and record bytes with
// a correct CRC, so record-level checks are reached.
type rawHeader struct {
	version, typ      byte
	flags             uint16
	epoch, base       uint64
	count             uint32
	firstTs, maxTs    int64
	frameLenDelta     int // added to the true length
	badCRC            bool
	magic             [4]byte
	noFixMagic        bool
	truncateTo        int // if > 0, cut the final buffer
	appendAfterFrame  []byte
	overrideFrameLen  uint32
	useOverrideLength bool
}

func defaultRaw() rawHeader {
	return rawHeader{version: FrameVersion, typ: byte(FrameTypeBatch), epoch: 1, base: 10, count: 1, magic: frameMagic}
}

func buildRaw(h rawHeader, body []byte) []byte {
	b := make([]byte, FrameHeaderSize, FrameHeaderSize+len(body))
	copy(b, h.magic[:])
	b[hVersion] = h.version
	b[hType] = h.typ
	binary.LittleEndian.PutUint16(b[hFlags:], h.flags)
	n := uint32(FrameHeaderSize + len(body) + h.frameLenDelta)
	if h.useOverrideLength {
		n = h.overrideFrameLen
	}
	binary.LittleEndian.PutUint32(b[hFrameLen:], n)
	binary.LittleEndian.PutUint64(b[hEpoch:], h.epoch)
	binary.LittleEndian.PutUint64(b[hBase:], h.base)
	binary.LittleEndian.PutUint32(b[hCount:], h.count)
	binary.LittleEndian.PutUint64(b[hFirstTs:], uint64(h.firstTs))
	binary.LittleEndian.PutUint64(b[hMaxTs:], uint64(h.maxTs))
	b = append(b, body...)
	crc := frameCRC(b)
	if h.badCRC {
		crc++
	}
	binary.LittleEndian.PutUint32(b[hCRC:], crc)
	b = append(b, h.appendAfterFrame...)
	if h.truncateTo > 0 {
		b = b[:h.truncateTo]
	}
	return b
}

// rec encodes one record body with explicit varint bytes.
func rec(fields ...[]byte) []byte { return bytes.Join(fields, nil) }
func uv(x uint64) []byte          { return binary.AppendUvarint(nil, x) }

// TestFramesWithoutHeadersAreUnchanged: records without headers encode
// exactly as before headers existed (flags 0, no header counts), so every
// frame already on disk is still canonical, and the flag is set only when
// some record has a header.
func TestFramesWithoutHeadersAreUnchanged(t *testing.T) {
	okRec := rec(uv(0), uv(0), uv(0), uv(0), uv(1), []byte("k"), uv(1), []byte("v"))
	want := buildRaw(defaultRaw(), okRec)
	if got := mustFrame(t, 1, 10, []Record{{Key: []byte("k"), Value: []byte("v")}}); !bytes.Equal(got, want) {
		t.Fatalf("a record without headers encodes as\n%x\nnot as before headers\n%x", got, want)
	}
	withHeaders := mustFrame(t, 1, 10, []Record{{Key: []byte("k"), Value: []byte("v"), Headers: []Header{{Key: []byte("h"), Value: []byte("x")}}}})
	h := defaultRaw()
	h.flags = FlagHeaders
	if want := buildRaw(h, rec(okRec, uv(1), uv(1), []byte("h"), uv(1), []byte("x"))); !bytes.Equal(withHeaders, want) {
		t.Fatalf("a record with a header encodes as\n%x\nwant\n%x", withHeaders, want)
	}
}

func TestHeaderLimits(t *testing.T) {
	over := []Record{{Key: make([]byte, 10), Value: make([]byte, MaxRecordBytes-20), Headers: []Header{{Key: make([]byte, 5), Value: make([]byte, 6)}}}}
	if _, err := AppendBatch(nil, 1, 0, over); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("key+value+headers over MaxRecordBytes: %v", err)
	}
	many := make([]Record, 2)
	many[0].Headers = make([]Header, MaxBatchHeaders)
	many[1].Headers = make([]Header, 1)
	if _, err := AppendBatch(nil, 1, 0, many); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("more than MaxBatchHeaders headers in a batch: %v", err)
	}
	// Decoding bounds the headers a record's bytes may carry too.
	h := defaultRaw()
	h.flags = FlagHeaders
	big := rec(uv(0), uv(0), uv(0), uv(0), uv(0), uv(MaxRecordBytes), make([]byte, MaxRecordBytes), uv(1), uv(1), []byte("h"), uv(0))
	if _, _, err := DecodeBatch(buildRaw(h, big)); !errors.Is(err, ErrBadFrame) {
		t.Fatalf("a header past MaxRecordBytes decoded: %v", err)
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	okRec := rec(uv(0), uv(0), uv(0), uv(0), uv(1), []byte("k"), uv(1), []byte("v"))
	valid := buildRaw(defaultRaw(), okRec)
	if _, _, err := DecodeBatch(valid); err != nil {
		t.Fatalf("baseline frame invalid: %v", err)
	}
	with := func(f func(*rawHeader)) rawHeader { h := defaultRaw(); f(&h); return h }
	tests := []struct {
		name  string
		frame []byte
		want  error
	}{
		{"empty", nil, ErrBadFrame},
		{"short header", valid[:FrameHeaderSize-1], ErrBadFrame},
		{"zero header", make([]byte, 64), ErrBadFrame},
		{"bad magic", buildRaw(with(func(h *rawHeader) { h.magic = [4]byte{'C', 'T', 'N', 'X'} }), okRec), ErrBadFrame},
		{"bad version", buildRaw(with(func(h *rawHeader) { h.version = 2 }), okRec), ErrBadFrame},
		{"type never written", buildRaw(with(func(h *rawHeader) { h.typ = 0 }), okRec), ErrBadFrame},
		{"unknown type", buildRaw(with(func(h *rawHeader) { h.typ = 9 }), okRec), ErrBadFrame},
		{"unknown flag", buildRaw(with(func(h *rawHeader) { h.flags = 2 }), okRec), ErrBadFrame},
		{"headers flag, record without a header count", buildRaw(with(func(h *rawHeader) { h.flags = FlagHeaders }), okRec), ErrBadFrame},
		{"headers flag on a batch without headers", buildRaw(with(func(h *rawHeader) { h.flags = FlagHeaders }), rec(okRec, uv(0))), ErrBadFrame},
		{"header count beyond the frame", buildRaw(with(func(h *rawHeader) { h.flags = FlagHeaders }), rec(okRec, uv(3), uv(0), uv(0))), ErrBadFrame},
		{"header key beyond the frame", buildRaw(with(func(h *rawHeader) { h.flags = FlagHeaders }), rec(okRec, uv(1), uv(9), []byte("ab"), uv(0))), ErrBadFrame},
		{"header value beyond the frame", buildRaw(with(func(h *rawHeader) { h.flags = FlagHeaders }), rec(okRec, uv(1), uv(1), []byte("a"), uv(5), []byte("b"))), ErrBadFrame},
		{"header non-minimal varint", buildRaw(with(func(h *rawHeader) { h.flags = FlagHeaders }), rec(okRec, []byte{0x81, 0x00}, uv(0), uv(0))), ErrBadFrame},
		{"frame length over max", buildRaw(with(func(h *rawHeader) {
			h.useOverrideLength, h.overrideFrameLen = true, MaxFrameBytes+1
		}), okRec), ErrFrameTooLarge},
		{"frame length huge", buildRaw(with(func(h *rawHeader) {
			h.useOverrideLength, h.overrideFrameLen = true, math.MaxUint32
		}), okRec), ErrFrameTooLarge},
		{"frame length longer than buffer", buildRaw(with(func(h *rawHeader) { h.frameLenDelta = 1 }), okRec), ErrBadFrame},
		{"frame length shorter than buffer", buildRaw(with(func(h *rawHeader) { h.frameLenDelta = -1 }), okRec), ErrBadFrame},
		{"buffer longer than frame", buildRaw(with(func(h *rawHeader) { h.appendAfterFrame = []byte{0} }), okRec), ErrBadFrame},
		{"count zero", buildRaw(with(func(h *rawHeader) { h.count = 0 }), okRec), ErrBadFrame},
		{"count over max", buildRaw(with(func(h *rawHeader) { h.count = MaxBatchRecords + 1 }), okRec), ErrBadFrame},
		{"count too big for length", buildRaw(with(func(h *rawHeader) { h.count = 3 }), okRec), ErrBadFrame},
		{"offset overflow", buildRaw(with(func(h *rawHeader) { h.base = MaxOffset }), okRec), ErrBadFrame},
		{"max timestamp below first", buildRaw(with(func(h *rawHeader) { h.firstTs, h.maxTs = 5, 4 }), okRec), ErrBadFrame},
		{"crc mismatch", buildRaw(with(func(h *rawHeader) { h.badCRC = true }), okRec), ErrBadFrame},
		{"offset delta not index", buildRaw(defaultRaw(),
			rec(uv(1), uv(0), uv(0), uv(0), uv(1), []byte("k"), uv(1), []byte("v"))), ErrBadFrame},
		{"non-minimal varint", buildRaw(defaultRaw(),
			rec(uv(0), uv(0), []byte{0x80, 0x00}, uv(0), uv(1), []byte("k"), []byte("v"))), ErrBadFrame},
		{"varint overflow", buildRaw(defaultRaw(),
			rec(uv(0), uv(0), bytes.Repeat([]byte{0xff}, 9), []byte{0x02}, uv(0), uv(0), uv(0))), ErrBadFrame},
		{"varint too long", buildRaw(defaultRaw(),
			rec(uv(0), uv(0), bytes.Repeat([]byte{0x80}, 11), []byte{0x01})), ErrBadFrame},
		{"truncated varint", buildRaw(defaultRaw(),
			rec(uv(0), uv(0), uv(0), uv(0), uv(0), []byte{0x80})), ErrBadFrame},
		{"first record timestamp delta", buildRaw(with(func(h *rawHeader) { h.maxTs = 1 }),
			rec(uv(0), uv(zigzag(1)), uv(0), uv(0), uv(0), uv(0))), ErrBadFrame},
		{"max timestamp mismatch", buildRaw(with(func(h *rawHeader) { h.maxTs = 9 }), okRec), ErrBadFrame},
		{"key length beyond frame", buildRaw(defaultRaw(),
			rec(uv(0), uv(0), uv(0), uv(0), uv(200), []byte("k"), uv(1), []byte("v"))), ErrBadFrame},
		{"key length over max", buildRaw(defaultRaw(),
			rec(uv(0), uv(0), uv(0), uv(0), uv(MaxRecordBytes+1), []byte("k"), uv(1), []byte("v"))), ErrBadFrame},
		{"key+value over max", buildRaw(defaultRaw(),
			rec(uv(0), uv(0), uv(0), uv(0), uv(1), []byte("k"), uv(MaxRecordBytes), []byte("v"))), ErrBadFrame},
		{"value length beyond frame", buildRaw(defaultRaw(),
			rec(uv(0), uv(0), uv(0), uv(0), uv(1), []byte("k"), uv(5), []byte("v"))), ErrBadFrame},
		{"trailing bytes", buildRaw(defaultRaw(), append(append([]byte(nil), okRec...), 0)), ErrBadFrame},
		{"fewer records than count", buildRaw(with(func(h *rawHeader) { h.count = 2 }),
			append(append([]byte(nil), okRec...), 0, 0, 0, 0, 0)), ErrBadFrame},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, recs, err := DecodeBatch(tc.frame)
			if !errors.Is(err, tc.want) {
				t.Fatalf("DecodeBatch err = %v, want %v", err, tc.want)
			}
			if recs != nil || h != (BatchHeader{}) {
				t.Fatal("values returned with an error")
			}
			if _, err := validateFrame(tc.frame); !errors.Is(err, tc.want) {
				t.Fatalf("validateFrame err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestReadUvarintCanonical(t *testing.T) {
	for _, x := range []uint64{0, 1, 127, 128, 300, 1<<35 + 7, math.MaxUint64} {
		b := binary.AppendUvarint(nil, x)
		got, rest, ok := readUvarint(append(b, 0xAA))
		if !ok || got != x || len(rest) != 1 || uvarintLen(x) != len(b) {
			t.Fatalf("%d: got %d ok %v rest %d", x, got, ok, len(rest))
		}
	}
	for _, bad := range [][]byte{{}, {0x80}, {0x80, 0x00}, {0xff, 0x80, 0x00}, append(bytes.Repeat([]byte{0xff}, 9), 0x02)} {
		if _, _, ok := readUvarint(bad); ok {
			t.Fatalf("%x accepted", bad)
		}
	}
}

func TestCodecNoAllocs(t *testing.T) {
	recs := testRecords(64, 1024, 1)
	frame := mustFrame(t, 1, 0, recs)
	dst := make([]byte, 0, len(frame))
	if n := testing.AllocsPerRun(50, func() { _, _ = AppendBatch(dst[:0], 1, 0, recs) }); n != 0 {
		t.Fatalf("AppendBatch into a large enough dst allocates %v times", n)
	}
	if n := testing.AllocsPerRun(50, func() { _, _ = validateFrame(frame) }); n != 0 {
		t.Fatalf("validateFrame allocates %v times", n)
	}
	if n := testing.AllocsPerRun(50, func() { _, _, _ = DecodeBatch(frame) }); n != 1 {
		t.Fatalf("DecodeBatch allocates %v times, want 1 (the record slice)", n)
	}
}

func TestRollChecksumDefinition(t *testing.T) {
	for _, c := range [][2]uint32{{0, 0}, {0, 0xdeadbeef}, {0x12345678, 0x9abcdef0}, {math.MaxUint32, 1}} {
		var b [8]byte
		binary.LittleEndian.PutUint32(b[:4], c[0])
		binary.LittleEndian.PutUint32(b[4:], c[1])
		if got, want := rollChecksum(c[0], c[1]), crc32.Checksum(b[:], castagnoli); got != want {
			t.Fatalf("rollChecksum(%08x, %08x) = %08x, want %08x", c[0], c[1], got, want)
		}
	}
}

// TestReframe: a sender's frame (epoch 0, offset 0) given an epoch and base
// offset in place is byte for byte the frame the head would have encoded,
// and frames Reframe cannot place are refused untouched.
func TestReframe(t *testing.T) {
	recs := testRecords(5, 100, 1_700_000_000_000)
	frame := mustFrame(t, 0, 0, recs)
	if err := Reframe(frame, 7, 1000); err != nil {
		t.Fatal(err)
	}
	if want := mustFrame(t, 7, 1000, recs); !bytes.Equal(frame, want) {
		t.Fatal("reframed frame differs from one encoded at epoch 7, offset 1000")
	}
	if _, _, err := DecodeBatch(frame); err != nil {
		t.Fatalf("reframed frame does not verify: %v", err)
	}
	for name, f := range map[string]func() ([]byte, uint64){
		"base offset overflows": func() ([]byte, uint64) { return mustFrame(t, 0, 0, recs), MaxOffset - 2 },
		"truncated":             func() ([]byte, uint64) { f := mustFrame(t, 0, 0, recs); return f[:len(f)-1], 0 },
		"not a frame":           func() ([]byte, uint64) { return make([]byte, FrameHeaderSize), 0 },
	} {
		t.Run(name, func(t *testing.T) {
			b, base := f()
			orig := bytes.Clone(b)
			if err := Reframe(b, 1, base); !errors.Is(err, ErrBadFrame) {
				t.Fatalf("err = %v, want ErrBadFrame", err)
			}
			if !bytes.Equal(b, orig) {
				t.Fatal("a refused frame was changed")
			}
		})
	}
}
