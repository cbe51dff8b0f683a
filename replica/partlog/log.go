package partlog

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Log is one partition's log. Safe for one writer and concurrent readers.
//
// Locking, in acquisition order:
//   - syncMu serialises Sync's fsync with the operations that close or cut
//     files (Truncate, EnforceRetention, Close), so Sync can fsync without
//     holding wmu and Append can proceed while an fsync is in flight.
//   - wmu serialises the mutating operations (Append, Truncate, retention,
//     Close, and Sync's snapshot). State read only by mutators is read under
//     wmu alone.
//   - mu guards what readers see (segment list, sizes, index, next offset,
//     rolling checksum, epochs, closed). Mutators hold it exclusively only to
//     publish, never across a write or fsync syscall; readers hold it shared
//     across their preads so a segment cannot be closed or cut under them.
//
// Append writes a frame past the published size of the active segment, and
// only then publishes it, so readers only ever see whole frames.
type Log struct {
	fs       FS
	dir      string
	interval int64
	// limits are the segment size and the soft retention limits; they may
	// change while the log is open (SetLimits).
	limits    atomic.Pointer[Limits]
	now       func() time.Time
	recovered RecoveryInfo // set by Open, then immutable

	syncMu sync.Mutex
	wmu    sync.Mutex
	mu     sync.RWMutex

	segs []*segment // oldest first; the last is active; never empty
	// cuts counts Truncate and Reset calls, and recentCuts holds where
	// the latest cut the log (indexed by count, modulo its length): a
	// read made outside mu checks them before it calls the log corrupt or
	// returns what it read (bytes at and past a cut may have changed
	// under it; bytes below it never do).
	cuts       uint64
	recentCuts [16]uint64
	next       uint64
	rolling    uint32
	epochs     []EpochStart
	closed     bool
	// avgFrame is a moving average of appended frames' sizes (under wmu):
	// whether zero-filling ahead pays (Preallocate).
	avgFrame int64

	durable atomic.Uint64
	// journal, once UseJournal set it, records the log's changes and
	// makes its frames durable (Sync waits for it); jticket is the
	// journal's ticket for the last frame appended (under wmu). flushed
	// is where the segment files are fsynced up to, the journal aside:
	// Flush skips an fsync that would add nothing.
	journal Journal
	jticket uint64
	flushed atomic.Uint64
	// direct is Options.DirectFrameBytes. fileOnly (under wmu) is the end
	// of the last frame a journaled log wrote to its segment file only:
	// while it is past flushed, Sync fsyncs the file for it.
	direct   int64
	fileOnly uint64
	// fault is the first fatal error (wrapping ErrFailed or ErrCorrupt);
	// once set, it is returned by every later call. Atomic so that readers
	// holding mu shared can record corruption they find.
	fault atomic.Pointer[error]
}

// EpochStart is a change of chain epoch in the log: batches from
// StartOffset on (until the next EpochStart) were written under Epoch.
type EpochStart struct {
	Epoch       uint64
	StartOffset uint64
}

// RecoveryInfo says what Open repaired, for the server to log.
type RecoveryInfo struct {
	TornSegment string // segment whose torn tail was cut; "" if none was
	TornAt      int64  // byte position of the cut in TornSegment
	TornBytes   int64  // number of bytes cut
	Evidence    string // file holding the cut bytes
	Reason      string // why the first cut byte did not start a valid frame
	// ZeroTailBytes is how many zero bytes followed the last frame (zeros
	// written ahead by Preallocate, or pages that never reached the
	// disk); they were cut without evidence.
	ZeroTailBytes int64
}

// fail records err as the log's permanent fault (if none is recorded yet)
// and returns the recorded fault.
func (l *Log) fail(kind error, format string, args ...any) error {
	err := fmt.Errorf("%w: "+format, append([]any{kind}, args...)...)
	l.fault.CompareAndSwap(nil, &err)
	return *l.fault.Load()
}

// corrupt records corruption found at pos of the segment at path.
func (l *Log) corrupt(path string, pos int64, cause error) error {
	return l.fail(ErrCorrupt, "%s at byte %d: %w", path, pos, cause)
}

// readErr classifies a read failure: a file shorter than its published size
// was cut under us (corrupt); anything else (EIO) is returned as is.
func (l *Log) readErr(path string, pos int64, err error) error {
	if errors.Is(err, errShort) {
		return l.corrupt(path, pos, err)
	}
	return fmt.Errorf("partlog: read %s at byte %d: %w", path, pos, err)
}

// usable reports the fault or closed state. Call with mu or wmu held.
func (l *Log) usable() error {
	if p := l.fault.Load(); p != nil {
		return *p
	}
	if l.closed {
		return ErrClosed
	}
	return nil
}

func (l *Log) active() *segment { return l.segs[len(l.segs)-1] }

// segmentFor returns the index of the last segment with base <= offset.
func (l *Log) segmentFor(offset uint64) int {
	return max(sort.Search(len(l.segs), func(i int) bool { return l.segs[i].base > offset })-1, 0)
}

func (l *Log) advanceDurable(end uint64) { advance(&l.durable, end) }

// advance raises v to end unless it is there already.
func advance(v *atomic.Uint64, end uint64) {
	for {
		d := v.Load()
		if d >= end || v.CompareAndSwap(d, end) {
			return
		}
	}
}

// UseJournal makes the log journaled from now on (docs/journal.md): frames
// appended later are handed to j and made durable by it, and Truncate and
// Reset record themselves in it first. What the log holds now must be
// durable in its segment files (as Open leaves it). A log is journaled
// once; the journal cannot be taken away.
func (l *Log) UseJournal(j Journal) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	switch {
	case j == nil:
		return errors.New("partlog: UseJournal of no journal")
	case l.journal != nil:
		return errors.New("partlog: the log is journaled already")
	case l.durable.Load() < l.next:
		return fmt.Errorf("partlog: UseJournal with [%d,%d) not yet durable", l.durable.Load(), l.next)
	}
	l.journal = j
	l.jticket = 0
	l.flushed.Store(l.next)
	return nil
}

// Append appends one encoded frame whose BaseOffset must equal NextOffset()
// (ErrOffsetGap otherwise) after validating it fully. It writes but does not
// fsync; the data is readable at once by ReadFrames (the caller decides what
// is visible to consumers).
//
// Exactly one write syscall per frame; no allocation unless the segment
// rolls or the sparse index grows.
func (l *Log) Append(frame []byte) error {
	if p := l.fault.Load(); p != nil {
		return *p
	}
	// Validate (CRC and record structure) before taking the lock: it is the
	// expensive part and touches no shared state.
	h, err := validateFrame(frame)
	if err != nil {
		return err
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	if h.BaseOffset != l.next {
		return fmt.Errorf("%w: frame base offset %d, log end offset %d", ErrOffsetGap, h.BaseOffset, l.next)
	}
	if n := len(l.epochs); n > 0 && h.Epoch < l.epochs[n-1].Epoch {
		return fmt.Errorf("%w: frame at offset %d has epoch %d, log is at epoch %d",
			ErrEpochRegress, h.BaseOffset, h.Epoch, l.epochs[n-1].Epoch)
	}
	s := l.active()
	if !s.empty() && s.size+int64(len(frame)) > l.limits.Load().SegmentBytes {
		if s, err = l.roll(); err != nil {
			return err
		}
	}
	pos := s.size
	if l.avgFrame == 0 {
		l.avgFrame = int64(len(frame))
	} else {
		l.avgFrame += (int64(len(frame)) - l.avgFrame) / 8
	}
	if _, err := s.f.WriteAt(frame, pos); err != nil {
		// Part of the frame may be on disk; the in-memory end did not move,
		// and the log never writes again: recovery will cut the torn tail.
		return l.fail(ErrFailed, "write %d bytes to %s at byte %d: %w", len(frame), s.path, pos, err)
	}
	l.mu.Lock()
	s.addFrame(h, pos, l.interval)
	l.next = h.End()
	l.rolling = rollChecksum(l.rolling, h.CRC)
	if n := len(l.epochs); n == 0 || l.epochs[n-1].Epoch != h.Epoch {
		l.epochs = append(l.epochs, EpochStart{Epoch: h.Epoch, StartOffset: h.BaseOffset})
	}
	l.mu.Unlock()
	if l.journal != nil {
		// In the log's order, under wmu: the journal holds one
		// partition's frames in the order they were appended. A large
		// frame is not copied: the journal records where it is, and
		// Sync fsyncs the segment file for it.
		var t uint64
		if l.direct > 0 && int64(len(frame)) >= l.direct {
			t, err = l.journal.Written(h)
			l.fileOnly = h.End()
		} else {
			t, err = l.journal.Frame(h, frame)
		}
		if err != nil {
			// In the file and readable, but never durable: the log
			// stops, and recovery cuts what the journal does not hold.
			return l.fail(ErrFailed, "journal frame [%d,%d): %w", h.BaseOffset, h.End(), err)
		}
		l.jticket = t
	}
	return nil
}

// roll seals the active segment and creates the next one. The sealed
// segment is fsynced first, so that every sealed segment is whole on disk
// and a torn tail can only be in the last segment (storage-format.md §6).
// Called with wmu held.
func (l *Log) roll() (*segment, error) {
	old := l.active()
	if err := old.cutZeros(); err != nil {
		return nil, l.fail(ErrFailed, "roll: %w", err)
	}
	if err := old.f.Sync(); err != nil {
		return nil, l.fail(ErrFailed, "fsync %s before roll: %w", old.path, err)
	}
	if l.journal == nil {
		// A journaled log's frames are durable when the journal holds
		// them, never before: recovery trusts the segment files only up
		// to the journal's last checkpoint, and replays the rest from
		// the journal.
		l.advanceDurable(old.end)
	}
	advance(&l.flushed, old.end)
	// Sealed: its summary spares the next Open a scan of its frames. The
	// new segment's creation fsyncs the directory after it.
	l.writeSummary(old, l.summarize(old, l.rolling, false))
	s, err := createSegment(l.fs, l.dir, old.end, l.rolling)
	if err != nil {
		return nil, l.fail(ErrFailed, "roll: %w", err)
	}
	l.mu.Lock()
	l.segs = append(l.segs, s)
	l.mu.Unlock()
	return s, nil
}

// Sync makes everything appended durable. Any failure moves the log to
// ErrFailed for good: the process must crash-stop, never acknowledge.
func (l *Log) Sync() error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	return l.syncHeld()
}

// syncHeld is Sync, called with syncMu held.
func (l *Log) syncHeld() error {
	l.wmu.Lock()
	if err := l.usable(); err != nil {
		l.wmu.Unlock()
		return err
	}
	// Only the active segment can hold unsynced data (roll fsyncs the one it
	// seals). If Append rolls while we fsync, s is the sealed one and end is
	// within it, so fsyncing s still covers end.
	s, end := l.active(), l.next
	size, ticket, fileOnly := s.size, l.jticket, l.fileOnly
	l.wmu.Unlock()
	if l.durable.Load() >= end {
		return nil
	}
	if l.journal != nil {
		// Durable once the journal holds it; the segment files are
		// fsynced later, by Flush. A frame written to the segment file
		// only is durable once the file is fsynced past it too (and the
		// journal holds its record, its offsets and CRC, which recovery
		// finds it by): the fsync runs while the journal's group commit
		// does.
		var synced chan error
		if fileOnly > l.flushed.Load() {
			synced = make(chan error, 1)
			go func() { synced <- datasync(s.f) }()
		}
		werr := l.journal.Wait(ticket)
		if synced != nil {
			if err := <-synced; err != nil {
				return l.fail(ErrFailed, "fsync %s: %w", s.path, err)
			}
			advance(&l.flushed, end)
			l.dropCachedBehind(s, size)
		}
		if werr != nil {
			return l.fail(ErrFailed, "journal: %w", werr)
		}
		l.advanceDurable(end)
		return nil
	}
	if err := datasync(s.f); err != nil {
		return l.fail(ErrFailed, "fsync %s: %w", s.path, err)
	}
	l.advanceDurable(end)
	advance(&l.flushed, end)
	l.dropCachedBehind(s, size)
	return nil
}

// Flush fsyncs the segment files up to the log's end and returns that
// end: the segment files hold [StartOffset, end) durably on their own. A
// journaled log's journal calls it before a checkpoint (docs/journal.md,
// "The shape"); it holds off Truncate, Reset and retention while it
// runs, not appends. Like Sync, a failure is the log's for good.
//
// A log a reader found corrupt is flushed all the same: its files are
// what they are, and the journal's checkpoint must still be able to say
// how far they are durable, or no checkpoint could be taken at all.
func (l *Log) Flush() (uint64, error) {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.wmu.Lock()
	if err := l.usable(); err != nil && (l.closed || !errors.Is(err, ErrCorrupt)) {
		l.wmu.Unlock()
		return 0, err
	}
	s, end := l.active(), l.next
	size := s.size
	l.wmu.Unlock()
	if l.flushed.Load() >= end {
		return end, nil
	}
	if err := datasync(s.f); err != nil {
		if ferr := l.fail(ErrFailed, "fsync %s: %w", s.path, err); !errors.Is(ferr, ErrFailed) {
			// The log was corrupt already: say what failed now.
			return 0, fmt.Errorf("%w: fsync %s: %w", ErrFailed, s.path, err)
		}
		return 0, *l.fault.Load()
	}
	advance(&l.flushed, end)
	if l.journal == nil {
		l.advanceDurable(end)
	}
	l.dropCachedBehind(s, size)
	return end, nil
}

// dropCachedBehind drops from the page cache what lies more than
// cachedTailBytes behind size bytes into segment s (the log's end when
// Sync read it): in s, and in the segments before it, which rolls left
// partly cached, back to one that was dropped whole (as every one before
// it was). Called by Sync, under syncMu, so nothing closes or cuts the
// segments meanwhile; sealed segments' sizes no longer change.
func (l *Log) dropCachedBehind(s *segment, size int64) {
	l.mu.RLock()
	segs := l.segs
	l.mu.RUnlock()
	i := len(segs) - 1
	for i >= 0 && segs[i] != s {
		i--
	}
	keep := int64(cachedTailBytes)
	for ; i >= 0; i-- {
		seg, segSize := segs[i], size
		if seg != s {
			segSize = seg.size // sealed: no longer changes
		}
		if keep > 0 {
			seg.dropCached(segSize - keep)
			keep -= segSize
			continue
		}
		if seg.uncachedTo >= segSize&^4095 {
			break
		}
		seg.dropCached(segSize + 4095) // all of it, its last page too
	}
}

// cachedTailBytes is how much of the active segment, behind its end, a
// log leaves in the page cache after an fsync; see segment.dropCached.
const cachedTailBytes = 32 << 20

// Cuts counts the log's truncations and resets since it was opened: a
// journal's checkpoint compares it before and after it flushes the log,
// and does not trust an end read across a cut.
func (l *Log) Cuts() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.cuts
}

// NextOffset is the log end offset: the offset the next batch must start at.
func (l *Log) NextOffset() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.next
}

// StartOffset is the first retained offset (the oldest segment's base).
func (l *Log) StartOffset() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.segs[0].base
}

// StartChecksum is the rolling checksum at StartOffset (the oldest
// segment's header): what a copy that starts there must start from.
func (l *Log) StartChecksum() uint32 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.segs[0].rollBase
}

// Usage is the log's size on disk (headers and whole frames of every
// retained segment) and how many segments hold it.
func (l *Log) Usage() (bytes int64, segments int) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, s := range l.segs {
		bytes += s.size
	}
	return bytes, len(l.segs)
}

// DurableOffset is the end of the prefix known to be fsynced.
func (l *Log) DurableOffset() uint64 { return l.durable.Load() }

// RollingChecksum returns the rolling checksum of the log up to NextOffset
// (see storage-format.md): equal on two members iff their logs are equal.
func (l *Log) RollingChecksum() uint32 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.rolling
}

// Recovery reports what Open repaired (zero value: nothing).
func (l *Log) Recovery() RecoveryInfo { return l.recovered }

// Epochs returns the epoch transitions of the retained log, oldest first.
// The first entry's StartOffset is clamped to StartOffset after retention.
func (l *Log) Epochs() []EpochStart {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return append([]EpochStart(nil), l.epochs...)
}

// EpochEndOffset returns the first offset written under an epoch greater
// than epoch, or NextOffset if there is none: for chain repair, the end of
// epoch's (and earlier epochs') part of the log. If retention has deleted the
// batches that would answer (the oldest retained batch is already of a later
// epoch), it returns ErrOutOfRange.
func (l *Log) EpochEndOffset(epoch uint64) (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if err := l.usable(); err != nil {
		return 0, err
	}
	for i, e := range l.epochs {
		if e.Epoch <= epoch {
			continue
		}
		if start := l.segs[0].base; i == 0 && start > 0 && e.StartOffset == start {
			return 0, fmt.Errorf("%w: epoch %d: the oldest retained batch (offset %d) is of epoch %d and older batches are deleted",
				ErrOutOfRange, epoch, start, e.Epoch)
		}
		return e.StartOffset, nil
	}
	return l.next, nil
}

// ReadFrames returns whole raw frames starting with the one containing
// offset from, stopping before maxEnd (exclusive offset bound) and after
// roughly maxBytes (at least one frame if any is available). Frames are
// CRC-checked; a mismatch moves the partition to ErrCorrupt.
//
// A frame is returned only if it ends at or before maxEnd. The frames are
// slices of buffers private to this call (capacity clipped to each frame),
// so they stay valid and unchanged after later appends. from == NextOffset
// returns no frames and no error; from outside [StartOffset, NextOffset] is
// ErrOutOfRange.
//
// The log's lock is held only to pin the segments the read needs (see
// handle) and note their published sizes: the reads and checksums happen
// outside it, so appends go on meanwhile. A read that a Truncate or Reset
// may have disturbed starts again on the cut log (readFramesOnce), never
// reporting corruption; after maxReadAttempts it is ErrOutOfRange.
func (l *Log) ReadFrames(from, maxEnd uint64, maxBytes int) ([][]byte, error) {
	for attempt := 1; ; attempt++ {
		out, cut, err := l.readFramesOnce(from, maxEnd, maxBytes)
		if !cut {
			return out, err
		}
		if attempt == maxReadAttempts {
			return nil, fmt.Errorf("%w: the log was cut under each of %d reads from offset %d", ErrOutOfRange, attempt, from)
		}
	}
}

// maxReadAttempts bounds how often ReadFrames starts again after a cut.
const maxReadAttempts = 4

// readFramesOnce is one attempt of ReadFrames. cut: a Truncate or Reset
// ran meanwhile and may explain what the read found (a failure, when any
// cut ran: the read reaches ahead past the frames it needs, so even a cut
// above them can shorten what it reads; frames, when a cut is below their
// end: they may mix two logs); the caller starts again, from a fresh look
// at the log.
func (l *Log) readFramesOnce(from, maxEnd uint64, maxBytes int) (out [][]byte, cut bool, err error) {
	views, maxEnd, cuts, err := l.pinFor(from, maxEnd, maxBytes)
	if err != nil || len(views) == 0 {
		return nil, false, err
	}
	defer func() {
		for _, v := range views {
			v.h.unpin()
		}
	}()
	// A failure is the log's (readErr, corrupt) unless any cut ran since
	// the pin: the read reaches ahead past what it needs, up to the size
	// it pinned.
	anyCut := func() bool { return l.cutBelow(cuts, math.MaxUint64) }
	readFailed := func(path string, pos int64, err error) ([][]byte, bool, error) {
		if anyCut() {
			return nil, true, nil
		}
		return nil, false, l.readErr(path, pos, err)
	}
	badFrame := func(path string, pos int64, err error) ([][]byte, bool, error) {
		if anyCut() {
			return nil, true, nil
		}
		return nil, false, l.corrupt(path, pos, err)
	}
	// Remaining byte budget, clamped so that read-ahead sums cannot overflow
	// (no read spans more than one segment anyway).
	budget := func(total int) int64 { return min(int64(max(maxBytes-total, 0)), MaxSegmentBytes+MaxFrameBytes) }
	total := 0
	expect := from // base offset the next returned frame must have, once started
	started := false
	for _, v := range views {
		r := segReader{f: v.h.f, limit: v.size}
		pos, skip := v.pos, v.skip
		for pos < v.size {
			hb, err := r.at(pos, FrameHeaderSize, budget(total)+skip+FrameHeaderSize)
			if err != nil {
				return readFailed(v.path, pos, err)
			}
			h, err := DecodeHeader(hb)
			if err != nil {
				return badFrame(v.path, pos, err)
			}
			if !started && h.End() <= from {
				pos += int64(h.FrameLen)
				continue
			}
			if (started && h.BaseOffset != expect) || (!started && h.BaseOffset > from) {
				return badFrame(v.path, pos, fmt.Errorf("frame base offset %d, expected %d", h.BaseOffset, expect))
			}
			if h.End() > maxEnd || (len(out) > 0 && total+int(h.FrameLen) > maxBytes) {
				return out, l.cutBelow(cuts, expect), nil
			}
			fb, err := r.at(pos, int64(h.FrameLen), budget(total))
			if err != nil {
				return readFailed(v.path, pos, err)
			}
			if c := frameCRC(fb); c != h.CRC {
				return badFrame(v.path, pos, fmt.Errorf("%w: batch at offset %d: crc32c %08x, header says %08x",
					ErrBadFrame, h.BaseOffset, c, h.CRC))
			}
			out = append(out, fb[:len(fb):len(fb)])
			total += len(fb)
			expect, started, skip = h.End(), true, 0
			pos += int64(h.FrameLen)
		}
	}
	return out, l.cutBelow(cuts, expect), nil
}

// cutBelow reports whether a Truncate or Reset since the log's cut count
// was cuts cut it below offset end (when more cuts ran than recentCuts
// remembers, it says yes).
func (l *Log) cutBelow(cuts, end uint64) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.cutBelowLocked(cuts, end)
}

// cutBelowLocked is cutBelow, called with mu (or wmu) held.
func (l *Log) cutBelowLocked(cuts, end uint64) bool {
	if l.cuts-cuts > uint64(len(l.recentCuts)) {
		return true
	}
	for c := cuts + 1; c <= l.cuts; c++ {
		if l.recentCuts[c%uint64(len(l.recentCuts))] < end {
			return true
		}
	}
	return false
}

// noteCut records a cut of the log at offset to. Called with mu held.
func (l *Log) noteCut(to uint64) {
	l.cuts++
	l.recentCuts[l.cuts%uint64(len(l.recentCuts))] = to
}

// segView is a pinned segment as one read sees it: its published size
// then, and where the read starts in it (skip: how far the first read
// should reach ahead, from the index entry to the wanted frame).
type segView struct {
	h         *handle
	path      string
	size, pos int64
	skip      int64
}

// pinFor pins, under the read lock, the segments a read of [from, maxEnd)
// of about maxBytes needs, and returns them with maxEnd clipped to the
// log's end and the log's cut count.
func (l *Log) pinFor(from, maxEnd uint64, maxBytes int) ([]segView, uint64, uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if err := l.usable(); err != nil {
		return nil, 0, 0, err
	}
	if start := l.segs[0].base; from < start || from > l.next {
		return nil, 0, 0, fmt.Errorf("%w: read from offset %d, log holds [%d,%d)", ErrOutOfRange, from, start, l.next)
	}
	maxEnd = min(maxEnd, l.next)
	if from >= maxEnd {
		return nil, maxEnd, l.cuts, nil
	}
	var views []segView
	var bytes int64
	for si := l.segmentFor(from); si < len(l.segs) && (len(views) == 0 || bytes <= int64(maxBytes)); si++ {
		s := l.segs[si]
		if len(views) > 0 && s.base >= maxEnd {
			break
		}
		v := segView{h: s.h, path: s.path, size: s.size, pos: SegmentHeaderSize}
		if len(views) == 0 {
			v.pos, v.skip = s.lookup(from), l.interval
		}
		s.h.pin()
		views = append(views, v)
		bytes += v.size - v.pos
	}
	return views, maxEnd, l.cuts, nil
}

// OffsetForTime returns the first offset whose batch MaxTimestamp >= ts,
// or NextOffset if none. (The base offset of the first such batch; headers
// are trusted here, CRCs are checked when the frames are read.)
func (l *Log) OffsetForTime(ts int64) (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if err := l.usable(); err != nil {
		return 0, err
	}
	for _, s := range l.segs {
		if s.empty() || s.maxTs < ts {
			continue
		}
		// The last entry's prefixMax is s.maxTs >= ts, so i is in range, and
		// entry i's interval holds the first batch with MaxTimestamp >= ts.
		i := sort.Search(len(s.index), func(i int) bool { return s.index[i].prefixMax >= ts })
		pos, limit := int64(s.index[i].pos), s.size
		if i+1 < len(s.index) {
			limit = int64(s.index[i+1].pos)
		}
		r := segReader{f: s.f, limit: s.size, reuse: true}
		for pos < limit {
			hb, err := r.at(pos, FrameHeaderSize, headerWalkReadahead)
			if err != nil {
				return 0, l.readErr(s.path, pos, err)
			}
			h, err := DecodeHeader(hb)
			if err != nil {
				return 0, l.corrupt(s.path, pos, err)
			}
			if h.MaxTimestamp >= ts {
				return h.BaseOffset, nil
			}
			pos += int64(h.FrameLen)
		}
		return 0, l.corrupt(s.path, pos, fmt.Errorf("index promises a batch with max timestamp >= %d that the file lacks", ts))
	}
	return l.next, nil
}

// Close closes files (after a final Sync if healthy). It returns the log's
// fault if it has one; later calls return ErrClosed.
func (l *Log) Close() error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.closed {
		return l.usable() // the fault if any: failed stays failed
	}
	var err error
	if p := l.fault.Load(); p != nil {
		err = *p
	} else if s := l.active(); l.durable.Load() < l.next || l.flushed.Load() < l.next || s.zeroTo > s.size {
		// A journaled log too: a clean close leaves the segment files
		// whole, so the journal's last checkpoint needs nothing of it.
		if serr := s.cutZeros(); serr != nil {
			err = l.fail(ErrFailed, "close: %w", serr)
		} else if serr := s.f.Sync(); serr != nil {
			err = l.fail(ErrFailed, "fsync %s at close: %w", s.path, serr)
		} else {
			if l.journal == nil {
				l.advanceDurable(l.next)
			}
			advance(&l.flushed, l.next)
		}
	}
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	for _, s := range l.segs {
		if cerr := s.h.retire(); cerr != nil && err == nil {
			err = fmt.Errorf("partlog: close %s: %w", s.path, cerr)
		}
	}
	return err
}
