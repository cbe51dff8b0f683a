package partlog_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
)

// recJournal is a partlog.Journal that records what a log hands it, in
// order, and holds Wait until release says the records up to a ticket
// are durable. The real journal (replica/journal) is tested on its own
// and with partition logs in its package.
type recJournal struct {
	mu       sync.Mutex
	cond     *sync.Cond
	log      []string
	ticket   uint64
	durable  uint64
	failNext error
}

func newRecJournal() *recJournal {
	j := &recJournal{}
	j.cond = sync.NewCond(&j.mu)
	return j
}

func (j *recJournal) add(s string) (uint64, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if err := j.failNext; err != nil {
		j.failNext = nil
		return 0, err
	}
	j.log = append(j.log, s)
	j.ticket++
	return j.ticket, nil
}

func (j *recJournal) Frame(h partlog.BatchHeader, frame []byte) (uint64, error) {
	return j.add(fmt.Sprintf("frame %d-%d e%d", h.BaseOffset, h.End(), h.Epoch))
}

func (j *recJournal) Truncate(to, epoch uint64) error {
	t, err := j.add(fmt.Sprintf("truncate %d e%d", to, epoch))
	if err == nil {
		j.release(t)
	}
	return err
}

func (j *recJournal) Reset(s partlog.Start) error {
	t, err := j.add(fmt.Sprintf("reset %d %08x", s.Base, s.Rolling))
	if err == nil {
		j.release(t)
	}
	return err
}

func (j *recJournal) Written(h partlog.BatchHeader) (uint64, error) {
	return j.add(fmt.Sprintf("written %d-%d e%d", h.BaseOffset, h.End(), h.Epoch))
}

func (j *recJournal) Wait(t uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.durable < t {
		j.cond.Wait()
	}
	return nil
}

func (j *recJournal) release(t uint64) {
	j.mu.Lock()
	j.durable = max(j.durable, t)
	j.mu.Unlock()
	j.cond.Broadcast()
}

func (j *recJournal) records() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.log...)
}

func equalStrings(t *testing.T, got, want []string) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

// A journaled log's frames are durable when the journal says so: Sync
// waits for it and fsyncs nothing; Flush fsyncs the segment files, once
// for what is new; truncation and reset are recorded before they happen.
func TestJournaledLog(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	defer l.Close()
	appendAll(t, l, uniform(2, 3, 10, 1))
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	j := newRecJournal()
	if err := l.UseJournal(j); err != nil {
		t.Fatal(err)
	}
	if err := l.UseJournal(j); err == nil {
		t.Fatal("a second journal was taken")
	}
	syncs := fsys.Syncs()
	appendAll(t, l, uniform(2, 3, 10, 2))
	synced := make(chan error, 1)
	go func() { synced <- l.Sync() }()
	select {
	case err := <-synced:
		t.Fatalf("Sync returned (%v) before the journal held the frames", err)
	default:
	}
	if d := l.DurableOffset(); d != 6 {
		t.Fatalf("durable offset %d before the journal's commit, want 6", d)
	}
	j.release(2)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if d := l.DurableOffset(); d != 12 {
		t.Fatalf("durable offset %d, want 12", d)
	}
	if n := fsys.Syncs() - syncs; n != 0 {
		t.Fatalf("%d fsyncs for journaled appends", n)
	}
	end, err := l.Flush()
	if err != nil || end != 12 {
		t.Fatalf("Flush = %d, %v; want 12", end, err)
	}
	if n := fsys.Syncs() - syncs; n != 1 {
		t.Fatalf("Flush made %d fsyncs, want 1", n)
	}
	if end, err := l.Flush(); err != nil || end != 12 || fsys.Syncs()-syncs != 1 {
		t.Fatalf("a second Flush = %d, %v after %d fsyncs; want 12 and no fsync", end, err, fsys.Syncs()-syncs)
	}

	// A truncation to the end cuts nothing and makes it durable.
	appendAll(t, l, uniform(1, 3, 10, 2))
	truncated := make(chan error, 1)
	go func() { truncated <- l.Truncate(15) }()
	j.release(3)
	if err := <-truncated; err != nil || l.DurableOffset() != 15 {
		t.Fatalf("Truncate to the end: %v, durable offset %d; want 15", err, l.DurableOffset())
	}
	if err := l.Truncate(9); err != nil {
		t.Fatal(err)
	}
	appendAll(t, l, uniform(1, 3, 10, 3))
	if err := l.Reset(100, 0xabcd); err != nil {
		t.Fatal(err)
	}
	equalStrings(t, j.records(), []string{
		"frame 6-9 e2", "frame 9-12 e2", "frame 12-15 e2",
		"truncate 9 e2", "frame 9-12 e3",
		"reset 100 0000abcd",
	})
	if d := l.DurableOffset(); d != 100 {
		t.Fatalf("durable offset %d after the reset, want 100", d)
	}
}

// A frame of at least DirectFrameBytes is written to its segment file
// only: the journal is told where it is and its CRC (written), and Sync
// fsyncs the file while it waits for the journal. Small frames around it
// are journalled as ever. A truncation's own fsync covers a file-only
// frame below the cut.
func TestJournaledLogLargeFrames(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, func(o *partlog.Options) { o.SegmentBytes = 1 << 20; o.DirectFrameBytes = 400 })
	defer l.Close()
	j := newRecJournal()
	if err := l.UseJournal(j); err != nil {
		t.Fatal(err)
	}
	syncs := fsys.Syncs()
	appendAll(t, l, uniform(1, 1, 10, 1))  // small: [0,1)
	appendAll(t, l, uniform(1, 5, 100, 1)) // large: [1,6)
	appendAll(t, l, uniform(1, 1, 10, 1))  // small: [6,7)
	synced := make(chan error, 1)
	go func() { synced <- l.Sync() }()
	j.release(2)
	select {
	case err := <-synced:
		t.Fatalf("Sync returned (%v) before the journal held its last frame", err)
	default:
	}
	j.release(3)
	if err := <-synced; err != nil {
		t.Fatal(err)
	}
	if d := l.DurableOffset(); d != 7 {
		t.Fatalf("durable offset %d, want 7", d)
	}
	if n := fsys.Syncs() - syncs; n != 1 {
		t.Fatalf("Sync made %d fsyncs, want 1 (the segment file, for its large frame)", n)
	}
	// Small frames alone: no fsync.
	appendAll(t, l, uniform(1, 1, 10, 1)) // [7,8)
	j.release(4)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if n := fsys.Syncs() - syncs; n != 1 {
		t.Fatalf("%d fsyncs after a Sync of small frames, want 1", n)
	}
	// A truncation above a large frame not yet synced: its fsync of the
	// segment covers the frame.
	appendAll(t, l, uniform(1, 5, 100, 2)) // large: [8,13)
	appendAll(t, l, uniform(1, 1, 10, 2))  // small: [13,14)
	truncated := make(chan error, 1)
	go func() { truncated <- l.Truncate(13) }()
	j.release(100)
	if err := <-truncated; err != nil || l.DurableOffset() != 13 {
		t.Fatalf("Truncate: %v, durable offset %d; want 13", err, l.DurableOffset())
	}
	appendAll(t, l, uniform(1, 5, 100, 3)) // large: [13,18)
	if err := l.Reset(100, 0xabcd); err != nil {
		t.Fatal(err)
	}
	appendAll(t, l, uniform(1, 1, 10, 4)) // small: [100,101)
	j.release(100)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	equalStrings(t, j.records(), []string{
		"frame 0-1 e1", "written 1-6 e1", "frame 6-7 e1",
		"frame 7-8 e1",
		"written 8-13 e2", "frame 13-14 e2", "truncate 13 e2",
		"written 13-18 e3", "reset 100 0000abcd",
		"frame 100-101 e4",
	})
}

// Recovery keeps the frames above Flushed (or from Empty's base) that the
// segment files hold whole and that match Verify from its first, offsets
// and CRC, across segment rolls, and cuts what follows: later segments
// removed, a torn or stale frame cut.
func TestOpenVerify(t *testing.T) {
	build := func(t *testing.T) (*faultfs.FS, [][]byte) {
		fsys := faultfs.New()
		l := openFS(t, fsys, nil)                        // 4 KiB segments
		frames := appendAll(t, l, uniform(40, 4, 40, 1)) // [4i, 4i+4)
		mustClose(t, l)
		if n := len(segments(t, fsys)); n < 3 {
			t.Fatalf("%d segments, want several", n)
		}
		return fsys, frames
	}
	checks := func(t *testing.T, frames [][]byte, from, to int) []partlog.FrameCheck {
		var cs []partlog.FrameCheck
		for _, f := range frames[from:to] {
			h, err := partlog.DecodeHeader(f[:partlog.FrameHeaderSize])
			if err != nil {
				t.Fatal(err)
			}
			cs = append(cs, partlog.FrameCheck{Base: h.BaseOffset, End: h.End(), CRC: h.CRC})
		}
		return cs
	}
	for _, tc := range []struct {
		name    string
		flushed uint64
		empty   *partlog.Start
		verify  func([][]byte) []partlog.FrameCheck
		damage  int  // a frame to damage on disk (-1: none)
		trimmed bool // retention removed the first segment
		frames  int  // whole frames kept
	}{
		{name: "every frame above, across rolls", flushed: 20, frames: 40, damage: -1,
			verify: func(f [][]byte) []partlog.FrameCheck { return checks(t, f, 5, 40) }},
		{name: "fewer frames than the files hold", flushed: 20, frames: 31, damage: -1,
			verify: func(f [][]byte) []partlog.FrameCheck { return checks(t, f, 5, 31) }},
		{name: "from a later segment", flushed: 100, frames: 40, damage: -1,
			verify: func(f [][]byte) []partlog.FrameCheck { return checks(t, f, 25, 40) }},
		{name: "a CRC that does not match", flushed: 20, frames: 10, damage: -1,
			verify: func(f [][]byte) []partlog.FrameCheck {
				cs := checks(t, f, 5, 40)
				cs[5].CRC++
				return cs
			}},
		{name: "a frame damaged on disk", flushed: 20, frames: 12, damage: 12,
			verify: func(f [][]byte) []partlog.FrameCheck { return checks(t, f, 5, 40) }},
		{name: "a plan that does not start at the cut", flushed: 20, frames: 5, damage: -1,
			verify: func(f [][]byte) []partlog.FrameCheck { return checks(t, f, 6, 40) }},
		{name: "empty, the files starting there", empty: &partlog.Start{}, frames: 40, damage: -1,
			verify: func(f [][]byte) []partlog.FrameCheck { return checks(t, f, 0, 40) }},
		{name: "empty, the files another log's", empty: &partlog.Start{Rolling: 0x1234}, frames: 0, damage: -1,
			verify: func(f [][]byte) []partlog.FrameCheck { return checks(t, f, 0, 40) }},
		{name: "empty, retention past its base", empty: &partlog.Start{}, trimmed: true, frames: 40, damage: -1,
			verify: func(f [][]byte) []partlog.FrameCheck { return checks(t, f, 0, 40) }},
		{name: "empty, retention past its base, the files another log's", empty: &partlog.Start{Rolling: 0x1234}, trimmed: true, frames: 0, damage: -1,
			verify: func(f [][]byte) []partlog.FrameCheck { return checks(t, f, 0, 40) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys, frames := build(t)
			if tc.damage >= 0 {
				// Find the frame's bytes in its segment and flip one.
				for _, seg := range segments(t, fsys) {
					data, _ := fsys.ReadFile(seg)
					if i := bytes.Index(data, frames[tc.damage]); i >= 0 {
						f, err := fsys.OpenFile(seg, os.O_RDWR, 0)
						if err != nil {
							t.Fatal(err)
						}
						f.WriteAt([]byte{data[i+len(frames[tc.damage])-1] ^ 0xff}, int64(i+len(frames[tc.damage])-1))
						f.Sync()
						f.Close()
					}
				}
			}
			start := 0 // the first frame kept
			if tc.trimmed {
				segs := segments(t, fsys)
				if err := fsys.Remove(segs[0]); err != nil {
					t.Fatal(err)
				}
				var base uint64
				fmt.Sscanf(filepath.Base(segs[1]), "%d", &base)
				start = int(base / 4)
			}
			if tc.frames == 0 {
				start = 0
			}
			at := tc.flushed
			l := openFS(t, fsys, func(o *partlog.Options) {
				if tc.empty != nil {
					o.Empty = tc.empty
				} else {
					o.Flushed = &at
				}
				o.Verify = tc.verify(frames)
			})
			defer l.Close()
			if n := l.NextOffset(); n != uint64(4*tc.frames) {
				t.Fatalf("log ends at %d, want %d", n, 4*tc.frames)
			}
			equalFrames(t, readAll(t, l), frames[start:tc.frames])
			appendAll(t, l, uniform(1, 4, 40, 2))
			mustClose(t, l)
			l = openFS(t, fsys, nil)
			if n := l.NextOffset(); n != uint64(4*tc.frames+4) {
				t.Fatalf("reopened log ends at %d, want %d", n, 4*tc.frames+4)
			}
			mustClose(t, l)
		})
	}
}

// A failed journal record fails the log for good, and a truncation the
// journal could not record changes nothing.
func TestJournaledLogFailures(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	defer l.Close()
	j := newRecJournal()
	if err := l.UseJournal(j); err != nil {
		t.Fatal(err)
	}
	appendAll(t, l, uniform(3, 2, 10, 1))
	boom := errors.New("journal failed")
	j.failNext = boom
	if err := l.Truncate(2); !errors.Is(err, partlog.ErrFailed) || !errors.Is(err, boom) {
		t.Fatalf("Truncate with a failing journal: %v", err)
	}
	if n := l.NextOffset(); n != 6 {
		t.Fatalf("the unrecorded truncation cut the log to %d", n)
	}
	if err := l.Append(encode(t, batch{epoch: 1, n: 1}, 6)); !errors.Is(err, partlog.ErrFailed) {
		t.Fatalf("append after the journal failed: %v", err)
	}

	l2 := openFS(t, faultfs.New(), nil)
	defer l2.Close()
	j2 := newRecJournal()
	if err := l2.UseJournal(j2); err != nil {
		t.Fatal(err)
	}
	j2.failNext = boom
	if err := l2.Append(encode(t, batch{epoch: 1, n: 1}, 0)); !errors.Is(err, partlog.ErrFailed) {
		t.Fatalf("append the journal refused: %v", err)
	}
	if _, err := l2.Flush(); !errors.Is(err, partlog.ErrFailed) {
		t.Fatalf("Flush after a failed append: %v", err)
	}
}

// Recovery with Options.Flushed keeps what the journal's checkpoint says
// was fsynced and cuts everything above it, whole later segments and
// whatever bytes a crash left; Options.Empty starts the log again.
func TestOpenFlushed(t *testing.T) {
	build := func(t *testing.T) (*faultfs.FS, [][]byte) {
		fsys := faultfs.New()
		l := openFS(t, fsys, nil) // 4 KiB segments
		frames := appendAll(t, l, uniform(40, 4, 40, 1))
		if err := l.Sync(); err != nil {
			t.Fatal(err)
		}
		mustClose(t, l)
		if n := len(segments(t, fsys)); n < 3 {
			t.Fatalf("%d segments, want several", n)
		}
		return fsys, frames
	}
	for _, tc := range []struct {
		name    string
		flushed uint64
		frames  int // whole frames kept
	}{
		{"inside the first segment", 20, 5},
		{"at the end", 160, 40},
		{"at the start", 0, 0},
		{"in a later segment", 100, 25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys, frames := build(t)
			// A crash's unsynced garbage above the cut is not read.
			segs := segments(t, fsys)
			last := segs[len(segs)-1]
			data, _ := fsys.ReadFile(last)
			f, err := fsys.OpenFile(last, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte("a torn frame that reached the disk"), int64(len(data))); err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			f.Close()
			at := tc.flushed
			l := openFS(t, fsys, func(o *partlog.Options) { o.Flushed = &at })
			defer l.Close()
			if n := l.NextOffset(); n != tc.flushed {
				t.Fatalf("log ends at %d, want %d", n, tc.flushed)
			}
			equalFrames(t, readAll(t, l), frames[:tc.frames])
			appendAll(t, l, uniform(3, 4, 40, 2))
			mustClose(t, l)
			l = openFS(t, fsys, nil)
			if n := l.NextOffset(); n != tc.flushed+12 {
				t.Fatalf("reopened log ends at %d, want %d", n, tc.flushed+12)
			}
			mustClose(t, l)
		})
	}
	for _, tc := range []struct {
		name    string
		flushed uint64
	}{
		{"past the end", 164},
		{"inside a frame", 22},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys, _ := build(t)
			at := tc.flushed
			if _, err := partlog.Open(options(fsys, func(o *partlog.Options) { o.Flushed = &at })); !errors.Is(err, partlog.ErrCorrupt) {
				t.Fatalf("Open flushed at %d: %v, want ErrCorrupt", at, err)
			}
		})
	}
	t.Run("below the first segment", func(t *testing.T) {
		fsys, _ := build(t)
		l := openFS(t, fsys, func(o *partlog.Options) { o.SegmentBytes = 4096; o.RetentionBytes = 4096 })
		if _, err := l.EnforceRetention(); err != nil {
			t.Fatal(err)
		}
		start := l.StartOffset()
		mustClose(t, l)
		at := start - 4
		if _, err := partlog.Open(options(fsys, func(o *partlog.Options) { o.Flushed = &at })); !errors.Is(err, partlog.ErrCorrupt) {
			t.Fatalf("Open flushed at %d below the start %d: %v, want ErrCorrupt", at, start, err)
		}
	})
	t.Run("empty", func(t *testing.T) {
		fsys, _ := build(t)
		l := openFS(t, fsys, func(o *partlog.Options) { o.Empty = &partlog.Start{Base: 500, Rolling: 0x1234} })
		defer l.Close()
		if l.StartOffset() != 500 || l.NextOffset() != 500 || l.RollingChecksum() != 0x1234 {
			t.Fatalf("log [%d,%d) rolling %08x, want empty at 500, 00001234", l.StartOffset(), l.NextOffset(), l.RollingChecksum())
		}
		if n := len(segments(t, fsys)); n != 1 {
			t.Fatalf("%d segments, want 1", n)
		}
	})
}

// A log a reader found corrupt still flushes: a journal's checkpoints
// need its files' durable end.
func TestFlushOfACorruptLog(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	defer l.Close()
	if err := l.UseJournal(newRecJournal()); err != nil {
		t.Fatal(err)
	}
	appendAll(t, l, uniform(3, 2, 10, 1))
	segs := segments(t, fsys)
	f, err := fsys.OpenFile(segs[0], os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("damage"), partlog.SegmentHeaderSize+10); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := l.ReadFrames(0, 6, 1<<20); !errors.Is(err, partlog.ErrCorrupt) {
		t.Fatalf("read of a damaged frame: %v, want ErrCorrupt", err)
	}
	syncs := fsys.Syncs()
	if end, err := l.Flush(); err != nil || end != 6 || fsys.Syncs() != syncs+1 {
		t.Fatalf("Flush of a corrupt log = %d, %v after %d fsyncs; want 6 and one fsync", end, err, fsys.Syncs()-syncs)
	}
	if err := l.Append(encode(t, batch{epoch: 1, n: 1}, 6)); !errors.Is(err, partlog.ErrCorrupt) {
		t.Fatalf("append to a corrupt log: %v, want ErrCorrupt", err)
	}
}
