package partlog_test

import (
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/replica/partlog/faultfs"
)

// gateFS holds every file read while its gate is armed, as a slow disk
// does to a read of cold data.
type gateFS struct {
	*faultfs.FS
	mu      sync.Mutex
	gate    chan struct{}
	entered chan struct{}
	closes  map[string]int
}

func newGateFS() *gateFS { return &gateFS{FS: faultfs.New(), closes: map[string]int{}} }

// arm holds the next reads until the returned func is called; entered gets
// a value as the first one waits.
func (g *gateFS) arm() (entered <-chan struct{}, release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gate, g.entered = make(chan struct{}), make(chan struct{}, 1)
	gate := g.gate
	var once sync.Once
	return g.entered, func() {
		once.Do(func() {
			g.mu.Lock()
			g.gate = nil
			g.mu.Unlock()
			close(gate)
		})
	}
}

func (g *gateFS) closed(name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closes[name]
}

func (g *gateFS) OpenFile(name string, flag int, perm os.FileMode) (partlog.File, error) {
	f, err := g.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	// A segment is created under a temporary name and renamed.
	return &gateFile{File: f, g: g, name: strings.TrimSuffix(name, ".tmp")}, nil
}

type gateFile struct {
	partlog.File
	g    *gateFS
	name string
}

func (f *gateFile) ReadAt(p []byte, off int64) (int, error) {
	f.g.mu.Lock()
	gate, entered := f.g.gate, f.g.entered
	f.g.mu.Unlock()
	if gate != nil {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-gate
	}
	return f.File.ReadAt(p, off)
}

func (f *gateFile) Close() error {
	f.g.mu.Lock()
	f.g.closes[f.name]++
	f.g.mu.Unlock()
	return f.File.Close()
}

type readResult struct {
	frames [][]byte
	err    error
}

func readAsync(l *partlog.Log, from, to uint64) <-chan readResult {
	done := make(chan readResult, 1)
	go func() {
		frames, err := l.ReadFrames(from, to, 1<<30)
		done <- readResult{frames, err}
	}()
	return done
}

func waitEntered(t *testing.T, entered <-chan struct{}) {
	t.Helper()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the read never reached the file")
	}
}

// A read waiting for the disk (a consumer replaying history, a replacement
// copying the log) must not hold up the partition's appends: they used to
// wait for the log's lock, which the read held across its file reads.
func TestAppendsGoOnWhileAReadWaitsForTheDisk(t *testing.T) {
	g := newGateFS()
	l := openFS(t, g, nil)
	defer mustClose(t, l)
	want := appendAll(t, l, uniform(20, 5, 50, 1))
	end := l.NextOffset()
	entered, release := g.arm()
	defer release()
	read := readAsync(l, 0, end)
	waitEntered(t, entered)

	appended := make(chan error, 1)
	go func() {
		for _, b := range uniform(20, 5, 50, 1) {
			if err := l.Append(encode(t, b, l.NextOffset())); err != nil {
				appended <- err
				return
			}
		}
		appended <- l.Sync()
	}()
	select {
	case err := <-appended:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("appends waited for a read held up by the disk")
	}
	release()
	got := <-read
	if got.err != nil {
		t.Fatal(got.err)
	}
	equalFrames(t, got.frames, want)
}

// Retention may delete a segment a read is still in: the read finishes
// with the segment's frames intact, and the file is closed after it.
func TestARetainedReadOutlivesItsDeletedSegment(t *testing.T) {
	g := newGateFS()
	l := openFS(t, g, func(o *partlog.Options) { o.RetentionBytes = 10_000 })
	defer mustClose(t, l)
	frames := appendAll(t, l, uniform(60, 5, 50, 1))
	oldest := segments(t, g.FS)[0]
	entered, release := g.arm()
	defer release()
	read := readAsync(l, 0, 5)
	waitEntered(t, entered)
	retained := make(chan error, 1)
	go func() {
		n, err := l.EnforceRetention()
		if err == nil && n == 0 {
			err = errors.New("no segment deleted")
		}
		retained <- err
	}()
	select {
	case err := <-retained:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("retention waited for a read held up by the disk")
	}
	if segs := segments(t, g.FS); segs[0] == oldest {
		t.Fatal("retention kept the oldest segment")
	}
	if n := g.closed(oldest); n != 0 {
		t.Fatalf("the deleted segment was closed %d times under a read", n)
	}
	release()
	got := <-read
	if got.err != nil {
		t.Fatal(got.err)
	}
	equalFrames(t, got.frames, frames[:1])
	if n := g.closed(oldest); n != 1 {
		t.Fatalf("the deleted segment was closed %d times once the read let go, want 1", n)
	}
}

// truncateUnderRead appends 20 frames of 5 records, holds a read of
// [0, readTo) at the disk, truncates the log to truncateTo meanwhile,
// and returns the frames appended, the read's outcome and the log.
func truncateUnderRead(t *testing.T, readTo, truncateTo uint64) ([][]byte, readResult, *partlog.Log) {
	t.Helper()
	g := newGateFS()
	l := openFS(t, g, func(o *partlog.Options) { o.SegmentBytes = 1 << 20 })
	t.Cleanup(func() { mustClose(t, l) })
	frames := appendAll(t, l, uniform(20, 5, 50, 1))
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	entered, release := g.arm()
	defer release()
	read := readAsync(l, 0, readTo)
	waitEntered(t, entered)
	truncated := make(chan error, 1)
	go func() { truncated <- l.Truncate(truncateTo) }()
	// Truncate reads the segment too (to rebuild its index): let every
	// read through now.
	release()
	if err := <-truncated; err != nil {
		t.Fatal(err)
	}
	return frames, <-read, l
}

// A Truncate that cuts what a read is reading makes the read start again
// on the cut log: the log is not corrupt, and no read mixes the two.
func TestAReadCutByTruncateIsNotCorruption(t *testing.T) {
	frames, got, l := truncateUnderRead(t, 100, 10)
	// The read saw the log before the cut, or started again after it
	// and saw the cut log: never a mix, never corruption.
	if got.err != nil {
		t.Fatalf("a read cut under it: %v, want the frames of the log before or after the cut", got.err)
	}
	if len(got.frames) == len(frames) {
		equalFrames(t, got.frames, frames)
	} else {
		equalFrames(t, got.frames, frames[:2])
	}
	after, err := l.ReadFrames(0, l.NextOffset(), 1<<30)
	if err != nil {
		t.Fatalf("the log after the cut: %v", err)
	}
	equalFrames(t, after, frames[:2])
}

// A Truncate above what a read covers leaves the read alone: a consumer
// reading committed records is never failed by a cut of the uncommitted
// tail (which would end its subscription).
func TestATruncateAboveAReadLeavesItAlone(t *testing.T) {
	frames, got, _ := truncateUnderRead(t, 25, 50)
	if got.err != nil {
		t.Fatalf("a read below the cut: %v", got.err)
	}
	equalFrames(t, got.frames, frames[:5])
}
