// Package durable writes small files so that a crash leaves the old
// content or the new, never a torn or empty file: what a replica's chain
// state and catenactl's profiles are kept in.
package durable

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteFile replaces dir/name with b, with permissions perm: a temporary
// file, fsync, rename over name, fsync of dir.
func WriteFile(dir, name string, b []byte, perm os.FileMode) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
	if err != nil {
		return fmt.Errorf("failed to create %s: %w", tmp, err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("failed to write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("failed to fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("failed to close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("failed to install %s: %w", name, err)
	}
	return SyncDir(dir)
}

// SyncDir fsyncs a directory: a file created, renamed or removed in it is
// durable once it returns.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("failed to open dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("failed to fsync dir %s: %w", dir, err)
	}
	return nil
}
