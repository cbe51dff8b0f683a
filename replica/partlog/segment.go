package partlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Segment file layout (docs/storage-format.md §2).
const (
	// SegmentHeaderSize is the size of the header at the start of a segment.
	SegmentHeaderSize = 24
	segmentVersion    = 1
	segSuffix         = ".seg"
	tmpSuffix         = ".tmp"
	tornInfix         = ".torn-"
	segNameDigits     = 20

	// scanReadahead is the chunk size of sequential scans (Open, Truncate):
	// large enough that syscalls are negligible against CRC work.
	scanReadahead = 1 << 20
	// headerWalkReadahead is the chunk size when only frame headers are
	// needed (offset and timestamp lookups within one index interval).
	headerWalkReadahead = 16 << 10
)

var segMagic = [4]byte{'C', 'T', 'N', 'S'}

// segmentName is the file name of the segment whose first offset is base.
func segmentName(base uint64) string {
	return fmt.Sprintf("%0*d%s", segNameDigits, base, segSuffix)
}

// parseSegmentName accepts exactly 20 digits + ".seg"; everything else in the
// directory (tmp files, torn evidence, strangers) is not a segment.
func parseSegmentName(name string) (uint64, bool) {
	digits, ok := strings.CutSuffix(name, segSuffix)
	if !ok || len(digits) != segNameDigits {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	base, err := strconv.ParseUint(digits, 10, 64)
	return base, err == nil
}

func encodeSegmentHeader(base uint64, rolling uint32) []byte {
	b := make([]byte, SegmentHeaderSize)
	copy(b, segMagic[:])
	b[4] = segmentVersion
	binary.LittleEndian.PutUint64(b[8:], base)
	binary.LittleEndian.PutUint32(b[16:], rolling)
	binary.LittleEndian.PutUint32(b[20:], crc32.Checksum(b[:20], castagnoli))
	return b
}

func decodeSegmentHeader(b []byte) (base uint64, rolling uint32, err error) {
	switch {
	case len(b) < SegmentHeaderSize:
		return 0, 0, fmt.Errorf("segment header: %d bytes, want %d", len(b), SegmentHeaderSize)
	case [4]byte(b[:4]) != segMagic:
		return 0, 0, fmt.Errorf("segment header: bad magic %x", b[:4])
	case b[4] != segmentVersion:
		return 0, 0, fmt.Errorf("segment header: version %d, want %d", b[4], segmentVersion)
	case b[5] != 0 || b[6] != 0 || b[7] != 0:
		return 0, 0, fmt.Errorf("segment header: reserved bytes not zero")
	}
	if c, want := crc32.Checksum(b[:20], castagnoli), binary.LittleEndian.Uint32(b[20:]); c != want {
		return 0, 0, fmt.Errorf("segment header: crc32c %08x, header says %08x", c, want)
	}
	return binary.LittleEndian.Uint64(b[8:]), binary.LittleEndian.Uint32(b[16:]), nil
}

// rollChecksum folds one batch CRC into the rolling checksum:
// rolling' = crc32c(LE32(rolling) || LE32(batch crc)) (storage-format.md §5).
// Computed bytewise with the Castagnoli table: an 8-byte buffer passed to
// crc32.Checksum escapes to the heap, and this runs once per Append.
func rollChecksum(rolling, batchCRC uint32) uint32 {
	in := uint64(rolling) | uint64(batchCRC)<<32 // little-endian byte order
	c := ^uint32(0)
	for i := 0; i < 8; i++ {
		c = castagnoli[byte(c)^byte(in>>(8*i))] ^ c>>8
	}
	return ^c
}

// indexEntry marks a frame start. prefixMax is the greatest batch
// MaxTimestamp from the segment start through the last frame before the next
// entry: non-decreasing, hence binary-searchable.
type indexEntry struct {
	offset    uint64
	pos       uint32
	prefixMax int64
}

// segment is one segment file. Once the segment is published in Log.segs,
// its fields change only with Log.wmu and Log.mu (exclusive) held, and are
// read under either.
type segment struct {
	path     string
	f        File
	h        *handle // f as readers outside the log's lock see it
	base     uint64
	rollBase uint32 // rolling checksum at base, from the header

	size  int64  // bytes of header + whole published frames
	end   uint64 // exclusive end offset
	maxTs int64  // greatest batch MaxTimestamp; math.MinInt64 if empty
	// firstMaxTs is the first frame's MaxTimestamp (retention's roll by
	// age); set by addFrame, so not for a segment opened from its
	// summary, which is never the active one.
	firstMaxTs int64
	index      []indexEntry
	// lastPos and lastCRC are the last frame's byte position and CRC, for
	// the segment's summary (summary.go).
	lastPos int64
	lastCRC uint32
	// rollEnd is the rolling checksum at end as a summary gave it, and
	// unverified says the segment's frames were not read since (Open took
	// them from its summary): VerifySealed reads them.
	rollEnd    uint32
	unverified bool

	// uncachedTo is where the page cache of the file was last dropped up
	// to (only Sync, under syncMu, touches it).
	uncachedTo int64
	// zeroTo is where zeros written ahead of the frames end in the file
	// (Preallocate); at or below size when there are none. Under wmu.
	zeroTo int64
}

// dropCached asks the kernel to drop the file's clean cached pages below
// byte to (rounded down to whole pages), once they are durable. Tail
// readers are served from the last cachedTailBytes and the successor from
// memory; dropping the rest bounds a partition's page-cache footprint and
// hands the pages straight back to the next writes. On virtual machines
// whose freed memory is reported to the host, a page the guest has not
// touched for a while costs a host fault on its next use: appends into
// an ever-growing page cache spent 1.1-1.2 s of CPU in pwrite per replica
// per 8 s at 75k records/s of 1 KiB; dropping behind the tail made it
// 0.3-0.45 s, and the same run went from 70-75k to 77-88k records/s
// (docs/benchmarks.md). It is advice: errors are ignored, and files
// without a descriptor (tests' fault-injecting file systems) are left
// alone.
//
// The page cache holds large folios (up to 2 MiB here), and the kernel
// drops only folios wholly inside the advised range: the one straddling
// its end stays, and so would it for good if the next range began where
// this one ended (it starts before that). Each call therefore advises
// again from dropRelapse below the previous end. Without that, 40% of what
// lay more than 32 MiB behind a log's end stayed cached.
func (s *segment) dropCached(to int64) {
	to &^= 4095
	if to <= s.uncachedTo {
		return
	}
	fd, ok := fdOf(s.f)
	if !ok {
		return
	}
	from := max(0, s.uncachedTo-dropRelapse)
	_ = unix.Fadvise(fd, from, to-from, unix.FADV_DONTNEED)
	s.uncachedTo = to
}

// noReadAhead turns off the kernel's read-ahead for the file (advice:
// errors are ignored, files without a descriptor left alone). Reads of a
// served log are either of its last bytes, which are cached, or of
// history, read in pieces of readPieceBytes (segReader.at) by a consumer
// replaying it, a replacement copying it or a Truncate scanning to its
// cut; the kernel's read-ahead turns each such read into requests of up
// to read_ahead_kb (8 MiB on the VMs Catena is measured on), and the
// chain's fsyncs on the same disk queue behind them. A probe there (an
// fdatasync every 2 ms beside a reader of a cold file at 150 MiB/s) saw
// the fsync's p99 go from 0.4 ms to 8.3 ms with the read-ahead, and to
// 0.86 ms with none and 256 KiB reads (docs/benchmarks.md, "Catch-up of a
// replacement"). The cost: a reader of cold history waits for each piece
// in turn, about 850 MiB/s there, less on a disk of higher latency.
// Recovery scans whole segments before this is set.
func noReadAhead(f File) {
	if fd, ok := fdOf(f); ok {
		_ = unix.Fadvise(fd, 0, 0, unix.FADV_RANDOM)
	}
}

// fdOf returns f's descriptor, when it has one (tests' file systems
// do not).
func fdOf(f File) (int, bool) {
	if f, ok := f.(interface{ Fd() uintptr }); ok {
		return int(f.Fd()), true
	}
	return 0, false
}

// readPieceBytes is the most one pread of segReader asks the disk for: a
// larger read is several, so that an fsync waits behind one piece at most.
const readPieceBytes = 256 << 10

// dropRelapse is how far below the previous end dropCached advises again:
// twice the largest folio.
const dropRelapse = 4 << 20

func newSegmentState(path string, f File, base uint64, rolling uint32) *segment {
	return &segment{path: path, f: f, h: &handle{f: f}, base: base, rollBase: rolling,
		size: SegmentHeaderSize, end: base, maxTs: math.MinInt64}
}

// handle is a segment's file as ReadFrames uses it: a reader pins it under
// the log's read lock and reads after releasing the lock, so that a slow
// read (a consumer replaying history from disk, a replacement copying the
// log) never holds up the appends, which take the lock exclusively to
// publish. A segment deleted or closed meanwhile (retention, Truncate,
// Reset, Close) is retired: its file is closed once the last pin is gone,
// and until then stays readable (an unlinked file's data stays until its
// last descriptor closes).
type handle struct {
	f       File
	pins    atomic.Int32
	retired atomic.Bool
	once    sync.Once
	err     error // of the close
}

func (h *handle) pin() { h.pins.Add(1) }

func (h *handle) unpin() {
	if h.pins.Add(-1) == 0 && h.retired.Load() {
		h.close()
	}
}

// retire closes the file now if no reader holds it (returning the close
// error), else when the last one lets go.
func (h *handle) retire() error {
	h.retired.Store(true)
	if h.pins.Load() == 0 {
		return h.close()
	}
	return nil
}

func (h *handle) close() error {
	h.once.Do(func() { h.err = h.f.Close() })
	return h.err
}

func (s *segment) empty() bool { return s.end == s.base }

// addFrame records a published frame at pos in the in-memory state.
func (s *segment) addFrame(h BatchHeader, pos int64, interval int64) {
	if s.empty() {
		s.firstMaxTs = h.MaxTimestamp
	}
	n := len(s.index)
	if n == 0 || pos-int64(s.index[n-1].pos) >= interval {
		prev := int64(math.MinInt64)
		if n > 0 {
			prev = s.index[n-1].prefixMax
		}
		s.index = append(s.index, indexEntry{offset: h.BaseOffset, pos: uint32(pos), prefixMax: max(prev, h.MaxTimestamp)})
	} else {
		s.index[n-1].prefixMax = max(s.index[n-1].prefixMax, h.MaxTimestamp)
	}
	s.size = pos + int64(h.FrameLen)
	s.end = h.End()
	s.maxTs = max(s.maxTs, h.MaxTimestamp)
	s.lastPos, s.lastCRC = pos, h.CRC
}

// lookup returns the byte position of the last indexed frame starting at or
// before offset (the segment header end if none).
func (s *segment) lookup(offset uint64) int64 {
	i := sort.Search(len(s.index), func(i int) bool { return s.index[i].offset > offset })
	if i == 0 {
		return SegmentHeaderSize
	}
	return int64(s.index[i-1].pos)
}

// segReader reads a segment through a window buffer so that walking many
// small frames costs one pread per window, not per frame.
type segReader struct {
	f      File
	limit  int64 // readable end (published size)
	reuse  bool  // reuse the buffer: earlier slices become invalid
	buf    []byte
	bufPos int64
}

// errShort means the file ended before limit: it was truncated under us.
var errShort = errors.New("file shorter than expected")

// at returns bytes [pos, pos+n) of the segment, reading at least ra bytes
// (clipped to limit) when the window has to move. Without reuse, every
// returned slice stays valid: a new window is a new allocation.
func (r *segReader) at(pos, n, ra int64) ([]byte, error) {
	if pos < 0 || n < 0 || pos+n > r.limit {
		return nil, fmt.Errorf("%w: want [%d,%d) of %d", errShort, pos, pos+n, r.limit)
	}
	if pos >= r.bufPos && pos+n <= r.bufPos+int64(len(r.buf)) {
		return r.buf[pos-r.bufPos : pos-r.bufPos+n], nil
	}
	size := min(max(n, ra), r.limit-pos)
	if r.reuse && int64(cap(r.buf)) >= size {
		r.buf = r.buf[:size]
	} else {
		r.buf = make([]byte, size)
	}
	r.bufPos = pos
	for done := int64(0); done < size; {
		piece := min(size-done, readPieceBytes)
		m, err := r.f.ReadAt(r.buf[done:done+piece], pos+done)
		done += int64(m)
		if int64(m) < piece {
			r.buf = r.buf[:0]
			if err == nil || errors.Is(err, io.EOF) {
				err = fmt.Errorf("%w: read %d of %d bytes at %d", errShort, done, size, pos)
			}
			return nil, err
		}
	}
	return r.buf[:n], nil
}

// fileSize returns the current size of f.
func fileSize(f File) (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// createSegment durably creates the segment file for base: header written to
// a .tmp file and fsynced, renamed into place, directory fsynced. A .seg file
// therefore always has a whole header (storage-format.md §2.1).
func createSegment(fsys FS, dir string, base uint64, rolling uint32) (*segment, error) {
	path := filepath.Join(dir, segmentName(base))
	tmp := path + tmpSuffix
	f, err := fsys.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", tmp, err)
	}
	fail := func(what string, err error) (*segment, error) {
		f.Close()
		return nil, fmt.Errorf("%s %s: %w", what, tmp, err)
	}
	if _, err := f.WriteAt(encodeSegmentHeader(base, rolling), 0); err != nil {
		return fail("write header of", err)
	}
	if err := f.Sync(); err != nil {
		return fail("fsync", err)
	}
	if err := fsys.Rename(tmp, path); err != nil {
		return fail("rename", err)
	}
	if err := fsys.SyncDir(dir); err != nil {
		f.Close()
		return nil, fmt.Errorf("fsync dir %s after creating %s: %w", dir, path, err)
	}
	noReadAhead(f)
	return newSegmentState(path, f, base, rolling), nil
}
