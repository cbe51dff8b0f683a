package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"sort"
)

// The journal's bytes (docs/journal.md, "The shape"; little-endian, as the
// segment format). A journal is a sequence of groups, each written by one
// group commit and synced before the next is written:
//
//	group  := magic u32 | position u64 | length u32 | crc u32 | records (length bytes)
//	record := kind u8 | incarnation u64 | partition u32 | epoch u64 |
//	          base u64 | end u64 | rolling u32 | stream-length u16 |
//	          payload-length u32 | stream | payload
//
// position is the group's journal position: the byte offset of its first
// byte in the journal as one stream across its segment files, so that a
// group left over from a recycled file (an older position) is never taken
// for a new one. crc is the CRC-32C of the header's position and length
// and of the records. A record's payload is a Frame's bytes, exactly as
// the partition's segment file holds them, or a checkpoint's entries
// (EncodeCheckpoint); other kinds carry none, and a checkpoint no stream.
const (
	groupMagic      = 0x4c4e524a // "JRNL"
	GroupHeaderSize = 4 + 8 + 4 + 4
	recordFixedSize = 1 + 8 + 4 + 8 + 8 + 8 + 4 + 2 + 4
	// MaxGroupBytes bounds one group's records: a length past it is
	// damage, not a group.
	MaxGroupBytes = 256 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Logged is a record as written and read back: what recovery plans from,
// and the frame's bytes it writes.
type Logged struct {
	Record
	Payload []byte
}

// encodedSize is the bytes e takes in a group.
func (e *Logged) encodedSize() int {
	return recordFixedSize + len(e.Part.Stream) + len(e.Payload)
}

// validate refuses what the format cannot hold.
func (e *Logged) validate() error {
	switch {
	case e.Kind < Create || e.Kind > Written:
		return fmt.Errorf("journal: unknown record kind %d", e.Kind)
	case e.Kind == CheckpointRecord && len(e.Part.Stream) > 0:
		return errors.New("journal: a checkpoint record names a stream")
	case e.Kind != CheckpointRecord && (len(e.Part.Stream) == 0 || len(e.Part.Stream) > math.MaxUint16):
		return fmt.Errorf("journal: stream name of %d bytes", len(e.Part.Stream))
	case e.Kind != Frame && e.Kind != CheckpointRecord && len(e.Payload) > 0:
		return fmt.Errorf("journal: a %s record carries no payload", e.Kind)
	case e.encodedSize() > MaxGroupBytes:
		return fmt.Errorf("journal: a record of %d bytes is over the group limit", e.encodedSize())
	}
	return nil
}

// appendLogged appends e's encoding to b.
func appendLogged(b []byte, e *Logged) []byte {
	b = append(b, byte(e.Kind))
	b = binary.LittleEndian.AppendUint64(b, e.Incarnation)
	b = binary.LittleEndian.AppendUint32(b, e.Part.Partition)
	b = binary.LittleEndian.AppendUint64(b, e.Epoch)
	b = binary.LittleEndian.AppendUint64(b, e.Base)
	b = binary.LittleEndian.AppendUint64(b, e.End)
	b = binary.LittleEndian.AppendUint32(b, e.Rolling)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(e.Part.Stream)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(e.Payload)))
	b = append(b, e.Part.Stream...)
	return append(b, e.Payload...)
}

// sealGroup fills in the header of the group in b (GroupHeaderSize bytes
// reserved at its start, the records after them) at position pos.
func sealGroup(b []byte, pos uint64) {
	binary.LittleEndian.PutUint32(b[0:], groupMagic)
	binary.LittleEndian.PutUint64(b[4:], pos)
	binary.LittleEndian.PutUint32(b[12:], uint32(len(b)-GroupHeaderSize))
	binary.LittleEndian.PutUint32(b[16:], groupCRC(b))
}

func groupCRC(b []byte) uint32 {
	c := crc32.Update(0, castagnoli, b[4:16])
	return crc32.Update(c, castagnoli, b[GroupHeaderSize:])
}

// errNoGroup: the bytes at a position are not a whole, valid group of that
// position (a torn or never written tail, or damage).
var errNoGroup = errors.New("no valid group")

// groupLength reads the header at the start of hdr (GroupHeaderSize
// bytes) of a group expected at pos and returns its records' length.
func groupLength(hdr []byte, pos uint64) (int, error) {
	if binary.LittleEndian.Uint32(hdr[0:]) != groupMagic || binary.LittleEndian.Uint64(hdr[4:]) != pos {
		return 0, errNoGroup
	}
	n := binary.LittleEndian.Uint32(hdr[12:])
	if n == 0 || n > MaxGroupBytes {
		return 0, errNoGroup
	}
	return int(n), nil
}

// checkGroup verifies a whole group (header and records) read at pos.
func checkGroup(b []byte, pos uint64) error {
	if len(b) < GroupHeaderSize {
		return errNoGroup
	}
	n, err := groupLength(b, pos)
	if err != nil || len(b) != GroupHeaderSize+n || binary.LittleEndian.Uint32(b[16:]) != groupCRC(b) {
		return errNoGroup
	}
	return nil
}

// decodeLogged calls fn for each record of a checked group's records.
// The entries' payloads alias b.
func decodeLogged(b []byte, fn func(Logged) error) error {
	for len(b) > 0 {
		if len(b) < recordFixedSize {
			return fmt.Errorf("%w: a record's header is cut short", ErrCorrupt)
		}
		var e Logged
		e.Kind = Kind(b[0])
		e.Incarnation = binary.LittleEndian.Uint64(b[1:])
		e.Part.Partition = binary.LittleEndian.Uint32(b[9:])
		e.Epoch = binary.LittleEndian.Uint64(b[13:])
		e.Base = binary.LittleEndian.Uint64(b[21:])
		e.End = binary.LittleEndian.Uint64(b[29:])
		e.Rolling = binary.LittleEndian.Uint32(b[37:])
		sl := int(binary.LittleEndian.Uint16(b[41:]))
		pl := int(binary.LittleEndian.Uint32(b[43:]))
		b = b[recordFixedSize:]
		if len(b) < sl+pl {
			return fmt.Errorf("%w: a record's stream and payload run past its group", ErrCorrupt)
		}
		e.Part.Stream = string(b[:sl])
		if pl > 0 {
			e.Payload = b[sl : sl+pl : sl+pl]
		}
		b = b[sl+pl:]
		if err := e.validate(); err != nil {
			return fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		if err := fn(e); err != nil {
			return err
		}
	}
	return nil
}

// EncodeCheckpoint is the payload of a checkpoint record: the number of
// entries, then each entry as partition u32 | incarnation u64 | flushed
// u64 | stream-length u16 | stream, in the order of their names.
func EncodeCheckpoint(entries map[PartitionID]Entry) []byte {
	ids := make([]PartitionID, 0, len(entries))
	for id := range entries {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		if ids[i].Stream != ids[j].Stream {
			return ids[i].Stream < ids[j].Stream
		}
		return ids[i].Partition < ids[j].Partition
	})
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(ids)))
	for _, id := range ids {
		e := entries[id]
		b = binary.LittleEndian.AppendUint32(b, id.Partition)
		b = binary.LittleEndian.AppendUint64(b, e.Incarnation)
		b = binary.LittleEndian.AppendUint64(b, e.Flushed)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(id.Stream)))
		b = append(b, id.Stream...)
	}
	return b
}

// DecodeCheckpoint reads a checkpoint record's payload.
func DecodeCheckpoint(b []byte) (map[PartitionID]Entry, error) {
	bad := func(what string) (map[PartitionID]Entry, error) {
		return nil, fmt.Errorf("%w: checkpoint record: %s", ErrCorrupt, what)
	}
	if len(b) < 4 {
		return bad("no entry count")
	}
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	const fixed = 4 + 8 + 8 + 2
	if uint64(n)*fixed > uint64(len(b)) {
		return bad(fmt.Sprintf("%d entries in %d bytes", n, len(b)))
	}
	out := make(map[PartitionID]Entry, n)
	for range n {
		if len(b) < fixed {
			return bad("an entry cut short")
		}
		var id PartitionID
		id.Partition = binary.LittleEndian.Uint32(b)
		e := Entry{Incarnation: binary.LittleEndian.Uint64(b[4:]), Flushed: binary.LittleEndian.Uint64(b[12:])}
		sl := int(binary.LittleEndian.Uint16(b[20:]))
		b = b[fixed:]
		if sl == 0 || len(b) < sl {
			return bad("an entry's stream name cut short")
		}
		id.Stream, b = string(b[:sl]), b[sl:]
		if _, dup := out[id]; dup {
			return bad(fmt.Sprintf("%s twice", id))
		}
		out[id] = e
	}
	if len(b) > 0 {
		return bad(fmt.Sprintf("%d bytes after the entries", len(b)))
	}
	return out, nil
}
