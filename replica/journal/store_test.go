package journal

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
)

func storeOptions(fsys partlog.FS) StoreOptions {
	return StoreOptions{
		Journal: Options{Dir: "/data/journal", FS: fsys, SegmentBytes: 64 << 10},
		LogOptions: func(id PartitionID) partlog.Options {
			return partlog.Options{Dir: partDir(id), SegmentBytes: 4096, IndexIntervalBytes: 256}
		},
		CheckpointEvery: -1, // tests checkpoint when they choose
		// Frames of 800 bytes or more go to their segment files only:
		// the scripted runs' frames (up to 4 records of up to 400 bytes)
		// are of both kinds.
		DirectFrameBytes: 800,
	}
}

// openWithLog opens a store on no partitions and creates partition s/0 in
// it.
func openWithLog(t *testing.T, opts StoreOptions) (*Store, PartitionID, *partlog.Log) {
	t.Helper()
	st, _, err := OpenStore(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := PartitionID{"s", 0}
	l, err := st.Create(id)
	if err != nil {
		t.Fatal(err)
	}
	return st, id, l
}

// appendValue appends a frame of one record holding value, at epoch 1.
func appendValue(t *testing.T, l *partlog.Log, value []byte) {
	t.Helper()
	f, err := partlog.AppendBatch(nil, 1, l.NextOffset(), []partlog.Record{{Value: value}})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Append(f); err != nil {
		t.Fatal(err)
	}
}

func partDir(id PartitionID) string {
	return filepath.Join("/data/streams", id.Stream, fmt.Sprintf("%05d", id.Partition))
}

// removeDir removes a partition directory's files, as the server removes
// a dropped partition's directory (faultfs has no directories to remove).
func removeDir(t *testing.T, fsys *faultfs.FS, id PartitionID) {
	t.Helper()
	names, err := fsys.ReadDir(partDir(id))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := fsys.Remove(filepath.Join(partDir(id), n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := fsys.SyncDir(partDir(id)); err != nil {
		t.Fatal(err)
	}
}

// model is what a partition's log must hold: its frames from its start,
// and how far they are durable (acknowledged).
type model struct {
	start   uint64
	rolling uint32
	frames  [][]byte
	ends    []uint64
	durable uint64
}

func (m *model) end() uint64 {
	if len(m.ends) == 0 {
		return m.start
	}
	return m.ends[len(m.ends)-1]
}

func (m *model) truncate(to uint64) {
	n := 0
	for n < len(m.ends) && m.ends[n] <= to {
		n++
	}
	m.frames, m.ends = m.frames[:n], m.ends[:n]
	m.durable = to
}

// check says whether l holds a prefix of m's frames that reaches what m
// says is durable.
func (m *model) check(l *partlog.Log) error {
	if l.StartOffset() != m.start && !(len(m.ends) == 0 && l.NextOffset() == m.start) {
		return fmt.Errorf("log starts at %d, want %d", l.StartOffset(), m.start)
	}
	end := l.NextOffset()
	if end < m.durable || end > m.end() {
		return fmt.Errorf("log ends at %d; durable %d, appended to %d", end, m.durable, m.end())
	}
	if end == m.start {
		return nil
	}
	got, err := l.ReadFrames(m.start, end, 1<<30)
	if err != nil {
		return err
	}
	for i, f := range got {
		if i >= len(m.frames) || !bytes.Equal(f, m.frames[i]) {
			return fmt.Errorf("frame %d of %d differs from the one appended", i, len(got))
		}
	}
	return nil
}

// A scripted run of random appends, syncs, checkpoints, truncations,
// resets, drops and creates over a journaled store, cut by a power loss
// at a random step (keeping none, all, or part of each file's unsynced
// bytes, or zeros for them): after recovery every partition holds every
// frame acknowledged to it and nothing it was not given, dropped ones are
// gone, and the store goes on, through a second crash.
func TestStoreRecoversEveryDurableFrame(t *testing.T) {
	seeds := 100
	if testing.Short() {
		seeds = 15
	}
	if n, err := strconv.Atoi(os.Getenv("CATENA_STORE_SEEDS")); err == nil {
		seeds = n // a longer campaign
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { storeRun(t, int64(seed)) })
	}
}

func storeRun(t *testing.T, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	fsys := faultfs.New()
	st, opened, err := OpenStore(storeOptions(fsys), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(opened) != 0 {
		t.Fatalf("a new store opened %v", opened)
	}
	ids := []PartitionID{{"s", 0}, {"s", 1}, {"t", 0}}
	models := map[PartitionID]*model{}
	logs := map[PartitionID]*partlog.Log{}
	onDisk := map[PartitionID]bool{}
	create := func(id PartitionID) {
		l, err := st.Create(id)
		if err != nil {
			t.Fatal(err)
		}
		logs[id], models[id], onDisk[id] = l, &model{}, true
	}
	for _, id := range ids {
		create(id)
	}
	epoch := uint64(1)
	for round := range 2 {
		steps := 20 + rng.Intn(120)
		for range steps {
			id := ids[rng.Intn(len(ids))]
			l, m := logs[id], models[id]
			if l == nil {
				create(id)
				continue
			}
			switch r := rng.Intn(100); {
			case r < 60:
				recs := make([]partlog.Record, 1+rng.Intn(5))
				for i := range recs {
					recs[i] = partlog.Record{Key: fmt.Appendf(nil, "k%d", rng.Intn(10)), Value: bytes.Repeat([]byte{byte(rng.Intn(256))}, rng.Intn(300))}
				}
				f, err := partlog.AppendBatch(nil, epoch, l.NextOffset(), recs)
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Append(f); err != nil {
					t.Fatal(err)
				}
				m.frames, m.ends = append(m.frames, f), append(m.ends, l.NextOffset())
			case r < 80:
				if err := l.Sync(); err != nil {
					t.Fatal(err)
				}
				m.durable = l.DurableOffset()
				if m.durable != m.end() {
					t.Fatalf("synced to %d, appended to %d", m.durable, m.end())
				}
			case r < 88:
				if err := st.Checkpoint(); err != nil {
					t.Fatal(err)
				}
			case r < 93 && len(m.ends) > 0:
				// A truncation to a frame boundary; a new epoch follows.
				k := rng.Intn(len(m.ends) + 1)
				to := m.start
				if k > 0 {
					to = m.ends[k-1]
				}
				if err := l.Truncate(to); err != nil {
					t.Fatal(err)
				}
				m.truncate(to)
				epoch++
			case r < 96:
				base := l.NextOffset() + 1 + uint64(rng.Intn(50))
				rolling := rng.Uint32()
				if err := l.Reset(base, rolling); err != nil {
					t.Fatal(err)
				}
				*m = model{start: base, rolling: rolling, durable: base}
			default:
				if err := st.Drop(id); err != nil {
					t.Fatal(err)
				}
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				if rng.Intn(2) == 0 {
					removeDir(t, fsys, id)
					delete(onDisk, id)
				}
				delete(logs, id)
				delete(models, id)
			}
		}
		// The power goes.
		keep := []int{0, -1, rng.Intn(200)}[rng.Intn(3)]
		fsys.Crash(faultfs.CrashOptions{KeepUnsynced: keep, ZeroFill: rng.Intn(4) == 0})
		for _, l := range logs {
			l.Close()
		}
		st.Close()

		var disk []PartitionID
		for id := range onDisk {
			disk = append(disk, id)
		}
		st, opened, err = OpenStore(storeOptions(fsys), disk)
		if err != nil {
			dump(t, fsys, PartitionID{})
			t.Fatalf("round %d: reopen: %v", round, err)
		}
		logs = map[PartitionID]*partlog.Log{}
		for id, o := range opened {
			switch {
			case o.Err != nil:
				t.Fatalf("round %d: partition %s: %v", round, id, o.Err)
			case o.Removed:
				if models[id] != nil {
					t.Fatalf("round %d: partition %s removed, and it was not dropped", round, id)
				}
				if onDisk[id] {
					removeDir(t, fsys, id)
					delete(onDisk, id)
				}
			default:
				m := models[id]
				if m == nil {
					t.Fatalf("round %d: partition %s opened, and it was dropped", round, id)
				}
				if err := m.check(o.Log); err != nil {
					dump(t, fsys, id)
					t.Fatalf("round %d: partition %s: %v", round, id, err)
				}
				// Unacknowledged frames may have survived or not: the
				// model follows the log.
				m.truncate(o.Log.NextOffset())
				logs[id] = o.Log
			}
		}
		for id := range models {
			if logs[id] == nil {
				t.Fatalf("round %d: partition %s lost", round, id)
			}
		}
		epoch++
	}
	for _, l := range logs {
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

// Checkpoints release the journal behind them; the logs' files hold what
// they say; a store closed cleanly opens with every log as it was.
func TestStoreCheckpointsReleaseTheJournal(t *testing.T) {
	fsys := faultfs.New()
	opts := storeOptions(fsys)
	opts.DirectFrameBytes = -1 // every frame fills the journal
	st, id, l := openWithLog(t, opts)
	value := bytes.Repeat([]byte("v"), 1000)
	for i := range 300 {
		appendValue(t, l, value)
		if err := l.Sync(); err != nil {
			t.Fatal(err)
		}
		if i%50 == 49 {
			if err := st.Checkpoint(); err != nil {
				t.Fatal(err)
			}
		}
	}
	stats := st.Stats()
	segs, err := listSegments(fsys, "/data/journal")
	if err != nil {
		t.Fatal(err)
	}
	if stats.Released == 0 || len(segs) > 2 {
		t.Fatalf("%d segments released, %d left: %+v", stats.Released, len(segs), stats)
	}
	if js := st.Journal().Stats(); js.Recycled == 0 || js.Recycled >= js.Rolls {
		t.Fatalf("%d of %d rolls into a recycled segment; want some, after the first checkpoint", js.Recycled, js.Rolls)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st, opened, err := OpenStore(storeOptions(fsys), []PartitionID{id})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	o := opened[id]
	if o.Err != nil || o.Log == nil || o.Log.NextOffset() != 300 {
		t.Fatalf("reopened: %+v", o)
	}
	defer o.Log.Close()
}

// A partition whose incarnation file is damaged is kept, out of the
// journal, and reported; the others open.
func TestStoreKeepsAPartitionItCannotName(t *testing.T) {
	fsys := faultfs.New()
	st, _, err := OpenStore(storeOptions(fsys), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := PartitionID{"s", 0}, PartitionID{"s", 1}
	for _, id := range []PartitionID{a, b} {
		l, err := st.Create(id)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fsys.Corrupt(filepath.Join(partDir(b), incarnationFile), 3, []byte("z")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		st, opened, err := OpenStore(storeOptions(fsys), []PartitionID{a, b})
		if err != nil {
			t.Fatal(err)
		}
		if o := opened[b]; !errors.Is(o.Err, partlog.ErrCorrupt) || o.Removed {
			t.Fatalf("damaged incarnation: %+v", o)
		}
		if o := opened[a]; o.Log == nil {
			t.Fatalf("the other partition: %+v", o)
		} else {
			o.Log.Close()
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fsys.ReadFile(filepath.Join(partDir(b), "00000000000000000000.seg")); err != nil {
		t.Fatalf("the damaged partition's log: %v", err)
	}
}

// dump logs the journal's records (of one partition, if id names one).
func dump(t *testing.T, fsys partlog.FS, id PartitionID) {
	Scan(fsys, "/data/journal", 0, func(pos uint64, l Logged) error {
		if l.Kind == CheckpointRecord {
			e, _ := DecodeCheckpoint(l.Payload)
			t.Logf("%d: checkpoint at %d %v", pos, l.Base, e)
		} else if id.Stream == "" || l.Part == id {
			t.Logf("%d: %s %s inc %d e%d [%d,%d)", pos, l.Kind, l.Part, l.Incarnation%1000, l.Epoch, l.Base, l.End)
		}
		return nil
	})
}

// A truncation promises [.., to) durable. Below the cut may lie a frame
// written to its segment file only, with no Sync since: the truncation's
// fsync of the segment covers it, and recovery finds it there whole (a
// build that cut the files above the checkpoint without reading them lost
// it).
func TestStoreTruncationKeepsAFileOnlyFrameBelowIt(t *testing.T) {
	fsys := faultfs.New()
	st, id, l := openWithLog(t, storeOptions(fsys))
	for _, size := range []int{10, 1000, 10} { // small [0,1), large [1,2), small [2,3)
		appendValue(t, l, bytes.Repeat([]byte("v"), size))
	}
	if err := l.Truncate(2); err != nil {
		t.Fatal(err)
	}
	fsys.Crash(faultfs.CrashOptions{})
	l.Close()
	st.Close()

	st, opened, err := OpenStore(storeOptions(fsys), []PartitionID{id})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	o := opened[id]
	if o.Err != nil || o.Log == nil {
		t.Fatalf("reopen: %+v", o)
	}
	defer o.Log.Close()
	if n := o.Log.NextOffset(); n != 2 {
		t.Fatalf("log ends at %d after the power loss, want 2 (the truncation's promise)", n)
	}
}

// A log created (or reset) after the last checkpoint whose first segments
// retention has removed since: its plan starts it empty at a base its
// files no longer start at. Its large frames, acknowledged, are in the
// files only; recovery keeps them from the files' start.
func TestStoreRetentionPastACreationKeepsFileOnlyFrames(t *testing.T) {
	for _, reset := range []bool{false, true} {
		fsys := faultfs.New()
		opts := storeOptions(fsys)
		logOptions := opts.LogOptions
		opts.LogOptions = func(id PartitionID) partlog.Options {
			lo := logOptions(id)
			lo.RetentionBytes = 4096
			return lo
		}
		st, id, l := openWithLog(t, opts)
		if reset {
			if err := st.Checkpoint(); err != nil {
				t.Fatal(err)
			}
			if err := l.Reset(100, 7); err != nil {
				t.Fatal(err)
			}
		}
		for range 10 {
			appendValue(t, l, bytes.Repeat([]byte("v"), 1000)) // large: written to the file only
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
		}
		want := l.NextOffset()
		if _, err := l.EnforceRetention(); err != nil {
			t.Fatal(err)
		}
		if l.StartOffset() == want-10 {
			t.Fatalf("retention removed nothing: log [%d,%d)", l.StartOffset(), want)
		}
		fsys.Crash(faultfs.CrashOptions{})
		l.Close()
		st.Close()

		st, opened, err := OpenStore(opts, []PartitionID{id})
		if err != nil {
			t.Fatal(err)
		}
		o := opened[id]
		if o.Err != nil || o.Log == nil {
			t.Fatalf("reset %v: reopen: %+v", reset, o)
		}
		if n := o.Log.NextOffset(); n != want {
			t.Errorf("reset %v: log [%d,%d) after the power loss, acknowledged up to %d", reset, o.Log.StartOffset(), n, want)
		}
		o.Log.Close()
		st.Close()
	}
}
