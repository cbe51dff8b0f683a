package journal

import (
	"testing"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
)

// Races a review found between a checkpoint and the partitions' own
// changes: each runs the change between the checkpoint's snapshot (its
// journal position and members) and its flushes, then stops the store
// cleanly (a clean stop does not checkpoint) and opens it again.

// appendSynced appends a frame of n records under epoch and syncs it.
func appendSynced(t *testing.T, l *partlog.Log, epoch uint64, n int) {
	t.Helper()
	f, err := partlog.AppendBatch(nil, epoch, l.NextOffset(), make([]partlog.Record, n))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Append(f); err != nil {
		t.Fatal(err)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
}

// twoPartitions opens a store with partitions s/0 and s/1 holding 10
// records each, checkpointed.
func twoPartitions(t *testing.T, fsys partlog.FS) (*Store, PartitionID, PartitionID, *partlog.Log, *partlog.Log) {
	t.Helper()
	st, _, err := OpenStore(storeOptions(fsys), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := PartitionID{"s", 0}, PartitionID{"s", 1}
	la, err := st.Create(a)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := st.Create(b)
	if err != nil {
		t.Fatal(err)
	}
	appendSynced(t, la, 1, 10)
	appendSynced(t, lb, 1, 10)
	if err := st.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	return st, a, b, la, lb
}

// A truncation between the snapshot and the log's flush, with frames
// before and after it at the same offsets: the checkpoint must not name
// the end it flushed (the frames cut are after its position, and replay
// would find them straddling that end).
func TestCheckpointDuringATruncation(t *testing.T) {
	fsys := faultfs.New()
	st, a, b, la, lb := twoPartitions(t, fsys)
	st.afterSnapshot = func() {
		st.afterSnapshot = nil     // once: the checkpoint takes its snapshot again
		appendSynced(t, la, 1, 10) // [10,20), after the checkpoint's position
		if err := la.Truncate(10); err != nil {
			t.Fatal(err)
		}
		appendSynced(t, la, 2, 5) // [10,15) of a later epoch, acknowledged
	}
	err := st.Checkpoint()
	st.afterSnapshot = nil
	if err != nil {
		t.Fatal(err)
	}
	la.Close()
	lb.Close()
	st.Close()
	st, opened, err := OpenStore(storeOptions(fsys), []PartitionID{a, b})
	if err != nil {
		dump(t, fsys, PartitionID{})
		t.Fatalf("reopen: %v", err)
	}
	defer st.Close()
	defer closeOpened(opened)
	if l := opened[a].Log; l == nil || l.NextOffset() != 15 {
		t.Fatalf("the truncated partition: %+v, want a log ending at 15", opened[a])
	}
}

// A drop between the snapshot and the log's flush (the log closed, the
// drop recorded after the checkpoint's position): the next start removes
// the partition and opens the rest.
func TestCheckpointDuringADrop(t *testing.T) {
	fsys := faultfs.New()
	st, a, b, la, lb := twoPartitions(t, fsys)
	appendSynced(t, lb, 1, 3) // frames of b after the position, before its drop
	st.afterSnapshot = func() {
		lb.Close()
		if err := st.Drop(b); err != nil {
			t.Fatal(err)
		}
	}
	err := st.Checkpoint()
	st.afterSnapshot = nil
	if err != nil {
		t.Fatal(err)
	}
	la.Close()
	st.Close()
	st, opened, err := OpenStore(storeOptions(fsys), []PartitionID{a, b})
	if err != nil {
		dump(t, fsys, PartitionID{})
		t.Fatalf("reopen: %v", err)
	}
	defer st.Close()
	defer closeOpened(opened)
	if !opened[b].Removed || opened[a].Log == nil || opened[a].Log.NextOffset() != 10 {
		t.Fatalf("after a drop during a checkpoint: %+v", opened)
	}
}

// A detach between the snapshot and the log's flush: the partition is
// kept, opened as its files are, never removed.
func TestCheckpointDuringADetach(t *testing.T) {
	fsys := faultfs.New()
	st, a, b, la, lb := twoPartitions(t, fsys)
	st.afterSnapshot = func() {
		st.Detach(b)
		lb.Close()
	}
	err := st.Checkpoint()
	st.afterSnapshot = nil
	if err != nil {
		t.Fatal(err)
	}
	la.Close()
	st.Close()
	st, opened, err := OpenStore(storeOptions(fsys), []PartitionID{a, b})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer st.Close()
	defer closeOpened(opened)
	if o := opened[b]; o.Removed || o.Log == nil || o.Log.NextOffset() != 10 {
		t.Fatalf("the detached partition: %+v, want it kept with its 10 records", o)
	}
}

func closeOpened(opened map[PartitionID]Opened) {
	for _, o := range opened {
		if o.Log != nil {
			o.Log.Close()
		}
	}
}
