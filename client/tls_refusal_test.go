package client

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRefusedByTLS(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Unavailable, `connection error: desc = "error reading server preface: remote error: tls: certificate required"`), true},
		{status.Error(codes.Unavailable, `connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"`), true},
		{fmt.Errorf("record 1: %w", status.Error(codes.Unavailable, `remote error: tls: bad certificate`)), true},
		// A server restarting, a dead address: retried.
		{status.Error(codes.Unavailable, `connection error: desc = "error reading server preface: EOF"`), false},
		{status.Error(codes.Unavailable, `connection error: desc = "transport: authentication handshake failed: context deadline exceeded"`), false},
		{status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"`), false},
		{status.Error(codes.PermissionDenied, `tls: not this`), false},
		{errors.New("tls: plain"), false},
	} {
		if got := RefusedByTLS(tc.err); got != tc.want {
			t.Errorf("RefusedByTLS(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
