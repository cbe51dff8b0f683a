package partlog

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// spoiledLog writes a log of 40 one-record batches in segments of
// segmentBytes (the epoch going up every epochEvery batches: 0, never),
// closes it, changes the first segment's summary with change and opens it
// again. It returns the log as opened and its end and rolling checksum as
// written.
func spoiledLog(t *testing.T, segmentBytes int64, epochEvery int, change func(*summary)) (l *Log, next uint64, rolling uint32) {
	t.Helper()
	dir := t.TempDir()
	opts := Options{Dir: dir, SegmentBytes: segmentBytes, IndexIntervalBytes: 256}
	l, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		epoch := uint64(1)
		if epochEvery > 0 {
			epoch += uint64(i / epochEvery)
		}
		f, err := AppendBatch(nil, epoch, l.NextOffset(), []Record{{TimestampMs: int64(1000 + i), Key: []byte("k"), Value: make([]byte, 300)}})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Append(f); err != nil {
			t.Fatal(err)
		}
	}
	next, rolling = l.NextOffset(), l.RollingChecksum()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	path := summaryPath(filepath.Join(dir, segmentName(0)))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := decodeSummary(b)
	if err != nil || len(sum.index) < 2 || (epochEvery > 0 && len(sum.epochs) < 2) {
		t.Fatalf("setup: %+v, %v", sum, err)
	}
	change(&sum)
	if err := os.WriteFile(path, encodeSummary(sum), 0o644); err != nil {
		t.Fatal(err)
	}
	if l, err = Open(opts); err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, next, rolling
}

// A summary that checks whole and names its segment's file, but whose end
// state does not lead to the next segment (its rolling checksum at end) or
// whose epochs go back, is not adopted: the segment is scanned, which
// gives the log as it is.
func TestASummaryThatDoesNotLeadOnIsScannedInstead(t *testing.T) {
	spoil := map[string]func(*summary){
		"rolling checksum at end": func(s *summary) { s.rollEnd ^= 1 },
		"end offset":              func(s *summary) { s.end++ },
		"epochs going back":       func(s *summary) { s.epochs = append(s.epochs, EpochStart{Epoch: 0, StartOffset: s.base + 1}) },
		"epoch at base missing":   func(s *summary) { s.epochs[0].StartOffset++ },
	}
	for name, change := range spoil {
		t.Run(name, func(t *testing.T) {
			l, next, rolling := spoiledLog(t, 4096, 0, change)
			if l.NextOffset() != next || l.RollingChecksum() != rolling || l.segs[0].unverified {
				t.Fatalf("opened at %d, rolling %08x, first segment unverified %v; want %d, %08x, scanned", l.NextOffset(), l.RollingChecksum(), l.segs[0].unverified, next, rolling)
			}
		})
	}
}

// What the summary says beyond what Open checks (the newest timestamp,
// the index, the epochs within the segment) is held against the frames by
// VerifySealed: a summary that disagrees is damage, found there.
func TestVerifySealedHoldsTheWholeSummaryAgainstTheFrames(t *testing.T) {
	spoil := map[string]func(*summary){
		"newest timestamp":  func(s *summary) { s.maxTs++ },
		"index position":    func(s *summary) { s.index[len(s.index)-1].pos += 3 },
		"index timestamp":   func(s *summary) { s.index[0].prefixMax-- },
		"index entry":       func(s *summary) { s.index = s.index[:len(s.index)-1] },
		"epoch change":      func(s *summary) { s.epochs[1].StartOffset++ },
		"epoch change lost": func(s *summary) { s.epochs = s.epochs[:1] },
	}
	for name, change := range spoil {
		t.Run(name, func(t *testing.T) {
			l, _, _ := spoiledLog(t, 8192, 6, change) // epochs change within segments
			if !l.segs[0].unverified {
				t.Fatal("setup: Open did not take the summary, so VerifySealed has nothing to find")
			}
			if err := l.VerifySealed(context.Background(), nil); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("VerifySealed: %v, want ErrCorrupt", err)
			}
		})
	}
}

// A truncation while VerifySealed runs, of the last segment or into the
// one it reads, is no damage; a segment it finished reading stays
// verified across a cut above it.
func TestVerifySealedAcrossATruncation(t *testing.T) {
	for _, into := range []string{"last segment", "segment being read"} {
		t.Run(into, func(t *testing.T) {
			l, next, _ := spoiledLog(t, 4096, 0, func(*summary) {})
			sealed := l.Unverified()
			cut := next - 2 // inside the last segment: one record a batch
			if into != "last segment" {
				cut = l.segs[1].base + 1
			}
			once := false
			err := l.VerifySealed(context.Background(), func(context.Context, int) error {
				if !once {
					once = true
					return l.Truncate(cut)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("VerifySealed across a truncation to %d: %v", cut, err)
			}
			if into == "last segment" && (sealed < 2 || l.Unverified() != 0) {
				t.Fatalf("%d sealed segments opened from summaries, %d left unverified after a cut above them", sealed, l.Unverified())
			}
		})
	}
}
