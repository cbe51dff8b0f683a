package journal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
)

// loggedFrame makes a Frame record of partition p at [base, base+1) whose
// payload says where it belongs.
func loggedFrame(p uint32, base uint64, size int) *Logged {
	tag := []byte(fmt.Sprintf("%d/%d;", p, base))
	payload := bytes.Repeat(tag, size/len(tag)+1)[:size]
	return &Logged{Record: Record{Kind: Frame, Part: PartitionID{Stream: "s", Partition: p}, Incarnation: 7, Epoch: 3, Base: base, End: base + 1}, Payload: payload}
}

type scanned struct {
	pos uint64
	l   Logged
}

func scanAll(t *testing.T, fsys partlog.FS, dir string, from uint64) ([]scanned, ScanResult, error) {
	t.Helper()
	var got []scanned
	res, err := Scan(fsys, dir, from, func(pos uint64, l Logged) error {
		l.Payload = bytes.Clone(l.Payload)
		got = append(got, scanned{pos, l})
		return nil
	})
	return got, res, err
}

// writeConcurrently has writers goroutines append n frames each (writer w
// owns partition w) and wait for each; it returns what each had
// acknowledged, in order.
func writeConcurrently(t *testing.T, j *Journal, writers, n int) [][]*Logged {
	t.Helper()
	return writeConcurrentlyFrom(t, j, writers, n, nil)
}

// writeConcurrentlyFrom is writeConcurrently with writer w's records
// starting at base first[w] (0 when first is short).
func writeConcurrentlyFrom(t *testing.T, j *Journal, writers, n int, first []int) [][]*Logged {
	t.Helper()
	acked := make([][]*Logged, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			base := 0
			if w < len(first) {
				base = first[w]
			}
			for i := base; i < base+n; i++ {
				l := loggedFrame(uint32(w), uint64(i), 1+r.IntN(3000))
				tk, err := j.Append(l)
				if err == nil {
					err = j.Wait(tk)
				}
				if err != nil {
					return
				}
				acked[w] = append(acked[w], l)
			}
		})
	}
	wg.Wait()
	return acked
}

// checkHolds checks that the scan holds every acknowledged record, each
// partition's in order and whole, and nothing else.
func checkHolds(t *testing.T, got []scanned, acked [][]*Logged, exact bool) {
	t.Helper()
	next := make([]int, len(acked))
	var lastPos uint64
	for _, s := range got {
		if s.pos < lastPos {
			t.Fatalf("group at %d after one at %d", s.pos, lastPos)
		}
		lastPos = s.pos
		p := s.l.Part.Partition
		if int(p) >= len(acked) {
			t.Fatalf("a record of partition %d, which no writer owns", p)
		}
		want := loggedFrame(p, uint64(next[p]), len(s.l.Payload))
		if s.l.Record != want.Record || !bytes.Equal(s.l.Payload, want.Payload) {
			t.Fatalf("partition %d: record %d is %+v (%d bytes), want base %d", p, next[p], s.l.Record, len(s.l.Payload), next[p])
		}
		next[p]++
	}
	for p, a := range acked {
		if next[p] < len(a) {
			t.Errorf("partition %d: %d records acknowledged, %d read back", p, len(a), next[p])
		}
		if exact && next[p] != len(a) {
			t.Errorf("partition %d: %d records read back, %d acknowledged", p, next[p], len(a))
		}
	}
}

func TestGroupCommitKeepsEveryAcknowledgedRecordInOrder(t *testing.T) {
	dir := t.TempDir()
	// Small segments: the run rolls many times.
	j, err := New(Options{Dir: dir, SegmentBytes: 64 << 10}, 0)
	if err != nil {
		t.Fatal(err)
	}
	acked := writeConcurrently(t, j, 8, 150)
	end := j.End()
	st := j.Stats()
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	got, res, err := scanAll(t, nil, dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	checkHolds(t, got, acked, true)
	if res.End != end || res.Torn || res.Groups != int(st.Groups) || int(st.Groups) != len(groupStarts(t, dir)) {
		t.Errorf("scan %+v; the journal ended at %d after %d groups", res, end, st.Groups)
	}
	if st.Rolls == 0 || st.Records != 8*150 || st.Groups > st.Records {
		t.Errorf("stats %+v", st)
	}
	t.Logf("%d records in %d groups, %d segments", st.Records, st.Groups, st.Rolls+1)
	// Close removes the segment prepared ahead and never used.
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if filepath.Ext(n.Name()) != segmentSuffix {
			t.Errorf("after Close the journal's directory holds %s", n.Name())
		}
	}

	// From a later position: the groups before it are passed over.
	from := got[len(got)/2].pos
	rest, _, err := scanAll(t, nil, dir, from)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, s := range got {
		if s.pos >= from {
			want++
		}
	}
	if len(rest) == 0 || len(rest) != want || rest[0].pos != from {
		t.Errorf("from %d: %d records, the first at %d; want %d", from, len(rest), rest[0].pos, want)
	}
}

func TestAGroupIsAcknowledgedOnlyOnceSynced(t *testing.T) {
	fsys := faultfs.New()
	j, err := New(Options{Dir: "/j", FS: fsys, SegmentBytes: 1 << 20}, 0)
	if err != nil {
		t.Fatal(err)
	}
	acked := writeConcurrently(t, j, 4, 50)
	// The next sync fails: the record in flight is not acknowledged, and
	// the journal refuses everything after (its outcome is unknown).
	fsys.FailSyncs(0, -1, syscall.EIO)
	tk, err := j.Append(loggedFrame(0, 50, 100))
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Wait(tk); !errors.Is(err, syscall.EIO) {
		t.Fatalf("wait after a failed fsync: %v", err)
	}
	if _, err := j.Append(loggedFrame(0, 51, 100)); !errors.Is(err, syscall.EIO) {
		t.Fatalf("append after a failed fsync: %v", err)
	}
	fsys.ClearFaults()
	// Power loss: only what was synced is there.
	fsys.Crash(faultfs.CrashOptions{KeepUnsynced: -1})
	got, res, err := scanAll(t, fsys, "/j", 0)
	if err != nil {
		t.Fatal(err)
	}
	checkHolds(t, got, acked, true)
	if res.Torn {
		t.Errorf("scan after the crash: %+v", res)
	}
}

func TestCrashesKeepEveryAcknowledgedRecord(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 2))
			fsys := faultfs.New()
			j, err := New(Options{Dir: "/j", FS: fsys, SegmentBytes: 32 << 10}, 0)
			if err != nil {
				t.Fatal(err)
			}
			var acked [][]*Logged
			var wg sync.WaitGroup
			wg.Go(func() { acked = writeConcurrently(t, j, 4, 100) })
			// The crash comes at some point of the run: later syncs fail
			// (what the power cut did not let through), then the disk
			// keeps only its durable state. (faultfs drops every unsynced
			// overwrite of a zero-filled segment whole, whatever the
			// options; torn groups are TestScanTellsATornTailFromDamage's.)
			fsys.FailSyncs(r.IntN(60), -1, syscall.EIO)
			wg.Wait()
			fsys.ClearFaults()
			fsys.Crash(faultfs.CrashOptions{KeepUnsynced: r.IntN(5000) - 1, ZeroFill: r.IntN(2) == 0})
			got, _, err := scanAll(t, fsys, "/j", 0)
			if err != nil {
				t.Fatal(err)
			}
			checkHolds(t, got, acked, false)
		})
	}
}

// journalOf writes groups of three records each to a new journal in a
// temporary directory and returns it, closed.
func journalOf(t *testing.T, groups int, segBytes int64) string {
	t.Helper()
	dir := t.TempDir()
	j, err := New(Options{Dir: dir, SegmentBytes: segBytes}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for g := range groups {
		tk, err := j.Append(loggedFrame(0, uint64(3*g), 500), loggedFrame(1, uint64(3*g), 700), loggedFrame(2, uint64(3*g), 900))
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Wait(tk); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

func segments(t *testing.T, dir string) []string {
	t.Helper()
	names, err := partlog.OSFS{}.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// groupStarts lists the positions of the groups in dir.
func groupStarts(t *testing.T, dir string) []uint64 {
	t.Helper()
	got, _, err := scanAll(t, nil, dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	var starts []uint64
	for _, s := range got {
		if len(starts) == 0 || starts[len(starts)-1] != s.pos {
			starts = append(starts, s.pos)
		}
	}
	return starts
}

// poke overwrites bytes of the journal at position pos (in the segment
// holding it).
func poke(t *testing.T, dir string, pos uint64, b []byte) {
	t.Helper()
	var seg string
	var base uint64
	for _, n := range segments(t, dir) {
		var nb uint64
		fmt.Sscanf(n, "%020d.jrn", &nb)
		if nb <= pos {
			seg, base = n, nb
		}
	}
	f, err := partlog.OSFS{}.OpenFile(filepath.Join(dir, seg), 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, int64(pos-base)); err != nil {
		t.Fatal(err)
	}
}

func TestScanTellsATornTailFromDamage(t *testing.T) {
	t.Run("a torn last group is the end", func(t *testing.T) {
		dir := journalOf(t, 5, 1<<20)
		starts := groupStarts(t, dir)
		last := starts[len(starts)-1]
		poke(t, dir, last+GroupHeaderSize+100, []byte{0xff, 0xee})
		got, res, err := scanAll(t, nil, dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		if res.End != last || !res.Torn || len(got) != 12 {
			t.Errorf("scan %+v with %d records; want the end at %d, torn, 12 records", res, len(got), last)
		}
	})
	t.Run("a bad group before a good one is damage", func(t *testing.T) {
		dir := journalOf(t, 5, 1<<20)
		starts := groupStarts(t, dir)
		poke(t, dir, starts[2]+GroupHeaderSize+100, []byte{0xff})
		if _, _, err := scanAll(t, nil, dir, 0); !errors.Is(err, ErrCorrupt) {
			t.Errorf("scan: %v, want ErrCorrupt", err)
		}
	})
	t.Run("the last group of an earlier segment damaged", func(t *testing.T) {
		dir := journalOf(t, 12, 8<<10) // about three groups a segment
		if len(segments(t, dir)) < 3 {
			t.Fatalf("segments %v", segments(t, dir))
		}
		starts := groupStarts(t, dir)
		var lastOfFirst uint64
		for _, s := range starts {
			if s < 8<<10 {
				lastOfFirst = s
			}
		}
		poke(t, dir, lastOfFirst+GroupHeaderSize+10, []byte{0xff})
		if _, _, err := scanAll(t, nil, dir, 0); !errors.Is(err, ErrCorrupt) {
			t.Errorf("scan: %v, want ErrCorrupt (the next segment says where the groups end)", err)
		}
	})
	t.Run("a segment missing in the middle", func(t *testing.T) {
		dir := journalOf(t, 12, 8<<10)
		segs := segments(t, dir)
		if err := (partlog.OSFS{}).Remove(filepath.Join(dir, segs[1])); err != nil {
			t.Fatal(err)
		}
		if _, _, err := scanAll(t, nil, dir, 0); !errors.Is(err, ErrCorrupt) {
			t.Errorf("scan: %v, want ErrCorrupt", err)
		}
	})
	t.Run("a last segment whose creation was cut", func(t *testing.T) {
		dir := journalOf(t, 12, 8<<10)
		segs := segments(t, dir)
		var base uint64
		fmt.Sscanf(segs[len(segs)-1], "%020d.jrn", &base)
		before, _, err := scanAll(t, nil, dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		var lastBefore uint64
		for _, s := range before {
			if s.pos < base {
				lastBefore = s.pos
			}
		}
		// Drop the last segment's groups and header, as if the crash
		// came while it was being made; where the groups before it end
		// is in that header.
		f, err := partlog.OSFS{}.OpenFile(filepath.Join(dir, segs[len(segs)-1]), 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		hdr := make([]byte, SegmentHeaderSize)
		if _, err := f.ReadAt(hdr, 0); err != nil {
			t.Fatal(err)
		}
		prevEnd := binary.LittleEndian.Uint64(hdr[12:])
		if err := f.Truncate(0); err != nil {
			t.Fatal(err)
		}
		f.Close()
		got, res, err := scanAll(t, nil, dir, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Torn || res.End != prevEnd || got[len(got)-1].pos != lastBefore {
			t.Errorf("scan %+v, last group at %d; want torn, ending at %d after the group at %d", res, got[len(got)-1].pos, prevEnd, lastBefore)
		}
	})
	t.Run("a last segment's header damaged with groups after it", func(t *testing.T) {
		dir := journalOf(t, 12, 8<<10)
		segs := segments(t, dir)
		var base uint64
		fmt.Sscanf(segs[len(segs)-1], "%020d.jrn", &base)
		poke(t, dir, base+1, []byte{0xff})
		if _, _, err := scanAll(t, nil, dir, 0); !errors.Is(err, ErrCorrupt) {
			t.Errorf("scan: %v, want ErrCorrupt (a segment's header is synced before its first group)", err)
		}
	})
}

func TestBadRecordsAreRefusedAndNothingIsWritten(t *testing.T) {
	dir := t.TempDir()
	j, err := New(Options{Dir: dir, SegmentBytes: 1 << 20}, 0)
	if err != nil {
		t.Fatal(err)
	}
	part := PartitionID{Stream: "s", Partition: 1}
	for _, l := range []*Logged{
		{Record: Record{Kind: 0, Part: part}},
		{Record: Record{Kind: Written + 1, Part: part}},
		{Record: Record{Kind: Written, Part: part}, Payload: []byte("x")},
		{Record: Record{Kind: CheckpointRecord, Part: part}, Payload: EncodeCheckpoint(nil)},
		{Record: Record{Kind: Create, Part: PartitionID{Partition: 1}}},
		{Record: Record{Kind: Truncate, Part: part}, Payload: []byte("x")},
	} {
		if _, err := j.Append(loggedFrame(0, 0, 10), l); err == nil {
			t.Errorf("appended %+v", l.Record)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	got, res, err := scanAll(t, nil, dir, 0)
	if err != nil || len(got) != 0 || res.Groups != 0 {
		t.Errorf("after refused appends: %d records, %+v, %v", len(got), res, err)
	}
}

func TestNewRefusesADirectoryHoldingAJournal(t *testing.T) {
	dir := journalOf(t, 1, 1<<20)
	if _, err := New(Options{Dir: dir}, 0); err == nil {
		t.Fatal("a second journal over the first")
	}
}

func TestAGroupHoldsAtMostTheLimit(t *testing.T) {
	dir := t.TempDir()
	j, err := New(Options{Dir: dir, SegmentBytes: 1 << 20}, 0)
	if err != nil {
		t.Fatal(err)
	}
	const limit = 4 << 10
	j.groupLimit = limit // before any append
	if end, want := j.End(), uint64(SegmentHeaderSize); end != want {
		t.Errorf("a new journal ends at %d, want %d (where its first group goes)", end, want)
	}
	if _, err := j.Append(); err == nil {
		t.Error("an append of no records")
	}
	if _, err := j.Append(loggedFrame(0, 0, limit)); err == nil {
		t.Error("a record over a group's limit")
	}
	acked := writeConcurrently(t, j, 8, 60) // up to 3 KiB each: a group holds one to a few
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Errorf("a second close: %v", err)
	}
	got, _, err := scanAll(t, nil, dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	checkHolds(t, got, acked, true)
	starts := groupStarts(t, dir)
	for i := 1; i < len(starts); i++ {
		if starts[i]>>20 != starts[i-1]>>20 {
			continue // a roll's padding between them
		}
		if n := starts[i] - starts[i-1]; n > GroupHeaderSize+limit {
			t.Fatalf("group at %d is %d bytes, over the limit %d", starts[i-1], n, limit)
		}
	}
	if _, err := j.Append(loggedFrame(0, 99, 10)); !errors.Is(err, ErrClosed) {
		t.Errorf("an append after close: %v", err)
	}
}

// hookFS is faultfs with hooks on file syncs, renames and directory syncs:
// a hook may block (holding the writer inside a step) or fail the step.
type hookFS struct {
	*faultfs.FS
	mu       sync.Mutex
	fileSync func(name string) error
	rename   func() error
	syncDir  func() error
}

type hookFile struct {
	partlog.File
	fs   *hookFS
	name string
}

func (h *hookFS) hooks() (func(string) error, func() error, func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fileSync, h.rename, h.syncDir
}

func (h *hookFS) set(fileSync func(string) error, rename, syncDir func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fileSync, h.rename, h.syncDir = fileSync, rename, syncDir
}

func (h *hookFS) OpenFile(name string, flag int, perm os.FileMode) (partlog.File, error) {
	f, err := h.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &hookFile{File: f, fs: h, name: name}, nil
}

func (f *hookFile) Sync() error {
	if hk, _, _ := f.fs.hooks(); hk != nil {
		if err := hk(f.name); err != nil {
			return err
		}
	}
	return f.File.Sync()
}

func (h *hookFS) Rename(oldpath, newpath string) error {
	if _, hk, _ := h.hooks(); hk != nil {
		if err := hk(); err != nil {
			return err
		}
	}
	return h.FS.Rename(oldpath, newpath)
}

func (h *hookFS) SyncDir(dir string) error {
	if _, _, hk := h.hooks(); hk != nil {
		if err := hk(); err != nil {
			return err
		}
	}
	return h.FS.SyncDir(dir)
}

// waitPrepared waits until the next segment's preparation is over, without
// taking it from the writer.
func waitPrepared(j *Journal) {
	p := <-j.prep
	j.prep <- p
}

// guard fails the test if ch yields nothing for 30 s: a hang guard, not a
// timing.
func guard[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: nothing after 30 s", what)
		panic("unreachable")
	}
}

// Waiters wait on their own group's channel: when the sync of the group
// being written fails, its waiter and the waiter of the group being
// filled behind it both return the error; neither is left asleep.
func TestAFailedSyncWakesTheWaitersOfBothLiveGroups(t *testing.T) {
	h := &hookFS{FS: faultfs.New()}
	j, err := New(Options{Dir: "/j", FS: h, SegmentBytes: 1 << 20}, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitPrepared(j)
	inSync, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.set(func(name string) error {
		if filepath.Ext(name) != segmentSuffix {
			return nil
		}
		once.Do(func() { close(inSync) })
		<-release
		return syscall.EIO
	}, nil, nil)
	first, err := j.Append(loggedFrame(0, 0, 100))
	if err != nil {
		t.Fatal(err)
	}
	guard(t, inSync, "the first group's sync")
	second, err := j.Append(loggedFrame(1, 0, 100))
	if err != nil {
		t.Fatal(err)
	}
	if first == second {
		t.Fatalf("both appends in group %d while the first was being written", first)
	}
	errs := make(chan error, 2)
	for _, tk := range []Ticket{first, second} {
		go func() { errs <- j.Wait(tk) }()
	}
	asleep := make(chan struct{})
	go func() {
		for {
			j.mu.Lock()
			n := j.sleepers
			j.mu.Unlock()
			if n == 2 {
				close(asleep)
				return
			}
			runtime.Gosched()
		}
	}()
	guard(t, asleep, "both waiters asleep")
	close(release)
	for range 2 {
		if err := guard(t, errs, "a waiter after the failed sync"); !errors.Is(err, syscall.EIO) {
			t.Errorf("wait after a failed sync: %v, want EIO", err)
		}
	}
	if err := j.Close(); !errors.Is(err, syscall.EIO) {
		t.Errorf("close: %v", err)
	}
}

// A wait for a group no append was given fails at once, on a healthy
// journal too, rather than sleeping until some later append.
func TestAWaitForAGroupNoAppendWasGivenFails(t *testing.T) {
	j, err := New(Options{Dir: t.TempDir(), SegmentBytes: 1 << 20}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if err := j.Wait(5); err == nil {
		t.Error("a wait for group 5 of a fresh journal succeeded")
	}
	if err := j.Wait(1); err == nil {
		t.Error("a wait for the empty group being filled succeeded")
	}
	appendAll(t, j, 0, 1, 100) // a wait for an append's group succeeds
}

// A roll gives the prepared file its header, syncs it, renames it and
// syncs the directory, in that order. Power lost at each step (the step
// fails, then the crash keeps only what was durable) leaves every
// acknowledged record readable and no damage.
func TestACrashAtEachStepOfARollKeepsEveryAcknowledgedRecord(t *testing.T) {
	for _, step := range []string{"header sync", "rename", "directory sync", "after the roll"} {
		for _, keep := range []int{0, -1} {
			t.Run(fmt.Sprintf("%s, keep %d", step, keep), func(t *testing.T) {
				h := &hookFS{FS: faultfs.New()}
				j, err := New(Options{Dir: "/j", FS: h, SegmentBytes: 32 << 10}, 0)
				if err != nil {
					t.Fatal(err)
				}
				waitPrepared(j)
				var (
					once    sync.Once
					renamed atomic.Bool
				)
				cut := func() error {
					err := error(nil)
					once.Do(func() { err = errors.New("power cut") })
					return err
				}
				switch step {
				case "header sync":
					h.set(func(name string) error {
						if filepath.Base(name) == prepName {
							return cut()
						}
						return nil
					}, nil, nil)
				case "rename":
					h.set(nil, cut, nil)
				case "directory sync":
					h.set(nil, nil, cut)
				case "after the roll": // the first file sync after it: a group's in the new segment, or the next preparation's
					h.set(func(name string) error {
						if renamed.Load() {
							return cut()
						}
						return nil
					}, func() error { renamed.Store(true); return nil }, nil)
				}
				acked := writeConcurrently(t, j, 4, 100)
				if err := j.Close(); err == nil {
					t.Error("close after the cut step: no error")
				}
				h.set(nil, nil, nil)
				h.FS.Crash(faultfs.CrashOptions{KeepUnsynced: keep})
				got, res, err := scanAll(t, h.FS, "/j", 0)
				if err != nil {
					t.Fatal(err)
				}
				checkHolds(t, got, acked, false)
				if n := len(got); n < 8 {
					t.Errorf("only %d records before the roll: the cut came too early to test a roll", n)
				}
				t.Logf("%d records read back, %+v", len(got), res)
			})
		}
	}
}

// Close while the next segment is still being prepared waits for it
// without holding the journal's lock, and removes it.
func TestCloseWhilePreparingHoldsNothingUp(t *testing.T) {
	h := &hookFS{FS: faultfs.New()}
	inPrep, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.set(func(name string) error {
		if filepath.Base(name) == prepName {
			once.Do(func() { close(inPrep) })
			<-release
		}
		return nil
	}, nil, nil)
	j, err := New(Options{Dir: "/j", FS: h, SegmentBytes: 32 << 10}, 0)
	if err != nil {
		t.Fatal(err)
	}
	guard(t, inPrep, "the preparation")
	closed := make(chan error, 1)
	go func() { closed <- j.Close() }()
	guard(t, j.done, "the writer's end") // Close now waits for the preparation
	stats := make(chan Stats, 1)
	go func() { stats <- j.Stats() }()
	guard(t, stats, "Stats while Close waits for the preparation")
	close(release)
	if err := guard(t, closed, "Close"); err != nil {
		t.Fatal(err)
	}
	names, err := h.FS.ReadDir("/j")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if filepath.Ext(n) != segmentSuffix {
			t.Errorf("after Close the journal's directory holds %s", n)
		}
	}
}

// The next segment is zero-filled ahead, off the group commit; when that
// fails, the roll that needs it fails the journal, and no record written
// after is acknowledged.
func TestAFailedPreparationFailsTheRollThatNeedsIt(t *testing.T) {
	fsys := faultfs.New()
	// The first segment takes two writes (its zeros, its header); the
	// third is the prepared segment's zeros.
	fsys.FailWrites(2, 1, syscall.ENOSPC, 0)
	j, err := New(Options{Dir: "/j", FS: fsys, SegmentBytes: 32 << 10}, 0)
	if err != nil {
		t.Fatal(err)
	}
	waitPrepared(j) // the preparation is over before any group is written
	var last error
	for i := range 100 { // 100 KiB: past the first segment
		tk, err := j.Append(loggedFrame(0, uint64(i), 1000))
		if err == nil {
			err = j.Wait(tk)
		}
		if err != nil {
			last = err
			break
		}
	}
	if !errors.Is(last, syscall.ENOSPC) || !strings.Contains(last.Error(), "preparing the next segment") {
		t.Fatalf("appends past the first segment: %v, want the preparation's ENOSPC", last)
	}
	if err := j.Close(); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("close: %v", err)
	}
	names, err := fsys.ReadDir("/j")
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names, prepName) {
		t.Errorf("the half-prepared segment is left after Close: %v", names)
	}
}

// perPartition groups records read back by partition, as acked lists are.
func perPartition(got []scanned, partitions int) [][]*Logged {
	out := make([][]*Logged, partitions)
	for _, s := range got {
		l := s.l
		out[l.Part.Partition] = append(out[l.Part.Partition], &l)
	}
	return out
}

// A journal opened after a crash gives back every acknowledged record and
// continues at its end: after a second run and a clean stop, both runs'
// records read back, in order, and nothing else. (faultfs drops an
// unsynced group whole, so no crash here leaves a torn group: those are
// TestOpenOverwritesATornTail's.)
func TestOpenAfterACrashContinuesTheJournal(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 3))
			fsys := faultfs.New()
			opts := Options{Dir: "/j", FS: fsys, SegmentBytes: 32 << 10}
			j, err := New(opts, 0)
			if err != nil {
				t.Fatal(err)
			}
			var acked [][]*Logged
			var wg sync.WaitGroup
			wg.Go(func() { acked = writeConcurrently(t, j, 4, 60) })
			fsys.FailSyncs(r.IntN(40), -1, syscall.EIO)
			wg.Wait()
			j.Close()
			fsys.ClearFaults()
			fsys.Crash(faultfs.CrashOptions{KeepUnsynced: r.IntN(5000) - 1, ZeroFill: r.IntN(2) == 0})

			var first []scanned
			j, res, err := Open(opts, 0, func(pos uint64, l Logged) error {
				l.Payload = bytes.Clone(l.Payload)
				first = append(first, scanned{pos, l})
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			checkHolds(t, first, acked, false)
			if got := j.End(); got != res.End {
				t.Errorf("opened at %d, the scan ended at %d", got, res.End)
			}
			kept := perPartition(first, 4)
			next := make([]int, 4)
			for p := range kept {
				next[p] = len(kept[p])
			}
			acked2 := writeConcurrentlyFrom(t, j, 4, 60, next)
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			fsys.Crash(faultfs.CrashOptions{KeepUnsynced: -1})
			for p := range kept {
				kept[p] = append(kept[p], acked2[p]...)
			}
			checkClean(t, fsys, "/j", kept)
		})
	}
}

// A last segment whose creation a crash cut short (no header, no group)
// is removed by Open, which continues in the segment before it, at its end.
func TestOpenRemovesASegmentWhoseCreationWasCutShort(t *testing.T) {
	fsys := faultfs.New()
	opts := Options{Dir: "/j", FS: fsys, SegmentBytes: 32 << 10}
	j, err := New(opts, 0)
	if err != nil {
		t.Fatal(err)
	}
	acked := writeConcurrently(t, j, 2, 10)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	segs, err := listSegments(fsys, "/j")
	if err != nil {
		t.Fatal(err)
	}
	cut := segmentName(segs[len(segs)-1].base + 1<<20)
	f, err := fsys.OpenFile("/j/"+cut, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := fsys.SyncDir("/j"); err != nil {
		t.Fatal(err)
	}
	_, res, err := scanAll(t, fsys, "/j", 0)
	if err != nil || !res.Torn || !res.Headerless {
		t.Fatalf("scan with a headerless last segment: %+v, %v; want torn and headerless", res, err)
	}
	// A refused open changes nothing, the headerless segment included.
	if _, _, err := Open(opts, res.End+1, noRecords); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open from past the end: %v, want ErrCorrupt", err)
	}
	if names, _ := fsys.ReadDir("/j"); !slices.Contains(names, cut) {
		t.Fatalf("a refused open removed %s: %v", cut, names)
	}
	j, _, err = Open(opts, 0, noRecords)
	if err != nil {
		t.Fatal(err)
	}
	names, err := fsys.ReadDir("/j")
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names, cut) {
		t.Errorf("the headerless segment %s is still there: %v", cut, names)
	}
	acked2 := writeConcurrentlyFrom(t, j, 2, 10, []int{10, 10})
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	for p := range acked {
		acked[p] = append(acked[p], acked2[p]...)
	}
	checkClean(t, fsys, "/j", acked)
}

// Open passes fn the records at or after from only; a directory with no
// segment starts a journal there.
func TestOpenFromAPositionAndInAnEmptyDirectory(t *testing.T) {
	dir := journalOf(t, 6, 4<<10)
	starts := groupStarts(t, dir)
	from := starts[3]
	var seen []uint64
	j, res, err := Open(Options{Dir: dir, SegmentBytes: 4 << 10}, from, func(pos uint64, l Logged) error {
		seen = append(seen, pos)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if len(seen) != 3*3 || seen[0] != from {
		t.Errorf("from %d: records at %v, want the 9 of the last 3 groups", from, seen)
	}
	if res.End <= from || res.Groups != 6 { // the whole journal was scanned
		t.Errorf("scan %+v", res)
	}

	empty := t.TempDir()
	j2, res, err := Open(Options{Dir: empty}, 5000, noRecords)
	if err != nil {
		t.Fatal(err)
	}
	appendAll(t, j2, 0, 1, 10)
	if err := j2.Close(); err != nil {
		t.Fatal(err)
	}
	got, _, err := scanAll(t, nil, empty, 0)
	if err != nil || len(got) != 1 || got[0].pos != 5000+SegmentHeaderSize {
		t.Errorf("an empty directory opened at 5000: %v, %v, want one record at %d", got, err, 5000+SegmentHeaderSize)
	}
}

// Damage refuses the open and changes nothing on disk.
func TestOpenRefusesADamagedJournalAndChangesNothing(t *testing.T) {
	dir := journalOf(t, 5, 1<<20)
	starts := groupStarts(t, dir)
	poke(t, dir, starts[2]+GroupHeaderSize+100, []byte{0xff})
	before := map[string][]byte{}
	for _, n := range segments(t, dir) {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		before[n] = b
	}
	if _, _, err := Open(Options{Dir: dir, SegmentBytes: 1 << 20}, 0, noRecords); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open of a damaged journal: %v, want ErrCorrupt", err)
	}
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != len(before) {
		t.Errorf("the directory holds %d files after the refused open, %d before", len(names), len(before))
	}
	for n, b := range before {
		after, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil || !bytes.Equal(after, b) {
			t.Errorf("%s changed by a refused open (%v)", n, err)
		}
	}
}

// What a crash left of a group cut short is zeroed before the journal
// continues over it: the next groups are written where it began, and
// nothing of it is read after them, not even as a torn tail.
func TestOpenOverwritesATornTail(t *testing.T) {
	dir := journalOf(t, 5, 1<<20)
	starts := groupStarts(t, dir)
	last := starts[len(starts)-1]
	poke(t, dir, last+GroupHeaderSize+100, []byte{0xff, 0xee})
	n := 0
	j, res, err := Open(Options{Dir: dir, SegmentBytes: 1 << 20}, 0, func(uint64, Logged) error { n++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if !res.Torn || res.End != last || n != 4*3 {
		t.Fatalf("opened a journal with a torn last group: %+v, %d records", res, n)
	}
	appendAll(t, j, 99, 100, 10) // far shorter than the torn group
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	got, res, err := scanAll(t, nil, dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Torn || len(got) != 4*3+1 || got[len(got)-1].pos != last || got[len(got)-1].l.Base != 99 {
		t.Errorf("after continuing over the torn group: %+v, %d records, the last %+v", res, len(got), got[len(got)-1])
	}
}

// appendAll appends records of partition 0 at bases [from, to), each
// waited for, each of size bytes.
func appendAll(t *testing.T, j *Journal, from, to, size int) {
	t.Helper()
	for i := from; i < to; i++ {
		tk, err := j.Append(loggedFrame(0, uint64(i), size))
		if err == nil {
			err = j.Wait(tk)
		}
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
}

// A group whose fdatasync failed stays in this process's page cache,
// clean, though it never reached the disk. A journal reopened in the same
// process reads the disk: that group is not handed over, and the groups
// written after the reopen survive a crash.
func TestAJournalReopenedAfterAFailedSyncReadsTheDisk(t *testing.T) {
	fsys := faultfs.New()
	opts := Options{Dir: "/j", FS: fsys, SegmentBytes: 32 << 10}
	j, err := New(opts, 0)
	if err != nil {
		t.Fatal(err)
	}
	appendAll(t, j, 0, 3, 100)
	fsys.FailSyncs(0, 1, syscall.EIO)
	tk, err := j.Append(loggedFrame(0, 3, 100))
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Wait(tk); !errors.Is(err, syscall.EIO) {
		t.Fatalf("wait for the group whose sync failed: %v", err)
	}
	j.Close()
	fsys.ClearFaults()
	n := 0
	j, _, err = Open(opts, 0, func(uint64, Logged) error { n++; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("reopened after a failed sync: %d records handed over, want the 3 acknowledged", n)
	}
	appendAll(t, j, 3, 7, 100)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	fsys.Crash(faultfs.CrashOptions{KeepUnsynced: -1})
	checkClean(t, fsys, "/j", records(7))
}

// When the sync of Open's zeros fails, Open fails; retried in the same
// process, it reads the disk, finds the torn bytes again and zeroes them.
func TestOpenRetriedAfterItsZeroingFailedZeroesAgain(t *testing.T) {
	fsys := faultfs.New()
	opts := Options{Dir: "/j", FS: fsys, SegmentBytes: 32 << 10}
	j, err := New(opts, 0)
	if err != nil {
		t.Fatal(err)
	}
	appendAll(t, j, 0, 3, 100)
	end := j.End()
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	segs, err := listSegments(fsys, "/j")
	if err != nil {
		t.Fatal(err)
	}
	// A group cut short past the end, as a crash leaves it.
	if err := fsys.Corrupt("/j/"+segs[0].name, int64(end-segs[0].base), bytes.Repeat([]byte{0xab}, 50)); err != nil {
		t.Fatal(err)
	}
	fsys.FailSyncs(1, 1, syscall.EIO) // the segment's read-from-disk sync passes, the zeros' sync fails
	if _, _, err := Open(opts, 0, noRecords); !errors.Is(err, syscall.EIO) {
		t.Fatalf("open whose zeroing sync fails: %v", err)
	}
	fsys.ClearFaults()
	j, res, err := Open(opts, 0, noRecords)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Torn || res.End != end {
		t.Errorf("retried open: %+v, want torn at %d", res, end)
	}
	appendAll(t, j, 3, 4, 10)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	fsys.Crash(faultfs.CrashOptions{KeepUnsynced: -1})
	checkClean(t, fsys, "/j", records(4))
}

// A caller that asks for records from past the journal's end counts on
// groups the journal does not hold: refused.
func TestOpenFromPastTheEndIsRefused(t *testing.T) {
	dir := journalOf(t, 3, 1<<20)
	res, err := Scan(nil, dir, 0, noRecords)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(Options{Dir: dir, SegmentBytes: 1 << 20}, res.End+5000, noRecords); !errors.Is(err, ErrCorrupt) {
		t.Errorf("open from %d, past the end %d: %v, want ErrCorrupt", res.End+5000, res.End, err)
	}
}

// A journal whose only segment lost its header (cut short at creation)
// starts again at that segment's base, or at from if greater.
func TestOpenOfOnlyAHeaderlessSegmentStartsAtItsBase(t *testing.T) {
	fsys := faultfs.New()
	if err := fsys.MkdirAll("/j", 0o755); err != nil {
		t.Fatal(err)
	}
	name := segmentName(7000)
	f, err := fsys.OpenFile("/j/"+name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	j, res, err := Open(Options{Dir: "/j", FS: fsys, SegmentBytes: 32 << 10}, 100, noRecords)
	if err != nil {
		t.Fatal(err)
	}
	if res.End != 7000+SegmentHeaderSize || j.End() != res.End {
		t.Errorf("opened at %d (scan %+v), want %d", j.End(), res, 7000+SegmentHeaderSize)
	}
	appendAll(t, j, 0, 2, 10)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	got, _, err := scanAll(t, fsys, "/j", 0)
	if err != nil || len(got) != 2 || got[0].pos != 7000+SegmentHeaderSize {
		t.Errorf("after: %v, %v", got, err)
	}
}

// A group larger than a segment fills a segment of its own, larger than
// the others: a journal ending with it, whole or cut short, continues.
func TestOpenAfterAGroupLargerThanASegment(t *testing.T) {
	for _, torn := range []bool{false, true} {
		t.Run(fmt.Sprintf("torn %v", torn), func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{Dir: dir, SegmentBytes: 4 << 10}
			j, err := New(opts, 0)
			if err != nil {
				t.Fatal(err)
			}
			appendAll(t, j, 0, 1, 100)
			appendAll(t, j, 1, 2, 10000)
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			want := 2
			if torn {
				starts := groupStarts(t, dir)
				poke(t, dir, starts[len(starts)-1]+GroupHeaderSize+5000, []byte{0xff})
				want = 1
			}
			n := 0
			j, _, err = Open(opts, 0, func(uint64, Logged) error { n++; return nil })
			if err != nil {
				t.Fatal(err)
			}
			if n != want {
				t.Errorf("%d records handed over, want %d", n, want)
			}
			appendAll(t, j, want, want+6, 1500)
			if err := j.Close(); err != nil {
				t.Fatal(err)
			}
			checkClean(t, nil, dir, records(want+6))
		})
	}
}

// A last segment shorter than the segment size (cut at the end of its
// groups, or written with a smaller size) is zero-filled to it first.
func TestOpenZeroFillsAShortLastSegment(t *testing.T) {
	dir := journalOf(t, 3, 64<<10)
	res, err := Scan(nil, dir, 0, noRecords)
	if err != nil {
		t.Fatal(err)
	}
	segs := segments(t, dir)
	path := filepath.Join(dir, segs[len(segs)-1])
	if err := os.Truncate(path, int64(res.End)); err != nil {
		t.Fatal(err)
	}
	j, _, err := Open(Options{Dir: dir, SegmentBytes: 64 << 10}, 0, noRecords)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Size() != 64<<10 {
		t.Errorf("the short segment after Open: %v, %v; want %d bytes", st, err, 64<<10)
	}
	appendAll(t, j, 100, 150, 3000)
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	got, res, err := scanAll(t, nil, dir, 0)
	if err != nil || len(got) != 3*3+50 || res.Torn {
		t.Errorf("after: %d records, %+v, %v", len(got), res, err)
	}
}

// noRecords is an Open or Scan callback that takes nothing.
func noRecords(uint64, Logged) error { return nil }

// checkClean scans the journal in dir after a clean stop: it holds every
// record of want (each partition's, in order) and nothing else, and ends
// in no torn tail.
func checkClean(t *testing.T, fsys partlog.FS, dir string, want [][]*Logged) {
	t.Helper()
	got, res, err := scanAll(t, fsys, dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	checkHolds(t, got, want, true)
	if res.Torn {
		t.Errorf("scan after a clean stop: %+v", res)
	}
}

// records stands for n records of partition 0, bases 0 to n-1, where
// checkHolds wants what was acknowledged: it counts them.
func records(n int) [][]*Logged { return [][]*Logged{make([]*Logged, n)} }

// A checkpoint's entries read back as written; damaged payloads are
// ErrCorrupt.
func TestCheckpointPayload(t *testing.T) {
	entries := map[PartitionID]Entry{
		{"orders", 0}:  {Incarnation: 7, Flushed: 1 << 40},
		{"orders", 12}: {Incarnation: 8, Flushed: 0},
		{"b", 3}:       {Incarnation: 1, Flushed: 99},
	}
	b := EncodeCheckpoint(entries)
	got, err := DecodeCheckpoint(b)
	if err != nil || fmt.Sprint(got) != fmt.Sprint(entries) {
		t.Fatalf("DecodeCheckpoint = %v, %v; want %v", got, err, entries)
	}
	if got, err := DecodeCheckpoint(EncodeCheckpoint(nil)); err != nil || len(got) != 0 {
		t.Fatalf("no entries: %v, %v", got, err)
	}
	one := EncodeCheckpoint(map[PartitionID]Entry{{"b", 3}: {}})[4:] // an entry
	for name, bad := range map[string][]byte{
		"empty":        nil,
		"cut short":    b[:len(b)-1],
		"trailing":     append(append([]byte(nil), b...), 0),
		"huge count":   append([]byte{0xff, 0xff, 0xff, 0xff}, b[4:]...),
		"twice":        append(append([]byte{2, 0, 0, 0}, one...), one...),
		"empty stream": {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	} {
		if _, err := DecodeCheckpoint(bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}
