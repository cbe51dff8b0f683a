package partlog_test

import (
	"math"
	"testing"
	"time"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
)

func TestRetentionKeepsHeldSegmentsUpToTheHardLimits(t *testing.T) {
	clock := &fakeClock{t: time.UnixMilli(1_000_000)}
	fsys := faultfs.New()
	// Soft limits that delete every sealed segment; holds restrain them.
	l := openFS(t, fsys, func(o *partlog.Options) { o.RetentionBytes = 1; o.RetentionTime = time.Minute; o.Now = clock.Now })
	defer l.Close()
	appendAll(t, l, uniform(60, 5, 50, 1)) // stamped at t0, well past a minute ago by the clock below
	clock.t = clock.t.Add(time.Hour)
	segs := len(segments(t, fsys))
	if segs < 4 {
		t.Fatalf("only %d segments; the test needs several", segs)
	}

	// A hold at 0 keeps everything.
	res, err := l.EnforceRetentionHeld(partlog.RetentionHold{KeepFrom: math.MaxUint64, HoldOffset: 0})
	if err != nil || res.Segments != 0 || res.Forced || l.StartOffset() != 0 {
		t.Fatalf("hold at 0: %+v, %v, start %d", res, err, l.StartOffset())
	}
	// A hold inside the log keeps the segment holding it and all later ones.
	res, err = l.EnforceRetentionHeld(partlog.RetentionHold{KeepFrom: math.MaxUint64, HoldOffset: 123})
	if err != nil || res.Segments == 0 || res.Forced || res.StartOffset > 123 || res.StartOffset != l.StartOffset() {
		t.Fatalf("hold at 123: %+v, %v, start %d", res, err, l.StartOffset())
	}
	held := l.StartOffset()
	// A hard time limit the segments are within changes nothing.
	res, err = l.EnforceRetentionHeld(partlog.RetentionHold{KeepFrom: math.MaxUint64, HoldOffset: 0, HardTime: 2 * time.Hour})
	if err != nil || res.Segments != 0 || l.StartOffset() != held {
		t.Fatalf("hard time not exceeded: %+v, %v", res, err)
	}
	// Past the hard time limit the hold is overridden, and the result says so.
	res, err = l.EnforceRetentionHeld(partlog.RetentionHold{KeepFrom: math.MaxUint64, HoldOffset: 0, HardTime: 30 * time.Minute})
	if err != nil || res.Segments == 0 || !res.Forced || res.StartOffset <= held {
		t.Fatalf("hard time exceeded: %+v, %v", res, err)
	}
	// Only the active segment is left, whatever the limits.
	if n := len(segments(t, fsys)); n != 1 {
		t.Fatalf("%d segments left, want the active one", n)
	}
	if res, err := l.EnforceRetentionHeld(partlog.RetentionHold{KeepFrom: math.MaxUint64, HoldOffset: math.MaxUint64, HardBytes: 1}); err != nil || res.Segments != 0 {
		t.Fatalf("active segment: %+v, %v", res, err)
	}
}

func TestHardByteLimitWithoutAHoldIsNotForced(t *testing.T) {
	fsys := faultfs.New()
	l := openFS(t, fsys, nil) // no soft limits
	defer l.Close()
	appendAll(t, l, uniform(60, 5, 50, 1))
	res, err := l.EnforceRetentionHeld(partlog.RetentionHold{KeepFrom: math.MaxUint64, HoldOffset: math.MaxUint64, HardBytes: 10_000})
	if err != nil || res.Segments == 0 || res.Forced {
		t.Fatalf("hard bytes without holds: %+v, %v", res, err)
	}
	// A hold at the log end: nothing sealed is held, nothing is forced.
	if res, err := l.EnforceRetentionHeld(partlog.RetentionHold{KeepFrom: math.MaxUint64, HoldOffset: l.NextOffset(), HardBytes: 10_000}); err != nil || res.Forced {
		t.Fatalf("second pass: %+v, %v", res, err)
	}
}
