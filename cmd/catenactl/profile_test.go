package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/catena-streams/catena/client/clienttest"
)

// Profiles keep the connection flags: the current one fills what neither a
// flag nor an environment variable sets, and bad input changes nothing
// stored.
func TestProfiles(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("CATENA_CONFIG", filepath.Join(dir, "cfg", "catenactl.yaml"))
	plain := clienttest.Start(t)
	plain.AddStream("s", 1)

	secure, cli := startTLSServer(t, dir)
	produce := []string{"produce", "--stream", "s", "--partition", "0", "--value", "v", "--retry-timeout", "1s"}
	ok := func(args ...string) string {
		t.Helper()
		r := catenactl(t, bg(), nil, "", args...)
		if r.code != 0 {
			t.Fatalf("catenactl %v: exit %d: %s", args, r.code, r.stderr)
		}
		return r.stdout
	}

	// Relative paths are stored absolute: the profile works from anywhere.
	t.Chdir(dir)
	ok("profile", "create", "prod", "--server", secure.Addr, "--tls-ca", filepath.Base(cli.ClientCAFile),
		"--tls-cert", filepath.Base(cli.CertFile), "--tls-key", filepath.Base(cli.KeyFile))
	ok("profile", "create", "local", "--server", plain.Addr)
	if got := ok("profile", "list"); got != "* local\t"+plain.Addr+"\tplaintext\n  prod\t"+secure.Addr+"\tmutual TLS\n" {
		t.Errorf("list:\n%s", got)
	}
	t.Chdir(t.TempDir())

	ok(produce...) // local, the current one
	ok(append([]string{"--profile", "prod"}, produce...)...)
	ok("profile", "use", "prod")
	ok(produce...)
	t.Setenv("CATENA_PROFILE", "local")
	ok(produce...)
	t.Setenv("CATENA_PROFILE", "")
	// A server given alone is dialled without the current profile's TLS
	// files (another endpoint's credentials); named, a profile lends them
	// to a server given beside it.
	ok(append([]string{"--server", plain.Addr}, produce...)...)
	t.Setenv("CATENA_SERVER", plain.Addr)
	ok(produce...)
	t.Setenv("CATENA_SERVER", "")
	ok(append([]string{"--profile", "prod", "--server", secure.Addr}, produce...)...)
	if n, m := len(plain.Records("s", 0)), len(secure.Records("s", 0)); n != 4 || m != 3 {
		t.Errorf("records: %d on the plain server, %d on the TLS one; want 4 and 3", n, m)
	}

	before, err := os.ReadFile(os.Getenv("CATENA_CONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"profile", "create", "prod", "--server", "x:1"}, `profile "prod" exists`},
		{[]string{"profile", "create", "Bad_Name", "--server", "x:1"}, `profile name "Bad_Name"`},
		{[]string{"profile", "create", "p2"}, "profile create needs --server"},
		{[]string{"profile", "create", "p2", "--server", "no-port"}, `--server "no-port" is not host:port`},
		{[]string{"profile", "create", "p2", "--server", "x:1", "--tls-ca", "missing.crt"}, "--tls-ca"},
		{[]string{"profile", "create", "p2", "--server", "x:1", "--tls-cert", cli.CertFile}, "--tls-cert and --tls-key go together"},
		{[]string{"profile", "use", "nope"}, `profile "nope" is not in`},
		{[]string{"profile", "delete", "nope"}, `profile "nope" is not in`},
		{append([]string{"--profile", "nope"}, produce...), `profile "nope" is not in`},
	} {
		r := catenactl(t, bg(), nil, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("catenactl %v: exit %d, %q; want exit 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	after, err := os.ReadFile(os.Getenv("CATENA_CONFIG"))
	if err != nil || string(after) != string(before) {
		t.Errorf("bad input changed the config (%v):\n%s\nwas\n%s", err, after, before)
	}
	if fi, err := os.Stat(os.Getenv("CATENA_CONFIG")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("config mode: %v, %v; want 0600", fi.Mode(), err)
	}

	ok("profile", "create", "prod", "--force", "--server", plain.Addr)
	ok("profile", "delete", "prod")
	if got := ok("profile", "list"); got != "  local\t"+plain.Addr+"\tplaintext\n" {
		t.Errorf("after deleting the current profile:\n%s", got)
	}
}

// --stream completes with the server's streams, found as the command would
// connect (here: the current profile).
func TestStreamCompletion(t *testing.T) {
	t.Setenv("CATENA_CONFIG", filepath.Join(t.TempDir(), "catenactl.yaml"))
	srv := clienttest.Start(t)
	srv.AddStream("orders", 1)
	srv.AddStream("order-audit", 1)
	srv.AddStream("clicks", 1)
	if r := catenactl(t, bg(), nil, "", "profile", "create", "local", "--server", srv.Addr); r.code != 0 {
		t.Fatal(r.stderr)
	}
	for _, cmd := range []string{"produce", "consume", "describe"} {
		r := catenactl(t, bg(), nil, "", "__complete", cmd, "--stream", "ord")
		got := lines(r.stdout)
		if r.code != 0 || len(got) != 3 || !slices.Equal(slices.Sorted(slices.Values(got[:2])), []string{"order-audit", "orders"}) || got[2] != ":4" {
			t.Errorf("%s --stream ord<TAB>: exit %d, %q (%s)", cmd, r.code, r.stdout, r.stderr)
		}
	}
}

// Without a config directory (no $HOME, no $CATENA_CONFIG), commands run
// from their flags, and making a profile says what is missing.
func TestNoConfigDirectory(t *testing.T) {
	srv := clienttest.Start(t)
	srv.AddStream("s", 1)
	t.Setenv("CATENA_CONFIG", "")
	t.Setenv("HOME", "")
	t.Setenv("XDG_CONFIG_HOME", "")
	if r := catenactl(t, bg(), srv, "", "produce", "--stream", "s", "--value", "v"); r.code != 0 {
		t.Errorf("produce: exit %d: %s", r.code, r.stderr)
	}
	if r := catenactl(t, bg(), nil, "", "version"); r.code != 0 {
		t.Errorf("version: exit %d: %s", r.code, r.stderr)
	}
	r := catenactl(t, bg(), nil, "", "profile", "create", "x", "--server", "h:1")
	if r.code != 2 || !strings.Contains(r.stderr, "set CATENA_CONFIG") {
		t.Errorf("profile create: exit %d: %s", r.code, r.stderr)
	}
}
