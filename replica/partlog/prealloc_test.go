package partlog_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
)

// fileLen is the length of name in fsys's current state.
func fileLen(t *testing.T, fsys *faultfs.FS, name string) int64 {
	t.Helper()
	b, err := fsys.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return int64(len(b))
}

// framesEnd is where the frames of a segment end: the segment header plus
// its frames, which must be all of the log.
func framesEnd(frames [][]byte) int64 {
	end := int64(partlog.SegmentHeaderSize)
	for _, f := range frames {
		end += int64(len(f))
	}
	return end
}

// openRoomy opens a log whose segments have room for the zeros written
// ahead of small appends.
func openRoomy(t *testing.T, fsys *faultfs.FS) *partlog.Log {
	t.Helper()
	return openFS(t, fsys, func(o *partlog.Options) { o.SegmentBytes = 4 << 20 })
}

func preallocate(t *testing.T, l *partlog.Log) {
	t.Helper()
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := l.Preallocate(); err != nil {
		t.Fatal(err)
	}
}

func TestSmallAppendsGoIntoZerosWrittenAhead(t *testing.T) {
	fsys := faultfs.New()
	l := openRoomy(t, fsys)
	frames := appendAll(t, l, uniform(10, 5, 50, 1))
	preallocate(t, l)
	seg := segments(t, fsys)[0]
	zeroed := fileLen(t, fsys, seg)
	if zeroed <= framesEnd(frames) {
		t.Fatalf("segment is %d bytes after Preallocate, its frames end at %d: nothing written ahead", zeroed, framesEnd(frames))
	}
	data, _ := fsys.ReadFile(seg)
	if tail := data[framesEnd(frames):]; !bytes.Equal(tail, make([]byte, len(tail))) {
		t.Fatal("the bytes written ahead are not zeros")
	}

	// Appends land in the zeros: the file does not grow, the log reads as
	// before, and Preallocate does not write again while half is left.
	frames = append(frames, appendAll(t, l, uniform(10, 5, 50, 1))...)
	preallocate(t, l)
	if n := fileLen(t, fsys, seg); n != zeroed {
		t.Fatalf("segment is %d bytes after appends into its zeros, was %d", n, zeroed)
	}
	equalFrames(t, readAll(t, l), frames)
	writes := fsys.Writes()
	if err := l.Preallocate(); err != nil || fsys.Writes() != writes {
		t.Fatalf("a second Preallocate wrote again (%d writes, %v)", fsys.Writes()-writes, err)
	}

	// A crash leaves the synced frames and the zeros; recovery cuts the
	// zeros without calling them a torn write or keeping them as evidence.
	durable := l.DurableOffset()
	fsys.Crash(faultfs.CrashOptions{KeepUnsynced: -1})
	l = openRoomy(t, fsys)
	defer mustClose(t, l)
	rec := l.Recovery()
	if l.NextOffset() != durable || rec.TornSegment != "" || rec.ZeroTailBytes != zeroed-framesEnd(frames) {
		t.Fatalf("after crash next %d (want %d), recovery %+v; want %d zero bytes cut and nothing torn", l.NextOffset(), durable, rec, zeroed-framesEnd(frames))
	}
	equalFrames(t, readAll(t, l), frames)
	if n := fileLen(t, fsys, seg); n != framesEnd(frames) {
		t.Fatalf("segment is %d bytes after recovery, its frames end at %d", n, framesEnd(frames))
	}
	names, _ := fsys.ReadDir(testDir)
	for _, n := range names {
		if strings.Contains(n, ".torn-") {
			t.Fatalf("zeros kept as torn evidence: %s", n)
		}
	}
}

func TestLargeAppendsAreNotZeroFilledAhead(t *testing.T) {
	// Zeros cost a write of their own per byte: for appends this large the
	// fsyncs they save cost less than writing every byte twice.
	fsys := faultfs.New()
	l := openRoomy(t, fsys)
	defer mustClose(t, l)
	frames := appendAll(t, l, uniform(12, 4, 16<<10, 1))
	preallocate(t, l)
	if n := fileLen(t, fsys, segments(t, fsys)[0]); n != framesEnd(frames) {
		t.Fatalf("segment is %d bytes, its frames end at %d: zero-filled ahead of 64 KiB appends", n, framesEnd(frames))
	}
}

func TestSealedSegmentsAndClosedLogsCarryNoZeros(t *testing.T) {
	fsys := faultfs.New()
	mod := func(o *partlog.Options) { o.SegmentBytes = 64 << 10 }
	l := openFS(t, fsys, mod)
	var frames [][]byte
	for len(segments(t, fsys)) < 3 {
		frames = append(frames, appendAll(t, l, uniform(4, 5, 200, 1))...)
		preallocate(t, l)
	}
	mustClose(t, l)
	var total int64
	for _, seg := range segments(t, fsys) {
		data, _ := fsys.ReadFile(seg)
		if len(data) >= 8 && bytes.Equal(data[len(data)-8:], make([]byte, 8)) {
			t.Fatalf("%s ends in zeros after roll or close", seg)
		}
		total += int64(len(data)) - partlog.SegmentHeaderSize
	}
	if want := framesEnd(frames) - partlog.SegmentHeaderSize; total != want {
		t.Fatalf("segments hold %d bytes past their headers, the frames are %d", total, want)
	}
	l = openFS(t, fsys, mod)
	defer mustClose(t, l)
	if (l.Recovery() != partlog.RecoveryInfo{}) {
		t.Fatalf("reopening a closed log repaired it: %+v", l.Recovery())
	}
	equalFrames(t, readAll(t, l), frames)
}

func TestTruncateCutsTheZerosWrittenAhead(t *testing.T) {
	fsys := faultfs.New()
	l := openRoomy(t, fsys)
	frames := appendAll(t, l, uniform(10, 5, 50, 1))
	preallocate(t, l)
	if err := l.Truncate(25); err != nil {
		t.Fatal(err)
	}
	if n := fileLen(t, fsys, segments(t, fsys)[0]); n != framesEnd(frames[:5]) {
		t.Fatalf("segment is %d bytes after Truncate, its frames end at %d", n, framesEnd(frames[:5]))
	}
	// Preallocate writes ahead again from the new end.
	preallocate(t, l)
	frames = append(frames[:5], appendAll(t, l, uniform(3, 5, 50, 1))...)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	fsys.Crash(faultfs.CrashOptions{})
	l = openRoomy(t, fsys)
	defer mustClose(t, l)
	equalFrames(t, readAll(t, l), frames)
}

func TestATornFrameBeforeZerosIsStillATornWrite(t *testing.T) {
	// Only a tail of zeros alone is cut quietly: the first bytes of a frame
	// that did not reach the disk whole are evidence, whatever follows.
	fsys := faultfs.New()
	l := openRoomy(t, fsys)
	frames := appendAll(t, l, uniform(10, 5, 50, 1))
	preallocate(t, l)
	seg := segments(t, fsys)[0]
	size := fileLen(t, fsys, seg)
	torn := encode(t, batch{epoch: 1, n: 5, vsize: 50}, 50)
	fsys.Crash(faultfs.CrashOptions{})
	p := framesEnd(frames)
	if err := fsys.Corrupt(seg, p, torn[:len(torn)/2]); err != nil {
		t.Fatal(err)
	}
	l = openRoomy(t, fsys)
	defer mustClose(t, l)
	rec := l.Recovery()
	if l.NextOffset() != 50 || rec.TornSegment != seg || rec.TornAt != p || rec.TornBytes != size-p || rec.ZeroTailBytes != 0 {
		t.Fatalf("next %d, recovery %+v; want the torn frame at %d cut with its zeros", l.NextOffset(), rec, p)
	}
	ev, err := fsys.ReadFile(rec.Evidence)
	if err != nil || !bytes.HasPrefix(ev, torn[:len(torn)/2]) {
		t.Fatalf("evidence %q does not start with the torn frame: %v", rec.Evidence, err)
	}
}

func TestZerosAheadOnARealFileSystem(t *testing.T) {
	// The file system the replica runs on: fdatasync, file sizes.
	dir := t.TempDir()
	open := func() *partlog.Log {
		l, err := partlog.Open(partlog.Options{Dir: dir, SegmentBytes: 4 << 20})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	l := open()
	frames := appendAll(t, l, uniform(10, 5, 50, 1))
	preallocate(t, l)
	seg := filepath.Join(dir, "00000000000000000000.seg")
	fi, err := os.Stat(seg)
	if err != nil || fi.Size() <= framesEnd(frames) {
		t.Fatalf("segment %v after Preallocate, frames end at %d: %v", fi, framesEnd(frames), err)
	}
	frames = append(frames, appendAll(t, l, uniform(10, 5, 50, 1))...)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	equalFrames(t, readAll(t, l), frames)
	mustClose(t, l)
	if fi, err := os.Stat(seg); err != nil || fi.Size() != framesEnd(frames) {
		t.Fatalf("segment %v after Close, frames end at %d: %v", fi, framesEnd(frames), err)
	}
	l = open()
	defer mustClose(t, l)
	if (l.Recovery() != partlog.RecoveryInfo{}) || l.NextOffset() != 100 {
		t.Fatalf("reopened at %d with recovery %+v", l.NextOffset(), l.Recovery())
	}
	equalFrames(t, readAll(t, l), frames)
}
