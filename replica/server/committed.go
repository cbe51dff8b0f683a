package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/catena-streams/catena/internal/durable"
)

// committedTableFile, in the replica's data directory, records every
// partition's committed offset, so that a restarted member neither forgets
// what it may serve nor lets Truncate cut below it (storage-format.md §11).
// One file for the whole replica, written durably (temporary file, fsync,
// rename) at most every committedPersistInterval while any offset moves,
// and once more at a clean close with Clean set: its cost does not grow
// with the partitions a replica holds. (A file per partition cost two
// fsyncs and an inode a second per partition: 21% of a replica's CPU with
// 256 partitions under load.) After a crash it may lag what the member knew
// by up to that interval; the chain's master passes the chain's committed
// offset with the next epoch, and until then a member that restarted from
// a crash does not answer LATEST.
const committedTableFile = "committed-offsets.json"

// legacyCommittedFile is the per-partition record replicas wrote before
// committedTableFile (version 1). It is read at open for a partition the
// table does not name, and removed once the table holds its offset.
const legacyCommittedFile = "committed.json"

const (
	committedTableVersion    = 2
	legacyCommittedVersion   = 1
	committedPersistInterval = time.Second
	maxLegacyCommittedBytes  = 4 << 10
	maxCommittedTableBytes   = 64 << 20
)

// committedTable is committedTableFile's content. Partitions are named
// "<stream>/<index>".
type committedTable struct {
	Version int `json:"version"`
	// Clean is set by a clean close only: each offset is exactly what the
	// member knew when it stopped.
	Clean      bool              `json:"clean,omitempty"`
	Partitions map[string]uint64 `json:"partitions"`
}

func (k partKey) tableName() string { return k.stream + "/" + strconv.FormatUint(uint64(k.index), 10) }

func parseTableName(s string) (partKey, error) {
	stream, idx, ok := strings.Cut(s, "/")
	n, err := strconv.ParseUint(idx, 10, 32)
	if !ok || err != nil || !nameRE.MatchString(stream) {
		return partKey{}, fmt.Errorf("partition name %q is not <stream>/<index>", s)
	}
	return partKey{stream, uint32(n)}, nil
}

// readCommittedTable loads dir's committedTableFile; a missing file is an
// empty table (a new replica, or one written before the table).
func readCommittedTable(dir string) (map[partKey]uint64, bool, error) {
	path := filepath.Join(dir, committedTableFile)
	b, err := readSmallFile(path, maxCommittedTableBytes)
	if errors.Is(err, os.ErrNotExist) {
		return map[partKey]uint64{}, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	var t committedTable
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, false, fmt.Errorf("failed to decode %s: %w", path, err)
	}
	if t.Version != committedTableVersion {
		return nil, false, fmt.Errorf("%s has version %d; this replica reads version %d", path, t.Version, committedTableVersion)
	}
	out := make(map[partKey]uint64, len(t.Partitions))
	for name, c := range t.Partitions {
		k, err := parseTableName(name)
		if err != nil {
			return nil, false, fmt.Errorf("%s: %w", path, err)
		}
		out[k] = c
	}
	return out, t.Clean, nil
}

func writeCommittedTable(dir string, offsets map[partKey]uint64, clean bool) error {
	t := committedTable{Version: committedTableVersion, Clean: clean, Partitions: make(map[string]uint64, len(offsets))}
	for k, c := range offsets {
		t.Partitions[k.tableName()] = c
	}
	b, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("failed to encode committed offsets: %w", err)
	}
	return durable.WriteFile(dir, committedTableFile, b, 0o644)
}

// legacyCommitted is the version-1 per-partition record.
type legacyCommitted struct {
	Version   int    `json:"version"`
	Committed uint64 `json:"committed"`
	Clean     bool   `json:"clean,omitempty"`
}

// readLegacyCommitted loads a partition directory's version-1 record.
func readLegacyCommitted(dir string) (legacyCommitted, error) {
	path := filepath.Join(dir, legacyCommittedFile)
	b, err := readSmallFile(path, maxLegacyCommittedBytes)
	if err != nil {
		return legacyCommitted{}, err
	}
	var rec legacyCommitted
	if err := json.Unmarshal(b, &rec); err != nil {
		return legacyCommitted{}, fmt.Errorf("failed to decode %s: %w", path, err)
	}
	if rec.Version != legacyCommittedVersion {
		return legacyCommitted{}, fmt.Errorf("%s has version %d; this replica reads version %d", path, rec.Version, legacyCommittedVersion)
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

// loadCommittedTable reads the table at start-up, before any partition
// opens. An unreadable table is logged and taken as empty: each offset is
// a floor, and the chain's master teaches the chain's with the next epoch.
func (s *Server) loadCommittedTable() {
	t, clean, err := readCommittedTable(s.dataDir)
	if err != nil {
		s.logger.Error(err, "Committed offsets are unreadable; partitions start from 0 until their chain's master installs an epoch")
		t, clean = map[partKey]uint64{}, false
	}
	s.committedLoaded, s.committedClean = t, clean
	s.committedOnDisk = maps.Clone(t)
}

// loadCommitted restores the committed offset recorded before a restart,
// capped at what the log holds (recovery may have cut a torn tail; the
// records below the cap were committed and are here). It reports whether
// the record is exact (written by a clean close). Only partitions opened
// at start-up have one: a partition created later starts at 0, whatever a
// table written before its directory was last dropped may still name.
func (p *partition) loadCommitted(logEnd uint64) (committed uint64, exact bool) {
	s := p.srv
	k := partKey{p.stream, p.index}
	if s.committedLoaded == nil {
		return 0, false
	}
	if c, ok := s.committedLoaded[k]; ok {
		return min(c, logEnd), s.committedClean
	}
	rec, err := readLegacyCommitted(p.dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return 0, false
	case err != nil:
		p.logger.Error(err, "Committed offset record is unreadable; starting from 0 until the chain's master installs an epoch")
		return 0, false
	}
	p.legacyCommitted = true
	return min(rec.Committed, logEnd), rec.Clean
}

// committedWrite says when persistCommitted writes.
type committedWrite int

const (
	// whenMoved: only if an offset moved or the set of partitions
	// changed since the last write (the periodic write).
	whenMoved committedWrite = iota
	// atStart: always, without Clean, before the replica serves: a clean
	// table must not outlive the start that trusted it.
	atStart
	// atCleanClose: always, with Clean set.
	atCleanClose
)

// persistCommitted writes the committed-offset table as w says. A failed
// partition keeps the offset the table last held for it. Writes are
// ordered by committedMu, and each takes its snapshot under it, so the
// last write holds the latest state.
func (s *Server) persistCommitted(w committedWrite) error {
	s.committedMu.Lock()
	defer s.committedMu.Unlock()
	return s.persistCommittedLocked(w)
}

// persistCommittedLocked is persistCommitted with committedMu held.
func (s *Server) persistCommittedLocked(w committedWrite) error {
	s.mu.Lock()
	parts := make(map[partKey]*partition, len(s.partitions))
	maps.Copy(parts, s.partitions)
	prev := s.committedOnDisk
	s.mu.Unlock()

	next := make(map[partKey]uint64, len(parts))
	var legacy []*partition
	anyFailed := false
	for k, p := range parts {
		p.mu.Lock()
		c, failed := p.committed, p.failed != nil || p.log == nil
		p.mu.Unlock()
		if failed {
			anyFailed = true
			if old, ok := prev[k]; ok {
				next[k] = old
			}
			continue
		}
		next[k] = c
		if p.legacyCommitted {
			legacy = append(legacy, p)
		}
	}
	if w == whenMoved && maps.Equal(next, prev) {
		return nil
	}
	// A failed partition's offset is the one it last reported, not what
	// it knew at the close: a table holding one is never clean.
	if err := writeCommittedTable(s.dataDir, next, w == atCleanClose && !anyFailed); err != nil {
		return err
	}
	s.mu.Lock()
	s.committedOnDisk = next
	s.mu.Unlock()
	for _, p := range legacy {
		// The table holds it now; a partition renamed away by Drop
		// meanwhile has no file here any more.
		if err := os.Remove(filepath.Join(p.dir, legacyCommittedFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			p.logger.Error(err, "Failed to remove the per-partition committed offset record")
			continue
		}
		p.legacyCommitted = false
	}
	return nil
}

// persistCommittedRound records every partition's committed offset if one
// moved (every committedPersistInterval). A failure is logged and retried
// on the next round: each offset is a floor, and a lagging floor is what a
// crash leaves anyway.
func (s *Server) persistCommittedRound() {
	if err := s.persistCommitted(whenMoved); err != nil {
		s.logger.Error(err, "Failed to record the committed offsets")
	}
}
