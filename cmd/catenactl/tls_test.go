package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/catena-streams/catena/client/clienttest"
	"github.com/catena-streams/catena/rpc/transport"
	"github.com/catena-streams/catena/rpc/transport/transporttest"
)

// catenactl reaches a mutual-TLS endpoint with --tls-ca, --tls-cert and
// --tls-key (or their CATENA_TLS_* variables), and says what is wrong with
// a bad set of files before it dials.
func TestTLSEndpoint(t *testing.T) {
	dir := t.TempDir()
	srv, cli := startTLSServer(t, dir)
	produce := []string{"produce", "--stream", "s", "--partition", "0", "--value", "over tls", "--retry-timeout", "1s"}
	other, err := transporttest.NewCA("someone-else")
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := other.WriteFiles(t.TempDir(), "client", "spiffe://catena/ns/t/client/stranger", other.PEM)
	if err != nil {
		t.Fatal(err)
	}

	r := catenactl(t, bg(), srv, "", append([]string{"--tls-ca", cli.ClientCAFile, "--tls-cert", cli.CertFile, "--tls-key", cli.KeyFile}, produce...)...)
	if r.code != 0 {
		t.Fatalf("mutual TLS: exit %d: %s", r.code, r.stderr)
	}
	if recs := srv.Records("s", 0); len(recs) != 1 || string(recs[0].Value) != "over tls" {
		t.Fatalf("stored %v", recs)
	}

	t.Setenv("CATENA_TLS_CA", cli.ClientCAFile)
	t.Setenv("CATENA_TLS_CERT", cli.CertFile)
	t.Setenv("CATENA_TLS_KEY", cli.KeyFile)
	if r := catenactl(t, bg(), srv, "", produce...); r.code != 0 {
		t.Fatalf("from the environment: exit %d: %s", r.code, r.stderr)
	}
	t.Setenv("CATENA_TLS_CA", "")
	t.Setenv("CATENA_TLS_CERT", "")
	t.Setenv("CATENA_TLS_KEY", "")

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"a certificate without its key", []string{"--tls-ca", cli.ClientCAFile, "--tls-cert", cli.CertFile}, 2, "--tls-cert and --tls-key go together"},
		{"a CA file that is not there", []string{"--tls-ca", filepath.Join(dir, "missing.crt")}, 2, "--tls-ca"},
		{"a CA file without a certificate", []string{"--tls-ca", cli.KeyFile}, 2, "holds no PEM certificate"},
		// Under TLS 1.3 the server refuses a missing client certificate
		// after the client's handshake is done: the client sees its alert
		// ("tls: certificate required", refused at once) or, when its
		// first write comes first, a broken pipe, which is retried.
		{"no client certificate for a server that requires one", []string{"--tls-ca", cli.ClientCAFile, "--retry-timeout", "1s"}, 1, "not acknowledged"},
		// A server not trusted is refused by the client itself: said at
		// once, not retried for --retry-timeout (a minute here) as if the
		// server were down.
		{"a server certificate from a CA not trusted", []string{"--tls-ca", stranger.ClientCAFile, "--tls-cert", stranger.CertFile, "--tls-key", stranger.KeyFile, "--retry-timeout", "1m"}, 1,
			"x509: certificate signed by unknown authority"},
		// EOF is also what a restarting server says: retried.
		{"plaintext to a TLS endpoint", nil, 1, "not acknowledged after"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(bg(), 10*time.Second)
			defer cancel()
			r := catenactl(t, ctx, srv, "", append(tc.args, produce...)...)
			t.Logf("stderr: %s", r.stderr)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", r.code, r.stderr, tc.code, tc.want)
			}
		})
	}
	if n := len(srv.Records("s", 0)); n != 2 {
		t.Errorf("%d records stored, want the 2 produced over TLS", n)
	}
}

// startTLSServer starts a test ingestion server requiring mutual TLS,
// with a stream "s" of one partition, and writes into dir the files of a
// client its CA signed.
func startTLSServer(t *testing.T, dir string) (*clienttest.Server, transport.TLSFiles) {
	t.Helper()
	ca, err := transporttest.NewCA("catena-test")
	if err != nil {
		t.Fatal(err)
	}
	srvFiles, err := ca.WriteFiles(dir, "ingest", "spiffe://catena/ns/t/ingest/s", ca.PEM)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := srvFiles.Config()
	if err != nil {
		t.Fatal(err)
	}
	srv := clienttest.StartWith(t, transport.ServerOptions(cfg)...)
	srv.AddStream("s", 1)
	cli, err := ca.WriteFiles(dir, "client", "spiffe://catena/ns/t/client/me", ca.PEM)
	if err != nil {
		t.Fatal(err)
	}
	return srv, cli
}
