package partlog

import (
	"fmt"
	"math"
	"time"
)

// EnforceRetention deletes whole sealed segments past the time or byte
// limits; the active segment is never deleted. It is EnforceRetentionHeld
// with no hold and no hard limits.
func (l *Log) EnforceRetention() (deletedSegments int, err error) {
	res, err := l.EnforceRetentionHeld(RetentionHold{HoldOffset: math.MaxUint64, KeepFrom: math.MaxUint64})
	return res.Segments, err
}

// RetentionHold restrains retention: consumers still need the records from
// HoldOffset on, and only hard limits may delete them.
type RetentionHold struct {
	// HoldOffset is the lowest offset a consumer holds; math.MaxUint64 when
	// nobody holds anything. A segment ending above it is kept by the
	// (soft) limits of Options.
	HoldOffset uint64
	// HardBytes and HardTime delete segments past them even when held
	// (0: no hard limit).
	HardBytes int64
	HardTime  time.Duration
	// KeepFrom is where nothing may be deleted, whatever the limits: a
	// segment ending above it stays. The replica server passes the
	// partition's committed offset (what is on every member of the
	// chain), so a member never deletes what a successor may still need
	// from it. The zero value deletes nothing; math.MaxUint64 lifts it.
	KeepFrom uint64
}

// RetentionResult says what EnforceRetentionHeld deleted.
type RetentionResult struct {
	Segments int
	// Forced is set when a deleted segment held records at or above
	// HoldOffset: a hard limit overrode a hold.
	Forced bool
	// StartOffset is the log's start offset afterwards.
	StartOffset uint64
}

// EnforceRetentionHeld deletes whole sealed segments past the time or byte
// limits of Options unless they hold records at or above h.HoldOffset, and
// any segment past h's hard limits; the active segment is never deleted.
//
// Segments go oldest first, and retention stops at the first segment it
// keeps, so the log stays contiguous; the directory is fsynced after each
// deletion so that a crash can only leave a contiguous suffix behind
// (storage-format.md §9).
func (l *Log) EnforceRetentionHeld(h RetentionHold) (res RetentionResult, err error) {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.usable(); err != nil {
		return res, err
	}
	res.StartOffset = l.segs[0].base
	lim := l.limits.Load()
	if lim.RetentionBytes == 0 && lim.RetentionTime == 0 && h.HardBytes == 0 && h.HardTime == 0 {
		return res, nil
	}
	var total int64
	for _, s := range l.segs {
		total += s.size
	}
	cutoff, hardCutoff := int64(math.MinInt64), int64(math.MinInt64)
	if lim.RetentionTime > 0 {
		cutoff = l.now().Add(-lim.RetentionTime).UnixMilli()
	}
	if h.HardTime > 0 {
		hardCutoff = l.now().Add(-h.HardTime).UnixMilli()
	}
	if a := l.active(); !a.empty() && h.KeepFrom > a.base {
		// A segment rolls when it is full, and only sealed segments are
		// deleted: without this, a partition written more slowly than a
		// segment a retention period would keep its records until the
		// segment filled (a day and a half at 1 KiB/s). Not while what
		// must stay (KeepFrom: not on every member yet) starts below the
		// active segment, and not by the soft time while a consumer's
		// hold does: a stalled chain, or a consumer that stopped, would
		// otherwise seal eight small segments a retention period, each
		// an open file, for as long as it lasts. A hold inside the active
		// segment (a consumer keeping up) does not stop it.
		soft := lim.RetentionTime
		if h.HoldOffset <= a.base {
			soft = 0
		}
		if age := rollAge(soft, h.HardTime); age > 0 && a.firstMaxTs <= l.now().Add(-age).UnixMilli() {
			if _, err := l.roll(); err != nil {
				return res, err
			}
		}
	}
	for len(l.segs) > 1 {
		s := l.segs[0]
		overBytes := lim.RetentionBytes > 0 && total > lim.RetentionBytes
		// maxTs is the newest record of the whole segment (>= its last
		// batch's MaxTimestamp): never delete a record younger than the limit.
		expired := lim.RetentionTime > 0 && s.maxTs < cutoff
		held := s.end > h.HoldOffset
		hard := (h.HardBytes > 0 && total > h.HardBytes) || (h.HardTime > 0 && s.maxTs < hardCutoff)
		if s.end > h.KeepFrom || (!hard && (held || (!overBytes && !expired))) {
			break
		}
		// Unpublish first: once we have held mu exclusively no new reader
		// can pin s; one that pinned it before keeps reading the unlinked
		// file, which closes when it lets go.
		l.mu.Lock()
		l.segs = append([]*segment(nil), l.segs[1:]...)
		l.trimEpochs()
		l.mu.Unlock()
		res.StartOffset = l.segs[0].base
		s.h.retire() // read-only from now on; its close error is of no use
		l.removeSummary(s.path)
		if err := l.fs.Remove(s.path); err != nil {
			return res, l.fail(ErrFailed, "retention: remove %s: %w", s.path, err)
		}
		if err := l.fs.SyncDir(l.dir); err != nil {
			return res, l.fail(ErrFailed, "retention: fsync dir %s after removing %s: %w", l.dir, s.path, err)
		}
		total -= s.size
		res.Segments++
		res.Forced = res.Forced || held
	}
	return res, nil
}

// rollAge is how old the first frame of the active segment may be
// before a retention round seals it: an eighth of the shorter retention
// time (0: neither is set). A record is then deleted at most an eighth
// of the time (and a round) after it expires, and a partition keeps
// about nine segments' worth of its retention time.
func rollAge(times ...time.Duration) time.Duration {
	var age time.Duration
	for _, t := range times {
		if t > 0 && (age == 0 || t/8 < age) {
			age = t / 8
		}
	}
	return age
}

// trimEpochs drops epoch transitions wholly before StartOffset, keeping the
// one in effect there (clamped to StartOffset). Called with mu held.
func (l *Log) trimEpochs() {
	start := l.segs[0].base
	i := 0
	for i+1 < len(l.epochs) && l.epochs[i+1].StartOffset <= start {
		i++
	}
	if i > 0 {
		l.epochs = append([]EpochStart(nil), l.epochs[i:]...)
	}
	if len(l.epochs) > 0 && l.epochs[0].StartOffset < start {
		l.epochs[0].StartOffset = start
	}
}

// Truncate drops every offset >= to (rounded to a batch boundary; error if
// to is inside a batch), durably. Used by chain repair.
//
// to must be a batch boundary in [StartOffset, NextOffset]: ErrNotBoundary
// if it is inside a batch, ErrOutOfRange outside. Later segments are deleted
// newest first (each followed by a directory fsync, so a crash leaves a
// contiguous log that is merely longer), then the segment holding to is cut
// and fsynced. On success DurableOffset = NextOffset = to.
func (l *Log) Truncate(to uint64) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	if start := l.segs[0].base; to < start || to > l.next {
		return fmt.Errorf("%w: truncate to %d, log holds [%d,%d)", ErrOutOfRange, to, start, l.next)
	}
	if to == l.next {
		// Nothing to cut, but the promise stands: [.., to) durable.
		l.wmu.Unlock()
		err := l.syncHeld()
		l.wmu.Lock() // for the deferred unlock
		return err
	}
	k := l.segmentFor(to)
	s := l.segs[k]
	pos, err := l.boundary(s, to)
	if err != nil {
		return err
	}
	// Rebuild s's state up to pos before touching the disk; the rolling
	// checksum restarts from the value stored in s's header.
	ns := newSegmentState(s.path, s.f, s.base, s.rollBase)
	rolling := s.rollBase
	r := segReader{f: s.f, limit: s.size, reuse: true}
	for p := int64(SegmentHeaderSize); p < pos; {
		h, bad, err := scanFrame(&r, p, pos)
		if err != nil {
			return l.readErr(s.path, p, err)
		}
		if bad != nil {
			return l.corrupt(s.path, p, bad)
		}
		ns.addFrame(h, p, l.interval)
		rolling = rollChecksum(rolling, h.CRC)
		p += int64(h.FrameLen)
	}
	if s.unverified {
		// Opened from its summary and not read since: the frames past the
		// cut are read too, so that the rolling checksum over all of them
		// is held against the summary's, as VerifySealed would (a frame
		// replaced by another valid one shows nowhere else).
		// Frames past the cut that do not read or check are damage to
		// this copy too: corrupt, so that it is replaced, rather than a
		// cut that fails every time it is asked for. (Unpaced, under
		// syncMu: a segment of at most MaxSegmentBytes, once.)
		all := rolling
		for p := pos; p < s.size; {
			h, bad, err := scanFrame(&r, p, s.size)
			if err != nil {
				return l.corrupt(s.path, p, fmt.Errorf("opened from its summary, past the cut: %w", err))
			}
			if bad != nil {
				return l.corrupt(s.path, p, bad)
			}
			all = rollChecksum(all, h.CRC)
			p += int64(h.FrameLen)
		}
		if all != s.rollEnd {
			return l.fail(ErrCorrupt, "%s, opened from its summary: its frames give the rolling checksum %08x at offset %d, the summary %08x", s.path, all, s.end, s.rollEnd)
		}
	}
	later := append([]*segment(nil), l.segs[k+1:]...)
	n := 0
	for n < len(l.epochs) && l.epochs[n].StartOffset < to {
		n++
	}
	if l.journal != nil {
		// Recorded before anything changes: a crash during the cut
		// leaves files the journal's replay cuts again.
		var epoch uint64
		if n > 0 {
			epoch = l.epochs[n-1].Epoch
		}
		if err := l.journal.Truncate(to, epoch); err != nil {
			return l.fail(ErrFailed, "journal truncation to %d: %w", to, err)
		}
	}

	l.mu.Lock()
	ns.h = s.h // readers may hold it
	*s = *ns
	l.noteCut(to)
	l.segs = l.segs[: k+1 : k+1]
	l.next = to
	l.fileOnly = min(l.fileOnly, to) // fsynced with the cut, below
	l.rolling = rolling
	l.epochs = l.epochs[:n:n]
	if l.durable.Load() > to {
		l.durable.Store(to)
	}
	l.mu.Unlock()

	if err := l.removeNewestFirst("truncate", later); err != nil {
		return err
	}
	l.removeSummary(s.path) // the last segment now, and cut
	if err := s.f.Truncate(pos); err != nil {
		return l.fail(ErrFailed, "truncate %s to byte %d: %w", s.path, pos, err)
	}
	if err := s.f.Sync(); err != nil {
		return l.fail(ErrFailed, "fsync %s after truncate: %w", s.path, err)
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		return l.fail(ErrFailed, "fsync dir %s after truncate: %w", l.dir, err)
	}
	// Sealed segments were fsynced when sealed, s just now: all of [.., to)
	// is durable.
	l.durable.Store(to)
	l.flushed.Store(to)
	return nil
}

// boundary returns the byte position in s of the frame starting at offset
// to, which must be a batch boundary within s. Called with wmu held.
func (l *Log) boundary(s *segment, to uint64) (int64, error) {
	if to == s.base {
		return SegmentHeaderSize, nil
	}
	r := segReader{f: s.f, limit: s.size, reuse: true}
	for pos := s.lookup(to); pos < s.size; {
		hb, err := r.at(pos, FrameHeaderSize, headerWalkReadahead)
		if err != nil {
			return 0, l.readErr(s.path, pos, err)
		}
		h, err := DecodeHeader(hb)
		if err != nil {
			return 0, l.corrupt(s.path, pos, err)
		}
		switch {
		case h.BaseOffset == to:
			return pos, nil
		case h.BaseOffset < to && to < h.End():
			return 0, fmt.Errorf("%w: truncate to %d, inside batch [%d,%d) of %s",
				ErrNotBoundary, to, h.BaseOffset, h.End(), s.path)
		case h.BaseOffset > to:
			return 0, l.corrupt(s.path, pos, fmt.Errorf("frame base offset %d past wanted offset %d", h.BaseOffset, to))
		}
		pos += int64(h.FrameLen)
	}
	return s.size, nil // to == s.end
}

// Reset replaces the whole log with an empty one starting at base, whose
// rolling checksum there is rolling: a copy whose log ends below its
// source's log start (retention there trimmed what it would copy next)
// starts again where the source's log does. base must be beyond
// NextOffset (ErrOutOfRange otherwise): nothing held is kept, and a log
// that reaches base continues as it is.
//
// Segments are deleted newest first, each followed by a directory fsync,
// then the new one is created (§6): a crash leaves the old log's prefix,
// an empty log at 0, or the new log, each contiguous, and the copy
// resets again. Readers are held off for the whole of it (mu): the log
// of a copy outside the chain has none but Status.
func (l *Log) Reset(base uint64, rolling uint32) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.usable(); err != nil {
		return err
	}
	if base <= l.next {
		return fmt.Errorf("%w: reset to start at %d, log holds [%d,%d)", ErrOutOfRange, base, l.segs[0].base, l.next)
	}
	if l.journal != nil {
		if err := l.journal.Reset(Start{Base: base, Rolling: rolling}); err != nil {
			return l.fail(ErrFailed, "journal reset to %d: %w", base, err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.noteCut(0)
	if err := l.removeNewestFirst("reset", l.segs); err != nil {
		return err
	}
	s, err := createSegment(l.fs, l.dir, base, rolling)
	if err != nil {
		return l.fail(ErrFailed, "reset: %w", err)
	}
	l.segs = []*segment{s}
	l.next = base
	l.rolling = rolling
	l.epochs = nil
	l.durable.Store(base)
	l.flushed.Store(base)
	return nil
}

// removeNewestFirst closes and deletes segs newest first, each removal
// followed by a directory fsync, so that a crash leaves a contiguous log
// (a prefix of what was there). A failure is the log's permanent fault.
func (l *Log) removeNewestFirst(op string, segs []*segment) error {
	for i := len(segs) - 1; i >= 0; i-- {
		d := segs[i]
		d.h.retire()
		l.removeSummary(d.path)
		if err := l.fs.Remove(d.path); err != nil {
			return l.fail(ErrFailed, "%s: remove %s: %w", op, d.path, err)
		}
		if err := l.fs.SyncDir(l.dir); err != nil {
			return l.fail(ErrFailed, "%s: fsync dir %s after removing %s: %w", op, l.dir, d.path, err)
		}
	}
	return nil
}
