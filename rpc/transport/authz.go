package transport

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"sync/atomic"

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

// Anyone in an allow list admits every caller, with a certificate or
// without (a client-facing listener whose clients need not present one).
const Anyone = "anyone"

// An entry ending in PrefixWildcard admits every identity that starts with
// what precedes the star: spiffe://catena/ns/shop/ingest/* admits the
// ingestion nodes of every Stream of namespace shop.
const PrefixWildcard = "/*"

// Admits reports whether an allow list admits a caller: id, or no
// certificate when ok is false.
func Admits(allowed []string, id string, ok bool) bool {
	for _, a := range allowed {
		switch {
		case a == Anyone:
			return true
		case !ok:
		case a == AnyIdentity || a == id:
			return true
		case strings.HasSuffix(a, PrefixWildcard) && strings.HasPrefix(id, strings.TrimSuffix(a, "*")):
			return true
		}
	}
	return false
}

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
	// ForRequest, when set, may name the list for one request instead
	// (ok false: Allow's). Ingestion uses it to judge a request by the
	// Stream it names. The request of a streaming call is judged at each
	// message the server receives.
	ForRequest func(class string, req any) (allowed []string, ok bool)
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

// Check is check for listeners that are not gRPC but serve the same
// methods (ingestion's Kafka listener): ctx carries the caller as a gRPC
// peer (peer.NewContext with credentials.TLSInfo), so the same identities
// and lists apply.
func (p *Policy) Check(ctx context.Context, method string, req any) error {
	return p.check(ctx, method, req)
}

// check returns nil when the caller of ctx may call method with req (nil:
// not known yet), else the gRPC error to answer with.
func (p *Policy) check(ctx context.Context, method string, req any) error {
	class, ok := p.Classes[method]
	if !ok {
		return p.refuse(method, "", codes.PermissionDenied, "method %s is not open to any caller", method)
	}
	allowed := p.Allow[class]
	if p.ForRequest != nil && req != nil {
		if l, ok := p.ForRequest(class, req); ok {
			allowed = l
		}
	}
	id, ok := PeerIdentity(ctx)
	if Admits(allowed, id, ok) {
		return nil
	}
	if !ok {
		return p.refuse(method, class, codes.Unauthenticated, "%s (%s) needs a client certificate this server's CA verifies", method, class)
	}
	return p.refuse(method, class, codes.PermissionDenied, "identity %q may not call %s%s (%s calls are allowed to %s)", id, method, describeRequest(req), class, describeAllow(allowed))
}

// describeRequest names the Stream a request is about, for a refusal.
func describeRequest(req any) string {
	if r, ok := req.(interface{ GetStream() string }); ok && r.GetStream() != "" {
		return " on stream " + r.GetStream()
	}
	return ""
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
			if err := p.check(ctx, info.FullMethod, req); err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if p.ForRequest != nil {
				// Judged by what it asks for: at each message the
				// handler receives, before it acts on it; a method of
				// no class is refused at once, and nothing is sent
				// before a received message has passed.
				if _, ok := p.Classes[info.FullMethod]; !ok {
					return p.check(ss.Context(), info.FullMethod, nil)
				}
				return handler(srv, &checkedStream{ServerStream: ss, p: p, method: info.FullMethod})
			}
			if err := p.check(ss.Context(), info.FullMethod, nil); err != nil {
				return err
			}
			return handler(srv, ss)
		}),
	}
}

// checkedStream judges each message a streaming call's server receives,
// and sends nothing until one has passed.
type checkedStream struct {
	grpc.ServerStream
	p      *Policy
	method string
	// passed: a received message passed. Atomic: a handler may send on
	// other goroutines than the one that receives (ProduceStream answers
	// each request on its own).
	passed atomic.Bool
}

func (s *checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if err := s.p.check(s.Context(), s.method, m); err != nil {
		return err
	}
	s.passed.Store(true)
	return nil
}

func (s *checkedStream) SendMsg(m any) error {
	if !s.passed.Load() {
		return status.Error(codes.PermissionDenied, "nothing is sent before the request is judged")
	}
	return s.ServerStream.SendMsg(m)
}
