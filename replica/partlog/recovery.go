package partlog

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Open recovers (or creates) the log in opts.Dir, following the numbered
// steps of storage-format.md §7.
func Open(opts Options) (*Log, error) {
	l, err := newLog(opts)
	if err != nil {
		return nil, err
	}
	if opts.Flushed != nil && opts.Empty != nil {
		return nil, errors.New("partlog: Options.Flushed and Options.Empty together")
	}
	if err := l.recover(opts.Flushed, opts.Empty, opts.Verify); err != nil {
		for _, s := range l.segs {
			s.f.Close()
		}
		return nil, err
	}
	for _, s := range l.segs {
		noReadAhead(s.f)
	}
	// A recovered log is durable by construction (step 8).
	l.durable.Store(l.next)
	return l, nil
}

func newLog(o Options) (*Log, error) {
	switch {
	case o.Dir == "":
		return nil, errors.New("partlog: Options.Dir is empty")
	case o.IndexIntervalBytes < 0:
		return nil, errors.New("partlog: negative IndexIntervalBytes")
	case o.DirectFrameBytes < 0:
		return nil, errors.New("partlog: negative DirectFrameBytes")
	}
	l := &Log{
		fs:       o.FS,
		dir:      filepath.Clean(o.Dir),
		interval: o.IndexIntervalBytes,
		now:      o.Now,
		direct:   int64(o.DirectFrameBytes),
	}
	if err := l.SetLimits(Limits{SegmentBytes: o.SegmentBytes, RetentionBytes: o.RetentionBytes, RetentionTime: o.RetentionTime}); err != nil {
		return nil, err
	}
	if l.fs == nil {
		l.fs = OSFS{}
	}
	if l.interval == 0 {
		l.interval = DefaultIndexIntervalBytes
	}
	if l.now == nil {
		l.now = time.Now
	}
	return l, nil
}

// Limits are the settings of an open log that may change while it is
// open (a Stream's retention or segment size edited live).
type Limits struct {
	// SegmentBytes is where the active segment rolls (0: the default); a
	// change applies from the next roll.
	SegmentBytes int64
	// RetentionBytes and RetentionTime are the soft retention limits
	// (0: unlimited), applied at the next retention round.
	RetentionBytes int64
	RetentionTime  time.Duration
}

// SetLimits replaces the log's limits; invalid ones are refused and change
// nothing.
func (l *Log) SetLimits(lim Limits) error {
	switch {
	case lim.SegmentBytes < 0 || lim.SegmentBytes > MaxSegmentBytes:
		return fmt.Errorf("partlog: SegmentBytes %d not in [0,%d]", lim.SegmentBytes, MaxSegmentBytes)
	case lim.SegmentBytes > 0 && lim.SegmentBytes < SegmentHeaderSize+FrameHeaderSize:
		return fmt.Errorf("partlog: SegmentBytes %d below the minimum %d", lim.SegmentBytes, SegmentHeaderSize+FrameHeaderSize)
	case lim.RetentionBytes < 0 || lim.RetentionTime < 0:
		return errors.New("partlog: negative RetentionBytes or RetentionTime")
	}
	if lim.SegmentBytes == 0 {
		lim.SegmentBytes = DefaultSegmentBytes
	}
	l.limits.Store(&lim)
	return nil
}

func corruptAt(path string, pos int64, format string, args ...any) error {
	return fmt.Errorf("%w: %s at byte %d: %s", ErrCorrupt, path, pos, fmt.Sprintf(format, args...))
}

// recover runs recovery steps 1–8, after cutting the log at flushed or
// emptying it at empty when the journal's replay says so, keeping the
// frames of verify that follow. On error, the segments opened so far are
// in l.segs for the caller to close.
func (l *Log) recover(flushed *uint64, empty *Start, verify []FrameCheck) error {
	// Step 1.
	if err := l.fs.MkdirAll(l.dir, 0o755); err != nil {
		return fmt.Errorf("partlog: create %s: %w", l.dir, err)
	}
	names, err := l.fs.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("partlog: list %s: %w", l.dir, err)
	}
	var bases []uint64
	removed := false
	for _, name := range names {
		if strings.HasSuffix(name, segSuffix+tmpSuffix) {
			if err := l.fs.Remove(filepath.Join(l.dir, name)); err != nil {
				return fmt.Errorf("partlog: remove leftover %s: %w", name, err)
			}
			removed = true
			continue
		}
		if base, ok := parseSegmentName(name); ok {
			bases = append(bases, base) // names are sorted, hence bases are
		}
	}
	if removed {
		if err := l.fs.SyncDir(l.dir); err != nil {
			return fmt.Errorf("partlog: fsync dir %s: %w", l.dir, err)
		}
	}
	if err := l.removeSummaries(names, bases); err != nil {
		return err
	}
	if empty != nil && len(verify) > 0 && len(bases) > 0 && bases[0] >= empty.Base {
		// The files may be the empty log's, with frames of verify;
		// retention may have removed its first segments since. They
		// are if the first one starts where those frames lead, with
		// the rolling checksum they lead to.
		at, rolling, rest := empty.Base, empty.Rolling, verify
		for len(rest) > 0 && rest[0].Base == at && rest[0].End <= bases[0] {
			rolling = rollChecksum(rolling, rest[0].CRC)
			at, rest = rest[0].End, rest[1:]
		}
		if at == bases[0] {
			ok, err := l.startsAt(at, Start{Base: at, Rolling: rolling})
			if err != nil {
				return err
			}
			if ok {
				flushed, empty, verify = &at, nil, rest
			}
		}
	}
	switch {
	case empty != nil:
		if err := l.removeNewestFirstAt(bases); err != nil {
			return err
		}
		s, err := createSegment(l.fs, l.dir, empty.Base, empty.Rolling)
		if err != nil {
			return fmt.Errorf("partlog: %w", err)
		}
		l.segs = []*segment{s}
		l.next, l.rolling = empty.Base, empty.Rolling
		return nil
	case flushed != nil:
		if bases, err = l.cutAbove(bases, *flushed, verify); err != nil {
			return err
		}
	}
	// Step 2.
	if len(bases) == 0 {
		s, err := createSegment(l.fs, l.dir, 0, 0)
		if err != nil {
			return fmt.Errorf("partlog: %w", err)
		}
		l.segs = []*segment{s}
		return nil
	}
	// Steps 3–7.
	for i, base := range bases {
		path := filepath.Join(l.dir, segmentName(base))
		f, err := l.fs.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("partlog: open %s: %w", path, err)
		}
		s := newSegmentState(path, f, base, 0)
		l.segs = append(l.segs, s)
		if i == len(bases)-1 {
			// Read the last segment from the disk: after a failed fsync
			// the kernel keeps unsynced pages cached but clean, so a
			// process restarted without a machine crash would read, and
			// call durable, records the disk never got. Sealed segments
			// were fsynced whole before the next existed.
			if err := readFromDisk(f); err != nil {
				return fmt.Errorf("partlog: %s: %w", path, err)
			}
		}
		var next *segmentStart
		if i < len(bases)-1 {
			next = l.peekStart(bases[i+1])
		}
		if err := l.loadSegment(s, i == 0, i == len(bases)-1, next); err != nil {
			return err
		}
	}
	// Step 8. A summary of the last segment is of an earlier life: it was
	// sealed once and cut since (a truncation, a journal's replay).
	last := l.active()
	l.removeSummary(last.path)
	if err := last.f.Sync(); err != nil {
		return fmt.Errorf("partlog: fsync %s: %w", last.path, err)
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		return fmt.Errorf("partlog: fsync dir %s: %w", l.dir, err)
	}
	return nil
}

// removeNewestFirstAt deletes the segments of bases newest first, each
// removal followed by a directory fsync, so that a crash leaves a
// contiguous log.
func (l *Log) removeNewestFirstAt(bases []uint64) error {
	for i := len(bases) - 1; i >= 0; i-- {
		path := filepath.Join(l.dir, segmentName(bases[i]))
		l.removeSummary(path)
		if err := l.fs.Remove(path); err != nil {
			return fmt.Errorf("partlog: remove %s: %w", path, err)
		}
		if err := l.fs.SyncDir(l.dir); err != nil {
			return fmt.Errorf("partlog: fsync dir %s after removing %s: %w", l.dir, path, err)
		}
	}
	return nil
}

// startsAt says whether the segment of base starts with a header of base
// and s's rolling checksum.
func (l *Log) startsAt(base uint64, s Start) (bool, error) {
	path := filepath.Join(l.dir, segmentName(base))
	f, err := l.fs.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Errorf("partlog: open %s: %w", path, err)
	}
	defer f.Close()
	if err := readFromDisk(f); err != nil {
		return false, fmt.Errorf("partlog: %s: %w", path, err)
	}
	hdr := make([]byte, SegmentHeaderSize)
	if _, err := f.ReadAt(hdr, 0); err != nil {
		return false, nil // shorter than a header: not the log's
	}
	b, rolling, err := decodeSegmentHeader(hdr)
	return err == nil && b == s.Base && rolling == s.Rolling, nil
}

// cutAbove cuts the log in the segments of bases at offset to, below which
// a journal's checkpoint says the files were fsynced, or past the frames
// above it that match verify from its first (offsets and CRC, whole): the
// segment holding the cut is cut at its frame boundary and fsynced, later
// segments removed newest first. Nothing else above to is trusted: it is
// whatever a crash left of unsynced writes. Below it the frames must be
// whole and contiguous (ErrCorrupt otherwise; the normal recovery that
// follows checks them again, with the rolling checksums). It returns the
// bases left.
func (l *Log) cutAbove(bases []uint64, to uint64, verify []FrameCheck) ([]uint64, error) {
	if len(bases) == 0 {
		if to == 0 {
			return nil, nil
		}
		return nil, corruptAt(l.dir, 0, "the journal says the log was flushed to offset %d, and it has no segment", to)
	}
	k := sort.Search(len(bases), func(i int) bool { return bases[i] > to }) - 1
	if k < 0 {
		return nil, corruptAt(filepath.Join(l.dir, segmentName(bases[0])), 0, "the journal says the log was flushed to offset %d, below its first segment", to)
	}
	path := filepath.Join(l.dir, segmentName(bases[k]))
	f, size, err := l.openToVerify(path)
	if err != nil {
		return nil, err
	}
	defer func() { f.Close() }()
	pos, next := int64(SegmentHeaderSize), bases[k]
	r := segReader{f: f, limit: size, reuse: true}
	for next < to {
		h, bad, err := scanFrame(&r, pos, size)
		switch {
		case err != nil:
			return nil, fmt.Errorf("partlog: read %s at byte %d: %w", path, pos, err)
		case bad != nil:
			return nil, corruptAt(path, pos, "below offset %d, which the journal says was flushed: %v", to, bad)
		case h.BaseOffset != next || h.End() > to:
			return nil, corruptAt(path, pos, "frame [%d,%d) where the log flushed to offset %d continues at %d", h.BaseOffset, h.End(), to, next)
		}
		next, pos = h.End(), pos+int64(h.FrameLen)
	}
	if size < pos {
		// A segment holding only a header, its frames cut short.
		return nil, corruptAt(path, size, "the segment ends before offset %d, which the journal says was flushed", to)
	}
	// The frames of verify the files hold whole, in order, each where the
	// one before ended: in this segment, or at the start of the next one
	// (an append rolled to it).
	for _, v := range verify {
		if v.Base != next {
			break
		}
		h, bad, err := scanFrame(&r, pos, size)
		if err != nil {
			return nil, fmt.Errorf("partlog: read %s at byte %d: %w", path, pos, err)
		}
		if bad != nil || h.BaseOffset != v.Base || h.End() != v.End || h.CRC != v.CRC {
			if k+1 >= len(bases) || bases[k+1] != next {
				break
			}
			if err := cutAt(f, path, size, pos); err != nil {
				return nil, err
			}
			f.Close()
			k++
			path = filepath.Join(l.dir, segmentName(bases[k]))
			if f, size, err = l.openToVerify(path); err != nil {
				return nil, err
			}
			pos, r = SegmentHeaderSize, segReader{f: f, limit: size, reuse: true}
			if h, bad, err = scanFrame(&r, pos, size); err != nil {
				return nil, fmt.Errorf("partlog: read %s at byte %d: %w", path, pos, err)
			}
			if bad != nil || h.BaseOffset != v.Base || h.End() != v.End || h.CRC != v.CRC {
				break
			}
		}
		next, pos = h.End(), pos+int64(h.FrameLen)
	}
	if err := l.removeNewestFirstAt(bases[k+1:]); err != nil {
		return nil, err
	}
	if err := cutAt(f, path, size, pos); err != nil {
		return nil, err
	}
	return bases[:k+1], nil
}

// openToVerify opens a segment file for cutAbove, its next reads from the
// disk, and gives its size.
func (l *Log) openToVerify(path string) (File, int64, error) {
	f, err := l.fs.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("partlog: open %s: %w", path, err)
	}
	if err := readFromDisk(f); err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("partlog: %s: %w", path, err)
	}
	size, err := fileSize(f)
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("partlog: stat %s: %w", path, err)
	}
	if size < SegmentHeaderSize {
		f.Close()
		return nil, 0, corruptAt(path, size, "file of %d bytes has no whole segment header", size)
	}
	return f, size, nil
}

// cutAt cuts the segment file f of size bytes at pos, if it is longer,
// and fsyncs it.
func cutAt(f File, path string, size, pos int64) error {
	if size <= pos {
		return nil
	}
	if err := f.Truncate(pos); err != nil {
		return fmt.Errorf("partlog: cut %s at byte %d: %w", path, pos, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("partlog: fsync %s: %w", path, err)
	}
	return nil
}

// ReadFromDisk is readFromDisk, for other files recovered the same way
// (the replica's journal).
func ReadFromDisk(f File) error { return readFromDisk(f) }

// readFromDisk makes the next reads of f come from the disk (step 3a):
// it fsyncs f, so that pages written but not yet written back (a process
// crash, the machine still up) reach the disk and stay valid, then drops
// its clean cached pages, which after a failed fsync include pages that
// never reached the disk. Files without a page cache of their own (tests'
// in-memory file systems that do not model one) are left alone.
func readFromDisk(f File) error {
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync before recovery: %w", err)
	}
	if err := dropCache(f); err != nil {
		return fmt.Errorf("drop cached pages before recovery: %w", err)
	}
	return nil
}

// peekStart reads the header of the segment of base: nil when it does not
// read or decode (loadSegment then finds what is wrong with it).
func (l *Log) peekStart(base uint64) *segmentStart {
	f, err := l.fs.OpenFile(filepath.Join(l.dir, segmentName(base)), os.O_RDONLY, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	hdr := make([]byte, SegmentHeaderSize)
	if _, err := f.ReadAt(hdr, 0); err != nil {
		return nil
	}
	b, rolling, err := decodeSegmentHeader(hdr)
	if err != nil || b != base {
		return nil
	}
	return &segmentStart{base: b, rolling: rolling}
}

// loadSegment verifies s's header and continuity (steps 3–4) and scans its
// frames (step 5), repairing a torn tail if s is the last segment (6–7).
// next is the start of the segment after s (nil: s is the last one, or
// that segment's header does not read), for s's summary.
func (l *Log) loadSegment(s *segment, first, last bool, next *segmentStart) (err error) {
	size, err := fileSize(s.f)
	if err != nil {
		return fmt.Errorf("partlog: stat %s: %w", s.path, err)
	}
	hdr := make([]byte, SegmentHeaderSize)
	if size < SegmentHeaderSize {
		return corruptAt(s.path, 0, "file of %d bytes has no whole segment header", size)
	}
	if _, err := s.f.ReadAt(hdr, 0); err != nil {
		return fmt.Errorf("partlog: read header of %s: %w", s.path, err)
	}
	base, rolling, err := decodeSegmentHeader(hdr)
	if err != nil {
		return corruptAt(s.path, 0, "%v", err)
	}
	if base != s.base {
		return corruptAt(s.path, 0, "header base offset %d does not match the file name", base)
	}
	s.rollBase = rolling
	if first {
		l.next, l.rolling = base, rolling
	} else {
		if base != l.next {
			return corruptAt(s.path, 0, "segment starts at offset %d but the previous segment ends at %d", base, l.next)
		}
		if rolling != l.rolling {
			return corruptAt(s.path, 0, "rolling checksum at base %08x, previous segments give %08x", rolling, l.rolling)
		}
	}

	if !last && next != nil {
		if sum, ok := l.readSummary(s, size, *next); ok {
			l.adopt(s, sum)
			return nil
		}
	}
	if !last {
		// Scanned, it is marked verified: read what the disk holds, not
		// pages a previous process left cached (clean: sealed segments
		// were fsynced whole).
		if err := readFromDisk(s.f); err != nil {
			return fmt.Errorf("partlog: %s: %w", s.path, err)
		}
		defer func() {
			if err == nil {
				// For the next Open; the scan verified the frames.
				l.writeSummary(s, l.summarize(s, l.rolling, true))
			}
		}()
	}
	r := segReader{f: s.f, limit: size, reuse: true}
	for pos := int64(SegmentHeaderSize); pos < size; {
		h, bad, err := scanFrame(&r, pos, size)
		if err != nil {
			return fmt.Errorf("partlog: read %s at byte %d: %w", s.path, pos, err)
		}
		if bad != nil {
			if !last {
				return corruptAt(s.path, pos, "sealed segment: %v", bad)
			}
			return l.repairTail(s, pos, size, bad)
		}
		// A CRC-valid frame in the wrong place is not what a crash leaves.
		if h.BaseOffset != l.next {
			return corruptAt(s.path, pos, "frame base offset %d, expected %d", h.BaseOffset, l.next)
		}
		if n := len(l.epochs); n > 0 && h.Epoch < l.epochs[n-1].Epoch {
			return corruptAt(s.path, pos, "frame epoch %d after epoch %d", h.Epoch, l.epochs[n-1].Epoch)
		}
		l.admit(s, h, pos)
		pos += int64(h.FrameLen)
	}
	return nil
}

// admit adds a verified frame at pos of s to the in-memory state.
func (l *Log) admit(s *segment, h BatchHeader, pos int64) {
	s.addFrame(h, pos, l.interval)
	l.next = h.End()
	l.rolling = rollChecksum(l.rolling, h.CRC)
	if n := len(l.epochs); n == 0 || l.epochs[n-1].Epoch != h.Epoch {
		l.epochs = append(l.epochs, EpochStart{Epoch: h.Epoch, StartOffset: h.BaseOffset})
	}
}

// scanFrame reads and fully validates the frame at pos of a file of size
// bytes. bad says why the bytes at pos are not a valid frame; err is an I/O
// error.
func scanFrame(r *segReader, pos, size int64) (h BatchHeader, bad, err error) {
	if left := size - pos; left < FrameHeaderSize {
		return h, fmt.Errorf("%d bytes left, a frame header needs %d", left, FrameHeaderSize), nil
	}
	hb, err := r.at(pos, FrameHeaderSize, scanReadahead)
	if err != nil {
		return h, nil, err
	}
	if h, bad = DecodeHeader(hb); bad != nil {
		return h, bad, nil
	}
	if pos+int64(h.FrameLen) > size {
		return h, fmt.Errorf("frame of %d bytes extends past the end of the file (%d)", h.FrameLen, size), nil
	}
	fb, err := r.at(pos, int64(h.FrameLen), scanReadahead)
	if err != nil {
		return h, nil, err
	}
	if _, bad = validateFrame(fb); bad != nil {
		return h, bad, nil
	}
	return h, nil, nil
}

// repairTail handles the first invalid frame at p of the last segment
// (steps 6–7): mid-log damage if any valid frame follows, else a torn tail
// that is cut, keeping the cut bytes as evidence.
func (l *Log) repairTail(s *segment, p, size int64, why error) error {
	zero, err := zeroFrom(s.f, p, size)
	if err != nil {
		return fmt.Errorf("partlog: read %s after byte %d: %w", s.path, p, err)
	}
	if zero {
		// Zeros written ahead (Preallocate), or a frame whose bytes never
		// reached the disk: nothing to keep.
		if err := s.f.Truncate(p); err != nil {
			return fmt.Errorf("partlog: truncate %s to %d: %w", s.path, p, err)
		}
		if err := s.f.Sync(); err != nil {
			return fmt.Errorf("partlog: fsync %s: %w", s.path, err)
		}
		l.recovered.ZeroTailBytes = size - p
		return nil
	}
	var minEpoch uint64
	if n := len(l.epochs); n > 0 {
		minEpoch = l.epochs[n-1].Epoch
	}
	q, found, err := findValidFrame(s, p+1, size, l.next, minEpoch)
	if err != nil {
		return fmt.Errorf("partlog: search %s after byte %d: %w", s.path, p, err)
	}
	if found {
		return corruptAt(s.path, p, "invalid frame (%v) followed by a valid frame at byte %d: damage in the middle of the log, not a torn tail", why, q)
	}

	evidence := s.path + tornInfix + strconv.FormatInt(l.now().UnixNano(), 10)
	for i := 1; ; i++ {
		err := copyToEvidence(l.fs, s, p, size, evidence)
		if err == nil {
			break
		}
		// Never overwrite earlier evidence (an injected or coarse clock can
		// repeat): pick the next free name.
		if !errors.Is(err, fs.ErrExist) || i > maxEvidenceNames {
			return fmt.Errorf("partlog: keep torn tail of %s: %w", s.path, err)
		}
		evidence = fmt.Sprintf("%s%s%d-%d", s.path, tornInfix, l.now().UnixNano(), i)
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		return fmt.Errorf("partlog: fsync dir %s: %w", l.dir, err)
	}
	if err := s.f.Truncate(p); err != nil {
		return fmt.Errorf("partlog: truncate %s to %d: %w", s.path, p, err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("partlog: fsync %s: %w", s.path, err)
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		return fmt.Errorf("partlog: fsync dir %s: %w", l.dir, err)
	}
	l.recovered = RecoveryInfo{TornSegment: s.path, TornAt: p, TornBytes: size - p, Evidence: evidence, Reason: why.Error()}
	return nil
}

// zeroFrom reports whether bytes [from, to) of f are all zero.
func zeroFrom(f File, from, to int64) (bool, error) {
	buf := make([]byte, min(to-from, scanReadahead))
	for off := from; off < to; {
		n := min(int64(len(buf)), to-off)
		if _, err := f.ReadAt(buf[:n], off); err != nil {
			return false, err
		}
		if !allZero(buf[:n]) {
			return false, nil
		}
		off += n
	}
	return true, nil
}

// findValidFrame looks at every byte position in [from, size) for a frame
// that decodes, verifies, has base offset >= minBase and epoch >= minEpoch
// (the conditions a later frame of this log would meet; they keep frames
// embedded in record values of older data from raising false alarms).
func findValidFrame(s *segment, from, size int64, minBase, minEpoch uint64) (int64, bool, error) {
	const window = scanReadahead
	buf := make([]byte, window)
	hdr := make([]byte, FrameHeaderSize)
	for w := from; w+FrameHeaderSize <= size; {
		n := min(int64(window), size-w)
		if _, err := s.f.ReadAt(buf[:n], w); err != nil {
			return 0, false, err
		}
		chunk := buf[:n]
		for i := 0; ; {
			j := bytes.Index(chunk[i:], frameMagic[:])
			if j < 0 {
				break
			}
			q := w + int64(i+j)
			i += j + 1
			if q+FrameHeaderSize > size {
				break
			}
			if _, err := s.f.ReadAt(hdr, q); err != nil {
				return 0, false, err
			}
			h, err := DecodeHeader(hdr)
			if err != nil || h.BaseOffset < minBase || h.Epoch < minEpoch || q+int64(h.FrameLen) > size {
				continue
			}
			fb := make([]byte, h.FrameLen) // ≤ MaxFrameBytes, checked by DecodeHeader
			if _, err := s.f.ReadAt(fb, q); err != nil {
				return 0, false, err
			}
			if _, err := validateFrame(fb); err == nil {
				return q, true, nil
			}
		}
		if w+n >= size {
			break
		}
		// Overlap windows by len(magic)-1 so a magic split across two
		// windows is still found.
		w += n - int64(len(frameMagic)-1)
	}
	return 0, false, nil
}

// maxEvidenceNames bounds the search for a free evidence file name.
const maxEvidenceNames = 1000

// copyToEvidence durably copies bytes [from, to) of s to a new file.
func copyToEvidence(fsys FS, s *segment, from, to int64, path string) error {
	ef, err := fsys.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	buf := make([]byte, min(to-from, scanReadahead))
	for off := from; off < to; {
		n := min(int64(len(buf)), to-off)
		if _, err := s.f.ReadAt(buf[:n], off); err != nil {
			ef.Close()
			return err
		}
		if _, err := ef.WriteAt(buf[:n], off-from); err != nil {
			ef.Close()
			return err
		}
		off += n
	}
	if err := ef.Sync(); err != nil {
		ef.Close()
		return err
	}
	return ef.Close()
}

// StartOnDisk is the first offset of the log in dir as its file names say
// (the oldest segment's base), without opening it: ok is false when dir
// holds no segment. A journal's recovery plans with it (retention may
// have moved the start past a checkpoint's flushed offset).
func StartOnDisk(fsys FS, dir string) (start uint64, ok bool, err error) {
	if fsys == nil {
		fsys = OSFS{}
	}
	names, err := fsys.ReadDir(dir)
	if err != nil {
		return 0, false, fmt.Errorf("partlog: list %s: %w", dir, err)
	}
	for _, name := range names {
		if base, isSeg := parseSegmentName(name); isSeg && (!ok || base < start) {
			start, ok = base, true
		}
	}
	return start, ok, nil
}
