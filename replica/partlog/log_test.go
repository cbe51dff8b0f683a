package partlog_test

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
	"golang.org/x/sys/unix"
)

func TestAppendReadAcrossRolls(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	defer l.Close()
	frames := appendAll(t, l, uniform(60, 5, 50, 1)) // ~450 B frames, 4 KiB segments
	if n := len(segments(t, fsys)); n < 5 {
		t.Fatalf("%d segments, want several rolls", n)
	}
	if l.NextOffset() != 300 || l.StartOffset() != 0 {
		t.Fatalf("offsets [%d,%d)", l.StartOffset(), l.NextOffset())
	}
	equalFrames(t, readAll(t, l), frames)

	// Every offset: the first frame returned contains it, the rest follow.
	for from := uint64(0); from < 300; from++ {
		got, err := l.ReadFrames(from, 300, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || !bytes.Equal(got[0], frames[from/5]) {
			t.Fatalf("from %d: wrong frame", from)
		}
	}

	tests := []struct {
		name           string
		from, maxEnd   uint64
		maxBytes       int
		first, nFrames int
		err            error
	}{
		{"all", 0, 300, 1 << 20, 0, 60, nil},
		{"maxEnd at boundary", 12, 25, 1 << 20, 2, 3, nil},
		{"maxEnd inside a batch excludes it", 12, 24, 1 << 20, 2, 2, nil},
		{"maxEnd before first frame end", 12, 13, 1 << 20, 0, 0, nil},
		{"maxEnd beyond log end", 290, 1000, 1 << 20, 58, 2, nil},
		{"maxBytes small returns one frame", 100, 300, 0, 20, 1, nil},
		{"maxBytes two frames", 100, 300, len(frames[20]) + len(frames[21]), 20, 2, nil},
		{"at log end", 300, 400, 1 << 20, 0, 0, nil},
		{"past log end", 301, 400, 1 << 20, 0, 0, partlog.ErrOutOfRange},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := l.ReadFrames(tc.from, tc.maxEnd, tc.maxBytes)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			equalFrames(t, got, frames[tc.first:tc.first+tc.nFrames])
		})
	}

	// Frames returned earlier are unaffected by later appends and by the
	// caller appending to them.
	got, _ := l.ReadFrames(295, 300, 1<<20)
	got0 := bytes.Clone(got[0])
	_ = append(got[0], 0xEE)
	appendAll(t, l, uniform(20, 5, 50, 1))
	if !bytes.Equal(got[0], got0) {
		t.Fatal("returned frame changed")
	}
}

func TestAppendValidation(t *testing.T) {
	l := openFS(t, faultfs.New(), nil)
	defer l.Close()
	appendAll(t, l, []batch{{epoch: 5, n: 3}})
	good := encode(t, batch{epoch: 5, n: 2}, 3)
	bad := bytes.Clone(good)
	bad[len(bad)-1] ^= 1
	tests := []struct {
		name  string
		frame []byte
		want  error
	}{
		{"gap", encode(t, batch{epoch: 5, n: 1}, 4), partlog.ErrOffsetGap},
		{"overlap", encode(t, batch{epoch: 5, n: 1}, 2), partlog.ErrOffsetGap},
		{"bad crc", bad, partlog.ErrBadFrame},
		{"garbage", []byte("not a frame"), partlog.ErrBadFrame},
		{"epoch regresses", encode(t, batch{epoch: 4, n: 1}, 3), partlog.ErrEpochRegress},
		{"trailing bytes", append(bytes.Clone(good), 0), partlog.ErrBadFrame},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := l.Append(tc.frame); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if l.NextOffset() != 3 {
				t.Fatal("rejected frame moved the log end")
			}
		})
	}
	if err := l.Append(good); err != nil {
		t.Fatalf("a rejected append must not poison the log: %v", err)
	}
}

func TestOneWritePerAppendNoAllocs(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, func(o *partlog.Options) { o.SegmentBytes = 1 << 20 })
	defer l.Close()
	for i := 0; i < 10; i++ {
		before := fsys.Writes()
		appendAll(t, l, []batch{{epoch: 1, n: 64, vsize: 100}})
		if w := fsys.Writes() - before; w != 1 {
			t.Fatalf("append %d issued %d writes", i, w)
		}
	}
	// On the real file system, Append allocates nothing per frame (the index
	// grows amortised).
	dir := t.TempDir()
	lo, err := partlog.Open(partlog.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer lo.Close()
	frames := make([][]byte, 201)
	for i := range frames {
		frames[i] = encode(t, batch{epoch: 1, n: 64, vsize: 16}, uint64(i*64))
	}
	i := 0
	if n := testing.AllocsPerRun(200, func() {
		if err := lo.Append(frames[i]); err != nil {
			t.Fatal(err)
		}
		i++
	}); n > 0.1 {
		t.Fatalf("Append allocates %v times per frame", n)
	}
}

func TestOffsetForTime(t *testing.T) {
	l := openFS(t, faultfs.New(), nil)
	defer l.Close()
	// Non-monotonic batch timestamps; batch i has records ts_i .. ts_i+2.
	ts := []int64{100, 50, 300, 200, 200, 900, 10, 400, 1000, 5}
	var bs []batch
	for range 6 { // repeat to span several segments
		for _, x := range ts {
			bs = append(bs, batch{epoch: 1, n: 3, ts: x, vsize: 200})
		}
	}
	appendAll(t, l, bs)
	want := func(q int64) uint64 {
		for i, b := range bs {
			if b.ts+2 >= q {
				return uint64(3 * i)
			}
		}
		return l.NextOffset()
	}
	for _, q := range []int64{math.MinInt64, 0, 5, 52, 53, 102, 103, 250, 302, 303, 902, 903, 1002, 1003, math.MaxInt64} {
		got, err := l.OffsetForTime(q)
		if err != nil {
			t.Fatal(err)
		}
		if got != want(q) {
			t.Fatalf("OffsetForTime(%d) = %d, want %d", q, got, want(q))
		}
	}
}

func TestRetentionByBytes(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, func(o *partlog.Options) { o.RetentionBytes = 10_000 })
	frames := appendAll(t, l, uniform(60, 5, 50, 1))
	before := len(segments(t, fsys))
	rolling := l.RollingChecksum()
	n, err := l.EnforceRetention()
	if err != nil {
		t.Fatal(err)
	}
	segs := segments(t, fsys)
	if n == 0 || len(segs) != before-n {
		t.Fatalf("deleted %d of %d segments, %d left", n, before, len(segs))
	}
	var total int
	for _, s := range segs {
		b, _ := fsys.ReadFile(s)
		total += len(b)
	}
	if total > 10_000 {
		t.Fatalf("%d bytes left, limit 10000", total)
	}
	start := l.StartOffset()
	if start == 0 || start%5 != 0 || l.NextOffset() != 300 || l.RollingChecksum() != rolling {
		t.Fatalf("start %d next %d", start, l.NextOffset())
	}
	if _, err := l.ReadFrames(start-1, 300, 1); !errors.Is(err, partlog.ErrOutOfRange) {
		t.Fatalf("read below start: %v", err)
	}
	equalFrames(t, readAll(t, l), frames[start/5:])
	// Again: nothing more to delete.
	if n, err := l.EnforceRetention(); n != 0 || err != nil {
		t.Fatalf("second pass deleted %d, %v", n, err)
	}
	mustClose(t, l)

	// The rolling checksum survives reopen although segment 0 is gone.
	l = openFS(t, fsys, nil)
	defer l.Close()
	if l.StartOffset() != start || l.RollingChecksum() != rolling {
		t.Fatalf("after reopen start %d rolling %08x, want %d %08x", l.StartOffset(), l.RollingChecksum(), start, rolling)
	}
	// And keeps rolling identically to a log that never lost anything.
	ref := openFS(t, faultfs.New(), nil)
	defer ref.Close()
	for _, f := range frames {
		if err := ref.Append(f); err != nil {
			t.Fatal(err)
		}
	}
	more := encode(t, batch{epoch: 2, n: 4, ts: 5000}, 300)
	if err := l.Append(more); err != nil {
		t.Fatal(err)
	}
	if err := ref.Append(more); err != nil {
		t.Fatal(err)
	}
	if l.RollingChecksum() != ref.RollingChecksum() {
		t.Fatal("rolling checksum diverged after retention and reopen")
	}
}

func TestRetentionByTime(t *testing.T) {
	clock := &fakeClock{t: time.UnixMilli(1_000_000)}
	fsys := faultfs.New()
	l := openFS(t, fsys, func(o *partlog.Options) { o.RetentionTime = time.Hour; o.Now = clock.Now })
	defer l.Close()
	// Batches stamped 0..59 minutes after t0; each segment holds several.
	t0 := int64(1_000_000)
	var bs []batch
	for i := 0; i < 60; i++ {
		bs = append(bs, batch{epoch: 1, n: 5, ts: t0 + int64(i)*60_000, vsize: 50})
	}
	// One old-stamped batch late in the log: must not make its segment
	// expire early, since the segment also holds younger records.
	bs[40].ts = 0
	appendAll(t, l, bs)
	segsBefore := len(segments(t, fsys))

	tests := []struct {
		name       string
		now        int64 // ms
		wantDelete bool
	}{
		{"nothing older than an hour", t0 + 30*60_000, false},
		{"first half expired", t0 + 90*60_000, true},
		{"everything expired except the active", t0 + 1000*60_000, true},
	}
	for _, tc := range tests {
		clock.t = time.UnixMilli(tc.now)
		n, err := l.EnforceRetention()
		if err != nil {
			t.Fatal(err)
		}
		if (n > 0) != tc.wantDelete {
			t.Fatalf("%s: deleted %d", tc.name, n)
		}
		// No retained record is older than the cutoff unless its segment
		// holds a younger one; the first retained batch's segment has a
		// record >= cutoff.
		cutoff := tc.now - time.Hour.Milliseconds()
		start := l.StartOffset()
		segMax := int64(math.MinInt64)
		for _, b := range bs[start/5:] {
			segMax = max(segMax, b.ts+4)
		}
		if len(segments(t, fsys)) > 1 && segMax < cutoff {
			t.Fatalf("%s: retained data all older than cutoff", tc.name)
		}
	}
	if got := len(segments(t, fsys)); got != 1 || segsBefore < 3 {
		t.Fatalf("%d segments left of %d: the active one must stay", got, segsBefore)
	}
	if l.StartOffset() >= l.NextOffset() && l.NextOffset() != 300 {
		t.Fatal("active segment lost")
	}
}

func TestReopenAfterClose(t *testing.T) {
	dir := t.TempDir()
	opts := partlog.Options{Dir: dir, SegmentBytes: 8192, IndexIntervalBytes: 1024}
	l, err := partlog.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	bs := append(uniform(30, 4, 100, 1), uniform(30, 4, 100, 3)...)
	frames := appendAll(t, l, bs)
	next, rolling, epochs := l.NextOffset(), l.RollingChecksum(), l.Epochs()
	mustClose(t, l)
	if err := l.Append(frames[0]); !errors.Is(err, partlog.ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}

	l, err = partlog.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.NextOffset() != next || l.DurableOffset() != next || l.RollingChecksum() != rolling {
		t.Fatalf("reopened next %d durable %d rolling %08x", l.NextOffset(), l.DurableOffset(), l.RollingChecksum())
	}
	if got := l.Epochs(); len(got) != 2 || got[0] != epochs[0] || got[1] != epochs[1] {
		t.Fatalf("epochs %v, want %v", got, epochs)
	}
	if (l.Recovery() != partlog.RecoveryInfo{}) {
		t.Fatalf("clean reopen repaired something: %+v", l.Recovery())
	}
	equalFrames(t, readAll(t, l), frames)
	appendAll(t, l, uniform(3, 4, 100, 3))
}

func TestRollingChecksum(t *testing.T) {
	bs := append(uniform(20, 3, 40, 1), uniform(20, 3, 40, 2)...)
	build := func(segBytes int64, mutate func(i int, f []byte) []byte) *partlog.Log {
		l := openFS(t, faultfs.New(), func(o *partlog.Options) { o.SegmentBytes = segBytes })
		t.Cleanup(func() { l.Close() })
		for i, b := range bs {
			f := encode(t, b, l.NextOffset())
			if mutate != nil {
				f = mutate(i, f)
			}
			if err := l.Append(f); err != nil {
				t.Fatal(err)
			}
		}
		return l
	}
	a := build(4096, nil)
	if a.RollingChecksum() == 0 {
		t.Fatal("zero checksum for a non-empty log")
	}
	tests := []struct {
		name  string
		other *partlog.Log
		equal bool
	}{
		{"same frames, other segmenting", build(1<<20, nil), true},
		{"one value byte differs", build(4096, func(i int, f []byte) []byte {
			if i != 17 {
				return f
			}
			h, recs, _ := partlog.DecodeBatch(f)
			recs[1].Value = append([]byte{'x'}, recs[1].Value[1:]...)
			f, _ = partlog.AppendBatch(nil, h.Epoch, h.BaseOffset, recs)
			return f
		}), false},
		{"one epoch differs", build(4096, func(i int, f []byte) []byte {
			if i != 19 { // the last batch of epoch 1 becomes epoch 2
				return f
			}
			h, recs, _ := partlog.DecodeBatch(f)
			f, _ = partlog.AppendBatch(nil, h.Epoch+1, h.BaseOffset, recs)
			return f
		}), false},
	}
	for _, tc := range tests {
		if got := a.RollingChecksum() == tc.other.RollingChecksum(); got != tc.equal {
			t.Errorf("%s: equal = %v", tc.name, got)
		}
	}
	// A prefix differs from the whole.
	p := openFS(t, faultfs.New(), nil)
	defer p.Close()
	appendAll(t, p, bs[:39])
	if p.RollingChecksum() == a.RollingChecksum() {
		t.Fatal("prefix has the same checksum")
	}
}

func TestEpochEndOffset(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, func(o *partlog.Options) { o.RetentionBytes = 1 })
	defer l.Close()
	if got, err := l.EpochEndOffset(3); got != 0 || err != nil {
		t.Fatalf("empty log: %d %v", got, err)
	}
	// epochs: 2 at [0,50), 4 at [50,100), 7 at [100,150)
	appendAll(t, l, uniform(10, 5, 50, 2))
	appendAll(t, l, uniform(10, 5, 50, 4))
	appendAll(t, l, uniform(10, 5, 50, 7))
	tests := []struct {
		epoch uint64
		want  uint64
	}{{0, 0}, {1, 0}, {2, 50}, {3, 50}, {4, 100}, {6, 100}, {7, 150}, {100, 150}}
	for _, tc := range tests {
		if got, err := l.EpochEndOffset(tc.epoch); got != tc.want || err != nil {
			t.Errorf("EpochEndOffset(%d) = %d, %v; want %d", tc.epoch, got, err, tc.want)
		}
	}
	want := []partlog.EpochStart{{Epoch: 2, StartOffset: 0}, {Epoch: 4, StartOffset: 50}, {Epoch: 7, StartOffset: 100}}
	if got := l.Epochs(); len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("epochs %v", got)
	}

	// Truncate into epoch 4: epoch 7 disappears.
	if err := l.Truncate(75); err != nil {
		t.Fatal(err)
	}
	if got, _ := l.EpochEndOffset(4); got != 75 {
		t.Fatalf("after truncate EpochEndOffset(4) = %d", got)
	}
	appendAll(t, l, uniform(1, 5, 50, 9))
	if got, _ := l.EpochEndOffset(4); got != 75 {
		t.Fatalf("after epoch 9 EpochEndOffset(4) = %d", got)
	}

	// Retention deletes everything but the active segment: history before
	// StartOffset is unknown, so small epochs are out of range.
	if _, err := l.EnforceRetention(); err != nil {
		t.Fatal(err)
	}
	start := l.StartOffset()
	if start == 0 {
		t.Fatal("retention deleted nothing")
	}
	if _, err := l.EpochEndOffset(1); !errors.Is(err, partlog.ErrOutOfRange) {
		t.Fatalf("EpochEndOffset(1) after retention: %v", err)
	}
	if got, err := l.EpochEndOffset(9); got != l.NextOffset() || err != nil {
		t.Fatalf("EpochEndOffset(9) = %d, %v", got, err)
	}
	mustClose(t, l)
	l2 := openFS(t, fsys, nil)
	defer l2.Close()
	if got := l2.Epochs(); len(got) == 0 || got[len(got)-1].Epoch != 9 || got[len(got)-1].StartOffset != 75 {
		t.Fatalf("epochs after reopen %v", got)
	}
}

func TestTruncate(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	frames := appendAll(t, l, uniform(60, 5, 50, 1))
	nsegs := len(segments(t, fsys))
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		to   uint64
		want error
	}{
		{"inside a batch", 102, partlog.ErrNotBoundary},
		{"past the end", 301, partlog.ErrOutOfRange},
		{"at the end is a no-op", 300, nil},
	}
	for _, tc := range tests {
		if err := l.Truncate(tc.to); !errors.Is(err, tc.want) {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if l.NextOffset() != 300 {
			t.Fatalf("%s: log changed", tc.name)
		}
	}

	// Reference: a log holding only the first 20 batches.
	ref := openFS(t, faultfs.New(), nil)
	defer ref.Close()
	for _, f := range frames[:20] {
		if err := ref.Append(f); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Truncate(100); err != nil {
		t.Fatal(err)
	}
	if l.NextOffset() != 100 || l.DurableOffset() != 100 || l.RollingChecksum() != ref.RollingChecksum() {
		t.Fatalf("after truncate next %d durable %d rolling %08x want %08x",
			l.NextOffset(), l.DurableOffset(), l.RollingChecksum(), ref.RollingChecksum())
	}
	if got := len(segments(t, fsys)); got >= nsegs {
		t.Fatalf("later segments not deleted: %d of %d", got, nsegs)
	}
	equalFrames(t, readAll(t, l), frames[:20])

	// Durable: survives a crash that keeps nothing unsynced.
	fsys.Crash(faultfs.CrashOptions{})
	l = openFS(t, fsys, nil)
	if l.NextOffset() != 100 || l.RollingChecksum() != ref.RollingChecksum() {
		t.Fatalf("after crash next %d", l.NextOffset())
	}
	// Appending continues from the cut, in a differently-numbered future.
	more := appendAll(t, l, uniform(3, 5, 50, 2))
	equalFrames(t, readAll(t, l), append(frames[:20:20], more...))
	// To the start of the log.
	if err := l.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if l.NextOffset() != 0 || l.RollingChecksum() != 0 || len(l.Epochs()) != 0 {
		t.Fatalf("truncate to 0: next %d rolling %08x", l.NextOffset(), l.RollingChecksum())
	}
	mustClose(t, l)
	l = openFS(t, fsys, nil)
	defer l.Close()
	if l.NextOffset() != 0 || len(segments(t, fsys)) != 1 {
		t.Fatalf("reopen after truncate to 0: next %d, %d segments", l.NextOffset(), len(segments(t, fsys)))
	}
}

func TestTruncateBelowStart(t *testing.T) {
	l := openFS(t, faultfs.New(), func(o *partlog.Options) { o.RetentionBytes = 5000 })
	defer l.Close()
	appendAll(t, l, uniform(60, 5, 50, 1))
	if _, err := l.EnforceRetention(); err != nil {
		t.Fatal(err)
	}
	start := l.StartOffset()
	if err := l.Truncate(start - 5); !errors.Is(err, partlog.ErrOutOfRange) {
		t.Fatalf("truncate below start: %v", err)
	}
	if err := l.Truncate(start); err != nil {
		t.Fatal(err)
	}
	if l.NextOffset() != start || l.StartOffset() != start {
		t.Fatalf("[%d,%d)", l.StartOffset(), l.NextOffset())
	}
	appendAll(t, l, uniform(2, 5, 50, 1))
}

// Readers run concurrently with the writer (and retention) under -race;
// they must only ever see whole, contiguous, CRC-valid frames.
func TestConcurrentReaders(t *testing.T) {
	l := openFS(t, faultfs.New(), func(o *partlog.Options) { o.RetentionBytes = 20_000 })
	defer l.Close()
	const batches = 300
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				start, next := l.StartOffset(), l.NextOffset()
				frames, err := l.ReadFrames(start, next, 8192)
				if errors.Is(err, partlog.ErrOutOfRange) {
					continue // retention moved the start
				}
				if err != nil {
					errs <- err
					return
				}
				expect := uint64(0)
				for i, f := range frames {
					h, _, err := partlog.DecodeBatch(f)
					if err != nil || (i > 0 && h.BaseOffset != expect) {
						errs <- errors.New("reader saw a bad or non-contiguous frame")
						return
					}
					expect = h.End()
				}
				if _, err := l.OffsetForTime(2000); err != nil && !errors.Is(err, partlog.ErrOutOfRange) {
					errs <- err
					return
				}
				_ = l.DurableOffset()
				_ = l.RollingChecksum()
			}
		}()
	}
	for i := 0; i < batches; i++ {
		appendAll(t, l, []batch{{epoch: 1, n: 5, ts: int64(i), vsize: 50}})
		if i%3 == 0 {
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
		}
		if i%50 == 0 {
			if _, err := l.EnforceRetention(); err != nil {
				t.Fatal(err)
			}
		}
	}
	close(done)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

// Sync may run concurrently with Append (pipelined group commit).
func TestSyncConcurrentWithAppend(t *testing.T) {
	l := openFS(t, faultfs.New(), nil)
	defer l.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	stop := make(chan struct{})
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				if err := l.Sync(); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	appendAll(t, l, uniform(200, 5, 50, 1))
	close(stop)
	wg.Wait()
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if l.DurableOffset() != l.NextOffset() {
		t.Fatalf("durable %d next %d", l.DurableOffset(), l.NextOffset())
	}
}

func TestOptionsValidation(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*partlog.Options)
	}{
		{"no dir", func(o *partlog.Options) { o.Dir = "" }},
		{"segment too small", func(o *partlog.Options) { o.SegmentBytes = 10 }},
		{"segment too large", func(o *partlog.Options) { o.SegmentBytes = partlog.MaxSegmentBytes + 1 }},
		{"negative retention", func(o *partlog.Options) { o.RetentionBytes = -1 }},
	}
	for _, tc := range tests {
		if _, err := partlog.Open(options(faultfs.New(), tc.mod)); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
}

// TestSyncDropsCachedPages: after an fsync the log leaves only the last
// 32 MiB of its segment in the page cache, and everything still reads
// back (from the file).
func TestSyncDropsCachedPages(t *testing.T) {
	dir := t.TempDir()
	// Segments smaller than the cached tail, so that rolls leave sealed
	// segments partly cached for later Syncs to drop.
	l, err := partlog.Open(partlog.Options{Dir: dir, FS: partlog.OSFS{}, SegmentBytes: 20 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer mustClose(t, l)
	var frames [][]byte
	write := func(n int) { // n MiB in 1 MiB frames, synced as it goes
		for range n {
			frames = append(frames, appendAll(t, l, uniform(1, 1024, 1000, 1))...)
			if err := l.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(72)
	// A truncation far behind the end, and the log written again over it:
	// those pages are new in the cache, and must be dropped again too.
	if err := l.Truncate(30 * 1024); err != nil {
		t.Fatal(err)
	}
	frames = frames[:30]
	write(60)

	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		// tmpfs pages are the file itself: nothing to drop, but it must
		// all still read back.
		equalFrames(t, readAll(t, l), frames)
		return
	}
	segs, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil || len(segs) < 4 {
		t.Fatalf("segments %v (%v), want at least four", segs, err)
	}
	// Every page more than 33 MiB behind the log's end must be dropped, in
	// whichever segment it is.
	var sizes []int64
	var total int64
	for _, seg := range segs {
		st, err := os.Stat(seg)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, st.Size())
		total += st.Size()
	}
	behind, resident := 0, 0
	var at int64
	for i, seg := range segs {
		cached := residentPages(t, seg)
		for p, in := range cached {
			if at+int64(p+1)*4096 <= total-33<<20 {
				behind++
				resident += int(in & 1)
			}
		}
		at += sizes[i]
	}
	// Advice, not a promise: a page or two in another CPU's batch may stay.
	if behind == 0 || resident > behind/64 {
		t.Errorf("%d of the %d pages more than 32 MiB behind the end are still cached", resident, behind)
	}
	equalFrames(t, readAll(t, l), frames)
}

// residentPages reports, for each page of the file at path, whether the
// page cache holds it (mincore).
func residentPages(t *testing.T, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Munmap(m) }()
	vec := make([]byte, (len(m)+4095)/4096)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	return vec
}

// TestReadingHistoryReadsOnlyWhatItAsks: a read of history (frames no
// longer in the page cache, as a replacement copying the log or a
// consumer replaying it reads them) brings in what it asks for and no
// more. The kernel's read-ahead would make each such read a request of up
// to read_ahead_kb (8 MiB on the VMs Catena is measured on) that the
// chain's fsyncs on the same disk queue behind. Both a segment the log
// created and one it recovered on Open are checked.
func TestReadingHistoryReadsOnlyWhatItAsks(t *testing.T) {
	dir := t.TempDir()
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type == unix.TMPFS_MAGIC {
		t.Skip("tmpfs: a file's pages are the file, there is no read-ahead to see")
	}
	l, err := partlog.Open(partlog.Options{Dir: dir, FS: partlog.OSFS{}})
	if err != nil {
		t.Fatal(err)
	}
	frames := appendAll(t, l, uniform(256, 64, 1000, 1)) // 256 frames of ~64 KiB: ~16 MiB
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	segs, err := filepath.Glob(filepath.Join(dir, "*.seg"))
	if err != nil || len(segs) != 1 {
		t.Fatalf("segments %v (%v), want one", segs, err)
	}
	const maxBytes = 256 << 10
	check := func(l *partlog.Log, what string) {
		t.Helper()
		dropPages(t, segs[0])
		if n := countResident(residentPages(t, segs[0]), 0); n > 0 {
			t.Skipf("%d pages stay cached after POSIX_FADV_DONTNEED: this file system keeps them", n)
		}
		// Four reads one after the other from the start, as a copy makes.
		var got [][]byte
		var pos int64 // where the last read began
		for range 4 {
			fr, err := l.ReadFrames(uint64(len(got))*64, l.NextOffset(), maxBytes)
			if err != nil || len(fr) == 0 {
				t.Fatalf("%s: read from frame %d: %d frames, %v", what, len(got), len(fr), err)
			}
			pos = int64(partlog.SegmentHeaderSize)
			for _, f := range got {
				pos += int64(len(f))
			}
			got = append(got, fr...)
		}
		equalFrames(t, got, frames[:len(got)])
		// The last read asked for maxBytes from pos. The page cache fills
		// whole folios, so a few pages past that may come in; the
		// read-ahead brings in MiBs.
		limit := (pos + 2*maxBytes) / 4096
		if n := countResident(residentPages(t, segs[0]), int(limit)); n > 0 {
			t.Errorf("%s: %d pages past the %d KiB read are cached: the kernel read ahead", what, n, (pos+maxBytes)>>10)
		}
	}
	check(l, "a segment the log created")
	mustClose(t, l)
	l, err = partlog.Open(partlog.Options{Dir: dir, FS: partlog.OSFS{}})
	if err != nil {
		t.Fatal(err)
	}
	defer mustClose(t, l)
	check(l, "a segment recovered on Open")
}

// TestAReadAsksTheDiskInPieces: one large read of the log is several
// preads of at most 256 KiB, so that an fsync on the same disk waits behind
// one piece, not behind a whole MiBs-long read.
func TestAReadAsksTheDiskInPieces(t *testing.T) {
	fsys := &pieceFS{FS: faultfs.New()}
	l := openFS(t, fsys, func(o *partlog.Options) { o.SegmentBytes = 64 << 20 })
	defer mustClose(t, l)
	frames := appendAll(t, l, uniform(64, 64, 1000, 1)) // ~4 MiB
	got, err := l.ReadFrames(0, l.NextOffset(), 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	equalFrames(t, got, frames)
	if fsys.largest.Load() == 0 || fsys.largest.Load() > 256<<10 {
		t.Errorf("the largest pread asked for %d bytes, want at most 256 KiB", fsys.largest.Load())
	}
}

// pieceFS records the largest ReadAt of its files.
type pieceFS struct {
	*faultfs.FS
	largest atomic.Int64
}

func (p *pieceFS) OpenFile(name string, flag int, perm os.FileMode) (partlog.File, error) {
	f, err := p.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &pieceFile{File: f, fs: p}, nil
}

type pieceFile struct {
	partlog.File
	fs *pieceFS
}

func (f *pieceFile) ReadAt(b []byte, off int64) (int, error) {
	for n := int64(len(b)); ; {
		old := f.fs.largest.Load()
		if n <= old || f.fs.largest.CompareAndSwap(old, n) {
			break
		}
	}
	return f.File.ReadAt(b, off)
}

// dropPages drops the file's clean pages from the page cache.
func dropPages(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
}

// countResident counts the resident pages of vec (residentPages) from
// page from on.
func countResident(vec []byte, from int) int {
	n := 0
	for _, v := range vec[min(from, len(vec)):] {
		n += int(v & 1)
	}
	return n
}

// A copy that ends below its source's log start resets to start there, with
// the source's rolling checksum, and then holds exactly what the source
// does; every crash point of the reset leaves a log that opens.
func TestReset(t *testing.T) {
	src := openFS(t, faultfs.New(), func(o *partlog.Options) { o.RetentionBytes = 5000 })
	defer src.Close()
	frames := appendAll(t, src, uniform(60, 5, 50, 1))
	if _, err := src.EnforceRetention(); err != nil {
		t.Fatal(err)
	}
	start, sum := src.StartOffset(), src.StartChecksum()
	if start <= 50 {
		t.Fatalf("setup: the source starts at %d", start)
	}
	kept := frames[start/5:]

	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	appendAll(t, l, uniform(10, 5, 50, 1)) // [0,50), several segments
	if err := l.Reset(50, 0); !errors.Is(err, partlog.ErrOutOfRange) {
		t.Fatalf("reset at the log end: %v, want ErrOutOfRange", err)
	}
	if err := l.Reset(start, sum); err != nil {
		t.Fatal(err)
	}
	if l.StartOffset() != start || l.NextOffset() != start || l.DurableOffset() != start || l.RollingChecksum() != sum || len(l.Epochs()) != 0 {
		t.Fatalf("after reset: [%d,%d) durable %d rolling %08x epochs %v", l.StartOffset(), l.NextOffset(), l.DurableOffset(), l.RollingChecksum(), l.Epochs())
	}
	for _, f := range kept {
		if err := l.Append(f); err != nil {
			t.Fatal(err)
		}
	}
	if l.RollingChecksum() != src.RollingChecksum() {
		t.Fatalf("rolling checksum %08x, source %08x", l.RollingChecksum(), src.RollingChecksum())
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	fsys.Crash(faultfs.CrashOptions{})
	l = openFS(t, fsys, nil)
	if l.StartOffset() != start || l.RollingChecksum() != src.RollingChecksum() {
		t.Fatalf("reopened: [%d,%d) rolling %08x", l.StartOffset(), l.NextOffset(), l.RollingChecksum())
	}
	equalFrames(t, readAll(t, l), kept)
	mustClose(t, l)

	// A crash at each fsync of a reset.
	for k := 0; ; k++ {
		fsys := faultfs.New()
		l := openFS(t, fsys, nil)
		appendAll(t, l, uniform(10, 5, 50, 1))
		if err := l.Sync(); err != nil {
			t.Fatal(err)
		}
		fsys.FailSyncs(k, 1, errors.New("injected"))
		err := l.Reset(start, sum)
		fsys.ClearFaults()
		fsys.Crash(faultfs.CrashOptions{})
		l, oerr := partlog.Open(options(fsys, nil))
		if oerr != nil {
			t.Fatalf("crash at fsync %d of a reset: reopen: %v", k, oerr)
		}
		if s := l.StartOffset(); s != 0 && s != start {
			t.Fatalf("crash at fsync %d of a reset: the log starts at %d", k, s)
		}
		if l.StartOffset() == start && l.RollingChecksum() != sum {
			t.Fatalf("crash at fsync %d of a reset: rolling %08x", k, l.RollingChecksum())
		}
		mustClose(t, l)
		if err == nil {
			break
		}
	}
}
