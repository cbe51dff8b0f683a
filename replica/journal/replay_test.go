package journal

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

var p0, p1 = PartitionID{"orders", 0}, PartitionID{"orders", 1}

func frame(p PartitionID, inc, epoch, base, end uint64) Record {
	return Record{Kind: Frame, Part: p, Incarnation: inc, Epoch: epoch, Base: base, End: end}
}

// written is a frame written to its partition's segment file only: the
// journal records where it is, not its bytes.
func written(p PartitionID, inc, epoch, base, end uint64) Record {
	return Record{Kind: Written, Part: p, Incarnation: inc, Epoch: epoch, Base: base, End: end}
}

func rec(k Kind, p PartitionID, inc, at uint64) Record {
	r := Record{Kind: k, Part: p, Incarnation: inc}
	switch k {
	case Create, Reset:
		r.Base = at
	default:
		r.End = at
	}
	return r
}

// want is a plan in short: what is kept, the reset, the frames written
// (as [base,end) of the records), dropped or orphan.
func show(pl *Plan, records []Record) string {
	if pl == nil {
		return "none"
	}
	switch {
	case pl.Orphan:
		return "orphan"
	case pl.Dropped:
		return "dropped"
	}
	s := fmt.Sprintf("inc %d keep %d", pl.Incarnation, pl.Keep)
	if pl.ResetTo != nil {
		s += fmt.Sprintf(" reset %d", pl.ResetTo.Base)
	}
	for _, i := range pl.Writes {
		w := ""
		if records[i].Kind == Written {
			w = "w" // to be found in the segment file
		}
		s += fmt.Sprintf(" %s[%d,%d)", w, records[i].Base, records[i].End)
	}
	return s
}

func TestReplay(t *testing.T) {
	cp := Checkpoint{Position: 1000, Entries: map[PartitionID]Entry{p0: {Incarnation: 1, Flushed: 100}}}
	onDisk := map[PartitionID]OnDisk{p0: {Incarnation: 1}}
	for _, tc := range []struct {
		name    string
		cp      Checkpoint
		disk    map[PartitionID]OnDisk
		records []Record
		want    map[PartitionID]string
		corrupt string // a substring of the error; "" for none
	}{
		{
			name: "nothing after the checkpoint: keep what it flushed",
			cp:   cp, disk: onDisk,
			want: map[PartitionID]string{p0: "inc 1 keep 100"},
		},
		{
			// The flusher takes the journal position before each
			// partition's end: frames journalled in between are below
			// the flushed offset and already in the files.
			name: "frames journalled while the flusher ran are passed over, the rest written",
			cp:   cp, disk: onDisk,
			records: []Record{frame(p0, 1, 3, 90, 100), frame(p0, 1, 3, 100, 110), frame(p0, 1, 3, 110, 125)},
			want:    map[PartitionID]string{p0: "inc 1 keep 100 [100,110) [110,125)"},
		},
		{
			name: "a truncation cuts planned frames, and frames of a higher epoch follow at the same offsets",
			cp:   cp, disk: onDisk,
			records: []Record{
				frame(p0, 1, 3, 100, 110), frame(p0, 1, 3, 110, 120),
				{Kind: Truncate, Part: p0, Incarnation: 1, Epoch: 4, End: 110},
				frame(p0, 1, 4, 110, 115),
			},
			want: map[PartitionID]string{p0: "inc 1 keep 100 [100,110) [110,115)"},
		},
		{
			name: "a truncation below the flushed offset cuts the files there",
			cp:   cp, disk: onDisk,
			records: []Record{frame(p0, 1, 3, 100, 110), {Kind: Truncate, Part: p0, Incarnation: 1, Epoch: 4, End: 80}, frame(p0, 1, 4, 80, 90)},
			want:    map[PartitionID]string{p0: "inc 1 keep 80 [80,90)"},
		},
		{
			name: "a truncation inside a frame",
			cp:   cp, disk: onDisk,
			records: []Record{frame(p0, 1, 3, 100, 110), rec(Truncate, p0, 1, 105)},
			corrupt: "inside frame [100, 110)",
		},
		{
			name: "a truncation above the log's end: frames are missing",
			cp:   cp, disk: onDisk,
			records: []Record{frame(p0, 1, 3, 100, 110), rec(Truncate, p0, 1, 130)},
			corrupt: "above the log's end",
		},
		{
			name: "a gap",
			cp:   cp, disk: onDisk,
			records: []Record{frame(p0, 1, 3, 100, 110), frame(p0, 1, 3, 111, 120)},
			corrupt: "does not continue the log at 110",
		},
		{
			name: "a frame of a lower epoch",
			cp:   cp, disk: onDisk,
			records: []Record{frame(p0, 1, 4, 100, 110), frame(p0, 1, 3, 110, 120)},
			corrupt: "epoch 3 after epoch 4",
		},
		{
			name: "retention removed segments past the flushed offset: the log starts there",
			cp:   cp, disk: map[PartitionID]OnDisk{p0: {Incarnation: 1, Start: 150}},
			records: []Record{frame(p0, 1, 3, 100, 150), frame(p0, 1, 3, 150, 160)},
			want:    map[PartitionID]string{p0: "inc 1 keep 150 [150,160)"},
		},
		{
			name: "a reset below a source, then frames from its base",
			cp:   cp, disk: onDisk,
			records: []Record{frame(p0, 1, 3, 100, 110), rec(Reset, p0, 1, 500), frame(p0, 1, 5, 500, 510)},
			want:    map[PartitionID]string{p0: "inc 1 keep 500 reset 500 [500,510)"},
		},
		{
			// The disk already holds the reset log (it starts at 52,
			// above the checkpoint's 45): what came before the reset,
			// frames past 52 and a truncation included, says nothing.
			name: "a reset the disk holds already passes over what came before it",
			cp:   Checkpoint{Position: 1000, Entries: map[PartitionID]Entry{p0: {Incarnation: 1, Flushed: 45}}},
			disk: map[PartitionID]OnDisk{p0: {Incarnation: 1, Start: 52}},
			records: []Record{
				frame(p0, 1, 8, 45, 50), frame(p0, 1, 8, 50, 53), frame(p0, 1, 8, 53, 60),
				{Kind: Truncate, Part: p0, Incarnation: 1, End: 30},
				rec(Reset, p0, 1, 52), frame(p0, 1, 9, 52, 53),
			},
			want: map[PartitionID]string{p0: "inc 1 keep 52 reset 52 [52,53)"},
		},
		{
			// A checkpoint leaves out a partition dropped while it
			// flushed: its frames and its drop follow, naming an
			// incarnation the checkpoint does not.
			name:    "the drop of an incarnation no checkpoint names, its frames before it",
			cp:      Checkpoint{Position: 1000, Entries: map[PartitionID]Entry{}},
			disk:    onDisk,
			records: []Record{frame(p0, 1, 3, 100, 110), rec(Drop, p0, 1, 0)},
			want:    map[PartitionID]string{p0: "dropped"},
		},
		{
			name:    "the drop of an incarnation no checkpoint names, its directory gone",
			cp:      Checkpoint{Position: 1000, Entries: map[PartitionID]Entry{}},
			disk:    map[PartitionID]OnDisk{},
			records: []Record{rec(Drop, p0, 1, 0)},
			want:    map[PartitionID]string{p0: "dropped"},
		},
		{
			// Retention after a truncation: the frames below the disk's
			// start were fsynced when their segments sealed, then removed.
			name: "retention past a truncation keeps from the disk's start",
			cp:   cp,
			disk: map[PartitionID]OnDisk{p0: {Incarnation: 1, Start: 300}},
			records: []Record{
				{Kind: Truncate, Part: p0, Incarnation: 1, Epoch: 3, End: 100},
				frame(p0, 1, 4, 100, 200), frame(p0, 1, 4, 200, 300), frame(p0, 1, 4, 300, 350),
			},
			want: map[PartitionID]string{p0: "inc 1 keep 300 [300,350)"},
		},
		{
			name: "a catch-up copy's flush covers the reset and what it copied",
			cp:   cp, disk: onDisk,
			records: []Record{rec(Reset, p0, 1, 500), rec(Flushed, p0, 1, 900), frame(p0, 1, 5, 900, 910)},
			want:    map[PartitionID]string{p0: "inc 1 keep 900 [900,910)"},
		},
		{
			name: "a flush below planned frames keeps those above it",
			cp:   cp, disk: onDisk,
			records: []Record{frame(p0, 1, 3, 100, 110), frame(p0, 1, 3, 110, 120), rec(Flushed, p0, 1, 110)},
			want:    map[PartitionID]string{p0: "inc 1 keep 110 [110,120)"},
		},
		{
			name: "a frame written to its file only, then flushed",
			cp:   cp, disk: onDisk,
			records: []Record{frame(p0, 1, 3, 100, 110), written(p0, 1, 3, 110, 200), frame(p0, 1, 3, 200, 210), rec(Flushed, p0, 1, 200)},
			want:    map[PartitionID]string{p0: "inc 1 keep 200 [200,210)"},
		},
		{
			name: "a file-only frame is planned, for recovery to find in its file",
			cp:   cp, disk: onDisk,
			records: []Record{frame(p0, 1, 3, 100, 110), written(p0, 1, 3, 110, 200), frame(p0, 1, 3, 200, 210)},
			want:    map[PartitionID]string{p0: "inc 1 keep 100 [100,110) w[110,200) [200,210)"},
		},
		{
			name: "two file-only frames, only the first flushed",
			cp:   cp, disk: onDisk,
			records: []Record{
				written(p0, 1, 3, 100, 200), frame(p0, 1, 3, 200, 210), written(p0, 1, 3, 210, 300),
				frame(p0, 1, 3, 300, 310), rec(Flushed, p0, 1, 200),
			},
			want: map[PartitionID]string{p0: "inc 1 keep 200 [200,210) w[210,300) [300,310)"},
		},
		{
			name: "a truncation removes the file-only frame it cuts",
			cp:   cp, disk: onDisk,
			records: []Record{
				frame(p0, 1, 3, 100, 110), written(p0, 1, 3, 110, 200),
				{Kind: Truncate, Part: p0, Incarnation: 1, Epoch: 3, End: 110}, frame(p0, 1, 4, 110, 120),
			},
			want: map[PartitionID]string{p0: "inc 1 keep 100 [100,110) [110,120)"},
		},
		{
			name: "a reset removes file-only frames",
			cp:   cp, disk: onDisk,
			records: []Record{written(p0, 1, 3, 100, 200), rec(Reset, p0, 1, 500), frame(p0, 1, 5, 500, 510)},
			want:    map[PartitionID]string{p0: "inc 1 keep 500 reset 500 [500,510)"},
		},
		{
			name: "a file-only frame below the checkpoint's flushed offset is passed over",
			cp:   cp, disk: onDisk,
			records: []Record{written(p0, 1, 3, 50, 100), frame(p0, 1, 3, 100, 110)},
			want:    map[PartitionID]string{p0: "inc 1 keep 100 [100,110)"},
		},
		{
			name: "retention past a file-only frame keeps from the disk's start",
			cp:   cp,
			disk: map[PartitionID]OnDisk{p0: {Incarnation: 1, Start: 300}},
			records: []Record{
				{Kind: Truncate, Part: p0, Incarnation: 1, Epoch: 3, End: 100},
				written(p0, 1, 4, 100, 300), frame(p0, 1, 4, 300, 350),
			},
			want: map[PartitionID]string{p0: "inc 1 keep 300 [300,350)"},
		},
		{
			// A checkpoint took its position, then a Sync recorded
			// flushed for its older snapshot, then the checkpoint's
			// flush found the log longer: the record says less than the
			// checkpoint and must not lower what it trusts.
			name:    "a flushed record below the checkpoint's offset lowers nothing",
			cp:      Checkpoint{Position: 1000, Entries: map[PartitionID]Entry{p0: {Incarnation: 1, Flushed: 300}}},
			disk:    onDisk,
			records: []Record{rec(Flushed, p0, 1, 200), frame(p0, 1, 3, 300, 310)},
			want:    map[PartitionID]string{p0: "inc 1 keep 300 [300,310)"},
		},
		{
			name:    "a flushed record below the checkpoint's offset, frames it passed over after it",
			cp:      Checkpoint{Position: 1000, Entries: map[PartitionID]Entry{p0: {Incarnation: 1, Flushed: 300}}},
			disk:    onDisk,
			records: []Record{rec(Flushed, p0, 1, 200), frame(p0, 1, 3, 200, 300), frame(p0, 1, 3, 300, 310)},
			want:    map[PartitionID]string{p0: "inc 1 keep 300 [300,310)"},
		},
		{
			name: "retention past a creation: planned whole, for recovery to find",
			cp:   cp,
			disk: map[PartitionID]OnDisk{p0: {Incarnation: 1}, p1: {Incarnation: 2, Start: 20}},
			records: []Record{
				rec(Create, p1, 2, 0), written(p1, 2, 1, 0, 10), written(p1, 2, 1, 10, 20),
				written(p1, 2, 1, 20, 30), frame(p1, 2, 1, 30, 31),
			},
			want: map[PartitionID]string{p0: "inc 1 keep 100", p1: "inc 2 keep 0 reset 0 w[0,10) w[10,20) w[20,30) [30,31)"},
		},
		{
			name: "retention past a reset: planned whole, for recovery to find",
			cp:   cp,
			disk: map[PartitionID]OnDisk{p0: {Incarnation: 1, Start: 520}},
			records: []Record{
				rec(Reset, p0, 1, 500), written(p0, 1, 5, 500, 510), written(p0, 1, 5, 510, 520),
				written(p0, 1, 5, 520, 530),
			},
			want: map[PartitionID]string{p0: "inc 1 keep 500 reset 500 w[500,510) w[510,520) w[520,530)"},
		},
		{
			name: "flushed inside a file-only frame",
			cp:   cp, disk: onDisk,
			records: []Record{written(p0, 1, 3, 100, 200), rec(Flushed, p0, 1, 150)},
			corrupt: "flushed to 150 inside frame [100, 200)",
		},
		{
			name: "a truncation inside a file-only frame",
			cp:   cp, disk: onDisk,
			records: []Record{written(p0, 1, 3, 100, 200), {Kind: Truncate, Part: p0, Incarnation: 1, Epoch: 3, End: 150}},
			corrupt: "truncation to 150 inside frame [100, 200)",
		},
		{
			name: "a file-only frame that does not continue the log",
			cp:   cp, disk: onDisk,
			records: []Record{frame(p0, 1, 3, 100, 110), written(p0, 1, 3, 120, 200)},
			corrupt: "does not continue the log at 110",
		},
		{
			name: "dropped, and created again under a new incarnation",
			cp:   cp, disk: map[PartitionID]OnDisk{p0: {Incarnation: 2}},
			records: []Record{frame(p0, 1, 3, 100, 110), rec(Drop, p0, 1, 0), rec(Create, p0, 2, 0), frame(p0, 2, 1, 0, 10)},
			want:    map[PartitionID]string{p0: "inc 2 keep 0 reset 0 [0,10)"},
		},
		{
			name: "dropped, directory already removed",
			cp:   cp, disk: map[PartitionID]OnDisk{},
			records: []Record{rec(Drop, p0, 1, 0)},
			want:    map[PartitionID]string{p0: "dropped"},
		},
		{
			name: "dropped, directory still there",
			cp:   cp, disk: onDisk,
			records: []Record{frame(p0, 1, 3, 100, 110), rec(Drop, p0, 1, 0)},
			want:    map[PartitionID]string{p0: "dropped"},
		},
		{
			name: "created after the checkpoint, its directory lost with the crash",
			cp:   cp, disk: onDisk,
			records: []Record{rec(Create, p1, 1, 40), frame(p1, 1, 1, 40, 50)},
			want:    map[PartitionID]string{p0: "inc 1 keep 100", p1: "inc 1 keep 40 reset 40 [40,50)"},
		},
		{
			name: "a directory no checkpoint and no record knows never took a frame",
			cp:   cp, disk: map[PartitionID]OnDisk{p0: {Incarnation: 1}, p1: {Incarnation: 7}},
			want: map[PartitionID]string{p0: "inc 1 keep 100", p1: "orphan"},
		},
		{
			name:    "in the checkpoint, gone from the disk, never dropped",
			cp:      cp,
			disk:    map[PartitionID]OnDisk{},
			corrupt: "in the checkpoint but not on disk",
		},
		{
			name:    "in the checkpoint, its directory holding another incarnation, never dropped",
			cp:      cp,
			disk:    map[PartitionID]OnDisk{p0: {Incarnation: 2}},
			corrupt: "in the checkpoint but not on disk",
		},
		{
			name: "a record of an incarnation never created",
			cp:   cp, disk: onDisk,
			records: []Record{frame(p1, 3, 1, 0, 10)},
			corrupt: "no checkpoint entry and no create record",
		},
		{
			name: "a record after the drop",
			cp:   cp, disk: onDisk,
			records: []Record{rec(Drop, p0, 1, 0), frame(p0, 1, 3, 100, 110)},
			corrupt: "after the incarnation was dropped",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plans, err := Replay(tc.cp, tc.records, tc.disk)
			if tc.corrupt != "" {
				if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.corrupt) {
					t.Fatalf("error %v, want ErrCorrupt saying %q", err, tc.corrupt)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[PartitionID]string{}
			for id, pl := range plans {
				got[id] = show(pl, tc.records)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("plans\n got %v\nwant %v", got, tc.want)
			}
		})
	}
}
