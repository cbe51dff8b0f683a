// Package lazyfs is a partlog.FS over the real file system that keeps
// every write since a file's last Sync in the process's memory only, as
// Jepsen's LazyFS does: when the process is killed, what it had not synced
// is gone, exactly as after a power cut. A SIGKILL of a process on the real
// file system keeps its writes in the kernel's page cache, so it cannot
// test what a coordinated power loss leaves on several members at once.
//
// It is for tests of real replica processes. The replica binary uses it
// only when built with the powerloss build tag (cmd/catena/powerloss.go),
// so a production binary cannot turn it on.
//
// The model, per file:
//   - WriteAt goes to an in-memory overlay; reads see the overlay over the
//     file's contents on disk, and Stat the size they make.
//   - Sync writes the overlay to the file, then fsyncs it.
//   - Names are not lazy: creating, renaming and removing a file, and
//     truncating it, reach the disk at once (a power cut could also undo
//     those; the log fsyncs its directory after each of them, so keeping
//     them is what a journaling file system gives it after SyncDir).
//
// Files are tracked by path while open or pending: handles of one path
// share one overlay, as they would share the page cache.
package lazyfs

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"

	"github.com/catena-streams/catena/replica/partlog"
)

// FS is the lazy file system. The zero value is ready to use.
type FS struct {
	mu     sync.Mutex
	inodes map[string]*inode
}

var _ partlog.FS = (*FS)(nil)

// inode is one file's unsynced state.
type inode struct {
	pending []extent // writes since the last Sync, in order
	size    int64    // the size reads see
	opens   int
}

type extent struct {
	off  int64
	data []byte
}

// New returns a lazy file system over the real one.
func New() *FS { return &FS{inodes: map[string]*inode{}} }

// OpenFile implements partlog.FS.
func (l *FS) OpenFile(name string, flag int, perm os.FileMode) (partlog.File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inodes == nil {
		l.inodes = map[string]*inode{}
	}
	ino := l.inodes[name]
	if ino == nil {
		fi, err := f.Stat()
		if err != nil {
			_ = f.Close()
			return nil, err
		}
		ino = &inode{size: fi.Size()}
		l.inodes[name] = ino
	}
	if flag&os.O_TRUNC != 0 {
		ino.pending, ino.size = nil, 0
	}
	ino.opens++
	return &file{fs: l, f: f, ino: ino, name: name, writable: flag&(os.O_WRONLY|os.O_RDWR) != 0}, nil
}

// ReadDir implements partlog.FS.
func (l *FS) ReadDir(dir string) ([]string, error) { return partlog.OSFS{}.ReadDir(dir) }

// Remove implements partlog.FS. Open handles keep their overlay, as an
// unlinked file's open handles keep its pages.
func (l *FS) Remove(name string) error {
	if err := os.Remove(name); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.inodes, name)
	return nil
}

// Rename implements partlog.FS.
func (l *FS) Rename(oldpath, newpath string) error {
	if err := os.Rename(oldpath, newpath); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ino, ok := l.inodes[oldpath]; ok {
		delete(l.inodes, oldpath)
		l.inodes[newpath] = ino
	} else {
		delete(l.inodes, newpath)
	}
	return nil
}

// MkdirAll implements partlog.FS.
func (l *FS) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }

// SyncDir implements partlog.FS.
func (l *FS) SyncDir(dir string) error { return partlog.OSFS{}.SyncDir(dir) }

// Pending reports the bytes written to files and not yet synced.
func (l *FS) Pending() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for _, ino := range l.inodes {
		for _, e := range ino.pending {
			n += int64(len(e.data))
		}
	}
	return n
}

type file struct {
	fs       *FS
	f        *os.File
	ino      *inode
	name     string
	writable bool
	closed   bool
}

func (f *file) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if off >= f.ino.size {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), f.ino.size-off))
	got, err := f.f.ReadAt(p[:n], off)
	if err != nil && err != io.EOF {
		return 0, err
	}
	clear(p[got:n]) // beyond the file on disk: only the overlay, or a hole
	for _, e := range f.ino.pending {
		lo, hi := max(e.off, off), min(e.off+int64(len(e.data)), off+int64(n))
		if lo < hi {
			copy(p[lo-off:hi-off], e.data[lo-e.off:hi-e.off])
		}
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return 0, os.ErrClosed
	}
	f.ino.pending = append(f.ino.pending, extent{off: off, data: append([]byte(nil), p...)})
	f.ino.size = max(f.ino.size, off+int64(len(p)))
	return len(p), nil
}

// Sync writes the overlay to the file and fsyncs it. Writes that fail
// stay pending: nothing is reported durable that is not.
func (f *file) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if len(f.ino.pending) > 0 && !f.writable {
		return fmt.Errorf("lazyfs: %s has unsynced writes and this handle is read-only", f.name)
	}
	for len(f.ino.pending) > 0 {
		e := f.ino.pending[0]
		if _, err := f.f.WriteAt(e.data, e.off); err != nil {
			return err
		}
		f.ino.pending = f.ino.pending[1:]
	}
	f.ino.pending = nil
	return f.f.Sync()
}

// Truncate cuts the file on disk at once, and the overlay with it.
func (f *file) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.f.Truncate(size); err != nil {
		return err
	}
	kept := f.ino.pending[:0]
	for _, e := range f.ino.pending {
		if e.off >= size {
			continue
		}
		if end := e.off + int64(len(e.data)); end > size {
			e.data = e.data[:size-e.off]
		}
		kept = append(kept, e)
	}
	f.ino.pending, f.ino.size = kept, size
	return nil
}

func (f *file) Stat() (os.FileInfo, error) {
	fi, err := f.f.Stat()
	if err != nil {
		return nil, err
	}
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	return sizedInfo{FileInfo: fi, size: f.ino.size}, nil
}

// Close closes the handle. Unsynced writes stay in the overlay (in the
// page cache, as it were) for the next handle of the path, and die with
// the process.
func (f *file) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return os.ErrClosed
	}
	f.closed = true
	f.ino.opens--
	if f.ino.opens == 0 && len(f.ino.pending) == 0 && f.fs.inodes[f.name] == f.ino {
		delete(f.fs.inodes, f.name) // nothing lazy left: the disk is the truth
	}
	return f.f.Close()
}

// sizedInfo is a FileInfo with the size reads see.
type sizedInfo struct {
	fs.FileInfo
	size int64
}

func (s sizedInfo) Size() int64 { return s.size }
