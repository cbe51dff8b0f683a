package partlog

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// A sealed segment's summary (storage-format.md §13): what a scan of its
// frames gives recovery (its end offset and size, the rolling checksum at
// its end, its epoch transitions, its sparse index and newest timestamp),
// written when the segment is sealed, so that Open reads the summary
// instead of every frame of every segment. Without summaries a replica's
// restart read and checked its whole disk: about a second per gigabyte
// here, minutes for a replica holding hundreds of partitions' retention.
//
// A summary is advice: Open uses it only when it checks whole (its CRC),
// names this segment (base, size, the rolling checksum the segment's
// header starts from) and the last frame it names is in the file where it
// says (offsets and CRC read from the frame's header); otherwise the
// segment is scanned as before, and its summary written afresh. Frames of
// a segment opened from its summary are verified when they are read, as
// every read verifies them.
const (
	summarySuffix  = ".sum"
	summaryVersion = 1
	// summaryFixed is the size of a summary without its epochs and index
	// entries, CRC included.
	summaryFixed = 4 + 4 + 8 + 8 + 8 + 4 + 4 + 8 + 4 + 8 + 4 + 4 + 4
	// Each epoch transition is 16 bytes, each index entry 20.
	summaryEpochBytes = 16
	summaryIndexBytes = 20
)

var summaryMagic = [4]byte{'C', 'T', 'N', 'M'}

// summaryVerified is the flag bit saying VerifySealed read the segment.
const summaryVerified = 1

// summary is a sealed segment's state as recovery needs it.
type summary struct {
	base, end uint64
	size      int64
	rollBase  uint32 // the rolling checksum at base (the segment header's)
	rollEnd   uint32 // the rolling checksum at end
	lastPos   int64  // the last frame's byte position
	lastCRC   uint32 // and its CRC
	maxTs     int64
	epochs    []EpochStart // the epoch at base, then each change within
	index     []indexEntry
	// verified: VerifySealed read the segment's frames and they gave
	// this summary (flag bit 0).
	verified bool
}

func summaryPath(segPath string) string { return segPath + summarySuffix }

func encodeSummary(s summary) []byte {
	b := make([]byte, 0, summaryFixed+len(s.epochs)*summaryEpochBytes+len(s.index)*summaryIndexBytes)
	b = append(b, summaryMagic[:]...)
	var flags byte
	if s.verified {
		flags |= summaryVerified
	}
	b = append(b, summaryVersion, flags, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, s.base)
	b = binary.LittleEndian.AppendUint64(b, s.end)
	b = binary.LittleEndian.AppendUint64(b, uint64(s.size))
	b = binary.LittleEndian.AppendUint32(b, s.rollBase)
	b = binary.LittleEndian.AppendUint32(b, s.rollEnd)
	b = binary.LittleEndian.AppendUint64(b, uint64(s.lastPos))
	b = binary.LittleEndian.AppendUint32(b, s.lastCRC)
	b = binary.LittleEndian.AppendUint64(b, uint64(s.maxTs))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s.epochs)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s.index)))
	for _, e := range s.epochs {
		b = binary.LittleEndian.AppendUint64(b, e.Epoch)
		b = binary.LittleEndian.AppendUint64(b, e.StartOffset)
	}
	for _, e := range s.index {
		b = binary.LittleEndian.AppendUint64(b, e.offset)
		b = binary.LittleEndian.AppendUint32(b, e.pos)
		b = binary.LittleEndian.AppendUint64(b, uint64(e.prefixMax))
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

var errSummary = errors.New("segment summary")

func decodeSummary(b []byte) (summary, error) {
	var s summary
	if len(b) < summaryFixed {
		return s, fmt.Errorf("%w: %d bytes, at least %d expected", errSummary, len(b), summaryFixed)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if c := crc32.Checksum(body, castagnoli); c != sum {
		return s, fmt.Errorf("%w: crc32c %08x, the summary says %08x", errSummary, c, sum)
	}
	if [4]byte(b[:4]) != summaryMagic || b[4] != summaryVersion || b[5]&^summaryVerified != 0 || b[6] != 0 || b[7] != 0 {
		return s, fmt.Errorf("%w: bad magic, version or reserved bits", errSummary)
	}
	s.verified = b[5]&summaryVerified != 0
	r := body[8:]
	u64 := func() uint64 { v := binary.LittleEndian.Uint64(r); r = r[8:]; return v }
	u32 := func() uint32 { v := binary.LittleEndian.Uint32(r); r = r[4:]; return v }
	s.base, s.end, s.size = u64(), u64(), int64(u64())
	s.rollBase, s.rollEnd = u32(), u32()
	s.lastPos, s.lastCRC = int64(u64()), u32()
	s.maxTs = int64(u64())
	ne, ni := int(u32()), int(u32())
	if len(r) != ne*summaryEpochBytes+ni*summaryIndexBytes {
		return s, fmt.Errorf("%w: %d epochs and %d index entries do not fill %d bytes", errSummary, ne, ni, len(r))
	}
	s.epochs = make([]EpochStart, ne)
	for i := range s.epochs {
		s.epochs[i] = EpochStart{Epoch: u64(), StartOffset: u64()}
	}
	s.index = make([]indexEntry, ni)
	for i := range s.index {
		s.index[i] = indexEntry{offset: u64(), pos: u32(), prefixMax: int64(u64())}
	}
	return s, nil
}

// summarize is the summary of the sealed segment s, whose frames end at
// the rolling checksum rollEnd, the log's epochs giving its epoch
// transitions. Called with wmu or mu held.
func (l *Log) summarize(s *segment, rollEnd uint32, verified bool) summary {
	return summary{base: s.base, end: s.end, size: s.size, rollBase: s.rollBase, rollEnd: rollEnd,
		lastPos: s.lastPos, lastCRC: s.lastCRC, maxTs: s.maxTs, epochs: l.epochsWithin(s.base, s.end), index: s.index, verified: verified}
}

// epochsWithin is the epoch in effect at base (as starting there), then
// each change of epoch below end. Called with wmu or mu held.
func (l *Log) epochsWithin(base, end uint64) []EpochStart {
	var epochs []EpochStart
	for _, e := range l.epochs {
		switch {
		case e.StartOffset <= base:
			epochs = append(epochs[:0], EpochStart{Epoch: e.Epoch, StartOffset: base})
		case e.StartOffset < end:
			epochs = append(epochs, e)
		}
	}
	return epochs
}

// writeSummary writes s's summary next to it, replacing any, without an
// fsync: a summary the disk lost or tore fails its checks and the segment
// is scanned. The caller fsyncs the directory before the segment stops
// being the last one (the next segment's creation does). A failure
// removes what was there: a summary of an earlier segment of the same
// name must not stay.
func (l *Log) writeSummary(s *segment, sum summary) {
	path := summaryPath(s.path)
	tmp := path + tmpSuffix
	err := func() error {
		f, err := l.fs.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		if _, err := f.WriteAt(encodeSummary(sum), 0); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		return l.fs.Rename(tmp, path)
	}()
	if err != nil {
		_ = l.fs.Remove(tmp)
		_ = l.fs.Remove(path)
	}
}

// segmentStart is a segment's first offset and rolling checksum there,
// from its header.
type segmentStart struct {
	base    uint64
	rolling uint32
}

// readSummary returns the summary of the sealed segment s of size bytes,
// whose header (base and rolling checksum) is read already and which the
// segment starting at next follows, if one is there and describes this
// file and leads to next; ok false otherwise. The epochs must not go below
// the log's so far. What it returns, adopted, is what a scan would give;
// anything else is left to the scan, which says what is wrong.
func (l *Log) readSummary(s *segment, size int64, next segmentStart) (summary, bool) {
	f, err := l.fs.OpenFile(summaryPath(s.path), os.O_RDONLY, 0)
	if err != nil {
		return summary{}, false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() > int64(summaryFixed)+MaxSegmentBytes {
		return summary{}, false
	}
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		return summary{}, false
	}
	sum, err := decodeSummary(b)
	if err != nil || sum.base != s.base || sum.rollBase != s.rollBase || sum.size != size || sum.end <= sum.base ||
		sum.end != next.base || sum.rollEnd != next.rolling ||
		sum.lastPos < SegmentHeaderSize || sum.lastPos+FrameHeaderSize > size || len(sum.epochs) == 0 || len(sum.index) == 0 {
		return summary{}, false
	}
	prev := uint64(0)
	if n := len(l.epochs); n > 0 {
		prev = l.epochs[n-1].Epoch
	}
	for i, e := range sum.epochs {
		if e.Epoch < prev || e.StartOffset < sum.base || e.StartOffset >= sum.end || (i == 0) != (e.StartOffset == sum.base) {
			return summary{}, false
		}
		prev = e.Epoch
	}
	// The frame it names last is in the file, where it says, and ends the
	// segment where it says: a summary of other contents under this name
	// (a segment cut and written again) is not used.
	hb := make([]byte, FrameHeaderSize)
	if _, err := s.f.ReadAt(hb, sum.lastPos); err != nil {
		return summary{}, false
	}
	h, err := DecodeHeader(hb)
	if err != nil || h.CRC != sum.lastCRC || h.End() != sum.end || sum.lastPos+int64(h.FrameLen) != size {
		return summary{}, false
	}
	return sum, true
}

// adopt sets the sealed segment s and the log from s's summary, as a scan
// of its frames would have (loadSegment); readSummary checked it.
func (l *Log) adopt(s *segment, sum summary) {
	for _, e := range sum.epochs {
		if n := len(l.epochs); n == 0 || l.epochs[n-1].Epoch != e.Epoch {
			l.epochs = append(l.epochs, e)
		}
	}
	s.index = sum.index
	s.size, s.end, s.maxTs = sum.size, sum.end, sum.maxTs
	s.lastPos, s.lastCRC = sum.lastPos, sum.lastCRC
	s.rollEnd = sum.rollEnd
	s.unverified = !sum.verified // VerifySealed reads its frames later
	l.next, l.rolling = sum.end, sum.rollEnd
}

// removeSummary deletes the summary of the segment at segPath, before the
// segment: what is left by a crash between the two, Open removes. A
// failure is left to Open too.
func (l *Log) removeSummary(segPath string) {
	_ = l.fs.Remove(summaryPath(segPath))
}

// removeSummaries deletes summaries whose segment is not in bases, and
// summaries being written when the process stopped.
func (l *Log) removeSummaries(names []string, bases []uint64) error {
	have := make(map[uint64]bool, len(bases))
	for _, b := range bases {
		have[b] = true
	}
	for _, name := range names {
		seg, tmp := strings.CutSuffix(name, summarySuffix+tmpSuffix)
		if !tmp {
			var isSum bool
			if seg, isSum = strings.CutSuffix(name, summarySuffix); !isSum {
				continue
			}
		}
		base, ok := parseSegmentName(seg)
		if !ok || (have[base] && !tmp) {
			continue // not a summary's name; or a segment's summary
		}
		if err := l.fs.Remove(filepath.Join(l.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("partlog: remove %s: %w", name, err)
		}
	}
	return nil
}

// VerifySealed reads and checks what Open took on trust from summaries:
// every frame of the sealed segments opened from a summary not marked
// verified, read from the disk (their cached pages dropped first): each
// frame's CRC and record structure, their offsets one after the other
// from the segment's base to its end, and that they give the summary's
// rolling checksum at end, epochs, newest timestamp and index (a frame
// replaced by another valid one shows only in the rolling checksum).
// Before each read pace is given its size (to bound the rate; nil:
// unpaced). Damage fails the log as corrupt (ErrCorrupt, for good), as a
// read of the damaged frame would. A verified segment's summary is written
// again marked verified, so that the next Open does not ask for it again,
// and its pages leave the cache. A segment retention or a truncation
// removes or cuts meanwhile is let be. It returns ctx's error if ctx ends
// first; Unverified says how much is left.
func (l *Log) VerifySealed(ctx context.Context, pace func(ctx context.Context, bytes int) error) error {
	l.mu.RLock()
	var todo []*segment
	for _, s := range l.segs {
		if s.unverified {
			todo = append(todo, s)
		}
	}
	l.mu.RUnlock()
	for _, s := range todo {
		if err := l.verifySegment(ctx, s, pace, false); err != nil {
			return err
		}
	}
	return nil
}

// Scrub reads every sealed segment ending above from back from the disk,
// oldest first, and checks it as VerifySealed checks one opened from its
// summary (the next segment's header gives the rolling checksum its
// frames must lead to): damage that reads have not met yet, a latent
// sector error or bits flipped on the medium, found while the chain
// still has good copies to replace this one from. Damage fails the log
// as corrupt. It returns the end offset of the last segment checked
// (from, when none was), for a caller to resume from after a read that
// failed, and ctx's error if ctx ends first. The active segment is not
// read: Open reads it, and readers at the tail read it all the time.
func (l *Log) Scrub(ctx context.Context, from uint64, pace func(ctx context.Context, bytes int) error) (uint64, error) {
	type sealed struct {
		s   *segment
		end uint64
	}
	l.mu.RLock()
	var todo []sealed
	for _, s := range l.segs[:len(l.segs)-1] {
		if s.end > from {
			todo = append(todo, sealed{s, s.end})
		}
	}
	l.mu.RUnlock()
	for _, t := range todo {
		if err := l.verifySegment(ctx, t.s, pace, true); err != nil {
			return from, err
		}
		from = t.end
	}
	// A segment it could not read because the log closed or failed was
	// not checked: say so rather than that everything was.
	l.mu.RLock()
	defer l.mu.RUnlock()
	return from, l.usable()
}

// Unverified is the number of segments VerifySealed has yet to read.
func (l *Log) Unverified() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	n := 0
	for _, s := range l.segs {
		if s.unverified {
			n++
		}
	}
	return n
}

// verifyReadBytes is what one read of VerifySealed asks for.
const verifyReadBytes = 1 << 20

// verifySegment reads sealed segment s back and checks it: one opened
// from its summary (unverified), or, scrubbing, any sealed one.
func (l *Log) verifySegment(ctx context.Context, s *segment, pace func(ctx context.Context, bytes int) error, scrub bool) error {
	what := "opened from its summary"
	if scrub {
		what = "read back by a scrub"
	}
	// Under wmu: retention, truncation and Close, which remove, cut or
	// close the segment, hold it.
	l.wmu.Lock()
	i := slices.Index(l.segs, s)
	current := l.usable() == nil && (s.unverified || scrub) && i >= 0 && i < len(l.segs)-1
	base, end, rolling, want, cuts := s.base, s.end, s.rollBase, s.rollEnd, l.cuts
	if current && !s.unverified {
		want = l.segs[i+1].rollBase // the summary's rollEnd was checked against it at Open
	}
	index, maxTs, size, path := s.index, s.maxTs, s.size, s.path // a Truncate rewrites *s under wmu
	epochs := l.epochsWithin(base, end)                          // as the summary gave them
	if current {
		_ = dropCache(s.f) // read what the disk holds
	}
	l.wmu.Unlock()
	if !current {
		return nil
	}
	var (
		pos      = int64(SegmentHeaderSize)
		seenMax  = int64(math.MinInt64)
		seen     []EpochStart
		nextIdx  int
		indexErr error
	)
	for at := base; at < end; {
		if err := ctx.Err(); err != nil {
			return err
		}
		if pace != nil {
			if err := pace(ctx, int(min(verifyReadBytes, size-pos))); err != nil {
				return err
			}
		}
		frames, err := l.ReadFrames(at, end, verifyReadBytes)
		switch {
		case errors.Is(err, ErrOutOfRange):
			return nil // retention took it, or a cut below it
		case err != nil:
			return err
		case len(frames) == 0:
			return nil
		}
		for _, fr := range frames {
			h, bad := validateFrame(fr)
			if bad == nil && h.BaseOffset != at {
				bad = fmt.Errorf("frame base offset %d, expected %d", h.BaseOffset, at)
			}
			if bad != nil {
				if l.cutBelow(cuts, end) {
					return nil
				}
				return l.fail(ErrCorrupt, "%s, %s, does not verify: %w", path, what, bad)
			}
			if n := len(seen); n == 0 || seen[n-1].Epoch != h.Epoch {
				seen = append(seen, EpochStart{Epoch: h.Epoch, StartOffset: h.BaseOffset})
			}
			if nextIdx < len(index) && index[nextIdx].offset == h.BaseOffset {
				if int64(index[nextIdx].pos) != pos || (nextIdx > 0 && index[nextIdx-1].prefixMax != seenMax) {
					indexErr = fmt.Errorf("index entry %d (offset %d) at byte %d, its frame at byte %d", nextIdx, h.BaseOffset, index[nextIdx].pos, pos)
				}
				nextIdx++
			}
			seenMax = max(seenMax, h.MaxTimestamp)
			rolling = rollChecksum(rolling, h.CRC)
			pos += int64(len(fr))
			at = h.End()
		}
	}
	if nextIdx != len(index) || (len(index) > 0 && index[len(index)-1].prefixMax != seenMax) {
		indexErr = fmt.Errorf("%d of %d index entries found at frames, the last one's newest timestamp %d, the frames' %d", nextIdx, len(index), index[len(index)-1].prefixMax, seenMax)
	}
	var wrong error
	switch {
	case rolling != want:
		wrong = fmt.Errorf("its frames give the rolling checksum %08x at offset %d, the summary %08x", rolling, end, want)
	case !slices.Equal(seen, epochs):
		wrong = fmt.Errorf("its frames give the epochs %v, the summary %v", seen, epochs)
	case seenMax != maxTs:
		wrong = fmt.Errorf("its frames' newest timestamp is %d, the summary's %d", seenMax, maxTs)
	case pos != size:
		wrong = fmt.Errorf("its frames end at byte %d, the summary says %d", pos, size)
	case indexErr != nil:
		wrong = indexErr
	}
	if wrong != nil && !l.cutBelow(cuts, end) {
		return l.fail(ErrCorrupt, "%s, %s: %w", path, what, wrong)
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if wrong != nil || l.usable() != nil || !slices.Contains(l.segs, s) || l.cutBelowLocked(cuts, end) {
		return nil
	}
	if !s.unverified {
		_ = dropCache(s.f) // scrubbed: its pages were read for this only
		return nil
	}
	l.mu.Lock()
	s.unverified = false
	l.mu.Unlock()
	// Under wmu only: no cut, removal or close of the segment meanwhile,
	// and readers go on.
	l.writeSummary(s, l.summarize(s, s.rollEnd, true))
	_ = dropCache(s.f)
	return nil
}

// dropCache drops f's clean cached pages (advice: files without a page
// cache of their own are left alone).
func dropCache(f File) error {
	if d, ok := f.(interface{ DropCache() error }); ok {
		return d.DropCache()
	}
	if fd, ok := fdOf(f); ok {
		return unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED)
	}
	return nil
}
