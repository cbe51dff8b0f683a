package transport_test

import (
	"context"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/transport"
	"github.com/catena-streams/catena/rpc/transport/transporttest"
)

// serve runs a health server with tlsFiles and opts on loopback until the
// test ends, and returns its address.
func serve(t *testing.T, files transport.TLSFiles, opts ...grpc.ServerOption) string {
	t.Helper()
	cfg, err := files.Config()
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(append(transport.ServerOptions(cfg), opts...)...)
	healthpb.RegisterHealthServer(g, health.NewServer())
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// check calls Health.Check on a new connection made with files, and
// returns the server certificate it saw.
func check(t *testing.T, addr string, files transport.TLSFiles) (*x509.Certificate, error) {
	t.Helper()
	cfg, err := files.Config()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := transport.Dial(addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var p peer.Peer
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return nil, err
	}
	info := p.AuthInfo.(credentials.TLSInfo)
	return info.State.PeerCertificates[0], nil
}

func mustCA(t *testing.T, name string) *transporttest.CA {
	t.Helper()
	ca, err := transporttest.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustFiles(t *testing.T, ca *transporttest.CA, dir, name, identity string, bundle []byte) transport.TLSFiles {
	t.Helper()
	f, err := ca.WriteFiles(dir, name, identity, bundle)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// A certificate rotated in place (a Secret volume updated by cert-manager or
// the operator's CA) is used by the next connections of the running
// process, and a bundle extended with the new CA is trusted, with no
// restart.
func TestTLSFilesAreReadAgainWhenTheyChange(t *testing.T) {
	dir := t.TempDir()
	old := mustCA(t, "old")
	srvFiles := mustFiles(t, old, dir, "server", "spiffe://catena/ns/t/pool/p", old.PEM)
	cliFiles := mustFiles(t, old, dir, "client", "spiffe://catena/ns/t/operator", old.PEM)
	addr := serve(t, srvFiles)
	first, err := check(t, addr, cliFiles)
	if err != nil {
		t.Fatal(err)
	}

	// The new CA goes into both bundles first, then the new leaves.
	next := mustCA(t, "next")
	bundle := append(append([]byte{}, old.PEM...), next.PEM...)
	_ = mustFiles(t, next, dir, "server", "spiffe://catena/ns/t/pool/p", bundle)
	cliFiles = mustFiles(t, next, dir, "client", "spiffe://catena/ns/t/operator", bundle)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := check(t, addr, cliFiles)
		if err == nil && got.Issuer.CommonName == "next" {
			if got.SerialNumber.Cmp(first.SerialNumber) == 0 {
				t.Fatal("the same certificate after rotation")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not take its rotated certificate: last %v, err %v", got, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A rotation to files that do not load: TestReloaderKeepsTheLastGoodFiles.
}

func TestTLSRefusesPeersOfAnotherCA(t *testing.T) {
	dir := t.TempDir()
	ca, other := mustCA(t, "ca"), mustCA(t, "other")
	addr := serve(t, mustFiles(t, ca, dir, "server", "spiffe://catena/ns/t/pool/p", ca.PEM))
	if _, err := check(t, addr, mustFiles(t, other, dir, "stranger", "spiffe://catena/ns/t/operator", ca.PEM)); err == nil {
		t.Error("a client certificate of another CA was accepted")
	}
	if _, err := check(t, addr, mustFiles(t, ca, dir, "trusting-other", "spiffe://catena/ns/t/operator", other.PEM)); err == nil {
		t.Error("a server certificate of a CA the client does not trust was accepted")
	}
	if _, err := check(t, addr, mustFiles(t, ca, dir, "member", "spiffe://catena/ns/t/operator", ca.PEM)); err != nil {
		t.Errorf("a client of the same CA was refused: %v", err)
	}
}

func TestPolicyAllowsEachClassToItsIdentities(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t, "ca")
	const operator = "spiffe://catena/ns/t/operator"
	var refused []string
	policy := &transport.Policy{
		Classes: map[string]string{healthpb.Health_Check_FullMethodName: "status"},
		Allow:   map[string][]string{"status": {operator}},
		Refused: func(method, class string, code codes.Code) { refused = append(refused, class+" "+code.String()) },
	}
	addr := serve(t, mustFiles(t, ca, dir, "server", "spiffe://catena/ns/t/pool/p", ca.PEM), policy.ServerOptions()...)

	if _, err := check(t, addr, mustFiles(t, ca, dir, "operator", operator, ca.PEM)); err != nil {
		t.Errorf("the allowed identity was refused: %v", err)
	}
	_, err := check(t, addr, mustFiles(t, ca, dir, "ingest", "spiffe://catena/ns/t/ingest/s", ca.PEM))
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `identity "spiffe://catena/ns/t/ingest/s" may not call /grpc.health.v1.Health/Check`) {
		t.Errorf("another identity: %v, want PermissionDenied naming it", err)
	}
	// A common name is the identity of a certificate without a URI.
	_, err = check(t, addr, mustFiles(t, ca, dir, "cn", "someone", ca.PEM))
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `identity "someone"`) {
		t.Errorf("a common name identity: %v, want PermissionDenied naming it", err)
	}
	if strings.Join(refused, ",") != "status PermissionDenied,status PermissionDenied" {
		t.Errorf("refusals counted: %v", refused)
	}

	// Plaintext has no identity: the policy refuses every call.
	plain := serve(t, transport.TLSFiles{}, policy.ServerOptions()...)
	conn, err := transport.Dial(plain, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("plaintext call: %v, want Unauthenticated", err)
	}
	// A method of no class is refused to everyone, the allowed included.
	conn2, err := mustConn(t, addr, mustFiles(t, ca, dir, "operator2", operator, ca.PEM))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	stream, err := healthpb.NewHealthClient(conn2).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "not open to any caller") {
		t.Errorf("a method of no class: %v, want PermissionDenied", err)
	}
}

func mustConn(t *testing.T, addr string, files transport.TLSFiles) (*grpc.ClientConn, error) {
	t.Helper()
	cfg, err := files.Config()
	if err != nil {
		t.Fatal(err)
	}
	return transport.Dial(addr, cfg)
}

func TestParseAllow(t *testing.T) {
	for in, want := range map[string]string{"": "", "*": "*", " a , b,,": "a|b"} {
		if got := strings.Join(transport.ParseAllow(in), "|"); got != want {
			t.Errorf("ParseAllow(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestAdmits(t *testing.T) {
	const ingest = "spiffe://catena/ns/shop/ingest/payments"
	for _, tc := range []struct {
		allowed []string
		id      string
		ok      bool
		want    bool
	}{
		{[]string{transport.AnyIdentity}, ingest, true, true},
		{[]string{transport.AnyIdentity}, "", false, false},
		{[]string{transport.Anyone}, "", false, true},
		{[]string{transport.Anyone}, ingest, true, true},
		{[]string{ingest}, ingest, true, true},
		{[]string{ingest}, ingest + "x", true, false},
		{[]string{"spiffe://catena/ns/shop/ingest/*"}, ingest, true, true},
		{[]string{"spiffe://catena/ns/shop/ingest/*"}, "spiffe://catena/ns/shop/ingest", true, false},
		{[]string{"spiffe://catena/ns/shop/ingest/*"}, "spiffe://catena/ns/shop/ingestx/a", true, false},
		{[]string{"spiffe://catena/ns/shop/ingest/*"}, "spiffe://catena/ns/other/ingest/a", true, false},
		{[]string{"spiffe://catena/ns/shop/ingest/*"}, "", false, false},
		{nil, ingest, true, false},
	} {
		if got := transport.Admits(tc.allowed, tc.id, tc.ok); got != tc.want {
			t.Errorf("Admits(%q, %q, %v) = %v, want %v", tc.allowed, tc.id, tc.ok, got, tc.want)
		}
	}
}
