package partlog

import (
	"io"
	"os"
	"sort"
)

// FS is the file-system seam: every byte the log reads or writes goes
// through it, so tests (and other packages' tests, via partlog/faultfs) can
// inject torn writes, fsync and write errors, and crashes that drop unsynced
// data. Names are full paths as built by the log with filepath.Join.
type FS interface {
	// OpenFile opens or creates a file; flag and perm are as for os.OpenFile.
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	// ReadDir returns the names (not paths) of the entries of dir, sorted.
	ReadDir(dir string) ([]string, error)
	Remove(name string) error
	Rename(oldpath, newpath string) error
	MkdirAll(dir string, perm os.FileMode) error
	// SyncDir makes the directory's entries (creations, renames, removals,
	// and for some file systems size changes) durable.
	SyncDir(dir string) error
}

// File is an open file. The log only uses positional I/O, so a File may be
// shared by one writer and concurrent readers without a file cursor.
type File interface {
	io.ReaderAt
	io.WriterAt
	Sync() error
	Truncate(size int64) error
	Stat() (os.FileInfo, error)
	Close() error
}

// OSFS is the real file system.
type OSFS struct{}

var _ FS = OSFS{}

func (OSFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err // a nil *os.File must not become a non-nil File
	}
	return f, nil
}

func (OSFS) ReadDir(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	sort.Strings(names)
	return names, nil
}

func (OSFS) Remove(name string) error                    { return os.Remove(name) }
func (OSFS) Rename(oldpath, newpath string) error        { return os.Rename(oldpath, newpath) }
func (OSFS) MkdirAll(dir string, perm os.FileMode) error { return os.MkdirAll(dir, perm) }

// SyncDir fsyncs the directory itself: on Linux that is what makes a create,
// rename or unlink in it survive power loss.
func (OSFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
