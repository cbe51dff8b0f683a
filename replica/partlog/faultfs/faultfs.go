// Package faultfs is an in-memory partlog.FS that models what a crash keeps
// and injects I/O faults, for tests of partlog and of the packages built on
// it.
//
// The model: every file has its current contents (the page cache) and its
// durable contents (what the last File.Sync made durable). The directory
// namespace likewise has a current and a durable version; SyncDir(dir) makes
// the current entries of dir durable. Crash replaces everything by its
// durable version, optionally keeping a torn prefix of each file's unsynced
// appended bytes (as data, or as zeros: the size reached the disk but the
// data did not). Directories made by MkdirAll are durable at once.
//
// Faults: writes can fail (ENOSPC) after persisting a prefix of the failing
// write (a torn write), and syncs (file and directory) can fail (EIO).
//
// A failed file sync is modelled as Linux handles a writeback error: the
// unsynced bytes stay in the page cache, marked clean, so reads still
// return them and later syncs of the file neither write them nor fail,
// but they are not on the disk. File.DropCache (posix_fadvise DONTNEED)
// drops them, and reads return what the disk holds. A process restart
// without a crash is simply a new open over the same FS: it sees the
// cache.
package faultfs

import (
	"errors"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/catena-streams/catena/replica/partlog"
)

// ErrCrashed is returned by files opened before the last Crash.
var ErrCrashed = errors.New("faultfs: file handle from before a crash")

// FS is the in-memory file system. The zero value is not usable; use New.
type FS struct {
	mu      sync.Mutex
	files   map[string]*inode // current namespace
	durable map[string]*inode // namespace as of each directory's last SyncDir
	dirs    map[string]bool
	gen     int // incremented by Crash; older handles fail

	writes, syncs int
	writeFault    fault
	syncFault     fault
	readFaults    []readFault
}

// readFault fails reads of bytes [from, to) of the file name, times times
// (< 0: forever): a bad stretch of the disk. in is the file name named
// when the fault was made: the fault stays with it through renames, as
// it is reached by handles opened under another name (a file created
// under a temporary name and renamed into place).
type readFault struct {
	name     string
	in       *inode
	from, to int64
	times    int
	err      error
}

// fault fails operations after `after` more successes, `times` times (< 0:
// forever).
type fault struct {
	armed   bool
	after   int
	times   int
	err     error
	partial int // writes only: bytes of the failing write that land
}

// trigger counts one operation and reports whether it must fail.
func (f *fault) trigger() bool {
	if !f.armed {
		return false
	}
	if f.after > 0 {
		f.after--
		return false
	}
	if f.times == 0 {
		f.armed = false
		return false
	}
	if f.times > 0 {
		f.times--
	}
	return true
}

type inode struct {
	data    []byte // current contents
	durable []byte // contents as of the last Sync; never aliases data
	// rewritten is set when bytes below len(durable) changed since the last
	// Sync (overwrite or truncate): then there is no "appended tail" to tear.
	rewritten bool
	// [dirtyLo, dirtyHi) covers every byte below len(durable) changed
	// since the last Sync (empty when dirtyLo >= dirtyHi), so that a Sync
	// copies what changed rather than the whole file: a file written in
	// place (a preallocated journal segment) is synced after each small
	// write, and copying all of it each time made the tests quadratic.
	dirtyLo, dirtyHi int
	// lost is set by a failed Sync: what data holds beyond durable is
	// clean in the cache and never reaches the disk (see the package doc).
	lost bool
}

var _ partlog.FS = (*FS)(nil)

// New returns an empty file system.
func New() *FS {
	return &FS{files: map[string]*inode{}, durable: map[string]*inode{}, dirs: map[string]bool{"/": true, ".": true}}
}

// FailWrites makes writes fail with err (e.g. syscall.ENOSPC) after `after`
// more successful writes, `times` times (times < 0: forever). The failing
// write first stores its first `partial` bytes (a torn write).
func (f *FS) FailWrites(after, times int, err error, partial int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writeFault = fault{armed: true, after: after, times: times, err: err, partial: partial}
}

// FailSyncs makes file and directory syncs fail with err (e.g. syscall.EIO)
// after `after` more successful ones, `times` times (times < 0: forever).
// A failed file sync makes nothing durable.
func (f *FS) FailSyncs(after, times int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncFault = fault{armed: true, after: after, times: times, err: err}
}

// FailReadsIn makes reads of file name that touch bytes [from, to) fail
// with err (e.g. syscall.EIO), times times (times < 0: forever); other
// reads of the file, and of other files, go on. The file is the one name
// names now, whatever names its handles were opened under; when there is
// none yet, the one a later open of name finds.
func (f *FS) FailReadsIn(name string, from, to int64, times int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	name = filepath.Clean(name)
	f.readFaults = append(f.readFaults, readFault{name: name, in: f.files[name], from: from, to: to, times: times, err: err})
}

// ClearFaults disarms all injected faults.
func (f *FS) ClearFaults() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writeFault, f.syncFault, f.readFaults = fault{}, fault{}, nil
}

// Writes and Syncs count successful WriteAt and Sync/SyncDir calls.
func (f *FS) Writes() int { f.mu.Lock(); defer f.mu.Unlock(); return f.writes }
func (f *FS) Syncs() int  { f.mu.Lock(); defer f.mu.Unlock(); return f.syncs }

// CrashOptions says what survives a crash beyond the durable state.
type CrashOptions struct {
	// KeepUnsynced is how many bytes of each file's unsynced appended tail
	// reach the disk: 0 none, < 0 all of it.
	KeepUnsynced int
	// ZeroFill makes those kept bytes zeros: the file size was persisted but
	// its data pages were not.
	ZeroFill bool
}

// Crash simulates power loss: the namespace reverts to its durable version,
// each file to its durable contents plus what opts keeps, and every open
// handle becomes unusable.
func (f *FS) Crash(opts CrashOptions) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	f.files = map[string]*inode{}
	done := map[*inode]bool{}
	for name, in := range f.durable {
		f.files[name] = in
		if done[in] {
			continue
		}
		done[in] = true
		d := slices.Clone(in.durable)
		if !in.rewritten && !in.lost && len(in.data) > len(in.durable) {
			tail := in.data[len(in.durable):]
			k := len(tail)
			if opts.KeepUnsynced >= 0 {
				k = min(k, opts.KeepUnsynced)
			}
			if opts.ZeroFill {
				d = append(d, make([]byte, k)...)
			} else {
				d = append(d, tail[:k]...)
			}
		}
		in.data, in.durable, in.rewritten, in.lost = d, slices.Clone(d), false, false
		in.clean()
	}
}

// ReadFile returns the current contents of name.
func (f *FS) ReadFile(name string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.files[filepath.Clean(name)]
	if !ok {
		return nil, &fs.PathError{Op: "read", Path: name, Err: fs.ErrNotExist}
	}
	return slices.Clone(in.data), nil
}

// Corrupt overwrites bytes of name at off, in both its current and its
// durable contents: damage on the medium, not a write by the program.
func (f *FS) Corrupt(name string, off int64, b []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	in, ok := f.files[filepath.Clean(name)]
	if !ok {
		return &fs.PathError{Op: "corrupt", Path: name, Err: fs.ErrNotExist}
	}
	if off < 0 || off+int64(len(b)) > int64(len(in.data)) || off+int64(len(b)) > int64(len(in.durable)) {
		return &fs.PathError{Op: "corrupt", Path: name, Err: errors.New("range beyond durable contents")}
	}
	copy(in.data[off:], b)
	copy(in.durable[off:], b)
	return nil
}

func (f *FS) OpenFile(name string, flag int, perm os.FileMode) (partlog.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	name = filepath.Clean(name)
	if !f.dirs[filepath.Dir(name)] {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	in, ok := f.files[name]
	switch {
	case ok && flag&os.O_CREATE != 0 && flag&os.O_EXCL != 0:
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrExist}
	case !ok && flag&os.O_CREATE == 0:
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	case !ok:
		in = &inode{}
		f.files[name] = in
	case flag&os.O_TRUNC != 0:
		in.data = nil
		in.rewritten = in.rewritten || len(in.durable) > 0
		in.dirty(0, math.MaxInt)
	}
	return &file{fs: f, in: in, name: name, gen: f.gen, readOnly: flag&(os.O_WRONLY|os.O_RDWR) == 0}, nil
}

func (f *FS) ReadDir(dir string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dir = filepath.Clean(dir)
	if !f.dirs[dir] {
		return nil, &fs.PathError{Op: "readdir", Path: dir, Err: fs.ErrNotExist}
	}
	var names []string
	for name := range f.files {
		if filepath.Dir(name) == dir {
			names = append(names, filepath.Base(name))
		}
	}
	sort.Strings(names)
	return names, nil
}

func (f *FS) Remove(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	name = filepath.Clean(name)
	if _, ok := f.files[name]; !ok {
		return &fs.PathError{Op: "remove", Path: name, Err: fs.ErrNotExist}
	}
	delete(f.files, name)
	return nil
}

func (f *FS) Rename(oldpath, newpath string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	oldpath, newpath = filepath.Clean(oldpath), filepath.Clean(newpath)
	in, ok := f.files[oldpath]
	if !ok {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: fs.ErrNotExist}
	}
	if !f.dirs[filepath.Dir(newpath)] {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: fs.ErrNotExist}
	}
	delete(f.files, oldpath)
	f.files[newpath] = in
	return nil
}

func (f *FS) MkdirAll(dir string, perm os.FileMode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for d := filepath.Clean(dir); !f.dirs[d]; d = filepath.Dir(d) {
		f.dirs[d] = true
	}
	return nil
}

// SyncDir makes the current entries of dir durable (creations, renames and
// removals alike).
func (f *FS) SyncDir(dir string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	dir = filepath.Clean(dir)
	if !f.dirs[dir] {
		return &fs.PathError{Op: "fsync", Path: dir, Err: fs.ErrNotExist}
	}
	if f.syncFault.trigger() {
		return &fs.PathError{Op: "fsync", Path: dir, Err: f.syncFault.err}
	}
	f.syncs++
	for name := range f.durable {
		if filepath.Dir(name) == dir {
			delete(f.durable, name)
		}
	}
	for name, in := range f.files {
		if filepath.Dir(name) == dir {
			f.durable[name] = in
		}
	}
	return nil
}

type file struct {
	fs       *FS
	in       *inode
	name     string
	gen      int
	closed   bool
	readOnly bool
}

// check is called with fs.mu held.
func (h *file) check(op string) error {
	switch {
	case h.closed:
		return &fs.PathError{Op: op, Path: h.name, Err: fs.ErrClosed}
	case h.gen != h.fs.gen:
		return &fs.PathError{Op: op, Path: h.name, Err: ErrCrashed}
	}
	return nil
}

func (h *file) ReadAt(p []byte, off int64) (int, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.check("read"); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, &fs.PathError{Op: "read", Path: h.name, Err: fs.ErrInvalid}
	}
	for i := range h.fs.readFaults {
		rf := &h.fs.readFaults[i]
		if (rf.in == h.in || (rf.in == nil && rf.name == h.name)) && rf.times != 0 && off < rf.to && off+int64(len(p)) > rf.from {
			if rf.times > 0 {
				rf.times--
			}
			return 0, &fs.PathError{Op: "read", Path: h.name, Err: rf.err}
		}
	}
	if off >= int64(len(h.in.data)) {
		return 0, io.EOF
	}
	n := copy(p, h.in.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (h *file) WriteAt(p []byte, off int64) (int, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.check("write"); err != nil {
		return 0, err
	}
	if h.readOnly || off < 0 {
		return 0, &fs.PathError{Op: "write", Path: h.name, Err: fs.ErrInvalid}
	}
	var ferr error
	if h.fs.writeFault.trigger() {
		p = p[:min(len(p), max(h.fs.writeFault.partial, 0))]
		ferr = &fs.PathError{Op: "write", Path: h.name, Err: h.fs.writeFault.err}
	} else {
		h.fs.writes++
	}
	in := h.in
	if end := off + int64(len(p)); end > int64(len(in.data)) {
		in.grow(int(end))
	}
	if off < int64(len(in.durable)) && len(p) > 0 {
		in.rewritten = true
		in.dirty(int(off), int(off)+len(p))
	}
	copy(in.data[off:], p)
	return len(p), ferr
}

func (h *file) Sync() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.check("sync"); err != nil {
		return err
	}
	if h.fs.syncFault.trigger() {
		h.in.lost = true
		return &fs.PathError{Op: "sync", Path: h.name, Err: h.fs.syncFault.err}
	}
	h.fs.syncs++
	in := h.in
	if in.lost {
		return nil // the pages are clean: nothing to write, nothing to report
	}
	if n := len(in.data); n < len(in.durable) {
		in.durable = in.durable[:n] // durable never aliases data: its bytes past n are unreachable
	} else {
		in.durable = append(in.durable, in.data[len(in.durable):]...)
	}
	if lo, hi := in.dirtyLo, min(in.dirtyHi, len(in.durable)); lo < hi {
		copy(in.durable[lo:hi], in.data[lo:hi])
	}
	in.rewritten = false
	in.clean()
	return nil
}

// dirty records that bytes [lo, hi) below len(in.durable) may differ from
// what the disk holds.
func (in *inode) dirty(lo, hi int) {
	if in.dirtyLo >= in.dirtyHi {
		in.dirtyLo, in.dirtyHi = lo, hi
		return
	}
	in.dirtyLo, in.dirtyHi = min(in.dirtyLo, lo), max(in.dirtyHi, hi)
}

// grow extends in.data to n bytes of zeros past its end. The capacity
// doubles: a file zero-filled (a journal segment) or appended to in
// small steps is not copied at each step. data's backing array is
// never shared, so bytes past its length (cut by Truncate) are cleared
// rather than reused.
func (in *inode) grow(n int) {
	old := len(in.data)
	if n > cap(in.data) {
		d := make([]byte, n, max(n, 2*cap(in.data)))
		copy(d, in.data)
		in.data = d
		return
	}
	in.data = in.data[:n]
	clear(in.data[old:])
}

// clean records that data and durable agree.
func (in *inode) clean() { in.dirtyLo, in.dirtyHi = 0, 0 }

// DropCache drops the file's clean cached pages, as posix_fadvise
// DONTNEED does: after a failed sync, reads then return what the disk
// holds. Dirty pages (written, not yet synced) stay.
func (h *file) DropCache() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.check("fadvise"); err != nil {
		return err
	}
	if in := h.in; in.lost {
		in.data, in.rewritten, in.lost = slices.Clone(in.durable), false, false
		in.clean()
	}
	return nil
}

func (h *file) Truncate(size int64) error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.check("truncate"); err != nil {
		return err
	}
	if h.readOnly || size < 0 {
		return &fs.PathError{Op: "truncate", Path: h.name, Err: fs.ErrInvalid}
	}
	in := h.in
	if size < int64(len(in.durable)) {
		in.rewritten = true
		in.dirty(int(size), math.MaxInt)
	}
	if size <= int64(len(in.data)) {
		in.data = in.data[:size]
	} else {
		in.grow(int(size))
	}
	return nil
}

func (h *file) Stat() (os.FileInfo, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if err := h.check("stat"); err != nil {
		return nil, err
	}
	return fileInfo{name: filepath.Base(h.name), size: int64(len(h.in.data))}, nil
}

func (h *file) Close() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if h.closed {
		return &fs.PathError{Op: "close", Path: h.name, Err: fs.ErrClosed}
	}
	h.closed = true
	return nil
}

type fileInfo struct {
	name string
	size int64
}

func (fi fileInfo) Name() string       { return fi.name }
func (fi fileInfo) Size() int64        { return fi.size }
func (fi fileInfo) Mode() os.FileMode  { return 0o644 }
func (fi fileInfo) ModTime() time.Time { return time.Time{} }
func (fi fileInfo) IsDir() bool        { return false }
func (fi fileInfo) Sys() any           { return nil }
