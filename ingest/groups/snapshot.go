package groups

// Snapshots of the offsets stream. Every commit adds a record to the
// offsets stream, so without them it grows for ever and a coordinator's
// start reads all of it. A snapshot is every group's offsets as of an
// offset of the stream (its asOf: the state after every record before
// it), written as one or more records of version 2 after that offset;
// then the snapshot hold (SnapshotHold, a consumer hold on the offsets
// stream) is moved to asOf. So:
//
//   - a load starts at the hold, takes the first complete snapshot it
//     reads there, and applies the commits stored from its asOf on (those
//     stored while the snapshot was being written too): it reads what
//     was stored since the newest snapshot, not the stream's history;
//   - retention of the offsets stream (its Stream's retention) deletes
//     only what is below the hold, which the snapshot replaces.
//
// A snapshot is complete when every one of its parts has been read; one
// whose writer failed half way is never complete and is passed over.

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// SnapshotHold is the consumer whose retention hold on the offsets stream
// keeps the newest snapshot and everything stored after it. (Group holds
// are named "kafka.group/...", aggregations' "<namespace>/<name>".)
const SnapshotHold = "kafka.offsets/snapshot"

// DefaultSnapshotEvery is StreamOffsets.SnapshotEvery's default: records
// of the offsets stream stored after the newest snapshot before the next.
const DefaultSnapshotEvery = 10000

const (
	// snapshotPartBytes bounds the offsets one snapshot record carries
	// (JSON), well below a record's limit.
	snapshotPartBytes = 256 << 10
	// maxSnapshotParts bounds the parts of one snapshot a load accepts.
	maxSnapshotParts = 1 << 16
	// snapshotOwnerKey is hashed over the nodes like a group id to choose
	// the one node that writes snapshots (a NUL-prefixed name no Kafka
	// client can use for a group).
	snapshotOwnerKey = "\x00catena.offsets-snapshot"
)

// snapshotHeader names the snapshot a record is a part of.
type snapshotHeader struct {
	// ID tells one snapshot's parts from another's.
	ID string `json:"id"`
	// AsOf is the offset of the stream the snapshot is the state before.
	AsOf uint64 `json:"asOf"`
	// Part is this record's index among Parts.
	Part  int `json:"part"`
	Parts int `json:"parts"`
}

func (h *snapshotHeader) validate() error {
	switch {
	case h.ID == "":
		return errors.New("offsets snapshot record without an id")
	case h.Parts < 1 || h.Parts > maxSnapshotParts:
		return fmt.Errorf("offsets snapshot %s has %d parts (1-%d)", h.ID, h.Parts, maxSnapshotParts)
	case h.Part < 0 || h.Part >= h.Parts:
		return fmt.Errorf("offsets snapshot %s: part %d of %d", h.ID, h.Part, h.Parts)
	}
	return nil
}

// snapshotGroup is one group's offsets in a snapshot part; a group's
// offsets may be spread over several parts.
type snapshotGroup struct {
	Group   string         `json:"group"`
	Offsets []offsetsEntry `json:"offsets,omitempty"`
}

// snapshotRecords encodes view as the parts of snapshot id as of asOf,
// each carrying at most about partBytes of offsets (at least one entry),
// groups and partitions in order.
func snapshotRecords(view map[string]map[TopicPartition]Committed, id string, asOf uint64, partBytes int) ([][]byte, error) {
	var parts [][]snapshotGroup
	var cur []snapshotGroup
	size, entries := 0, 0
	for _, name := range slices.Sorted(maps.Keys(view)) {
		offs := view[name]
		// The group's name counts in every part it is in (escaped, at
		// most six bytes a byte).
		start := func() { cur, size = append(cur, snapshotGroup{Group: name}), size+6*len(name)+32 }
		start()
		for _, tp := range slices.SortedFunc(maps.Keys(offs), compareTopicPartitions) {
			o := offs[tp]
			e := offsetsEntry{Topic: tp.Topic, Partition: tp.Partition, Offset: o.Offset, LeaderEpoch: o.LeaderEpoch, Metadata: o.Metadata, At: o.At}
			// Measured as encoded: JSON escapes some characters
			// in six bytes, and metadata may be 4 KiB of them.
			b, err := json.Marshal(e)
			if err != nil {
				return nil, err
			}
			n := len(b) + 1
			if size+n > partBytes && entries > 0 {
				parts, cur, size, entries = append(parts, cur), nil, 0, 0
				start()
			}
			last := &cur[len(cur)-1]
			last.Offsets = append(last.Offsets, e)
			size += n
			entries++
		}
	}
	if len(cur) > 0 || len(parts) == 0 {
		parts = append(parts, cur)
	}
	out := make([][]byte, len(parts))
	for i, groups := range parts {
		v, err := json.Marshal(offsetsRecord{V: 2, Snapshot: &snapshotHeader{ID: id, AsOf: asOf, Part: i, Parts: len(parts)}, Groups: groups})
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func compareTopicPartitions(a, b TopicPartition) int {
	return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
}

// snapshotBuild gathers one snapshot's parts as a load reads them.
type snapshotBuild struct {
	h     snapshotHeader
	seen  []bool
	left  int
	state map[string]map[TopicPartition]Committed
}

func newSnapshotBuild(h *snapshotHeader) *snapshotBuild {
	return &snapshotBuild{h: *h, seen: make([]bool, h.Parts), left: h.Parts, state: map[string]map[TopicPartition]Committed{}}
}

// add takes in a part; false if it does not belong with the parts before
// (another asOf or part count under the same id).
func (b *snapshotBuild) add(rec *offsetsRecord) bool {
	h := rec.Snapshot
	if h.AsOf != b.h.AsOf || h.Parts != b.h.Parts {
		return false
	}
	if b.seen[h.Part] {
		return true // the same part stored twice changes nothing
	}
	b.seen[h.Part] = true
	b.left--
	for _, g := range rec.Groups {
		offs := b.state[g.Group]
		if offs == nil {
			offs = map[TopicPartition]Committed{}
			b.state[g.Group] = offs
		}
		for _, e := range g.Offsets {
			offs[TopicPartition{e.Topic, e.Partition}] = Committed{Offset: e.Offset, LeaderEpoch: e.LeaderEpoch, Metadata: e.Metadata, At: e.At}
		}
	}
	return true
}

// LoadStats describes the last load that read the offsets stream anew (a
// start, or records trimmed past where the load before ended).
type LoadStats struct {
	// From is the offset it began to read at: the snapshot hold, or the
	// stream's first record.
	From uint64
	// Records is how many records it read.
	Records int
	// Snapshot says whether the view is a snapshot's, taken at
	// SnapshotAsOf, with the commits stored from there on.
	Snapshot     bool
	SnapshotAsOf uint64
}

// LastLoad describes the last load that read the stream anew.
func (s *StreamOffsets) LastLoad() LoadStats {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	return s.lastLoad
}

// replayed is what replay read.
type replayed struct {
	view    map[string]map[TopicPartition]Committed
	next    uint64
	records int
	// used: view is the snapshot of asOf and the commits after it.
	used bool
	asOf uint64
	// newestAsOf is the highest asOf of any snapshot part read.
	newestAsOf uint64
}

// loadWhole reads the partition anew: from the snapshot hold when it is
// above start (the stream's first record), else from start. A read from
// the hold that found no complete snapshot reads from start again.
func (s *StreamOffsets) loadWhole(ctx context.Context, p uint32, start, end uint64) error {
	hold, held, logStart, err := s.snapshotHold(ctx)
	if err != nil {
		// Reading from the start is always right, only longer; whether
		// to create the hold is left to the next load.
		s.Logger.Info("Could not find the offsets stream's snapshot hold: reading it from its start", "stream", s.stream(), "err", err.Error())
		held = true
	}
	start = min(max(start, logStart), end)
	from := start
	if held && hold > start && hold <= end {
		from = hold
	}
	r, err := s.replay(ctx, p, from, end)
	if err != nil {
		return err
	}
	if from > start && !r.used {
		s.Logger.Info("No complete snapshot of the consumer groups' offsets at the snapshot hold: reading the offsets stream from its start", "stream", s.stream(), "hold", from, "start", start)
		from = start
		if r, err = s.replay(ctx, p, from, end); err != nil {
			return err
		}
	}
	if from > 0 && !r.used {
		// Only hard retention, or retention with the hold deleted,
		// trims records no snapshot replaces.
		s.Logger.Error(nil, "The offsets stream lost its first records and no snapshot replaces them: groups whose offsets were stored only there have lost them", "stream", s.stream(), "start", from)
	}
	s.view, s.next = r.view, r.next
	s.snapshotAsOf = max(s.snapshotAsOf, r.newestAsOf)
	s.lastLoad = LoadStats{From: from, Records: r.records, Snapshot: r.used, SnapshotAsOf: r.asOf}
	s.Logger.Info("Loaded the consumer groups' committed offsets", "stream", s.stream(), "from", from, "records", r.records, "snapshot", r.used, "snapshotAsOf", r.asOf, "groups", len(r.view))
	if !held {
		// Keep what this load needed until a snapshot replaces it: a
		// stream given retention before its first snapshot would
		// otherwise lose every offset stored so far.
		at := from
		if r.used {
			at = r.asOf
		}
		if err := s.holdSnapshot(ctx, at); err != nil {
			s.Logger.Info("Could not hold the offsets stream from retention; the next load tries again", "stream", s.stream(), "err", err.Error())
		}
	}
	return nil
}

// replay reads [from, end) into a new view. Reading from past the
// stream's first offset, it takes the first complete snapshot whose asOf
// is at or after from (then any newer one) and applies the commits stored
// from its asOf on; from the first offset it needs none.
func (s *StreamOffsets) replay(ctx context.Context, p uint32, from, end uint64) (replayed, error) {
	r := replayed{view: map[string]map[TopicPartition]Committed{}, next: from}
	pending := map[string]*snapshotBuild{}
	err := s.fetch(ctx, p, from, end, func(rec *catenapb.Record, or *offsetsRecord) error {
		r.records++
		r.next = rec.GetOffset() + 1
		switch {
		case or == nil:
			return nil
		case or.Snapshot == nil:
			applyCommit(or, r.view)
			return nil
		}
		h := or.Snapshot
		if h.Part == h.Parts-1 {
			// A writer stores its parts in order, each once the one
			// before is committed: its last part stored means all are.
			r.newestAsOf = max(r.newestAsOf, h.AsOf)
		}
		if from == 0 || h.AsOf < from || (r.used && h.AsOf <= r.asOf) {
			return nil
		}
		b := pending[h.ID]
		if b == nil {
			b = newSnapshotBuild(h)
			pending[h.ID] = b
		}
		if !b.add(or) {
			s.Logger.Error(nil, "Skipping an offsets snapshot whose parts disagree", "stream", s.stream(), "snapshot", h.ID, "offset", rec.GetOffset())
			delete(pending, h.ID)
			return nil
		}
		if b.left > 0 {
			return nil
		}
		delete(pending, h.ID)
		view := b.state
		err := s.fetch(ctx, p, h.AsOf, rec.GetOffset(), func(_ *catenapb.Record, c *offsetsRecord) error {
			if c != nil && c.Snapshot == nil {
				applyCommit(c, view)
			}
			return nil
		})
		if err != nil {
			return err
		}
		r.view, r.used, r.asOf = view, true, h.AsOf
		return nil
	})
	return r, err
}

// snapshotHold is where SnapshotHold holds the offsets stream (the lowest
// offset any member holds it at), whether it does, and the highest log
// start any member reports: a member whose hold moved further than
// another's may have trimmed past the lowest.
func (s *StreamOffsets) snapshotHold(ctx context.Context) (hold uint64, held bool, logStart uint64, err error) {
	resp, err := s.Ingest.ListConsumers(ctx, &catenapb.ListConsumersRequest{Stream: s.stream()})
	if err != nil {
		return 0, false, 0, fmt.Errorf("list the holds on the offsets stream: %w", err)
	}
	for _, p := range resp.GetPartitions() {
		if p.GetPartition() != offsetsPartition {
			continue
		}
		logStart = p.GetLogStart()
		for _, h := range p.GetHolds() {
			if h.GetConsumer() == SnapshotHold {
				return h.GetOffset(), true, logStart, nil
			}
		}
	}
	return 0, false, logStart, nil
}

func (s *StreamOffsets) holdSnapshot(ctx context.Context, offset uint64) error {
	_, err := s.Ingest.CommitConsumerOffset(ctx, &catenapb.CommitConsumerOffsetRequest{Stream: s.stream(), Partition: offsetsPartition, Consumer: SnapshotHold, Offset: offset})
	return err
}

// Compact writes a snapshot of every group's offsets once SnapshotEvery
// records (and four times the last snapshot's parts) were stored after
// the newest snapshot, then moves the snapshot hold to it; a hold move
// that failed is tried again first. It reports whether it wrote a
// snapshot. The parts are written without holding up loads; a snapshot
// that could not be written whole is passed over by every load, and the
// hold stays where it was.
func (s *StreamOffsets) Compact(ctx context.Context) (bool, error) {
	s.compactMu.Lock()
	defer s.compactMu.Unlock()
	if s.holdOwed > 0 {
		if err := s.holdSnapshot(ctx, s.holdOwed); err != nil {
			return false, fmt.Errorf("move the offsets stream's snapshot hold to %d: %w", s.holdOwed, err)
		}
		s.holdOwed = 0
	}
	id, asOf, parts, groups, err := s.encodeSnapshot(ctx)
	if err != nil || parts == nil {
		return false, err
	}
	for i, v := range parts {
		if err := s.appendValue(ctx, []byte("snapshot/"+id), v); err != nil {
			return false, fmt.Errorf("write part %d of %d of a snapshot of the consumer groups' offsets as of %d: %w", i+1, len(parts), asOf, err)
		}
	}
	s.loadMu.Lock()
	s.snapshotAsOf, s.snapshotParts = max(s.snapshotAsOf, asOf), len(parts)
	s.loadMu.Unlock()
	s.Logger.Info("Wrote a snapshot of the consumer groups' committed offsets", "stream", s.stream(), "asOf", asOf, "parts", len(parts), "groups", groups)
	if err := s.holdSnapshot(ctx, asOf); err != nil {
		s.holdOwed = asOf
		return true, fmt.Errorf("move the offsets stream's snapshot hold to %d: %w", asOf, err)
	}
	return true, nil
}

// encodeSnapshot brings the view up to date and, when a snapshot is due,
// encodes it (parts nil: none is).
func (s *StreamOffsets) encodeSnapshot(ctx context.Context) (id string, asOf uint64, parts [][]byte, groups int, err error) {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	created, err := s.loadLocked(ctx)
	if err != nil || created {
		return "", 0, nil, 0, err
	}
	every := max(cmp.Or(s.SnapshotEvery, DefaultSnapshotEvery), 4*uint64(s.snapshotParts))
	if s.next < s.snapshotAsOf+every {
		return "", 0, nil, 0, nil
	}
	var idb [8]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return "", 0, nil, 0, err
	}
	id = hex.EncodeToString(idb[:])
	parts, err = snapshotRecords(s.view, id, s.next, snapshotPartBytes)
	return id, s.next, parts, len(s.view), err
}
