package partlog

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// FuzzDecodeBatch: DecodeBatch never panics, and a frame that decodes
// re-encodes to identical bytes (the encoding is canonical, which the
// rolling checksum relies on). Random mutations almost never keep the CRC
// valid, so each input is also tried with its CRC recomputed: that drives the
// fuzzer through the record parser, not just the CRC check.
func FuzzDecodeBatch(f *testing.F) {
	// Seeds are kept small on purpose: the fuzzer minimises every new
	// interesting input, and minimisation cost grows steeply with input size.
	seeds := [][]byte{
		mustFrame(f, 1, 0, []Record{{}}),
		mustFrame(f, 3, 100, testRecords(2, 2, 1_700_000_000_000)),
		mustFrame(f, 1<<40, MaxOffset-2, []Record{{ProducerID: 1 << 63, TimestampMs: -1}, {Key: []byte("k"), TimestampMs: 1 << 62}}),
		mustFrame(f, 2, 7, []Record{{Key: []byte("k"), Headers: []Header{{Key: []byte("h"), Value: []byte("v")}}}, {}}),
	}
	for _, s := range seeds {
		f.Add(s)
		// Mutations: truncations, a flipped byte in header and body, a
		// grown count, a zeroed tail.
		f.Add(s[:len(s)-1])
		f.Add(s[:FrameHeaderSize])
		for _, i := range []int{hType, hFrameLen, hCount, hMaxTs, FrameHeaderSize, len(s) - 1} {
			m := bytes.Clone(s)
			m[i] ^= 0x41
			f.Add(m)
		}
		m := bytes.Clone(s)
		binary.LittleEndian.PutUint32(m[hCount:], binary.LittleEndian.Uint32(m[hCount:])+1)
		f.Add(m)
		m = bytes.Clone(s)
		clear(m[FrameHeaderSize:])
		f.Add(m)
	}
	f.Add([]byte{})
	f.Add(make([]byte, FrameHeaderSize))

	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode(t, data)
		if len(data) >= FrameHeaderSize {
			fixed := bytes.Clone(data)
			binary.LittleEndian.PutUint32(fixed[hCRC:], frameCRC(fixed))
			checkDecode(t, fixed)
		}
	})
}

func checkDecode(t *testing.T, data []byte) {
	orig := bytes.Clone(data)
	h, recs, err := DecodeBatch(data)
	if !bytes.Equal(orig, data) {
		t.Fatal("DecodeBatch modified its input")
	}
	_, verr := validateFrame(data)
	if (err == nil) != (verr == nil) {
		t.Fatalf("DecodeBatch err %v but validateFrame err %v", err, verr)
	}
	if err != nil {
		return
	}
	if int(h.Count) != len(recs) || int(h.FrameLen) != len(data) {
		t.Fatalf("header %+v with %d records for %d bytes", h, len(recs), len(data))
	}
	again, err := AppendBatch(nil, h.Epoch, h.BaseOffset, recs)
	if err != nil {
		t.Fatalf("re-encoding a decoded frame failed: %v", err)
	}
	if !bytes.Equal(again, data) {
		t.Fatalf("re-encoding differs:\n got %x\nwant %x", again, data)
	}
}
