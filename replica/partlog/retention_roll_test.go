package partlog_test

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
)

// Retention deletes whole segments and never the active one, and a
// segment rolls when it is full: a partition written more slowly than
// a segment a retention period (1 KiB/s fills the default segment in a
// day and a half) kept every record past its retention time. The active
// segment rolls, at a retention round, once its first records are an
// eighth of the retention time old.
func TestRetentionByTimeReachesTheActiveSegment(t *testing.T) {
	t.Run("an idle partition", func(t *testing.T) {
		clock := &fakeClock{t: time.UnixMilli(10_000_000)}
		fsys := faultfs.New()
		opts := func(o *partlog.Options) { o.SegmentBytes, o.RetentionTime, o.Now = 0, time.Hour, clock.Now }
		l := openFS(t, fsys, opts)
		t0 := clock.t.UnixMilli()
		for i := range 10 {
			appendAll(t, l, []batch{{epoch: 1, n: 5, ts: t0 + int64(i)*60_000, vsize: 50}})
		}
		must(t, l.Sync())
		clock.t = time.UnixMilli(t0 + 30*60_000) // the newest record is 21 minutes old
		if _, err := l.EnforceRetention(); err != nil {
			t.Fatal(err)
		}
		if l.StartOffset() != 0 {
			t.Fatalf("start %d: records younger than the retention time deleted", l.StartOffset())
		}
		clock.t = time.UnixMilli(t0 + 70*60_000) // the newest is 61 minutes old
		if _, err := l.EnforceRetention(); err != nil {
			t.Fatal(err)
		}
		if l.StartOffset() != 50 || l.NextOffset() != 50 {
			t.Fatalf("offsets [%d,%d) after every record expired, want [50,50)", l.StartOffset(), l.NextOffset())
		}
		appendAll(t, l, []batch{{epoch: 1, n: 5, ts: clock.t.UnixMilli(), vsize: 50}})
		mustClose(t, l)
		l = openFS(t, fsys, opts)
		defer l.Close()
		if l.StartOffset() != 50 || l.NextOffset() != 55 {
			t.Fatalf("offsets [%d,%d) after reopening, want [50,55)", l.StartOffset(), l.NextOffset())
		}
	})
	for _, interval := range []int64{256, 64 << 10} {
		t.Run(fmt.Sprintf("a partition written slowly, index entries every %d bytes", interval), func(t *testing.T) {
			slowly(t, interval)
		})
	}
}

// slowly writes a small batch a minute for six hours, with a retention
// round after each, and checks what retention kept. An index entry
// covers many of the batches when interval is large.
func slowly(t *testing.T, interval int64) {
	clock := &fakeClock{t: time.UnixMilli(10_000_000)}
	fsys := faultfs.New()
	l := openFS(t, fsys, func(o *partlog.Options) {
		o.SegmentBytes, o.IndexIntervalBytes, o.RetentionTime, o.Now = 0, interval, time.Hour, clock.Now
	})
	defer l.Close()
	ts := map[uint64]int64{} // each batch's base offset: its time
	for range 6 * 60 {
		ts[l.NextOffset()] = clock.t.UnixMilli()
		appendAll(t, l, []batch{{epoch: 1, n: 5, ts: clock.t.UnixMilli(), vsize: 50}})
		// A retention round a minute (the server's is 30 s).
		if _, err := l.EnforceRetention(); err != nil {
			t.Fatal(err)
		}
		clock.t = clock.t.Add(time.Minute)
	}
	// Records are kept an hour, and at most an eighth more and a
	// round, with the segments that hold them.
	if age := clock.t.UnixMilli() - ts[l.StartOffset()]; age > (time.Hour + time.Hour/8 + 2*time.Minute).Milliseconds() {
		t.Fatalf("the oldest record kept is %v old, retention 1h", time.Duration(age)*time.Millisecond)
	}
	if n := len(segments(t, fsys)); n > 10 {
		t.Fatalf("%d segments for an hour of records rolled every 7.5 minutes", n)
	}
}

// A consumer that stopped holds everything after its offset; rolling the
// active segment by the soft time then only makes small segments nothing
// may delete, each an open file, for as long as the hold stays. Held,
// the active segment rolls by the hard time only.
func TestRetentionRollsHeldRecordsOnlyByTheHardTime(t *testing.T) {
	for _, hard := range []time.Duration{0, 4 * time.Hour} {
		t.Run(fmt.Sprintf("hard time %v", hard), func(t *testing.T) {
			clock := &fakeClock{t: time.UnixMilli(10_000_000)}
			fsys := faultfs.New()
			l := openFS(t, fsys, func(o *partlog.Options) { o.SegmentBytes, o.RetentionTime, o.Now = 0, time.Hour, clock.Now })
			defer l.Close()
			hold := partlog.RetentionHold{HoldOffset: 5, KeepFrom: math.MaxUint64, HardTime: hard}
			for range 6 * 60 {
				appendAll(t, l, []batch{{epoch: 1, n: 5, ts: clock.t.UnixMilli(), vsize: 50}})
				if _, err := l.EnforceRetentionHeld(hold); err != nil {
					t.Fatal(err)
				}
				clock.t = clock.t.Add(time.Minute)
			}
			n := len(segments(t, fsys))
			switch {
			case hard == 0 && n > 2:
				t.Fatalf("%d segments under a hold that stopped, without a hard time: want at most 2", n)
			case hard > 0 && (n < 3 || n > 12):
				t.Fatalf("%d segments under a hold that stopped, with a hard time of %v: want them rolled every half hour and trimmed past 4 h", n, hard)
			}
		})
	}
}
