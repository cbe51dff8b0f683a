package faultfs_test

import (
	"bytes"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"syscall"
	"testing"

	"github.com/catena-streams/catena/replica/partlog/faultfs"
)

func write(t *testing.T, fsys *faultfs.FS, name string, off int64, b []byte, sync bool) {
	t.Helper()
	f, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestCrashModel(t *testing.T) {
	tests := []struct {
		name    string
		opts    faultfs.CrashOptions
		dirSync bool
		want    []byte // nil: file gone
	}{
		{"unsynced dir entry is lost", faultfs.CrashOptions{KeepUnsynced: -1}, false, nil},
		{"only synced data survives", faultfs.CrashOptions{}, true, []byte("durable")},
		{"torn prefix of the unsynced tail", faultfs.CrashOptions{KeepUnsynced: 3}, true, []byte("durable-pe")},
		{"size but no data", faultfs.CrashOptions{KeepUnsynced: 2, ZeroFill: true}, true, []byte("durable\x00\x00")},
		{"everything", faultfs.CrashOptions{KeepUnsynced: -1}, true, []byte("durable-pending")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fsys := faultfs.New()
			if err := fsys.MkdirAll("/d", 0o755); err != nil {
				t.Fatal(err)
			}
			write(t, fsys, "/d/f", 0, []byte("durable"), true)
			if tc.dirSync {
				if err := fsys.SyncDir("/d"); err != nil {
					t.Fatal(err)
				}
			}
			write(t, fsys, "/d/f", 7, []byte("-pending"), false)
			fsys.Crash(tc.opts)
			got, err := fsys.ReadFile("/d/f")
			if tc.want == nil {
				if !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("file survives: %q %v", got, err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Fatalf("got %q %v, want %q", got, err, tc.want)
			}
		})
	}
}

func TestRenameAndRemoveNeedDirSync(t *testing.T) {
	fsys := faultfs.New()
	fsys.MkdirAll("/d", 0o755)
	write(t, fsys, "/d/a", 0, []byte("a"), true)
	fsys.SyncDir("/d")
	if err := fsys.Rename("/d/a", "/d/b"); err != nil {
		t.Fatal(err)
	}
	fsys.Crash(faultfs.CrashOptions{})
	if names, _ := fsys.ReadDir("/d"); len(names) != 1 || names[0] != "a" {
		t.Fatalf("after crash %v, want the rename undone", names)
	}
	fsys.Rename("/d/a", "/d/b")
	fsys.SyncDir("/d")
	fsys.Remove("/d/b")
	fsys.Crash(faultfs.CrashOptions{})
	if names, _ := fsys.ReadDir("/d"); len(names) != 1 || names[0] != "b" {
		t.Fatalf("after crash %v, want the removal undone", names)
	}
}

func TestFaults(t *testing.T) {
	fsys := faultfs.New()
	fsys.MkdirAll("/d", 0o755)
	f, _ := fsys.OpenFile("/d/f", os.O_RDWR|os.O_CREATE, 0o644)
	fsys.FailWrites(1, 1, syscall.ENOSPC, 2)
	if _, err := f.WriteAt([]byte("ok"), 0); err != nil {
		t.Fatal(err)
	}
	if n, err := f.WriteAt([]byte("torn"), 2); !errors.Is(err, syscall.ENOSPC) || n != 2 {
		t.Fatalf("write: %d %v", n, err)
	}
	if _, err := f.WriteAt([]byte("!"), 4); err != nil {
		t.Fatalf("fault should be one-shot: %v", err)
	}
	if got, _ := fsys.ReadFile("/d/f"); string(got) != "okto!" {
		t.Fatalf("contents %q", got)
	}
	fsys.FailSyncs(0, -1, syscall.EIO)
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("sync: %v", err)
	}
	if err := fsys.SyncDir("/d"); !errors.Is(err, syscall.EIO) {
		t.Fatalf("syncdir: %v", err)
	}
	fsys.ClearFaults()
	fsys.Crash(faultfs.CrashOptions{KeepUnsynced: -1})
	if _, err := f.ReadAt(make([]byte, 1), 0); !errors.Is(err, faultfs.ErrCrashed) {
		t.Fatalf("handle from before the crash: %v", err)
	}
}

// A sync makes the file's current contents durable whatever changed
// since the last one: appends, overwrites, cuts and cuts grown back
// with zeros. Each crash must leave exactly the contents of the last
// sync (a model that copies the whole file at each sync).
func TestSyncKeepsWhatChangedSinceTheLastSync(t *testing.T) {
	for seed := range 20 {
		rng := rand.New(rand.NewPCG(uint64(seed), 0))
		fsys := faultfs.New()
		fsys.MkdirAll("/d", 0o755)
		f, err := fsys.OpenFile("/d/f", os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		fsys.SyncDir("/d")
		var cur, synced []byte
		for step := range 200 {
			switch op := rng.IntN(10); {
			case op < 6:
				off := rng.IntN(len(cur) + 64)
				b := make([]byte, 1+rng.IntN(48))
				for i := range b {
					b[i] = byte(1 + rng.IntN(255))
				}
				if _, err := f.WriteAt(b, int64(off)); err != nil {
					t.Fatal(err)
				}
				if end := off + len(b); end > len(cur) {
					cur = append(cur, make([]byte, end-len(cur))...)
				}
				copy(cur[off:], b)
			case op < 8:
				size := rng.IntN(len(cur) + 32)
				if err := f.Truncate(int64(size)); err != nil {
					t.Fatal(err)
				}
				if size <= len(cur) {
					cur = cur[:size:size]
				} else {
					cur = append(cur, make([]byte, size-len(cur))...)
				}
			default:
				if err := f.Sync(); err != nil {
					t.Fatal(err)
				}
				synced = bytes.Clone(cur)
			}
			if got, _ := fsys.ReadFile("/d/f"); !bytes.Equal(got, cur) {
				t.Fatalf("seed %d step %d: contents %x, want %x", seed, step, got, cur)
			}
			if step%50 == 49 {
				fsys.Crash(faultfs.CrashOptions{})
				if got, _ := fsys.ReadFile("/d/f"); !bytes.Equal(got, synced) {
					t.Fatalf("seed %d step %d: after a crash %x, want the last sync's %x", seed, step, got, synced)
				}
				cur = bytes.Clone(synced)
				if f, err = fsys.OpenFile("/d/f", os.O_RDWR, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// A bad stretch is the file's, not its name's: a handle opened under the
// name the file had before a rename meets it.
func TestFailReadsInFollowsTheFile(t *testing.T) {
	fsys := faultfs.New()
	fsys.MkdirAll("/d", 0o755)
	f, err := fsys.OpenFile("/d/f.tmp", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("0123456789"), 0); err != nil {
		t.Fatal(err)
	}
	if err := fsys.Rename("/d/f.tmp", "/d/f"); err != nil {
		t.Fatal(err)
	}
	fsys.FailReadsIn("/d/f", 4, 6, 1, syscall.EIO)
	b := make([]byte, 2)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatalf("read outside the stretch: %v", err)
	}
	if _, err := f.ReadAt(b, 4); !errors.Is(err, syscall.EIO) {
		t.Fatalf("read of the stretch through the old name's handle: %v, want EIO", err)
	}
	if _, err := f.ReadAt(b, 4); err != nil {
		t.Fatalf("read after the one failure: %v", err)
	}
}
