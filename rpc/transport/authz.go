package transport

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Identities and authorization.
//
// A caller's identity is the one its verified client certificate names:
// the first URI subject alternative name (the operator issues
// spiffe://catena/ns/<namespace>/<role>/<name>, see docs/security.md), or
// the subject's common name when the certificate has no URI. A server
// sorts its methods into classes (a replica: admin, replication, data,
// status) and allows each class to a list of identities; "*" is any
// certificate the CA bundle verifies. The check is in the interceptors
// below, before any handler runs, so a refused call changes nothing.

// AnyIdentity in an allow list admits every verified certificate.
const AnyIdentity = "*"

// PeerIdentity returns the identity of the caller of ctx's call: ok is false
// without a verified client certificate (plaintext, or none presented).
func PeerIdentity(ctx context.Context) (string, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return "", false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return "", false
	}
	return CertIdentity(info.State.VerifiedChains[0][0]), true
}

// CertIdentity is the identity a certificate names.
func CertIdentity(c *x509.Certificate) string {
	if len(c.URIs) > 0 {
		return c.URIs[0].String()
	}
	return c.Subject.CommonName
}

// Policy says who may call which method of a server.
type Policy struct {
	// Classes maps a full method name (/catena.v1.Replica/Drop) to its
	// class; a method of no class is refused to everyone.
	Classes map[string]string
	// Allow lists, per class, the identities that may call its methods.
	Allow map[string][]string
	// Refused, when set, is told of each refusal (for metrics).
	Refused func(method, class string, code codes.Code)
}

// ParseAllow parses an allow list flag: identities separated by commas
// ("*": any verified certificate).
func ParseAllow(s string) []string {
	var out []string
	for _, id := range strings.Split(s, ",") {
		if id = strings.TrimSpace(id); id != "" {
			out = append(out, id)
		}
	}
	return out
}

// check returns nil when the caller of ctx may call method, else the
// gRPC error to answer with.
func (p *Policy) check(ctx context.Context, method string) error {
	class, ok := p.Classes[method]
	if !ok {
		return p.refuse(method, "", codes.PermissionDenied, "method %s is not open to any caller", method)
	}
	id, ok := PeerIdentity(ctx)
	if !ok {
		return p.refuse(method, class, codes.Unauthenticated, "%s (%s) needs a client certificate this server's CA verifies", method, class)
	}
	allowed := p.Allow[class]
	if slices.Contains(allowed, AnyIdentity) || slices.Contains(allowed, id) {
		return nil
	}
	return p.refuse(method, class, codes.PermissionDenied, "identity %q may not call %s (%s calls are allowed to %s)", id, method, class, describeAllow(allowed))
}

func (p *Policy) refuse(method, class string, code codes.Code, format string, args ...any) error {
	if p.Refused != nil {
		p.Refused(method, class, code)
	}
	return status.Error(code, fmt.Sprintf(format, args...))
}

func describeAllow(ids []string) string {
	if len(ids) == 0 {
		return "no one"
	}
	return strings.Join(ids, ", ")
}

// ServerOptions returns the interceptors that enforce p.
func (p *Policy) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if err := p.check(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if err := p.check(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return handler(srv, ss)
		}),
	}
}
