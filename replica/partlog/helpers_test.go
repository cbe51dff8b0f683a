package partlog_test

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
)

const testDir = "/data/p0"

// batch describes one batch to append.
type batch struct {
	epoch uint64
	n     int   // records
	ts    int64 // timestamp of the first record; others follow ts+i
	vsize int   // value size
}

// encode builds the frame for b at base offset base.
func encode(t testing.TB, b batch, base uint64) []byte {
	t.Helper()
	recs := make([]partlog.Record, b.n)
	for i := range recs {
		recs[i] = partlog.Record{
			TimestampMs: b.ts + int64(i),
			ProducerID:  7,
			Sequence:    base + uint64(i),
			Key:         []byte(fmt.Sprintf("key-%d", base+uint64(i))),
			Value:       bytes.Repeat([]byte{byte(base + uint64(i))}, b.vsize),
		}
	}
	f, err := partlog.AppendBatch(nil, b.epoch, base, recs)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// appendAll appends batches at the log end and returns their frames.
func appendAll(t testing.TB, l *partlog.Log, bs []batch) [][]byte {
	t.Helper()
	var frames [][]byte
	for _, b := range bs {
		f := encode(t, b, l.NextOffset())
		if err := l.Append(f); err != nil {
			t.Fatalf("append at %d: %v", l.NextOffset(), err)
		}
		frames = append(frames, f)
	}
	return frames
}

// uniform returns n batches of recs records with increasing timestamps.
func uniform(n, recs, vsize int, epoch uint64) []batch {
	bs := make([]batch, n)
	for i := range bs {
		bs[i] = batch{epoch: epoch, n: recs, ts: int64(1000 + 10*i), vsize: vsize}
	}
	return bs
}

// fakeClock is an injectable Options.Now.
type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time { return c.t }

func openFS(t testing.TB, fsys partlog.FS, mod func(*partlog.Options)) *partlog.Log {
	t.Helper()
	l, err := partlog.Open(options(fsys, mod))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func options(fsys partlog.FS, mod func(*partlog.Options)) partlog.Options {
	o := partlog.Options{Dir: testDir, FS: fsys, SegmentBytes: 4096, IndexIntervalBytes: 256}
	if mod != nil {
		mod(&o)
	}
	return o
}

// readAll reads every frame from the log start.
func readAll(t testing.TB, l *partlog.Log) [][]byte {
	t.Helper()
	frames, err := l.ReadFrames(l.StartOffset(), l.NextOffset(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return frames
}

func equalFrames(t testing.TB, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d frames, want %d", len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("frame %d differs", i)
		}
	}
}

func segments(t testing.TB, fsys *faultfs.FS) []string {
	t.Helper()
	names, err := fsys.ReadDir(testDir)
	if err != nil {
		t.Fatal(err)
	}
	var segs []string
	for _, n := range names {
		if filepath.Ext(n) == ".seg" {
			segs = append(segs, filepath.Join(testDir, n))
		}
	}
	return segs
}

func mustClose(t testing.TB, l *partlog.Log) {
	t.Helper()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}
