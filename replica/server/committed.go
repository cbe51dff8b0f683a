package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/catena-streams/catena/internal/durable"
)

// committedFile records the partition's committed offset, so that a
// restarted member neither forgets what it may serve nor lets Truncate cut
// below it (storage-format.md §11). It is written durably (temporary file,
// fsync, rename) at most every committedPersistInterval while the offset
// moves, and once more at a clean close with Clean set. After a crash it
// may lag what the member knew by up to that interval; the chain's master
// passes the chain's committed offset with the next epoch, and until then
// a member that restarted from a crash does not answer LATEST.
const committedFile = "committed.json"

const (
	committedFileVersion     = 1
	committedPersistInterval = time.Second
	// maxCommittedFileBytes bounds what is read: the file is a few dozen bytes.
	maxCommittedFileBytes = 4 << 10
)

type committedRecord struct {
	Version   int    `json:"version"`
	Committed uint64 `json:"committed"`
	// Clean is set by a clean close only: the offset is exactly what the
	// member knew when it stopped.
	Clean bool `json:"clean,omitempty"`
}

func writeCommitted(dir string, rec committedRecord) error {
	rec.Version = committedFileVersion
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("failed to encode committed offset: %w", err)
	}
	return durable.WriteFile(dir, committedFile, b, 0o644)
}

// readCommitted loads dir's committedFile; a missing file is offset 0
// (a partition that never committed, or one written before this file).
func readCommitted(dir string) (committedRecord, error) {
	path := filepath.Join(dir, committedFile)
	b, err := readSmallFile(path, maxCommittedFileBytes)
	if errors.Is(err, os.ErrNotExist) {
		return committedRecord{Version: committedFileVersion}, nil
	}
	if err != nil {
		return committedRecord{}, err
	}
	var rec committedRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return committedRecord{}, fmt.Errorf("failed to decode %s: %w", path, err)
	}
	if rec.Version != committedFileVersion {
		return committedRecord{}, fmt.Errorf("%s has version %d; this replica reads version %d", path, rec.Version, committedFileVersion)
	}
	return rec, nil
}

// readSmallFile reads path whole, refusing one above limit bytes.
func readSmallFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("failed to stat %s: %w", path, err)
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s is %d bytes, above the %d-byte limit", path, fi.Size(), limit)
	}
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil && fi.Size() > 0 {
		return nil, fmt.Errorf("failed to read %s: %w", path, err)
	}
	return b, nil
}

// persistCommitted writes the committed offset if it moved since the last
// write (always when clean: a clean close records that it was one). It
// holds holdsMu, which orders every write of the partition's small files
// with Drop. A failure is logged and retried on the next round: the file
// is a floor, and a lagging floor is what a crash leaves anyway.
func (p *partition) persistCommitted(clean bool) {
	p.holdsMu.Lock()
	defer p.holdsMu.Unlock()
	p.mu.Lock()
	c, failed := p.committed, p.failed != nil || p.log == nil
	p.mu.Unlock()
	if failed || (c == p.persistedCommitted && !clean) {
		return
	}
	if err := writeCommitted(p.dir, committedRecord{Committed: c, Clean: clean}); err != nil {
		p.logger.Error(err, "Failed to record the committed offset", "committed", c)
		return
	}
	p.persistedCommitted = c
}

// loadCommitted restores the committed offset recorded before a restart,
// capped at what the log holds (recovery may have cut a torn tail; the
// records below the cap were committed and are here). It reports whether
// the record is exact (written by a clean close). An unreadable file is
// logged and taken as 0: the offset is a floor, and the chain's master
// teaches the chain's with the next epoch.
func (p *partition) loadCommitted(logEnd uint64) (committed uint64, exact bool) {
	rec, err := readCommitted(p.dir)
	if err != nil {
		p.logger.Error(err, "Committed offset record is unreadable; starting from 0 until the chain's master installs an epoch")
		return 0, false
	}
	p.persistedCommitted = rec.Committed
	if rec.Clean {
		// Exact only until the offset moves and a crash follows before
		// the next write: mark it so now.
		if err := writeCommitted(p.dir, committedRecord{Committed: rec.Committed}); err != nil {
			p.logger.Error(err, "Failed to record the committed offset", "committed", rec.Committed)
			rec.Clean = false
		}
	}
	return min(rec.Committed, logEnd), rec.Clean
}

// committedLoop records every partition's committed offset as it moves.
func (s *Server) committedLoop() {
	defer s.wg.Done()
	t := time.NewTicker(committedPersistInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		for _, p := range s.openPartitions() {
			p.persistCommitted(false)
		}
	}
}
