package server

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/catena-streams/catena/replica/partlog"
)

// A partition's de-duplication table is kept in dedupSnapshotFile as of a
// log offset (storage-format.md §12), so that a start replays the records
// after that offset instead of reading back the last dedupRebuildRecords
// records: 1M records of 1 KiB is a gigabyte read and checked per
// partition, 0.5-1.5 s each here, so a replica with hundreds of busy
// partitions took minutes to come back from a crash.
//
// The file is written for each partition whose durable log end moved by
// dedupSnapshotRecords since its last one (looked at every
// dedupSnapshotInterval), and at a clean close, without fsync: a file the
// disk lost or tore fails its checksum and the start rebuilds as before. It
// covers durable records only (see saveDedup). A snapshot
// describes its log by the frame that ends at its offset (epoch and CRC);
// one that the log no longer ends a frame with there (cut by a Truncate or
// a Reset, retention past it) is not used.
const (
	dedupSnapshotFile     = "dedup.snap"
	dedupSnapshotVersion  = 1
	dedupSnapshotInterval = 10 * time.Second
	// dedupSnapshotRecords is how far a partition's log moves before its
	// next snapshot: what a start after a crash reads back at most, beyond
	// the last interval's records. It keeps a replica of many busy
	// partitions from writing and renaming a file per partition every
	// interval.
	dedupSnapshotRecords = 1 << 16
	dedupSnapshotHeader  = 4 + 4 + 8 + 8 + 4 + 4 // magic, version, offset, frame epoch, frame CRC, producers
)

var dedupSnapshotMagic = [4]byte{'C', 'D', 'D', 'S'}

var errBadDedupSnapshot = errors.New("bad de-duplication snapshot")

// dedupSnapshot is a de-duplication table holding every idempotent record
// below offset, and the frame of the log that ends at offset.
type dedupSnapshot struct {
	offset     uint64
	frameEpoch uint64
	frameCRC   uint32
	table      *dedupTable
}

func (t *dedupTable) clone() *dedupTable {
	out := &dedupTable{producers: make(map[uint64]*producerWindow, len(t.producers))}
	for id, w := range t.producers {
		c := *w
		c.runs = append([]seqRun(nil), w.runs...)
		out.producers[id] = &c
	}
	return out
}

func encodeDedupSnapshot(s dedupSnapshot) []byte {
	n := dedupSnapshotHeader + 4
	for _, w := range s.table.producers {
		n += 8*3 + 4 + 24*len(w.runs)
	}
	b := make([]byte, 0, n)
	b = append(b, dedupSnapshotMagic[:]...)
	b = binary.LittleEndian.AppendUint32(b, dedupSnapshotVersion)
	b = binary.LittleEndian.AppendUint64(b, s.offset)
	b = binary.LittleEndian.AppendUint64(b, s.frameEpoch)
	b = binary.LittleEndian.AppendUint32(b, s.frameCRC)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s.table.producers)))
	for id, w := range s.table.producers {
		b = binary.LittleEndian.AppendUint64(b, id)
		b = binary.LittleEndian.AppendUint64(b, w.minSeq)
		b = binary.LittleEndian.AppendUint64(b, w.lastSeen)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(w.runs)))
		for _, r := range w.runs {
			b = binary.LittleEndian.AppendUint64(b, r.seq)
			b = binary.LittleEndian.AppendUint64(b, r.offset)
			b = binary.LittleEndian.AppendUint64(b, r.n)
		}
	}
	return sealDedupSnapshot(b)
}

// sealDedupSnapshot appends the checksum of body.
func sealDedupSnapshot(body []byte) []byte {
	return binary.LittleEndian.AppendUint32(body, crc32.Checksum(body, castagnoli))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// decodeDedupSnapshot parses a snapshot, checking its checksum and that it
// describes a table the running code could have built (bounds, order).
func decodeDedupSnapshot(b []byte) (dedupSnapshot, error) {
	if len(b) < dedupSnapshotHeader+4 {
		return dedupSnapshot{}, fmt.Errorf("%w: %d bytes", errBadDedupSnapshot, len(b))
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return dedupSnapshot{}, fmt.Errorf("%w: checksum mismatch", errBadDedupSnapshot)
	}
	if [4]byte(body[:4]) != dedupSnapshotMagic {
		return dedupSnapshot{}, fmt.Errorf("%w: magic %q", errBadDedupSnapshot, body[:4])
	}
	if v := binary.LittleEndian.Uint32(body[4:]); v != dedupSnapshotVersion {
		return dedupSnapshot{}, fmt.Errorf("%w: version %d, this replica reads %d", errBadDedupSnapshot, v, dedupSnapshotVersion)
	}
	s := dedupSnapshot{
		offset:     binary.LittleEndian.Uint64(body[8:]),
		frameEpoch: binary.LittleEndian.Uint64(body[16:]),
		frameCRC:   binary.LittleEndian.Uint32(body[24:]),
		table:      newDedupTable(),
	}
	producers := binary.LittleEndian.Uint32(body[28:])
	if producers > dedupMaxProducers {
		return dedupSnapshot{}, fmt.Errorf("%w: %d producers, at most %d are kept", errBadDedupSnapshot, producers, dedupMaxProducers)
	}
	rest := body[dedupSnapshotHeader:]
	for range producers {
		if len(rest) < 8*3+4 {
			return dedupSnapshot{}, fmt.Errorf("%w: producer cut short", errBadDedupSnapshot)
		}
		id := binary.LittleEndian.Uint64(rest)
		w := &producerWindow{minSeq: binary.LittleEndian.Uint64(rest[8:]), lastSeen: binary.LittleEndian.Uint64(rest[16:])}
		runs := binary.LittleEndian.Uint32(rest[24:])
		rest = rest[28:]
		if runs > 2*dedupWindowRuns+1 || uint64(len(rest)) < 24*uint64(runs) || id == 0 || s.table.producers[id] != nil {
			return dedupSnapshot{}, fmt.Errorf("%w: producer %d with %d runs", errBadDedupSnapshot, id, runs)
		}
		w.runs = make([]seqRun, runs)
		for i := range w.runs {
			r := seqRun{seq: binary.LittleEndian.Uint64(rest), offset: binary.LittleEndian.Uint64(rest[8:]), n: binary.LittleEndian.Uint64(rest[16:])}
			rest = rest[24:]
			if r.n == 0 || r.n > s.offset || r.offset > s.offset-r.n || r.seq > math.MaxUint64-r.n || (i > 0 && r.seq < w.runs[i-1].end()) {
				return dedupSnapshot{}, fmt.Errorf("%w: producer %d run %d out of place", errBadDedupSnapshot, id, i)
			}
			w.runs[i] = r
		}
		s.table.producers[id] = w
	}
	if len(rest) != 0 {
		return dedupSnapshot{}, fmt.Errorf("%w: %d bytes past the last producer", errBadDedupSnapshot, len(rest))
	}
	return s, nil
}

// fitsLog reports why s does not describe l (nil: it does): l must hold
// the frame that ended at s.offset when s was taken, and hold it within the
// records a start would read back anyway.
func (s dedupSnapshot) fitsLog(l *partlog.Log) error {
	start, end := l.StartOffset(), l.NextOffset()
	switch {
	case s.offset > end:
		return fmt.Errorf("taken at offset %d, past the log end %d", s.offset, end)
	case s.offset <= start:
		return fmt.Errorf("taken at offset %d, at or below the log start %d", s.offset, start)
	case end-s.offset > dedupRebuildRecords:
		return fmt.Errorf("taken at offset %d, more than %d records below the log end %d", s.offset, dedupRebuildRecords, end)
	}
	h, err := frameEndingAt(l, s.offset)
	if err != nil {
		return err
	}
	if h.Epoch != s.frameEpoch || h.CRC != s.frameCRC {
		return fmt.Errorf("the log's frame [%d,%d) of epoch %d (CRC %08x) is not the one that ended there (epoch %d, CRC %08x)",
			h.BaseOffset, h.End(), h.Epoch, h.CRC, s.frameEpoch, s.frameCRC)
	}
	return nil
}

// frameEndingAt is the header of l's frame that ends at offset end (above
// the log start).
func frameEndingAt(l *partlog.Log, end uint64) (partlog.BatchHeader, error) {
	frames, err := l.ReadFrames(end-1, end, 1)
	if err != nil {
		return partlog.BatchHeader{}, fmt.Errorf("reading the frame holding offset %d: %w", end-1, err)
	}
	if len(frames) == 0 {
		return partlog.BatchHeader{}, fmt.Errorf("no frame holds offset %d", end-1)
	}
	h, err := partlog.DecodeHeader(frames[0])
	if err != nil {
		return partlog.BatchHeader{}, fmt.Errorf("the frame holding offset %d: %w", end-1, err)
	}
	if h.End() != end {
		return partlog.BatchHeader{}, fmt.Errorf("no frame ends at %d: the one holding offset %d is [%d,%d)", end, end-1, h.BaseOffset, h.End())
	}
	return h, nil
}

// loadDedup builds the de-duplication table at open: from the snapshot
// and the records after it when the snapshot describes this log, else from
// the last dedupRebuildRecords records. It returns the offset the records
// were read from.
func (p *partition) loadDedup() (uint64, error) {
	if b, err := os.ReadFile(filepath.Join(p.dir, dedupSnapshotFile)); err == nil {
		s, err := decodeDedupSnapshot(b)
		if err == nil {
			err = s.fitsLog(p.log)
		}
		if err == nil {
			p.dedup, p.dedupSaved = s.table, s.offset
			return s.offset, p.foldDedup(s.offset)
		}
		p.logger.Info("Not using the de-duplication snapshot; rebuilding the table from the log", "reason", err.Error())
	} else if !errors.Is(err, os.ErrNotExist) {
		p.logger.Info("Cannot read the de-duplication snapshot; rebuilding the table from the log", "error", err.Error())
	}
	from := p.log.StartOffset()
	if end := p.log.NextOffset(); end > dedupRebuildRecords && end-dedupRebuildRecords > from {
		from = end - dedupRebuildRecords
	}
	return from, p.foldDedup(from)
}

// foldDedup adds every record from offset from to the log end to the
// de-duplication table.
func (p *partition) foldDedup(from uint64) error {
	end := p.log.NextOffset()
	var recs []partlog.Record
	for from < end {
		frames, err := p.log.ReadFrames(from, end, 4<<20)
		if err != nil {
			return fmt.Errorf("failed to rebuild de-duplication table of %s/%d: %w", p.stream, p.index, err)
		}
		if len(frames) == 0 {
			break
		}
		for _, fr := range frames {
			var h partlog.BatchHeader
			h, recs, err = partlog.DecodeBatchInto(fr, recs[:0])
			if err != nil {
				return fmt.Errorf("failed to rebuild de-duplication table of %s/%d: %w", p.stream, p.index, err)
			}
			p.dedup.addBatch(recs)
			from = h.End()
		}
	}
	return nil
}

// saveDedup writes the partition's de-duplication snapshot if its durable
// log end moved by at least minRecords since the last one. holdsMu keeps it from writing into a directory a Drop
// is renaming away (Drop takes it before it fails the partition).
func (p *partition) saveDedup(minRecords uint64) error {
	p.holdsMu.Lock()
	defer p.holdsMu.Unlock()
	p.mu.Lock()
	if p.log == nil || p.failed != nil {
		p.mu.Unlock()
		return nil
	}
	// Durable records only: a snapshot of records a power cut then took
	// would name a frame the log may come to end at that offset again
	// (a sole member goes on at the same epoch, and a retried frame is
	// the same frame) after other records filled the gap below it.
	end := p.log.DurableOffset()
	if end == p.dedupSaved || end <= p.log.StartOffset() || (end > p.dedupSaved && end-p.dedupSaved < minRecords) {
		p.mu.Unlock()
		return nil
	}
	h, err := frameEndingAt(p.log, end)
	if err != nil {
		p.mu.Unlock()
		return fmt.Errorf("de-duplication snapshot of %s/%d: %w", p.stream, p.index, err)
	}
	table := p.dedup.clone()
	table.truncate(end) // what was appended past the durable end
	s := dedupSnapshot{offset: end, frameEpoch: h.Epoch, frameCRC: h.CRC, table: table}
	cuts := p.truncations.Load()
	p.mu.Unlock()

	tmp := filepath.Join(p.dir, dedupSnapshotFile+".tmp")
	if err := os.WriteFile(tmp, encodeDedupSnapshot(s), 0o644); err != nil {
		return fmt.Errorf("failed to write the de-duplication snapshot of %s/%d: %w", p.stream, p.index, err)
	}
	if err := os.Rename(tmp, filepath.Join(p.dir, dedupSnapshotFile)); err != nil {
		return fmt.Errorf("failed to install the de-duplication snapshot of %s/%d: %w", p.stream, p.index, err)
	}
	p.mu.Lock()
	if p.truncations.Load() == cuts {
		p.dedupSaved = end // else a cut since: the next round saves again
	}
	p.mu.Unlock()
	return nil
}

// saveDedups writes the de-duplication snapshots of partitions whose logs
// moved far enough (every dedupSnapshotInterval). A failure is logged and
// tried again on the next round: without a snapshot a start only reads more
// back.
func (s *Server) saveDedups() {
	for _, p := range s.openPartitions() {
		if err := p.saveDedup(dedupSnapshotRecords); err != nil {
			p.logger.Error(err, "Failed to save the de-duplication snapshot")
		}
	}
}
