// Package journal is the replica process's journal (docs/journal.md): the
// records it holds, the plan that recovery makes from them (Replay), the
// group-commit writer (New, Open) and the reader (Scan), and Store: a
// process's partition logs over one journal.
package journal

import (
	"errors"
	"fmt"
	"sort"

	"github.com/catena-streams/catena/replica/partlog"
)

// Kind is a journal record's kind.
type Kind uint8

const (
	// Create: a partition incarnation starts, empty at Base.
	Create Kind = iota + 1
	// Frame: a frame of offsets [Base, End) under Epoch, appended.
	Frame
	// Truncate: the log was cut to End (its records are synced before
	// the cut takes effect).
	Truncate
	// Reset: the log was emptied to start at Base (catch-up below a
	// source).
	Reset
	// Flushed: the segment files hold [.., End) durably on their own (a
	// Sync fsynced them for a Written frame). It raises what replay
	// trusts of the files, never lowers it.
	Flushed
	// Drop: the partition incarnation is gone.
	Drop
	// CheckpointRecord: the segment files of every partition named in
	// its payload were fsynced up to their flushed offsets, taken after
	// journal position Base (EncodeCheckpoint). Replay is given the last
	// one apart, not among its records.
	CheckpointRecord
	// Written: a frame of offsets [Base, End) under Epoch, its CRC in
	// Rolling, appended and written to its segment file only, not to the
	// journal (a large frame: docs/journal.md, "Large frames"). Replay
	// plans it as a frame the file must hold: recovery keeps it if the
	// file holds that frame whole, and ends the log at its base if not.
	Written
)

func (k Kind) String() string {
	switch k {
	case Create:
		return "create"
	case Frame:
		return "frame"
	case Truncate:
		return "truncate"
	case Reset:
		return "reset"
	case Flushed:
		return "flushed"
	case Drop:
		return "drop"
	case CheckpointRecord:
		return "checkpoint"
	case Written:
		return "written"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// PartitionID names a partition of a stream.
type PartitionID struct {
	Stream    string
	Partition uint32
}

func (p PartitionID) String() string { return fmt.Sprintf("%s/%d", p.Stream, p.Partition) }

// Record is one journal record, as far as recovery's plan needs it (a
// frame's bytes are not needed to plan, only to apply).
type Record struct {
	Kind Kind
	Part PartitionID
	// Incarnation tells a partition created again after a drop from its
	// predecessor; it is written in the partition's directory.
	Incarnation uint64
	Epoch       uint64
	// Base and End: Frame and Written [Base, End); Create and Reset Base;
	// Truncate and Flushed End; CheckpointRecord its position in Base.
	// Rolling: Create's and Reset's rolling checksum; Written's frame CRC
	// (and Frame's, when OpenStore reads it from the frame's header).
	Base, End uint64
	// Rolling is the log's rolling checksum at Base of a Create or a
	// Reset.
	Rolling uint32
}

// Entry is a checkpoint's record of one partition: the segment files of
// that incarnation were fsynced up to Flushed.
type Entry struct {
	Incarnation uint64
	Flushed     uint64
}

// Checkpoint is the last valid checkpoint record: the journal position J
// it was taken from (records from J on are replayed) and every open
// partition's flushed offset.
type Checkpoint struct {
	Position uint64
	Entries  map[PartitionID]Entry
}

// OnDisk is what recovery finds of a partition before replay.
type OnDisk struct {
	Incarnation uint64
	// Start is the log's first offset (retention may have moved it past
	// a checkpoint's flushed offset).
	Start uint64
}

// Plan is what recovery does to one partition: open its log trusting
// [start, Keep), or when ResetTo is set make it empty at that offset
// (creating its directory if missing; its files are kept if they are
// that log's, partlog.Options.Verify), then bring it to the frames of
// Writes (indexes into the records given to Replay), in order. Above Keep
// the segment files keep the frames that match Writes from the first on
// (offsets and CRC) and are cut after them; the rest of Writes is
// written from the journal, up to the first Written frame, whose bytes
// the journal does not have: the log ends at its base.
type Plan struct {
	Incarnation uint64
	Keep        uint64
	ResetTo     *partlog.Start
	Writes      []int
	// Dropped: the incarnation was dropped; its directory is removed.
	Dropped bool
	// Orphan: a directory no checkpoint and no record knows: created, and
	// crashed before its create record was synced, so it never accepted
	// a frame. It is removed.
	Orphan bool
}

// ErrCorrupt marks a journal whose records cannot be what a crash left.
var ErrCorrupt = errors.New("journal is corrupt")

// Replay plans recovery from the last checkpoint, the records from its
// position on (in journal order; a torn last group already cut), and the
// partitions found on disk. It is pure: the caller opens, cuts, resets,
// writes and removes as the plans say.
func Replay(cp Checkpoint, records []Record, disk map[PartitionID]OnDisk) (map[PartitionID]*Plan, error) {
	type key struct {
		id  PartitionID
		inc uint64
	}
	type state struct {
		plan      *Plan
		known     bool // a checkpoint entry or a create stands for it
		onDisk    bool // its directory is there
		end       uint64
		lastEpoch uint64
		writeEnds []uint64 // End of each planned write
	}
	parts := map[key]*state{}
	for id, d := range disk {
		parts[key{id, d.Incarnation}] = &state{plan: &Plan{Incarnation: d.Incarnation}, onDisk: true}
	}
	for id, e := range cp.Entries {
		k := key{id, e.Incarnation}
		st := parts[k]
		if st == nil {
			// Not on disk: it must be dropped by a record below.
			st = &state{plan: &Plan{Incarnation: e.Incarnation}}
			parts[k] = st
		}
		st.known = true
		st.plan.Keep = e.Flushed
		if d, ok := disk[id]; ok && d.Incarnation == e.Incarnation {
			st.plan.Keep = max(e.Flushed, d.Start)
		}
		st.end = st.plan.Keep
	}
	// A partition's records before its last reset are passed over: the
	// reset empties the log whatever they did, and the log on disk may
	// already start at the reset's base, which says nothing of them.
	lastReset := map[key]int{}
	for i, r := range records {
		switch r.Kind {
		case Reset:
			lastReset[key{r.Part, r.Incarnation}] = i
		case Create:
			delete(lastReset, key{r.Part, r.Incarnation})
		}
	}
	// An incarnation dropped in the records is planned dropped, whatever
	// its records before the drop: nothing of it is kept, and a
	// checkpoint taken while it was dropped names it nowhere.
	dropAt := map[key]int{}
	for i, r := range records {
		if k := (key{r.Part, r.Incarnation}); r.Kind == Drop {
			if _, ok := dropAt[k]; !ok {
				dropAt[k] = i
			}
		}
	}
	corrupt := func(i int, r Record, format string, a ...any) error {
		return fmt.Errorf("%w: record %d (%s of %s, incarnation %d): %s", ErrCorrupt, i, r.Kind, r.Part, r.Incarnation, fmt.Sprintf(format, a...))
	}
	for i, r := range records {
		k := key{r.Part, r.Incarnation}
		st := parts[k]
		if d, ok := dropAt[k]; ok && i <= d {
			if i == d {
				if st == nil {
					st = &state{plan: &Plan{Incarnation: r.Incarnation}}
					parts[k] = st
				}
				st.known, st.plan.Dropped = true, true
				st.plan.Writes, st.writeEnds, st.plan.ResetTo = nil, nil, nil
			}
			continue
		}
		if r.Kind == Create {
			// A new incarnation: every frame of it is in the records
			// from here, so it is made again from empty (its directory
			// may not have reached the disk).
			base := r.Base
			parts[k] = &state{plan: &Plan{Incarnation: r.Incarnation, Keep: base, ResetTo: &partlog.Start{Base: base, Rolling: r.Rolling}}, known: true, onDisk: st != nil && st.onDisk, end: base}
			continue
		}
		if last, ok := lastReset[k]; ok && i < last && st != nil && st.known && !st.plan.Dropped {
			continue
		}
		switch {
		case st == nil || !st.known:
			return nil, corrupt(i, r, "no checkpoint entry and no create record for this incarnation")
		case st.plan.Dropped:
			return nil, corrupt(i, r, "a record after the incarnation was dropped")
		}
		switch r.Kind {
		case Frame, Written:
			if r.Epoch < st.lastEpoch {
				return nil, corrupt(i, r, "epoch %d after epoch %d", r.Epoch, st.lastEpoch)
			}
			st.lastEpoch = r.Epoch
			switch {
			case r.End <= st.plan.Keep && st.plan.ResetTo == nil:
				// Below what the segment files hold durably: journalled
				// between the checkpoint's position and its snapshot, or
				// trimmed by retention since.
			case r.Base == st.end && r.End > r.Base:
				// A Written frame's bytes are in the segment file only:
				// recovery looks for it there.
				st.plan.Writes = append(st.plan.Writes, i)
				st.writeEnds = append(st.writeEnds, r.End)
				st.end = r.End
			default:
				return nil, corrupt(i, r, "frame [%d, %d) does not continue the log at %d", r.Base, r.End, st.end)
			}
		case Truncate:
			if r.End > st.end {
				return nil, corrupt(i, r, "a truncation to %d above the log's end %d: frames are missing", r.End, st.end)
			}
			// The epoch of the last frame kept: frames of a later chain
			// epoch follow, never of an earlier one than it.
			st.lastEpoch = r.Epoch
			st.end = r.End
			if r.End <= st.plan.Keep && st.plan.ResetTo == nil {
				st.plan.Keep = r.End
				st.plan.Writes, st.writeEnds = nil, nil
				continue
			}
			// Planned writes past the cut are cut with it.
			n := sort.Search(len(st.writeEnds), func(k int) bool { return st.writeEnds[k] > r.End })
			if n < len(st.writeEnds) && records[st.plan.Writes[n]].Base < r.End {
				return nil, corrupt(i, r, "a truncation to %d inside frame [%d, %d)", r.End, records[st.plan.Writes[n]].Base, st.writeEnds[n])
			}
			st.plan.Writes, st.writeEnds = st.plan.Writes[:n], st.writeEnds[:n]
		case Reset:
			base := r.Base
			st.plan.ResetTo, st.plan.Keep, st.end = &partlog.Start{Base: base, Rolling: r.Rolling}, base, base
			st.plan.Writes, st.writeEnds = nil, nil
			st.lastEpoch = 0
		case Flushed:
			// The files hold everything below End durably, as the log
			// was then (a reset and the frames before included): nothing
			// below it is replayed.
			if r.End <= st.plan.Keep && st.plan.ResetTo == nil {
				// Says less than the files are trusted with already: a
				// Sync's record for a snapshot older than the
				// checkpoint's flush, written after its position.
				continue
			}
			if r.End < st.end {
				n := sort.Search(len(st.writeEnds), func(k int) bool { return st.writeEnds[k] > r.End })
				if n < len(st.writeEnds) && records[st.plan.Writes[n]].Base < r.End {
					return nil, corrupt(i, r, "flushed to %d inside frame [%d, %d)", r.End, records[st.plan.Writes[n]].Base, st.writeEnds[n])
				}
				st.plan.Writes, st.writeEnds = st.plan.Writes[n:], st.writeEnds[n:]
			} else {
				st.plan.Writes, st.writeEnds = nil, nil
				st.end = r.End
			}
			st.plan.Keep, st.plan.ResetTo = r.End, nil
			st.onDisk = true
		case Drop:
			st.plan.Dropped = true
			st.plan.Writes, st.writeEnds = nil, nil
		default:
			return nil, corrupt(i, r, "unknown record kind")
		}
	}
	// One plan per partition: its live incarnation (on disk, or created),
	// else what is left of a dropped one, else an orphan directory.
	out := map[PartitionID]*Plan{}
	rank := func(st *state) int {
		switch {
		case st.known && !st.plan.Dropped:
			return 3
		case st.plan.Dropped:
			return 2
		}
		return 1
	}
	best := map[PartitionID]*state{}
	for k, st := range parts {
		if d, ok := disk[k.id]; ok && d.Incarnation == k.inc && st.known && !st.plan.Dropped && st.plan.ResetTo == nil && st.plan.Keep < d.Start {
			// A truncation lowered what is kept below the disk's start:
			// retention removed the segments between since, each
			// fsynced when it was sealed. What is planned below the
			// start goes with them. (A reset's or a creation's plan
			// keeps its frames: whether the files are that log, past a
			// start retention moved, recovery tells by their rolling
			// checksum.)
			n := sort.Search(len(st.writeEnds), func(w int) bool { return st.writeEnds[w] > d.Start })
			if n < len(st.writeEnds) && records[st.plan.Writes[n]].Base < d.Start {
				return nil, fmt.Errorf("%w: partition %s (incarnation %d): frame [%d, %d) straddles the log's start %d on disk", ErrCorrupt, k.id, k.inc, records[st.plan.Writes[n]].Base, st.writeEnds[n], d.Start)
			}
			st.plan.Keep = d.Start
			st.plan.Writes, st.writeEnds = st.plan.Writes[n:], st.writeEnds[n:]
		}
		switch {
		case st.known && !st.plan.Dropped && !st.onDisk && st.plan.ResetTo == nil:
			// In the checkpoint, gone from the disk, and no drop record
			// said so (a drop is synced before its directory is renamed).
			return nil, fmt.Errorf("%w: partition %s (incarnation %d) is in the checkpoint but not on disk, and was not dropped", ErrCorrupt, k.id, k.inc)
		case !st.known:
			// A directory no checkpoint and no record knows: created,
			// and crashed before its create record was synced.
			st.plan.Orphan = true
		}
		if b := best[k.id]; b == nil || rank(st) > rank(b) {
			best[k.id] = st
		}
	}
	for id, st := range best {
		out[id] = st.plan
	}
	return out, nil
}
