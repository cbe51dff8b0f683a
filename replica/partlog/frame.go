package partlog

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
)

// Frame layout constants (docs/storage-format.md §3).
const (
	// FrameHeaderSize is the fixed size of a batch frame header.
	FrameHeaderSize = 52
	// FrameVersion is the only frame version this package reads and writes.
	FrameVersion = 1
	// MaxBatchRecords bounds the record count of one batch. It bounds the
	// []Record allocation of DecodeBatch (65536 × 80 bytes = 5 MiB) even for a
	// hostile 16 MiB frame of minimal records.
	MaxBatchRecords = 1 << 16
	// MaxOffset is the largest end offset: offsets stay representable as int64
	// for clients that use signed offsets.
	MaxOffset = math.MaxInt64

	// MaxRecordOverhead bounds a record's encoding beyond its key and value
	// in a batch of at most MaxBatchRecords: six varints of at most
	// 3 + 10 + 10 + 10 + 3 + 3 bytes (§3.3). FrameHeaderSize plus, per
	// record, its key, value and this is room enough for the frame.
	MaxRecordOverhead = 39

	// MaxBatchHeaders bounds the headers of one batch, all records
	// together: it bounds DecodeBatch's []Header allocations (65536 × 48
	// bytes = 3 MiB) as MaxBatchRecords bounds its []Record.
	MaxBatchHeaders = 1 << 16

	// FlagHeaders is the header flag of a frame whose records carry
	// headers (§3.3): each record then ends with its header count and
	// headers. It is set exactly when some record has a header, so a
	// frame without headers is byte for byte a frame of before headers.
	FlagHeaders uint16 = 1

	// minRecordBytes is the smallest encoded record: six one-byte varints and
	// empty key and value. 6·count ≤ body length is checked before allocating.
	minRecordBytes = 6
	// maxVarintLen is the longest uvarint encoding of a uint64.
	maxVarintLen = binary.MaxVarintLen64
)

// FrameType is the type byte of a frame header. Zero is reserved to mean
// "never written", so a zero-filled region never decodes as a frame.
type FrameType uint8

const (
	FrameTypeUnwritten FrameType = 0
	FrameTypeBatch     FrameType = 1
)

// frameMagic is "CTNB" as it appears on disk.
var frameMagic = [4]byte{'C', 'T', 'N', 'B'}

// Header field offsets.
const (
	hMagic    = 0
	hVersion  = 4
	hType     = 5
	hFlags    = 6
	hFrameLen = 8
	hCRC      = 12
	hEpoch    = 16
	hBase     = 24
	hCount    = 32
	hFirstTs  = 36
	hMaxTs    = 44
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// frameCRC is the CRC32C of a frame with its CRC field skipped (not zeroed):
// bytes [0,12) then [16,len). frame must hold at least FrameHeaderSize bytes.
func frameCRC(frame []byte) uint32 {
	c := crc32.Update(0, castagnoli, frame[:hCRC])
	return crc32.Update(c, castagnoli, frame[hCRC+4:])
}

// AppendBatch encodes records as one frame appended to dst (records'
// Offset fields are ignored: they follow from baseOffset).
func AppendBatch(dst []byte, epoch, baseOffset uint64, recs []Record) ([]byte, error) {
	n := len(recs)
	if n == 0 {
		return dst, fmt.Errorf("%w: empty batch", ErrBadFrame)
	}
	if n > MaxBatchRecords {
		return dst, fmt.Errorf("%w: %d records, max %d", ErrFrameTooLarge, n, MaxBatchRecords)
	}
	if baseOffset > MaxOffset-uint64(n) {
		return dst, fmt.Errorf("%w: base offset %d + %d records overflows", ErrBadFrame, baseOffset, n)
	}
	// Size the frame exactly first: limits are checked before dst grows, and
	// dst grows once, so encoding does no per-record allocation.
	first := recs[0].TimestampMs
	maxTs := first
	size := FrameHeaderSize
	headers := 0
	for i := range recs {
		headers += len(recs[i].Headers)
	}
	if headers > MaxBatchHeaders {
		return dst, fmt.Errorf("%w: %d headers, max %d in one batch", ErrFrameTooLarge, headers, MaxBatchHeaders)
	}
	for i := range recs {
		r := &recs[i]
		if n := RecordBytes(r); n > MaxRecordBytes {
			return dst, fmt.Errorf("%w: record %d key+value+headers %d bytes, max %d",
				ErrFrameTooLarge, i, n, MaxRecordBytes)
		}
		maxTs = max(maxTs, r.TimestampMs)
		size += uvarintLen(uint64(i)) + uvarintLen(zigzag(r.TimestampMs-first)) +
			uvarintLen(r.ProducerID) + uvarintLen(r.Sequence) +
			uvarintLen(uint64(len(r.Key))) + len(r.Key) +
			uvarintLen(uint64(len(r.Value))) + len(r.Value)
		if headers > 0 {
			size += EncodedHeadersLen(r.Headers)
		}
		if size > MaxFrameBytes {
			return dst, fmt.Errorf("%w: more than %d bytes at record %d", ErrFrameTooLarge, MaxFrameBytes, i)
		}
	}

	start := len(dst)
	if cap(dst)-start < size {
		grown := make([]byte, start, start+size)
		copy(grown, dst)
		dst = grown
	}
	var h [FrameHeaderSize]byte
	copy(h[hMagic:], frameMagic[:])
	h[hVersion] = FrameVersion
	h[hType] = byte(FrameTypeBatch)
	binary.LittleEndian.PutUint32(h[hFrameLen:], uint32(size))
	binary.LittleEndian.PutUint64(h[hEpoch:], epoch)
	binary.LittleEndian.PutUint64(h[hBase:], baseOffset)
	binary.LittleEndian.PutUint32(h[hCount:], uint32(n))
	binary.LittleEndian.PutUint64(h[hFirstTs:], uint64(first))
	binary.LittleEndian.PutUint64(h[hMaxTs:], uint64(maxTs))
	if headers > 0 {
		binary.LittleEndian.PutUint16(h[hFlags:], FlagHeaders)
	}
	dst = append(dst, h[:]...)
	for i := range recs {
		r := &recs[i]
		dst = binary.AppendUvarint(dst, uint64(i))
		dst = binary.AppendUvarint(dst, zigzag(r.TimestampMs-first))
		dst = binary.AppendUvarint(dst, r.ProducerID)
		dst = binary.AppendUvarint(dst, r.Sequence)
		dst = binary.AppendUvarint(dst, uint64(len(r.Key)))
		dst = append(dst, r.Key...)
		dst = binary.AppendUvarint(dst, uint64(len(r.Value)))
		dst = append(dst, r.Value...)
		if headers > 0 {
			dst = binary.AppendUvarint(dst, uint64(len(r.Headers)))
			for _, hd := range r.Headers {
				dst = binary.AppendUvarint(dst, uint64(len(hd.Key)))
				dst = append(dst, hd.Key...)
				dst = binary.AppendUvarint(dst, uint64(len(hd.Value)))
				dst = append(dst, hd.Value...)
			}
		}
	}
	frame := dst[start:]
	binary.LittleEndian.PutUint32(frame[hCRC:], frameCRC(frame))
	return dst, nil
}

// RecordBytes is what counts toward MaxRecordBytes of a record: its key,
// value, and every header's key and value.
func RecordBytes(r *Record) int {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// EncodedHeadersLen is the size of a record's headers in a frame with
// FlagHeaders: the count, then each key and value with its length.
func EncodedHeadersLen(hs []Header) int {
	n := uvarintLen(uint64(len(hs)))
	for _, h := range hs {
		n += uvarintLen(uint64(len(h.Key))) + len(h.Key) + uvarintLen(uint64(len(h.Value))) + len(h.Value)
	}
	return n
}

// DecodeHeader validates and decodes the header of the frame at the start of
// b (magic, version, type, lengths within bounds) without checking the CRC.
func DecodeHeader(b []byte) (BatchHeader, error) {
	if len(b) < FrameHeaderSize {
		return BatchHeader{}, fmt.Errorf("%w: %d bytes, header needs %d", ErrBadFrame, len(b), FrameHeaderSize)
	}
	if [4]byte(b[hMagic:hMagic+4]) != frameMagic {
		if b[hType] == byte(FrameTypeUnwritten) && allZero(b[:FrameHeaderSize]) {
			return BatchHeader{}, fmt.Errorf("%w: never written (zero header)", ErrBadFrame)
		}
		return BatchHeader{}, fmt.Errorf("%w: bad magic %x", ErrBadFrame, b[hMagic:hMagic+4])
	}
	if b[hVersion] != FrameVersion {
		return BatchHeader{}, fmt.Errorf("%w: version %d, want %d", ErrBadFrame, b[hVersion], FrameVersion)
	}
	h := BatchHeader{
		Type:           FrameType(b[hType]),
		Epoch:          binary.LittleEndian.Uint64(b[hEpoch:]),
		BaseOffset:     binary.LittleEndian.Uint64(b[hBase:]),
		Count:          binary.LittleEndian.Uint32(b[hCount:]),
		FirstTimestamp: int64(binary.LittleEndian.Uint64(b[hFirstTs:])),
		MaxTimestamp:   int64(binary.LittleEndian.Uint64(b[hMaxTs:])),
		FrameLen:       binary.LittleEndian.Uint32(b[hFrameLen:]),
		CRC:            binary.LittleEndian.Uint32(b[hCRC:]),
		Flags:          binary.LittleEndian.Uint16(b[hFlags:]),
	}
	switch {
	case h.Type == FrameTypeUnwritten:
		return BatchHeader{}, fmt.Errorf("%w: frame type 0 (never written)", ErrBadFrame)
	case h.Type != FrameTypeBatch:
		return BatchHeader{}, fmt.Errorf("%w: unknown frame type %d", ErrBadFrame, h.Type)
	case binary.LittleEndian.Uint16(b[hFlags:])&^FlagHeaders != 0:
		return BatchHeader{}, fmt.Errorf("%w: unknown flags %#x", ErrBadFrame, binary.LittleEndian.Uint16(b[hFlags:]))
	case h.FrameLen > MaxFrameBytes:
		return BatchHeader{}, fmt.Errorf("%w: frame length %d, max %d", ErrFrameTooLarge, h.FrameLen, MaxFrameBytes)
	case h.Count == 0 || h.Count > MaxBatchRecords:
		return BatchHeader{}, fmt.Errorf("%w: record count %d not in [1,%d]", ErrBadFrame, h.Count, MaxBatchRecords)
	case uint64(h.FrameLen) < FrameHeaderSize+minRecordBytes*uint64(h.Count):
		return BatchHeader{}, fmt.Errorf("%w: frame length %d too small for %d records", ErrBadFrame, h.FrameLen, h.Count)
	case h.BaseOffset > MaxOffset-uint64(h.Count):
		return BatchHeader{}, fmt.Errorf("%w: base offset %d + count %d overflows", ErrBadFrame, h.BaseOffset, h.Count)
	case h.MaxTimestamp < h.FirstTimestamp:
		return BatchHeader{}, fmt.Errorf("%w: max timestamp %d < first timestamp %d", ErrBadFrame, h.MaxTimestamp, h.FirstTimestamp)
	}
	return h, nil
}

// DecodeBatch validates the whole frame (header and CRC32C) and returns its
// header and records (Key and Value alias frame). Never panics on any input.
func DecodeBatch(frame []byte) (BatchHeader, []Record, error) {
	h, err := checkFrame(frame)
	if err != nil {
		return BatchHeader{}, nil, err
	}
	// Count was bounded by DecodeHeader (≤ MaxBatchRecords and ≤ body/6) and
	// the CRC matched, so this allocation is bounded and not attacker-sized.
	recs := make([]Record, h.Count)
	if err := walkRecords(frame, h, recs); err != nil {
		return BatchHeader{}, nil, err
	}
	return h, recs, nil
}

// DecodeBatchInto is DecodeBatch appending the records to recs, so that a
// caller on a hot path can reuse one slice across frames.
func DecodeBatchInto(frame []byte, recs []Record) (BatchHeader, []Record, error) {
	h, err := checkFrame(frame)
	if err != nil {
		return BatchHeader{}, recs, err
	}
	n := len(recs)
	recs = append(recs, make([]Record, h.Count)...)
	if err := walkRecords(frame, h, recs[n:]); err != nil {
		return BatchHeader{}, recs[:n], err
	}
	return h, recs, nil
}

// checkFrame decodes the header and verifies length and CRC, without parsing
// records.
func checkFrame(frame []byte) (BatchHeader, error) {
	h, err := DecodeHeader(frame)
	if err != nil {
		return BatchHeader{}, err
	}
	if uint64(len(frame)) != uint64(h.FrameLen) {
		return BatchHeader{}, fmt.Errorf("%w: %d bytes given, header says %d", ErrBadFrame, len(frame), h.FrameLen)
	}
	if c := frameCRC(frame); c != h.CRC {
		return BatchHeader{}, fmt.Errorf("%w: crc32c %08x, header says %08x", ErrBadFrame, c, h.CRC)
	}
	return h, nil
}

// validateFrame is DecodeBatch without allocating: the Append path.
func validateFrame(frame []byte) (BatchHeader, error) {
	h, err := checkFrame(frame)
	if err != nil {
		return BatchHeader{}, err
	}
	return h, walkRecords(frame, h, nil)
}

// walkRecords parses the records of a frame whose header and length were
// checked, filling recs if non-nil. Every length is checked against what is
// left before it is used, so no input can make it index out of range.
func walkRecords(frame []byte, h BatchHeader, recs []Record) error {
	b := frame[FrameHeaderSize:]
	maxTs := h.FirstTimestamp
	withHeaders := h.Flags&FlagHeaders != 0
	// headers holds every record's headers; each record's are a window of
	// it (a reallocation leaves earlier windows on the old array, intact).
	var headers []Header
	total := 0
	for i := uint32(0); i < h.Count; i++ {
		var delta, tsz, pid, seq, klen, vlen uint64
		var ok bool
		if delta, b, ok = readUvarint(b); !ok || delta != uint64(i) {
			return recErr(i, "offset delta", ok)
		}
		if tsz, b, ok = readUvarint(b); !ok {
			return recErr(i, "timestamp delta", ok)
		}
		ts := h.FirstTimestamp + unzigzag(tsz) // wraps like the encoder
		if i == 0 && ts != h.FirstTimestamp {
			return fmt.Errorf("%w: record 0 timestamp %d != first timestamp %d", ErrBadFrame, ts, h.FirstTimestamp)
		}
		maxTs = max(maxTs, ts)
		if pid, b, ok = readUvarint(b); !ok {
			return recErr(i, "producer id", ok)
		}
		if seq, b, ok = readUvarint(b); !ok {
			return recErr(i, "sequence", ok)
		}
		if klen, b, ok = readUvarint(b); !ok || klen > MaxRecordBytes || klen > uint64(len(b)) {
			return recErr(i, "key length", ok)
		}
		key := b[:klen:klen]
		b = b[klen:]
		if vlen, b, ok = readUvarint(b); !ok || vlen > MaxRecordBytes-klen || vlen > uint64(len(b)) {
			return recErr(i, "value length", ok)
		}
		val := b[:vlen:vlen]
		b = b[vlen:]
		var hs []Header
		if withHeaders {
			var err error
			if hs, headers, b, err = readHeaders(b, i, MaxRecordBytes-klen-vlen, &total, headers, recs != nil); err != nil {
				return err
			}
		}
		if recs != nil {
			recs[i] = Record{
				Offset:      h.BaseOffset + uint64(i),
				TimestampMs: ts,
				ProducerID:  pid,
				Sequence:    seq,
				Key:         key,
				Value:       val,
				Headers:     hs,
			}
		}
	}
	if withHeaders && total == 0 {
		// Not canonical: a batch without headers is written without the flag.
		return fmt.Errorf("%w: headers flag set on a batch without headers", ErrBadFrame)
	}
	if len(b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes after %d records", ErrBadFrame, len(b), h.Count)
	}
	if maxTs != h.MaxTimestamp {
		return fmt.Errorf("%w: max record timestamp %d != header max timestamp %d", ErrBadFrame, maxTs, h.MaxTimestamp)
	}
	return nil
}

// readHeaders reads record i's headers from b: their count, then each
// key and value with its length, within room bytes of keys and values and
// MaxBatchHeaders for the batch (total counts them). keep: append them to
// all and return the record's window of it.
func readHeaders(b []byte, i uint32, room uint64, total *int, all []Header, keep bool) ([]Header, []Header, []byte, error) {
	n, b, ok := readUvarint(b)
	if !ok || n > uint64(len(b))/2 || uint64(*total)+n > MaxBatchHeaders {
		return nil, all, b, recErr(i, "header count", ok)
	}
	*total += int(n)
	start := len(all)
	for j := uint64(0); j < n; j++ {
		var klen, vlen uint64
		if klen, b, ok = readUvarint(b); !ok || klen > room || klen > uint64(len(b)) {
			return nil, all, b, recErr(i, "header key length", ok)
		}
		key := b[:klen:klen]
		b, room = b[klen:], room-klen
		if vlen, b, ok = readUvarint(b); !ok || vlen > room || vlen > uint64(len(b)) {
			return nil, all, b, recErr(i, "header value length", ok)
		}
		val := b[:vlen:vlen]
		b, room = b[vlen:], room-vlen
		if keep {
			all = append(all, Header{Key: key, Value: val})
		}
	}
	if !keep || n == 0 {
		return nil, all, b, nil
	}
	return all[start:len(all):len(all)], all, b, nil
}

func recErr(i uint32, field string, varintOK bool) error {
	if !varintOK {
		return fmt.Errorf("%w: record %d: bad or truncated %s varint", ErrBadFrame, i, field)
	}
	return fmt.Errorf("%w: record %d: invalid %s", ErrBadFrame, i, field)
}

// readUvarint decodes a canonical uvarint from the start of b. Unlike
// binary.Uvarint it rejects non-minimal encodings (a final 0x00 byte after a
// continuation byte), so every value has exactly one encoding and decoded
// frames re-encode to identical bytes.
func readUvarint(b []byte) (uint64, []byte, bool) {
	var x uint64
	var s uint
	for i := 0; i < len(b) && i < maxVarintLen; i++ {
		c := b[i]
		if c < 0x80 {
			if i == maxVarintLen-1 && c > 1 {
				return 0, b, false // overflows 64 bits
			}
			if c == 0 && i > 0 {
				return 0, b, false // non-minimal
			}
			return x | uint64(c)<<s, b[i+1:], true
		}
		x |= uint64(c&0x7f) << s
		s += 7
	}
	return 0, b, false // truncated or longer than 10 bytes
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

func zigzag(v int64) uint64   { return uint64(v<<1) ^ uint64(v>>63) }
func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// Reframe gives a frame that DecodeBatch accepted a new epoch and base
// offset, in place, and recomputes its CRC: a sender that is not the head
// (ingestion) encodes the records, and the head assigns their offsets
// without encoding them again.
func Reframe(frame []byte, epoch, baseOffset uint64) error {
	h, err := DecodeHeader(frame)
	if err != nil {
		return err
	}
	if uint64(len(frame)) != uint64(h.FrameLen) {
		return fmt.Errorf("%w: %d bytes given, header says %d", ErrBadFrame, len(frame), h.FrameLen)
	}
	if baseOffset > MaxOffset-uint64(h.Count) {
		return fmt.Errorf("%w: base offset %d + count %d overflows", ErrBadFrame, baseOffset, h.Count)
	}
	binary.LittleEndian.PutUint64(frame[hEpoch:], epoch)
	binary.LittleEndian.PutUint64(frame[hBase:], baseOffset)
	binary.LittleEndian.PutUint32(frame[hCRC:], frameCRC(frame))
	return nil
}
