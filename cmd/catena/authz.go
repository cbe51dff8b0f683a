package main

import (
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/catena-streams/catena/rpc/transport"
)

// allowFlags are a server's --allow-<class> flags: who may call each class
// of its methods.
type allowFlags struct {
	classes []string
	allow   map[string]*string
}

// addAllowFlags adds --allow-<class> for each class, every one "*" (any
// certificate the CA bundle verifies) by default.
func addAllowFlags(cmd *cobra.Command, role string, classes map[string]string, anyone bool) *allowFlags {
	anyoneHelp := ""
	if anyone {
		anyoneHelp = ", " + transport.Anyone + " any caller, with a certificate or without"
	}
	a := &allowFlags{allow: map[string]*string{}}
	for _, c := range classes {
		if !slices.Contains(a.classes, c) {
			a.classes = append(a.classes, c)
		}
	}
	slices.Sort(a.classes)
	for _, c := range a.classes {
		a.allow[c] = cmd.Flags().String("allow-"+c, transport.AnyIdentity,
			fmt.Sprintf("identities (certificate URI, or common name; a URI ending in /* admits every identity under it), comma-separated, that may make this %s's %s calls; * is any certificate the --tls-ca bundle verifies%s (needs TLS)", role, c, anyoneHelp))
	}
	return a
}

// serverOptions returns the interceptors enforcing the flags over classes,
// counting refusals in reg; none without TLS, where only the default (*)
// is accepted: a plaintext caller has no identity to check.
func (a *allowFlags) serverOptions(tlsOn bool, classes map[string]string, reg prometheus.Registerer) ([]grpc.ServerOption, error) {
	p, err := a.policy(tlsOn, classes, reg)
	if p == nil || err != nil {
		return nil, err
	}
	return p.ServerOptions(), nil
}

// policy is the transport.Policy of the flags (nil without TLS).
func (a *allowFlags) policy(tlsOn bool, classes map[string]string, reg prometheus.Registerer) (*transport.Policy, error) {
	allow := map[string][]string{}
	for _, c := range a.classes {
		allow[c] = transport.ParseAllow(*a.allow[c])
		if !tlsOn && !slices.Equal(allow[c], []string{transport.AnyIdentity}) {
			return nil, fmt.Errorf("--allow-%s needs TLS (--tls-cert, --tls-key and --tls-ca): a plaintext caller has no identity to check", c)
		}
	}
	if !tlsOn {
		return nil, nil
	}
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "catena", Name: "rpc_refused_total",
		Help: "Calls refused before any handler ran: Unauthenticated (no verified client certificate) or PermissionDenied (an identity the --allow-<class> flag does not list).",
	}, []string{"method", "class", "code"})
	if reg != nil {
		reg.MustRegister(refused)
	}
	return &transport.Policy{Classes: classes, Allow: allow, Refused: func(method, class string, code codes.Code) {
		refused.WithLabelValues(method, class, code.String()).Inc()
	}}, nil
}
