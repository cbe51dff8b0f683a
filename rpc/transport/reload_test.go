package transport

import (
	"os"
	"testing"
	"time"

	"github.com/catena-streams/catena/rpc/transport/internal/certgen"
)

// A rotation to files that do not load (a half-written key) keeps the last
// good files; the next good files are taken at the next look, and the files
// are looked at no more than once per reloadCheckInterval.
func TestReloaderKeepsTheLastGoodFiles(t *testing.T) {
	dir := t.TempDir()
	ca, err := certgen.NewCA("ca")
	if err != nil {
		t.Fatal(err)
	}
	cert, key, bundle, err := ca.WriteFiles(dir, "server", "spiffe://catena/ns/t/pool/p", ca.PEM)
	if err != nil {
		t.Fatal(err)
	}
	files := TLSFiles{CertFile: cert, KeyFile: key, ClientCAFile: bundle}
	now := time.Unix(1000, 0)
	r := &reloader{files: files, now: func() time.Time { return now }}
	if err := r.load(); err != nil {
		t.Fatal(err)
	}
	first := r.current()

	if err := os.WriteFile(files.KeyFile, []byte("-----BEGIN EC PRIVATE KEY-----\ntrunc"), 0o600); err != nil {
		t.Fatal(err)
	}
	now = now.Add(reloadCheckInterval)
	if got := r.current(); got != first {
		t.Fatal("a broken key replaced the last good files")
	}

	// A good rotation, looked at too soon, then at the next check.
	if _, _, _, err := ca.WriteFiles(dir, "server", "spiffe://catena/ns/t/pool/p", ca.PEM); err != nil {
		t.Fatal(err)
	}
	now = now.Add(reloadCheckInterval / 2)
	if got := r.current(); got != first {
		t.Fatal("the files were read again within the check interval")
	}
	now = now.Add(reloadCheckInterval / 2)
	next := r.current()
	if next == first || next.cert.Leaf.SerialNumber.Cmp(first.cert.Leaf.SerialNumber) == 0 {
		t.Fatal("the rotated certificate was not taken")
	}

	// Files touched but unchanged are not loaded again.
	now = now.Add(reloadCheckInterval)
	if got := r.current(); got != next {
		t.Error("unchanged files were loaded again")
	}
}
