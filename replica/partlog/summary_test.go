package partlog_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
)

// removeSummaries deletes the sealed segments' summaries under testDir,
// so that Open scans every frame.
func removeSummaries(t testing.TB, fsys *faultfs.FS) {
	t.Helper()
	names, err := fsys.ReadDir(testDir)
	must(t, err)
	for _, n := range names {
		if strings.HasSuffix(n, ".seg.sum") {
			must(t, fsys.Remove(filepath.Join(testDir, n)))
		}
	}
}

func summaries(t testing.TB, fsys *faultfs.FS) []string {
	t.Helper()
	names, err := fsys.ReadDir(testDir)
	must(t, err)
	var out []string
	for _, n := range names {
		if strings.HasSuffix(n, ".sum") {
			out = append(out, n)
		}
	}
	return out
}

// logState is what a log opened from summaries must have as a scan of
// every frame gives it.
type logState struct {
	start, next uint64
	rolling     uint32
	epochs      []partlog.EpochStart
	bytes       int64
	segments    int
	byTime      []uint64 // the first offset at or after each of a few timestamps
}

func stateOf(t *testing.T, l *partlog.Log) logState {
	t.Helper()
	bytes, segs := l.Usage()
	st := logState{start: l.StartOffset(), next: l.NextOffset(), rolling: l.RollingChecksum(), epochs: l.Epochs(), bytes: bytes, segments: segs}
	for _, ts := range []int64{0, 1000, 1050, 1100, 1180, 99999} {
		off, err := l.OffsetForTime(ts)
		must(t, err)
		st.byTime = append(st.byTime, off)
	}
	return st
}

func sameState(a, b logState) bool {
	return a.start == b.start && a.next == b.next && a.rolling == b.rolling && slices.Equal(a.epochs, b.epochs) &&
		a.bytes == b.bytes && a.segments == b.segments && slices.Equal(a.byTime, b.byTime)
}

// A sealed segment's summary gives Open what a scan of its frames gives:
// offsets, rolling checksum, epochs, sizes, the index its reads and
// lookups by time use; and an Open without summaries (a log written before
// them) writes them for the next.
func TestASealedSegmentOpensFromItsSummary(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	var frames [][]byte
	for epoch := uint64(1); epoch <= 4; epoch++ {
		frames = append(frames, appendAll(t, l, uniformEpoch(12, 5, 50, epoch, 1000+int64(epoch-1)*60))...)
	}
	want := stateOf(t, l)
	mustClose(t, l)
	segs := segments(t, fsys)
	if got := summaries(t, fsys); len(segs) < 4 || len(got) != len(segs)-1 {
		t.Fatalf("%d segments, summaries %v: every sealed one should have one", len(segs), got)
	}

	for _, how := range []string{"from summaries", "scanned", "from the summaries the scan wrote"} {
		if how == "scanned" {
			removeSummaries(t, fsys)
		}
		l = openFS(t, fsys, nil)
		if got := stateOf(t, l); !sameState(got, want) {
			t.Fatalf("opened %s: %+v, want %+v", how, got, want)
		}
		equalFrames(t, readAll(t, l), frames)
		mustClose(t, l)
		if got := summaries(t, fsys); len(got) != len(segs)-1 {
			t.Fatalf("opened %s: summaries %v", how, got)
		}
	}
}

// A summary that does not describe its segment's file is not used: the
// segment is scanned (and the summary written again).
func TestASummaryOfOtherContentsIsNotUsed(t *testing.T) {
	tests := map[string]func(t *testing.T, fsys *faultfs.FS, seg string){
		"damaged": func(t *testing.T, fsys *faultfs.FS, seg string) {
			b, err := fsys.ReadFile(seg + ".sum")
			must(t, err)
			b[30] ^= 0x5A
			writeFile(t, fsys, seg+".sum", b)
		},
		"short": func(t *testing.T, fsys *faultfs.FS, seg string) {
			f, err := fsys.OpenFile(seg+".sum", os.O_RDWR, 0)
			must(t, err)
			must(t, f.Truncate(40))
			must(t, f.Close())
		},
		"empty": func(t *testing.T, fsys *faultfs.FS, seg string) {
			f, err := fsys.OpenFile(seg+".sum", os.O_RDWR, 0)
			must(t, err)
			must(t, f.Truncate(0))
			must(t, f.Close())
		},
		"another segment's": func(t *testing.T, fsys *faultfs.FS, seg string) {
			segs := segments(t, fsys)
			other, err := fsys.ReadFile(segs[0] + ".sum")
			must(t, err)
			writeFile(t, fsys, seg+".sum", other)
		},
		// The same name, the same first segment (so the same rolling
		// checksum in this one's header), the same sizes, other frames:
		// a log cut here and written again differently, summarised.
		"another log's": func(t *testing.T, fsys *faultfs.FS, seg string) {
			other := faultfs.New()
			l := openFS(t, other, nil)
			first := len(framePositions(t, fsys, segments(t, fsys)[0]))
			appendAll(t, l, uniformEpoch(first, 5, 50, 1, 1000))
			appendAll(t, l, uniformEpoch(40-first, 5, 50, 1, 7000))
			mustClose(t, l)
			if a, b := segments(t, fsys), segments(t, other); !slices.Equal(a, b) {
				t.Fatalf("setup: segments %v and %v", a, b)
			}
			b, err := other.ReadFile(seg + ".sum")
			must(t, err)
			writeFile(t, fsys, seg+".sum", b)
		},
	}
	for name, spoil := range tests {
		t.Run(name, func(t *testing.T) {
			fsys := faultfs.New()
			l := openFS(t, fsys, nil)
			frames := appendAll(t, l, uniformEpoch(40, 5, 50, 1, 1000))
			want := stateOf(t, l)
			mustClose(t, l)
			segs := segments(t, fsys)
			spoil(t, fsys, segs[1])
			l = openFS(t, fsys, nil)
			defer l.Close()
			if got := stateOf(t, l); !sameState(got, want) {
				t.Fatalf("opened: %+v, want %+v", got, want)
			}
			equalFrames(t, readAll(t, l), frames)
		})
	}
}

// What Open no longer checks when summaries spare it the scan: a sealed
// segment damaged after it was sealed opens, and the first read of the
// damaged frame fails as corrupt (the replica then stops serving the
// partition and the chain repairs it).
func TestADamagedSealedSegmentFailsItsReads(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	frames := appendAll(t, l, uniform(40, 5, 50, 1))
	mustClose(t, l)
	segs := segments(t, fsys)
	p := framePositions(t, fsys, segs[0])
	must(t, fsys.Corrupt(segs[0], p[1]+60, []byte{0xFF}))

	l = openFS(t, fsys, nil)
	defer l.Close()
	// The segments after it read whole.
	next, err := partlog.DecodeHeader(frames[len(framePositions(t, fsys, segs[0]))])
	must(t, err)
	got, err := l.ReadFrames(next.BaseOffset, l.NextOffset(), 1<<30)
	if err != nil || len(got) == 0 {
		t.Fatalf("read past the damaged segment: %d frames, %v", len(got), err)
	}
	equalFrames(t, got, frames[len(frames)-len(got):])
	// The damaged frame's read finds it; from then on the log refuses
	// every call, as a log that failed a check at Open would have.
	h1, err := partlog.DecodeHeader(frames[1])
	must(t, err)
	if _, err := l.ReadFrames(h1.BaseOffset, h1.End(), 1<<20); !errors.Is(err, partlog.ErrCorrupt) {
		t.Fatalf("read of the damaged frame: %v, want ErrCorrupt", err)
	}
	if _, err := l.ReadFrames(next.BaseOffset, l.NextOffset(), 1<<30); !errors.Is(err, partlog.ErrCorrupt) {
		t.Fatalf("read after the damage was found: %v, want ErrCorrupt", err)
	}
}

// Retention, truncation and a reset remove the summaries of the segments
// they remove; a summary left without its segment (a crash between the
// two removals) is removed by Open.
func TestSummariesGoWithTheirSegments(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	frames := appendAll(t, l, uniform(60, 5, 50, 1))
	segs := segments(t, fsys)
	check := func(when string) {
		t.Helper()
		segs := segments(t, fsys)
		sums := summaries(t, fsys)
		if len(sums) != len(segs)-1 {
			t.Fatalf("%s: segments %v, summaries %v", when, segs, sums)
		}
		for i, s := range sums {
			if filepath.Join(testDir, s) != segs[i]+".sum" {
				t.Fatalf("%s: summary %s, segments %v", when, s, segs)
			}
		}
	}
	check("written")

	h, err := partlog.DecodeHeader(frames[len(frames)/2])
	must(t, err)
	must(t, l.Truncate(h.BaseOffset))
	check("truncated")

	must(t, l.SetLimits(partlog.Limits{SegmentBytes: 4096, RetentionBytes: 9000}))
	if n, err := l.EnforceRetention(); err != nil || n == 0 {
		t.Fatalf("retention deleted %d segments: %v", n, err)
	}
	check("retained")
	mustClose(t, l)

	writeFile(t, fsys, segs[0]+".sum", []byte("left by a crash"))
	writeFile(t, fsys, filepath.Join(testDir, "00000000000000000007.seg.sum.tmp"), []byte("torn"))
	l = openFS(t, fsys, nil)
	check("reopened")
	must(t, l.Reset(l.NextOffset()+100, 0))
	if sums := summaries(t, fsys); len(sums) != 0 {
		t.Fatalf("after a reset: summaries %v", sums)
	}
	mustClose(t, l)
}

// uniformEpoch is uniform at epoch, its timestamps from ts.
func uniformEpoch(n, recs, vsize int, epoch uint64, ts int64) []batch {
	bs := uniform(n, recs, vsize, epoch)
	for i := range bs {
		bs[i].ts = ts + int64(i)
	}
	return bs
}

func writeFile(t testing.TB, fsys *faultfs.FS, path string, b []byte) {
	t.Helper()
	f, err := fsys.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	must(t, err)
	_, err = f.WriteAt(b, 0)
	must(t, err)
	must(t, f.Close())
}

// VerifySealed reads what Open took from summaries, once: a clean log
// verifies (every sealed segment's bytes read, paced), and again reads
// nothing.
func TestVerifySealedReadsWhatOpenTookOnTrust(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	appendAll(t, l, uniform(40, 5, 50, 1))
	mustClose(t, l)
	segs := segments(t, fsys)
	var sealed int
	for _, s := range segs[:len(segs)-1] {
		b, err := fsys.ReadFile(s)
		must(t, err)
		sealed += len(b) - partlog.SegmentHeaderSize // its frames: what is read
	}

	l = openFS(t, fsys, nil)
	defer l.Close()
	paced := 0
	pace := func(_ context.Context, n int) error { paced += n; return nil }
	must(t, l.VerifySealed(context.Background(), pace))
	if paced != sealed {
		t.Fatalf("paced %d bytes, the sealed segments hold %d bytes of frames", paced, sealed)
	}
	paced = 0
	must(t, l.VerifySealed(context.Background(), pace))
	if paced != 0 {
		t.Fatalf("verified again: %d bytes paced", paced)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l2 := openFS(t, faultfs.New(), nil) // nothing to verify: no error even so
	defer l2.Close()
	must(t, l2.VerifySealed(ctx, nil))
}

// sealedDamages damage segment file seg, whose frames are frames (from
// its first on): a frame that fails its CRC, and a frame replaced by
// another valid one of the same size (only the rolling checksum tells).
var sealedDamages = map[string]func(t *testing.T, fsys *faultfs.FS, seg string, frames [][]byte){
	"bit flip": func(t *testing.T, fsys *faultfs.FS, seg string, _ [][]byte) {
		p := framePositions(t, fsys, seg)
		must(t, fsys.Corrupt(seg, p[1]+60, []byte{0xFF}))
	},
	"another valid frame": func(t *testing.T, fsys *faultfs.FS, seg string, frames [][]byte) {
		p := framePositions(t, fsys, seg)
		h, err := partlog.DecodeHeader(frames[2])
		must(t, err)
		other := encode(t, batch{epoch: 1, n: 5, ts: 77777, vsize: 50}, h.BaseOffset)
		if len(other) != len(frames[2]) {
			t.Fatalf("setup: %d bytes replace %d", len(other), len(frames[2]))
		}
		must(t, fsys.Corrupt(seg, p[2], other))
	},
}

// Damage a summary hid from Open is found by VerifySealed (sealedDamages).
func TestVerifySealedFindsDamage(t *testing.T) {
	for name, damage := range sealedDamages {
		t.Run(name, func(t *testing.T) {
			fsys := faultfs.New()
			l := openFS(t, fsys, nil)
			frames := appendAll(t, l, uniform(40, 5, 50, 1))
			mustClose(t, l)
			damage(t, fsys, segments(t, fsys)[0], frames)
			l = openFS(t, fsys, nil) // the summary hides it
			defer l.Close()
			err := l.VerifySealed(context.Background(), nil)
			if !errors.Is(err, partlog.ErrCorrupt) || !strings.Contains(err.Error(), segments(t, fsys)[0]) {
				t.Fatalf("VerifySealed: %v, want ErrCorrupt naming the segment", err)
			}
			if _, err := l.ReadFrames(l.StartOffset(), l.NextOffset(), 1<<30); !errors.Is(err, partlog.ErrCorrupt) {
				t.Fatalf("read after: %v, want ErrCorrupt", err)
			}
		})
	}
}

// A truncation into a segment opened from its summary leaves nothing for
// VerifySealed to call damage: the cut rebuilt the segment's state from
// the frames it kept.
func TestVerifySealedAfterATruncationIntoASegment(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	frames := appendAll(t, l, uniform(40, 5, 50, 1))
	mustClose(t, l)
	l = openFS(t, fsys, nil)
	defer l.Close()
	h, err := partlog.DecodeHeader(frames[len(framePositions(t, fsys, segments(t, fsys)[0]))+3])
	must(t, err)
	must(t, l.Truncate(h.BaseOffset)) // inside the second segment
	must(t, l.VerifySealed(context.Background(), nil))
	equalFrames(t, readAll(t, l), frames[:len(framePositions(t, fsys, segments(t, fsys)[0]))+3])
}

// A truncation into a segment opened from its summary, not verified yet,
// reads the whole segment and holds its rolling checksum against the
// summary's: a frame replaced by another valid one, below the cut or past
// it, fails the log as corrupt instead of being kept.
func TestATruncationIntoAnUnverifiedSegmentChecksIt(t *testing.T) {
	for _, replaced := range []int{1, 6} {
		fsys := faultfs.New()
		l := openFS(t, fsys, nil)
		frames := appendAll(t, l, uniform(40, 5, 50, 1))
		mustClose(t, l)
		segs := segments(t, fsys)
		first := len(framePositions(t, fsys, segs[0]))
		p := framePositions(t, fsys, segs[1])
		h, err := partlog.DecodeHeader(frames[first+replaced])
		must(t, err)
		other := encode(t, batch{epoch: 1, n: 5, ts: 77777, vsize: 50}, h.BaseOffset)
		must(t, fsys.Corrupt(segs[1], p[replaced], other))

		l = openFS(t, fsys, nil)
		cut, err := partlog.DecodeHeader(frames[first+3])
		must(t, err)
		if err := l.Truncate(cut.BaseOffset); !errors.Is(err, partlog.ErrCorrupt) {
			t.Fatalf("frame %d of the segment replaced, truncation at its frame 3: %v, want ErrCorrupt", replaced, err)
		}
		_ = l.Close() // failed: Close says so
	}
}

// A verified segment's summary says so: the next Open leaves it verified,
// and a file that only ends like a summary is none of the log's.
func TestAVerifiedSegmentStaysVerified(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	appendAll(t, l, uniform(40, 5, 50, 1))
	mustClose(t, l)
	writeFile(t, fsys, filepath.Join(testDir, "notes.sum"), []byte("a stranger"))
	l = openFS(t, fsys, nil)
	must(t, l.VerifySealed(context.Background(), nil))
	mustClose(t, l)
	l = openFS(t, fsys, nil)
	defer l.Close()
	paced := 0
	must(t, l.VerifySealed(context.Background(), func(context.Context, int) error { paced++; return nil }))
	if paced != 0 {
		t.Fatalf("verified again after a restart: %d reads", paced)
	}
	if _, err := fsys.ReadFile(filepath.Join(testDir, "notes.sum")); err != nil {
		t.Fatalf("a stranger's file: %v", err)
	}
}
