package partlog_test

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
)

// A scrub reads every sealed segment back and finds damage that nothing
// read yet (sealedDamages): in segments this process wrote and sealed,
// and in segments a restart opened from summaries marked verified (which
// VerifySealed does not read again). A frame replaced by another valid
// one shows only against the next segment's rolling checksum.
func TestScrubFindsDamageNothingReadYet(t *testing.T) {
	for name, damage := range sealedDamages {
		for _, reopened := range []bool{false, true} {
			t.Run(fmtBool(name, reopened, "reopened from verified summaries"), func(t *testing.T) {
				ctx := context.Background()
				fsys := faultfs.New()
				l := openFS(t, fsys, nil)
				frames := appendAll(t, l, uniform(40, 5, 50, 1))
				if reopened {
					mustClose(t, l)
					l = openFS(t, fsys, nil)
					must(t, l.VerifySealed(ctx, nil))
					mustClose(t, l)
					l = openFS(t, fsys, nil)
					if n := l.Unverified(); n != 0 {
						t.Fatalf("setup: %d segments unverified", n)
					}
				}
				defer l.Close()
				segs := segments(t, fsys)
				if len(segs) < 4 {
					t.Fatalf("setup: %d segments", len(segs))
				}
				// Frames of the second segment, from its first offset on.
				h, err := partlog.DecodeHeader(readSegmentFrame(t, fsys, segs[1]))
				must(t, err)
				damage(t, fsys, segs[1], frames[h.BaseOffset/5:])
				must(t, l.VerifySealed(ctx, nil)) // nothing for it to read
				_, err = l.Scrub(ctx, 0, nil)
				if !errors.Is(err, partlog.ErrCorrupt) || !strings.Contains(err.Error(), segs[1]) {
					t.Fatalf("Scrub: %v, want ErrCorrupt naming %s", err, segs[1])
				}
				if err := l.Append(encode(t, batch{epoch: 1, n: 1, ts: 5000}, l.NextOffset())); !errors.Is(err, partlog.ErrCorrupt) {
					t.Fatalf("append after the scrub found damage: %v, want ErrCorrupt", err)
				}
			})
		}
	}
}

// A scrub of an undamaged log changes nothing and says how far it got; a
// read that fails (EIO) is not damage: the scrub stops there and resumes
// from the segment it failed in.
func TestScrubResumesAfterAReadThatFails(t *testing.T) {
	ctx := context.Background()
	fsys := faultfs.New()
	l := openFS(t, fsys, nil)
	defer l.Close()
	appendAll(t, l, uniform(40, 5, 50, 1))
	segs := segments(t, fsys)
	ends := make([]uint64, len(segs)-1) // each sealed segment's end: the next one's first offset
	for i := range ends {
		h, err := partlog.DecodeHeader(readSegmentFrame(t, fsys, segs[i+1]))
		must(t, err)
		ends[i] = h.BaseOffset
	}
	fsys.FailReadsIn(segs[2], 0, 1<<20, 1, syscall.EIO)
	got, err := l.Scrub(ctx, 0, nil)
	if !errors.Is(err, syscall.EIO) || errors.Is(err, partlog.ErrCorrupt) || got != ends[1] {
		t.Fatalf("Scrub over a failing read: %d, %v; want %d and the read's error", got, err, ends[1])
	}
	got, err = l.Scrub(ctx, got, nil)
	if err != nil || got != ends[len(ends)-1] {
		t.Fatalf("Scrub resumed: %d, %v; want %d, nil", got, err, ends[len(ends)-1])
	}
	if got, err := l.Scrub(ctx, got, nil); err != nil || got != ends[len(ends)-1] {
		t.Fatalf("Scrub with nothing left: %d, %v", got, err)
	}
	if err := l.Append(encode(t, batch{epoch: 1, n: 1, ts: 5000}, l.NextOffset())); err != nil {
		t.Fatalf("append after scrubs: %v", err)
	}
}

func fmtBool(name string, b bool, what string) string {
	if b {
		return name + ", " + what
	}
	return name
}

// readSegmentFrame is the first frame of segment file seg.
func readSegmentFrame(t *testing.T, fsys *faultfs.FS, seg string) []byte {
	t.Helper()
	b, err := fsys.ReadFile(seg)
	must(t, err)
	h, err := partlog.DecodeHeader(b[partlog.SegmentHeaderSize:])
	must(t, err)
	return b[partlog.SegmentHeaderSize : partlog.SegmentHeaderSize+int(h.FrameLen)]
}
