package partlog_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
)

func TestCrashDropsUnsyncedData(t *testing.T) {
	tests := []struct {
		name            string
		synced, pending int // batches appended before and after the last Sync
	}{
		{"nothing pending", 10, 0},
		{"pending in the active segment", 10, 3},
		{"pending across rolls", 10, 30}, // rolls fsync what they seal
		{"nothing ever synced", 0, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fsys := faultfs.New()
			l := openFS(t, fsys, nil)
			frames := appendAll(t, l, uniform(tc.synced, 5, 50, 1))
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			synced := l.NextOffset()
			if l.DurableOffset() != synced {
				t.Fatalf("durable %d after sync, next %d", l.DurableOffset(), synced)
			}
			frames = append(frames, appendAll(t, l, uniform(tc.pending, 5, 50, 1))...)
			durable := l.DurableOffset()
			fsys.Crash(faultfs.CrashOptions{})

			l = openFS(t, fsys, nil)
			defer l.Close()
			next := l.NextOffset()
			if next < durable || next < synced || next > uint64(5*len(frames)) {
				t.Fatalf("after crash next %d; durable was %d", next, durable)
			}
			if next != durable {
				// Whole unsynced frames are dropped, nothing torn is kept.
				t.Fatalf("after crash next %d, want the durable offset %d", next, durable)
			}
			equalFrames(t, readAll(t, l), frames[:next/5])
			if (l.Recovery() != partlog.RecoveryInfo{}) {
				t.Fatalf("clean crash (whole frames lost) needed repair: %+v", l.Recovery())
			}
			appendAll(t, l, uniform(2, 5, 50, 1))
		})
	}
}

func TestTornTailRepaired(t *testing.T) {
	frameLen := len(encode(t, batch{epoch: 1, n: 5, vsize: 50}, 50))
	tests := []struct {
		name     string
		pending  int // unsynced batches
		crash    faultfs.CrashOptions
		wantNext uint64
	}{
		{"half a frame", 1, faultfs.CrashOptions{KeepUnsynced: frameLen / 2}, 50},
		{"header only", 1, faultfs.CrashOptions{KeepUnsynced: partlog.FrameHeaderSize}, 50},
		{"a few bytes", 1, faultfs.CrashOptions{KeepUnsynced: 3}, 50},
		{"all but the last byte", 1, faultfs.CrashOptions{KeepUnsynced: frameLen - 1}, 50},
		{"zero-filled frame", 1, faultfs.CrashOptions{KeepUnsynced: frameLen, ZeroFill: true}, 50},
		{"zero-filled several frames", 3, faultfs.CrashOptions{KeepUnsynced: -1, ZeroFill: true}, 50},
		{"one whole pending frame then a torn one", 2, faultfs.CrashOptions{KeepUnsynced: frameLen + 10}, 55},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fsys := faultfs.New()
			l := openFS(t, fsys, func(o *partlog.Options) { o.SegmentBytes = 1 << 20 })
			frames := appendAll(t, l, uniform(10, 5, 50, 1))
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			frames = append(frames, appendAll(t, l, uniform(tc.pending, 5, 50, 1))...)
			seg := segments(t, fsys)[0]
			before, _ := fsys.ReadFile(seg)
			fsys.Crash(tc.crash)
			crashed, _ := fsys.ReadFile(seg)

			l = openFS(t, fsys, func(o *partlog.Options) { o.SegmentBytes = 1 << 20 })
			rec := l.Recovery()
			if l.NextOffset() != tc.wantNext || l.DurableOffset() != tc.wantNext {
				t.Fatalf("next %d durable %d, want %d", l.NextOffset(), l.DurableOffset(), tc.wantNext)
			}
			equalFrames(t, readAll(t, l), frames[:tc.wantNext/5])
			if tc.crash.ZeroFill {
				// Zeros alone are no torn frame: cut, nothing kept.
				if cut := int64(len(crashed)) - framesEnd(frames[:tc.wantNext/5]); rec.TornSegment != "" || rec.ZeroTailBytes != cut {
					t.Fatalf("recovery info %+v, want %d zero bytes cut and nothing torn", rec, cut)
				}
				if now, _ := fsys.ReadFile(seg); int64(len(now)) != int64(len(crashed))-rec.ZeroTailBytes {
					t.Fatalf("segment is %d bytes, want the zeros cut", len(now))
				}
			} else {
				if rec.TornSegment != seg || rec.TornAt <= 0 || rec.TornBytes != int64(len(crashed))-rec.TornAt {
					t.Fatalf("recovery info %+v", rec)
				}
				// The evidence file holds exactly the cut bytes.
				ev, err := fsys.ReadFile(rec.Evidence)
				if err != nil || !bytes.Equal(ev, crashed[rec.TornAt:]) {
					t.Fatalf("evidence %q: %v (%d bytes, want %d)", rec.Evidence, err, len(ev), len(crashed)-int(rec.TornAt))
				}
				if !bytes.Equal(ev, before[rec.TornAt:rec.TornAt+int64(len(ev))]) {
					t.Fatal("evidence is not the torn prefix of the lost write")
				}
				if now, _ := fsys.ReadFile(seg); int64(len(now)) != rec.TornAt {
					t.Fatalf("segment is %d bytes, want cut at %d", len(now), rec.TornAt)
				}
			}
			// Writable, and the repair is durable: a second crash and open
			// finds nothing to repair.
			more := appendAll(t, l, uniform(1, 5, 50, 1))
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			fsys.Crash(faultfs.CrashOptions{KeepUnsynced: -1})
			l = openFS(t, fsys, nil)
			defer l.Close()
			if (l.Recovery() != partlog.RecoveryInfo{}) {
				t.Fatalf("second open repaired again: %+v", l.Recovery())
			}
			equalFrames(t, readAll(t, l), append(frames[:tc.wantNext/5:tc.wantNext/5], more...))
		})
	}
}

// framePositions returns the byte positions of the frames of a segment.
func framePositions(t *testing.T, fsys *faultfs.FS, seg string) []int64 {
	t.Helper()
	b, err := fsys.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	var pos []int64
	for p := int64(partlog.SegmentHeaderSize); p < int64(len(b)); {
		h, err := partlog.DecodeHeader(b[p:])
		if err != nil {
			t.Fatal(err)
		}
		pos = append(pos, p)
		p += int64(h.FrameLen)
	}
	return pos
}

func TestOpenRefusesCorruption(t *testing.T) {
	type setup struct {
		fsys *faultfs.FS
		segs []string
	}
	tests := []struct {
		name   string
		damage func(t *testing.T, s setup) (file string, pos int64)
	}{
		{"bit flip in a sealed segment", func(t *testing.T, s setup) (string, int64) {
			p := framePositions(t, s.fsys, s.segs[0])
			must(t, s.fsys.Corrupt(s.segs[0], p[1]+60, []byte{0xFF}))
			return s.segs[0], p[1]
		}},
		{"last frame of a sealed segment", func(t *testing.T, s setup) (string, int64) {
			p := framePositions(t, s.fsys, s.segs[1])
			last := p[len(p)-1]
			must(t, s.fsys.Corrupt(s.segs[1], last+partlog.FrameHeaderSize, []byte{'!'}))
			return s.segs[1], last
		}},
		{"zeroed frame header in a sealed segment", func(t *testing.T, s setup) (string, int64) {
			p := framePositions(t, s.fsys, s.segs[0])
			must(t, s.fsys.Corrupt(s.segs[0], p[2], make([]byte, partlog.FrameHeaderSize)))
			return s.segs[0], p[2]
		}},
		{"sealed segment cut short", func(t *testing.T, s setup) (string, int64) {
			b, _ := s.fsys.ReadFile(s.segs[0])
			f, err := s.fsys.OpenFile(s.segs[0], os.O_RDWR, 0)
			must(t, err)
			must(t, f.Truncate(int64(len(b)-7)))
			must(t, f.Sync())
			p := framePositions0(b)
			return s.segs[0], p[len(p)-1]
		}},
		{"bad frame followed by valid frames in the last segment", func(t *testing.T, s setup) (string, int64) {
			last := s.segs[len(s.segs)-1]
			p := framePositions(t, s.fsys, last)
			must(t, s.fsys.Corrupt(last, p[1]+70, []byte{0x00, 0x01}))
			return last, p[1]
		}},
		{"zeroed region followed by a valid frame in the last segment", func(t *testing.T, s setup) (string, int64) {
			last := s.segs[len(s.segs)-1]
			p := framePositions(t, s.fsys, last)
			must(t, s.fsys.Corrupt(last, p[0], make([]byte, p[2]-p[0])))
			return last, p[0]
		}},
		{"damaged length field hides later frames", func(t *testing.T, s setup) (string, int64) {
			last := s.segs[len(s.segs)-1]
			p := framePositions(t, s.fsys, last)
			must(t, s.fsys.Corrupt(last, p[0]+8, []byte{0x00, 0x00, 0x10})) // 1 MiB: past EOF
			return last, p[0]
		}},
		{"segment header damaged", func(t *testing.T, s setup) (string, int64) {
			must(t, s.fsys.Corrupt(s.segs[1], 9, []byte{0x7F}))
			return s.segs[1], 0
		}},
		{"missing middle segment", func(t *testing.T, s setup) (string, int64) {
			must(t, s.fsys.Remove(s.segs[1]))
			return s.segs[2], 0
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fsys := faultfs.New()
			l := openFS(t, fsys, nil)
			appendAll(t, l, uniform(40, 5, 50, 1))
			mustClose(t, l)
			segs := segments(t, fsys)
			if len(segs) < 4 || len(framePositions(t, fsys, segs[len(segs)-1])) < 3 {
				t.Fatalf("setup: %d segments", len(segs))
			}
			file, pos := tc.damage(t, setup{fsys, segs})
			// Without the sealed segments' summaries Open reads every
			// frame (with them, TestADamagedSealedSegmentFailsItsReads).
			removeSummaries(t, fsys)
			_, err := partlog.Open(options(fsys, nil))
			if !errors.Is(err, partlog.ErrCorrupt) {
				t.Fatalf("Open: %v, want ErrCorrupt", err)
			}
			if !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), fmt.Sprintf("byte %d:", pos)) {
				t.Fatalf("error %q does not name %s at byte %d", err, file, pos)
			}
			// Refusing to serve must not have modified anything.
			if after := segments(t, fsys); len(after) < len(segs)-1 {
				t.Fatal("Open deleted segments")
			}
		})
	}
}

func framePositions0(b []byte) []int64 {
	var pos []int64
	for p := int64(partlog.SegmentHeaderSize); p < int64(len(b)); {
		h, err := partlog.DecodeHeader(b[p:])
		if err != nil {
			break
		}
		pos = append(pos, p)
		p += int64(h.FrameLen)
	}
	return pos
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// On the real file system too: a damaged sealed segment stops Open.
func TestOpenRefusesCorruptionOSFS(t *testing.T) {
	dir := t.TempDir()
	opts := partlog.Options{Dir: dir, SegmentBytes: 4096}
	l, err := partlog.Open(opts)
	must(t, err)
	appendAll(t, l, uniform(20, 5, 50, 1))
	mustClose(t, l)
	seg := filepath.Join(dir, "00000000000000000000.seg")
	b, err := os.ReadFile(seg)
	must(t, err)
	b[len(b)/2] ^= 0x10
	must(t, os.WriteFile(seg, b, 0o644))
	must(t, os.Remove(seg+".sum")) // else its frames are checked when read
	_, err = partlog.Open(opts)
	if !errors.Is(err, partlog.ErrCorrupt) || !strings.Contains(err.Error(), seg) {
		t.Fatalf("Open: %v", err)
	}
}

// The last frame of the log with a bad CRC and nothing after it is cut as a
// torn write (storage-format.md §7: it may never have been synced).
func TestDamagedLastFrameIsTornTail(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	frames := appendAll(t, l, uniform(3, 5, 50, 1))
	mustClose(t, l)
	seg := segments(t, fsys)[0]
	p := framePositions(t, fsys, seg)
	must(t, fsys.Corrupt(seg, p[2]+80, []byte{0xAB}))
	l = openFS(t, fsys, nil)
	defer l.Close()
	if l.NextOffset() != 10 || l.Recovery().TornAt != p[2] {
		t.Fatalf("next %d recovery %+v", l.NextOffset(), l.Recovery())
	}
	equalFrames(t, readAll(t, l), frames[:2])
}

func TestCorruptionDetectedOnRead(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	defer l.Close()
	appendAll(t, l, uniform(30, 5, 50, 1))
	must(t, l.Sync())
	seg := segments(t, fsys)[1]
	p := framePositions(t, fsys, seg)
	must(t, fsys.Corrupt(seg, p[0]+100, []byte{0x5A}))

	_, err := l.ReadFrames(0, l.NextOffset(), 1<<20)
	if !errors.Is(err, partlog.ErrCorrupt) || !strings.Contains(err.Error(), seg) {
		t.Fatalf("ReadFrames: %v", err)
	}
	// From then on the partition refuses to serve, even undamaged ranges.
	if _, err := l.ReadFrames(0, 5, 1); !errors.Is(err, partlog.ErrCorrupt) {
		t.Fatalf("second read: %v", err)
	}
	if err := l.Append(encode(t, batch{epoch: 1, n: 1}, l.NextOffset())); !errors.Is(err, partlog.ErrCorrupt) {
		t.Fatalf("append: %v", err)
	}
	if _, err := l.OffsetForTime(0); !errors.Is(err, partlog.ErrCorrupt) {
		t.Fatalf("OffsetForTime: %v", err)
	}
}

func TestSyncFailureIsPermanent(t *testing.T) {
	tests := []struct {
		name string
		// run appends and syncs with an fsync failure injected; it returns
		// the error that must wrap ErrFailed.
		run func(t *testing.T, l *partlog.Log, fsys *faultfs.FS) error
		// The roll fsyncs the sealed segment before the directory fsync
		// fails: that advance is legitimate.
		durableMayAdvance bool
	}{
		{"fsync in Sync", func(t *testing.T, l *partlog.Log, fsys *faultfs.FS) error {
			appendAll(t, l, uniform(2, 5, 50, 1))
			fsys.FailSyncs(0, 1, syscall.EIO)
			return l.Sync()
		}, false},
		{"fsync when rolling", func(t *testing.T, l *partlog.Log, fsys *faultfs.FS) error {
			fsys.FailSyncs(0, 1, syscall.EIO)
			for {
				f := encode(t, batch{epoch: 1, n: 5, vsize: 50}, l.NextOffset())
				if err := l.Append(f); err != nil {
					return err
				}
			}
		}, false},
		{"directory fsync when rolling", func(t *testing.T, l *partlog.Log, fsys *faultfs.FS) error {
			fsys.FailSyncs(2, 1, syscall.EIO) // old segment, new .tmp, then the dir
			for {
				f := encode(t, batch{epoch: 1, n: 5, vsize: 50}, l.NextOffset())
				if err := l.Append(f); err != nil {
					return err
				}
			}
		}, true},
		{"fsync in Close", func(t *testing.T, l *partlog.Log, fsys *faultfs.FS) error {
			appendAll(t, l, uniform(1, 5, 50, 1))
			fsys.FailSyncs(0, 1, syscall.EIO)
			return l.Close()
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fsys := faultfs.New()
			l := openFS(t, fsys, nil)
			appendAll(t, l, uniform(3, 5, 50, 1))
			must(t, l.Sync())
			durable := l.DurableOffset()

			err := tc.run(t, l, fsys)
			if !errors.Is(err, partlog.ErrFailed) || !errors.Is(err, syscall.EIO) {
				t.Fatalf("got %v, want ErrFailed wrapping EIO", err)
			}
			if !tc.durableMayAdvance && l.DurableOffset() != durable {
				t.Fatalf("durable offset moved from %d to %d", durable, l.DurableOffset())
			}
			durable = l.DurableOffset()
			// The fault was one-shot: fsync would now succeed, but the
			// log stays failed (the kernel may have dropped the pages).
			fsys.ClearFaults()
			checkFailedForever(t, l)
			if l.DurableOffset() != durable {
				t.Fatal("durable offset moved after failure")
			}
		})
	}
}

func checkFailedForever(t *testing.T, l *partlog.Log) {
	t.Helper()
	calls := map[string]error{
		"Sync":   l.Sync(),
		"Append": l.Append(encode(t, batch{epoch: 1, n: 1}, l.NextOffset())),
	}
	_, calls["ReadFrames"] = l.ReadFrames(l.StartOffset(), l.NextOffset(), 1)
	_, calls["OffsetForTime"] = l.OffsetForTime(0)
	_, calls["EnforceRetention"] = l.EnforceRetention()
	_, calls["EpochEndOffset"] = l.EpochEndOffset(0)
	calls["Truncate"] = l.Truncate(l.StartOffset())
	calls["Close"] = l.Close()
	calls["Sync after Close"] = l.Sync()
	for name, err := range calls {
		if !errors.Is(err, partlog.ErrFailed) {
			t.Errorf("%s after failure: %v, want ErrFailed", name, err)
		}
	}
}

func TestWriteFailureENOSPC(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	frames := appendAll(t, l, uniform(3, 5, 50, 1))
	must(t, l.Sync())
	next := l.NextOffset()
	fsys.FailWrites(0, -1, syscall.ENOSPC, 20) // the failing write lands 20 bytes
	err := l.Append(encode(t, batch{epoch: 1, n: 5, vsize: 50}, next))
	if !errors.Is(err, partlog.ErrFailed) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("append: %v", err)
	}
	if l.NextOffset() != next {
		t.Fatal("failed append moved the log end")
	}
	fsys.ClearFaults()
	checkFailedForever(t, l)

	// The process restarts: the 20 torn bytes are cut, the rest is intact.
	fsys.Crash(faultfs.CrashOptions{KeepUnsynced: -1})
	l = openFS(t, fsys, nil)
	defer l.Close()
	if l.NextOffset() != next || l.Recovery().TornBytes != 20 {
		t.Fatalf("next %d recovery %+v", l.NextOffset(), l.Recovery())
	}
	equalFrames(t, readAll(t, l), frames)
}

func TestOpenHousekeeping(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	appendAll(t, l, uniform(20, 5, 50, 1))
	must(t, l.Sync())
	segsBefore := segments(t, fsys)
	mustClose(t, l)
	// A crashed roll leaves a .tmp; strangers and evidence files stay.
	for _, name := range []string{"00000000000000000100.seg.tmp", "README", "00000000000000000000.seg.torn-1"} {
		f, err := fsys.OpenFile(filepath.Join(testDir, name), os.O_RDWR|os.O_CREATE, 0o644)
		must(t, err)
		_, err = f.WriteAt([]byte("junk"), 0)
		must(t, err)
		must(t, f.Close())
	}
	l = openFS(t, fsys, nil)
	defer l.Close()
	names, _ := fsys.ReadDir(testDir)
	for _, n := range names {
		if strings.HasSuffix(n, ".tmp") {
			t.Fatalf("leftover %s not removed", n)
		}
	}
	// Each sealed segment has its summary.
	if len(names) != 2*len(segsBefore)-1+2 || l.NextOffset() != 100 {
		t.Fatalf("dir now %v", names)
	}
}

// Segment creation, retention and truncation fsync the directory: after a
// crash, the namespace is what the log last reported.
func TestDirectoryChangesAreDurable(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, func(o *partlog.Options) { o.RetentionBytes = 12_000 })
	appendAll(t, l, uniform(60, 5, 50, 1))
	must(t, l.Sync())
	if _, err := l.EnforceRetention(); err != nil {
		t.Fatal(err)
	}
	start, next, rolling := l.StartOffset(), l.NextOffset(), l.RollingChecksum()
	fsys.Crash(faultfs.CrashOptions{})
	l = openFS(t, fsys, nil)
	if l.StartOffset() != start || l.NextOffset() != next || l.RollingChecksum() != rolling {
		t.Fatalf("after crash [%d,%d) %08x, want [%d,%d) %08x",
			l.StartOffset(), l.NextOffset(), l.RollingChecksum(), start, next, rolling)
	}
	must(t, l.Truncate(start+25))
	fsys.Crash(faultfs.CrashOptions{KeepUnsynced: -1})
	l = openFS(t, fsys, nil)
	defer l.Close()
	if l.NextOffset() != start+25 || len(segments(t, fsys)) != 1 {
		t.Fatalf("after truncate+crash next %d, %d segments", l.NextOffset(), len(segments(t, fsys)))
	}
}

// After a failed fsync the kernel keeps the unsynced pages cached but
// marked clean: they are not on the disk, later fsyncs do not write them,
// and a process that restarts without a machine crash still reads them.
// Recovery must read what the disk holds, not trust the cache, or it
// reports durable (and a chain acknowledges) records a crash then loses.
func TestRecoveryAfterAFailedFsyncReadsTheDisk(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	synced := appendAll(t, l, uniform(3, 5, 50, 1))
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	appendAll(t, l, uniform(2, 5, 50, 1))
	fsys.FailSyncs(0, 1, syscall.EIO)
	if err := l.Sync(); err == nil {
		t.Fatal("setup: the injected fsync failure was not reported")
	}
	fsys.ClearFaults()
	// The process exits and starts again; the machine does not crash.
	l = openFS(t, fsys, nil)
	if l.NextOffset() != 15 || l.DurableOffset() != 15 {
		t.Fatalf("reopened after a failed fsync: next %d durable %d, want 15 (what is on the disk)", l.NextOffset(), l.DurableOffset())
	}
	equalFrames(t, readAll(t, l), synced)
	mustClose(t, l)
	// What it called durable is: a crash now keeps all of it.
	fsys.Crash(faultfs.CrashOptions{KeepUnsynced: -1})
	l = openFS(t, fsys, nil)
	defer l.Close()
	if l.NextOffset() != 15 {
		t.Fatalf("after a machine crash: next %d, want 15", l.NextOffset())
	}
}
