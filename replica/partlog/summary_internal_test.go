package partlog

import (
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
