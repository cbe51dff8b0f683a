package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Only this client's own handshake, failed over certificates, makes a
// call's Unavailable a TLS refusal: not a dropped connection, and not
// another hop's TLS failure that an endpoint relays in its message.
func TestTLSRefusal(t *testing.T) {
	verify := &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}
	for _, tc := range []struct {
		handshake error
		refused   bool
	}{
		{verify, true},
		{fmt.Errorf("transport: authentication handshake failed: %w", verify), true},
		{tls.AlertError(42), true}, // bad_certificate from the server
		{errors.New("EOF"), false},
		{errors.New("context deadline exceeded"), false},
	} {
		if got := certificateRefusal(tc.handshake); got != tc.refused {
			t.Errorf("certificateRefusal(%v) = %v, want %v", tc.handshake, got, tc.refused)
		}
	}

	c := &Client{tlsWatch: newHandshakeWatch(&tls.Config{})}
	relayed := status.Error(codes.Unavailable, `replica orders-pool-1: connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate has expired"`)
	if err := c.refusedByTLS(relayed); err != nil {
		t.Errorf("a relayed TLS failure, with this client's handshakes fine: %v", err)
	}
	c.tlsWatch.state.last = verify
	err := c.refusedByTLS(status.Error(codes.Unavailable, "connection error"))
	if !RefusedByTLS(err) || status.Code(err) != codes.Unavailable || !errors.Is(err, err.(*TLSRefusedError).Err) {
		t.Errorf("after a refused handshake: %v", err)
	}
	if err := c.refusedByTLS(status.Error(codes.NotFound, "no stream")); err != nil {
		t.Errorf("a NotFound after a refused handshake: %v", err)
	}
	if err := (&Client{}).refusedByTLS(relayed); err != nil {
		t.Errorf("plaintext: %v", err)
	}
	// A clone (gRPC may take one) shares what the watch remembers.
	if c.tlsWatch.Clone().(*handshakeWatch).refusal() != verify {
		t.Errorf("a clone does not share the refusal")
	}
}
