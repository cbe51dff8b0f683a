package server

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/replica/partlog/faultfs"
	"github.com/catena-streams/catena/rpc/catenapb"
)

func TestNextScrub(t *testing.T) {
	const every = time.Hour
	base := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	at := nextScrub(base, every, "r0", "s", 3)
	if !at.After(base) || at.Sub(base) > every {
		t.Fatalf("next scrub at %v after %v: want within an interval after", at, base)
	}
	tests := []struct {
		name string
		now  time.Time
		want time.Time
	}{
		{"a restart before the slot keeps it", at.Add(-every / 3), at},
		{"just before the slot", at.Add(-time.Nanosecond), at},
		{"at the slot: the next", at, at.Add(every)},
		{"a restart after the slot: the next period's", at.Add(time.Minute), at.Add(every)},
		{"days later: the same phase", at.Add(72*every + time.Second), at.Add(73 * every)},
	}
	for _, tc := range tests {
		if got := nextScrub(tc.now, every, "r0", "s", 3); !got.Equal(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	// Partitions, and copies of a partition, spread over the interval.
	phases := map[time.Time]bool{}
	for p := range uint32(16) {
		for _, id := range []string{"r0", "r1"} {
			phases[nextScrub(base, every, id, "s", p)] = true
		}
	}
	if len(phases) < 30 {
		t.Fatalf("32 copies share %d scrub times", len(phases))
	}
}

// startScrubbing starts node id on dir with fs and scrubs every interval.
func startScrubbing(t *testing.T, id, dir string, fs *faultfs.FS, every time.Duration) *node {
	t.Helper()
	n := &node{id: id, fatal: make(chan error, 4), fs: fs}
	startWith(t, n, dir, Options{FS: fs, ScrubInterval: every})
	return n
}

// Damage no read met, in sealed segments this process wrote (never read
// since), is found by the periodic scrub: the partition stops being
// served, and its chain's master replaces the copy. A read that fails
// once is tried again and is not damage.
func TestAScrubFindsDamageNoReadMet(t *testing.T) {
	defer func(d time.Duration) { verifyRetryMin = d }(verifyRetryMin)
	verifyRetryMin = 10 * time.Millisecond
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		damage func(fs *faultfs.FS, seg string) error
		serves bool
	}{
		{"a flipped bit", func(fs *faultfs.FS, seg string) error { return fs.Corrupt(seg, 300<<10, []byte{0x5A}) }, false},
		{"a read that fails once", func(fs *faultfs.FS, seg string) error {
			fs.FailReadsIn(seg, 300<<10, 400<<10, 1, syscall.EIO)
			return nil
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := faultfs.New()
			dir := t.TempDir()
			a := startScrubbing(t, "a", dir, fs, 200*time.Millisecond)
			fillSegments(t, a, 4)
			names, err := fs.ReadDir(filepath.Join(dir, "streams", "s", "00000"))
			if err != nil {
				t.Fatal(err)
			}
			var seg string
			for _, n := range names {
				if strings.HasSuffix(n, ".seg") {
					seg = filepath.Join(dir, "streams", "s", "00000", n) // the first, sealed
					break
				}
			}
			before := testutil.ToFloat64(a.srv.metrics.scrubs)
			if err := tc.damage(fs, seg); err != nil {
				t.Fatal(err)
			}
			if !tc.serves {
				eventually(t, 10*time.Second, func() error {
					if e := status0(t, a).GetError(); !strings.Contains(e, "corrupt") || !strings.Contains(e, "scrub") || !strings.Contains(e, filepath.Base(seg)) {
						return fmt.Errorf("partition error %q", e)
					}
					return nil
				})
				if _, err := a.rc.Append(ctx, &catenapb.AppendRequest{Stream: "s", Epoch: 1, Records: records(2, 1, 1)}, grpc.WaitForReady(true)); status.Code(err) == codes.OK {
					t.Fatal("the damaged partition took a write")
				}
				return
			}
			eventually(t, 10*time.Second, func() error {
				if n := testutil.ToFloat64(a.srv.metrics.scrubs); n < before+2 {
					return fmt.Errorf("%v scrubs completed since the fault", n-before)
				}
				return nil
			})
			if e := status0(t, a).GetError(); e != "" {
				t.Fatalf("partition error %q after a read that failed once", e)
			}
		})
	}
}
