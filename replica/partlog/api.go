// Package partlog is the durable, append-only log of one partition replica:
// segment files in one directory, batch frames checksummed with CRC32C, a
// sparse in-memory index for reads by offset and by timestamp, retention by
// time and bytes, and conservative recovery. docs/storage-format.md is the
// specification; this package implements it.
package partlog

// The exported signatures in this file are the contract the replica server
// codes against: add, don't change. Implementations live in frame.go (codec),
// log.go (append, read, sync), recovery.go (Open), maintain.go (retention,
// truncation) and fs.go (file-system seam).

import (
	"errors"
	"time"
)

// Record is one record of a batch.
type Record struct {
	Offset      uint64 // assigned: batch base offset + index within the batch
	TimestampMs int64  // producer or ingestion time, Unix milliseconds
	ProducerID  uint64 // 0 = no idempotence
	Sequence    uint64
	Key         []byte
	Value       []byte
	// Headers are the record's application headers, in order (Kafka's
	// record headers). Their keys and values count toward MaxRecordBytes.
	Headers []Header
}

// Header is one record header. A key may repeat; an empty value and an
// absent one are the same (length 0).
type Header struct {
	Key   []byte
	Value []byte
}

// BatchHeader is the fixed header of a batch frame (see storage-format.md).
type BatchHeader struct {
	Epoch          uint64 // chain epoch of the head that wrote the batch
	BaseOffset     uint64
	Count          uint32
	FirstTimestamp int64
	MaxTimestamp   int64
	FrameLen       uint32 // whole frame, header included
	Type           FrameType
	CRC            uint32 // CRC32C of the frame minus this field (storage-format.md §3.2)
	// Flags is 0 or FlagHeaders (records carry headers).
	Flags uint16
	// Magic and version are constants of version 1: DecodeHeader rejects
	// anything else, so they are not carried here.
}

// End is the exclusive end offset of the batch.
func (h BatchHeader) End() uint64 { return h.BaseOffset + uint64(h.Count) }

// Limits.
const (
	// MaxRecordBytes bounds key+value (and every header's key+value) of
	// one record.
	MaxRecordBytes = 1 << 20
	// MaxFrameBytes bounds one batch frame; checked before allocating.
	MaxFrameBytes = 16 << 20
	// MaxSegmentBytes caps Options.SegmentBytes so that a byte position in a
	// segment (which may exceed SegmentBytes by one frame) fits in 32 bits.
	MaxSegmentBytes = 1 << 30

	// DefaultSegmentBytes and DefaultIndexIntervalBytes apply when the
	// corresponding Options field is 0.
	DefaultSegmentBytes       = 128 << 20
	DefaultIndexIntervalBytes = 16 << 10
)

// Errors. Wrapped with details (file, offset) by the functions returning them.
var (
	ErrCorrupt       = errors.New("partition log is corrupt")          // refuse to serve
	ErrFailed        = errors.New("partition log failed (crash-stop)") // fsync or write failed: stop
	ErrBadFrame      = errors.New("malformed batch frame")
	ErrOffsetGap     = errors.New("batch base offset is not the log end offset")
	ErrOutOfRange    = errors.New("offset out of range")
	ErrFrameTooLarge = errors.New("batch frame exceeds the maximum size")
	ErrClosed        = errors.New("partition log closed")
	ErrNotBoundary   = errors.New("offset is inside a batch")                  // Truncate: not a batch boundary
	ErrEpochRegress  = errors.New("batch epoch is below the log's last epoch") // Append: epochs never decrease
)

// Options configure a Log.
type Options struct {
	Dir                string
	FS                 FS               // nil = the real file system
	SegmentBytes       int64            // roll to a new segment past this size
	IndexIntervalBytes int64            // sparse index granularity
	RetentionBytes     int64            // 0 = unlimited
	RetentionTime      time.Duration    // 0 = unlimited
	Now                func() time.Time // nil = time.Now (for retention by time)

	// Flushed, when set, is the offset below which recovery trusts the
	// segment files: a journal's checkpoint says they were fsynced that
	// far (docs/journal.md, "Recovery" step 3). Whatever lies above it is
	// cut without evidence, whole later segments removed newest first:
	// unsynced writes, for the journal's replay to write again. A log
	// that does not reach it is ErrCorrupt.
	Flushed *uint64
	// DirectFrameBytes: a journaled log writes a frame of at least this
	// many bytes to its segment file only, and the journal records where
	// it is and its CRC, not its bytes (docs/journal.md, "Large frames"):
	// Sync fsyncs the file for it while it waits for the journal. Smaller
	// frames are copied into the journal, which makes them durable with
	// every other partition's in one group commit. 0: every frame is
	// journalled.
	DirectFrameBytes int
	// Empty, when set, makes recovery remove every segment (newest
	// first) and start an empty log at Empty.Base: the journal says the
	// log was reset, or created, after its checkpoint. With Verify, the
	// segments are kept when they are that log's (below).
	Empty *Start
	// Verify, with Flushed or Empty, are the frames the journal says
	// follow, in order. Recovery keeps the segment files' frames above
	// Flushed as long as they are whole and match Verify from its first,
	// offsets and CRC, and cuts what follows. With Empty, the files are
	// that log's when their first segment starts where Verify's frames
	// from Empty.Base lead (at Empty.Base, or past it where retention
	// moved the start), with the rolling checksum they lead to; they are
	// then kept as with Flushed at that start. A frame found whole with
	// the offsets and the CRC of the frame written is that frame,
	// whatever else a crash left in the files.
	Verify []FrameCheck
}

// FrameCheck is a frame recovery may keep (Options.Verify): its offsets
// [Base, End) and its CRC.
type FrameCheck struct {
	Base, End uint64
	CRC       uint32
}

// Start is where an empty log begins: its first offset and the rolling
// checksum there.
type Start struct {
	Base    uint64
	Rolling uint32
}

// Journal is where a journaled log records its changes (docs/journal.md):
// the replica process's journal, one for all its partitions. A journaled
// log writes each frame to its segment file as a plain log does and hands
// it to the journal in the same order, under its write lock; Sync waits
// for the journal, not for an fsync of the segment, and Flush fsyncs the
// segment files when the journal asks. Truncate and Reset are recorded
// durably before they change anything.
type Journal interface {
	// Frame records an appended frame; Wait(ticket) returns once the
	// record is durable.
	Frame(h BatchHeader, frame []byte) (ticket uint64, err error)
	// Truncate durably records a cut to offset to, the log's last epoch
	// below the cut being epoch (0 when nothing is left).
	Truncate(to, epoch uint64) error
	// Reset durably records that the log was emptied to start at s.
	Reset(s Start) error
	// Written records a frame appended to its segment file only (one of
	// at least Options.DirectFrameBytes), by its offsets and CRC; Sync
	// fsyncs the file for it while it waits for the record.
	Written(h BatchHeader) (ticket uint64, err error)
	// Wait returns once the records up to ticket are durable.
	Wait(ticket uint64) error
}
