package partlog

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

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
			dir := t.TempDir()
			opts := Options{Dir: dir, SegmentBytes: 4096, IndexIntervalBytes: 256}
			l, err := Open(opts)
			if err != nil {
				t.Fatal(err)
			}
			recs := []Record{{Key: []byte("k"), Value: make([]byte, 300)}}
			for range 40 {
				f, err := AppendBatch(nil, 1, l.NextOffset(), recs)
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Append(f); err != nil {
					t.Fatal(err)
				}
			}
			next, rolling := l.NextOffset(), l.RollingChecksum()
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			path := summaryPath(filepath.Join(dir, segmentName(0)))
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			sum, err := decodeSummary(b)
			if err != nil {
				t.Fatal(err)
			}
			change(&sum)
			if err := os.WriteFile(path, encodeSummary(sum), 0o644); err != nil {
				t.Fatal(err)
			}

			l, err = Open(opts)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer l.Close()
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
			dir := t.TempDir()
			opts := Options{Dir: dir, SegmentBytes: 8192, IndexIntervalBytes: 256}
			l, err := Open(opts)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 40 {
				recs := []Record{{TimestampMs: int64(1000 + i), Key: []byte("k"), Value: make([]byte, 300)}}
				f, err := AppendBatch(nil, uint64(1+i/6), l.NextOffset(), recs) // epochs change within segments
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Append(f); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			path := summaryPath(filepath.Join(dir, segmentName(0)))
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			sum, err := decodeSummary(b)
			if err != nil || len(sum.epochs) < 2 || len(sum.index) < 2 {
				t.Fatalf("setup: %+v, %v", sum, err)
			}
			change(&sum)
			if err := os.WriteFile(path, encodeSummary(sum), 0o644); err != nil {
				t.Fatal(err)
			}
			l, err = Open(opts)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			defer l.Close()
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
			dir := t.TempDir()
			opts := Options{Dir: dir, SegmentBytes: 4096, IndexIntervalBytes: 256}
			l, err := Open(opts)
			if err != nil {
				t.Fatal(err)
			}
			var ends []uint64
			for range 40 {
				f, err := AppendBatch(nil, 1, l.NextOffset(), []Record{{Key: []byte("k"), Value: make([]byte, 300)}})
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Append(f); err != nil {
					t.Fatal(err)
				}
				ends = append(ends, l.NextOffset())
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			l, err = Open(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			sealed := l.Unverified()
			cut := ends[len(ends)-3] // inside the last segment
			if into != "last segment" {
				cut = l.segs[1].base + 1 // a batch boundary: one record a batch
			}
			once := false
			err = l.VerifySealed(context.Background(), func(context.Context, int) error {
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
