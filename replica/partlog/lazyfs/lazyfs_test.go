package lazyfs_test

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/lazyfs"
)

func TestUnsyncedWritesLiveOnlyInTheProcess(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "f")
	l := lazyfs.New()
	f, err := l.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, "hello ", 0)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, f, "world", 6)
	mustWrite(t, f, "W", 6) // overwrites in write order

	if got := readAll(t, f, 11); got != "hello World" {
		t.Fatalf("reads through the overlay = %q", got)
	}
	if fi, _ := f.Stat(); fi.Size() != 11 {
		t.Fatalf("size = %d, want 11", fi.Size())
	}
	// A second handle of the path shares the overlay (the page cache).
	g, err := l.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, g, 11); got != "hello World" {
		t.Fatalf("second handle reads %q", got)
	}
	if l.Pending() != 6 {
		t.Fatalf("pending = %d bytes, want 6", l.Pending())
	}
	// What the disk holds is what a power cut leaves.
	if disk, _ := os.ReadFile(name); string(disk) != "hello " {
		t.Fatalf("disk before sync = %q", disk)
	}
	if err := f.Truncate(8); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, f, 8); got != "hello Wo" {
		t.Fatalf("after truncate = %q", got)
	}
	if err := g.Sync(); err == nil {
		t.Fatal("a read-only handle synced writes it cannot make")
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if disk, _ := os.ReadFile(name); string(disk) != "hello Wo" {
		t.Fatalf("disk after sync = %q", disk)
	}
}

// The partition log over lazyfs, abandoned without a sync as a killed
// process abandons it, reopens with exactly what it synced.
func TestLogAfterPowerLossHoldsWhatItSynced(t *testing.T) {
	dir := t.TempDir()
	l, err := partlog.Open(partlog.Options{Dir: dir, FS: lazyfs.New()})
	if err != nil {
		t.Fatal(err)
	}
	appendRecords(t, l, 10)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	appendRecords(t, l, 5)
	if l.NextOffset() != 15 {
		t.Fatalf("log end before the cut = %d", l.NextOffset())
	}
	// No Close: the process is gone, and its memory with it.
	after, err := partlog.Open(partlog.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close()
	if after.NextOffset() != 10 {
		t.Fatalf("log end after the power cut = %d, want the 10 synced records", after.NextOffset())
	}
}

func appendRecords(t *testing.T, l *partlog.Log, n int) {
	t.Helper()
	for range n {
		base := l.NextOffset()
		frame, err := partlog.AppendBatch(nil, 1, base, []partlog.Record{{ProducerID: 1, Sequence: base, Value: bytes.Repeat([]byte{'x'}, 100)}})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Append(frame); err != nil {
			t.Fatal(err)
		}
	}
}

func mustWrite(t *testing.T, f partlog.File, s string, off int64) {
	t.Helper()
	if _, err := f.WriteAt([]byte(s), off); err != nil {
		t.Fatal(err)
	}
}

func readAll(t *testing.T, f partlog.File, n int) string {
	t.Helper()
	p := make([]byte, n+4)
	got, err := f.ReadAt(p, 0)
	if err != io.EOF || got != n {
		t.Fatalf("read %d bytes (%v), want %d and EOF", got, err, n)
	}
	return string(p[:got])
}
