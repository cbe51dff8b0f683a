package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/catena-streams/catena/controllers"
)

func TestLeaseTimingsValidate(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name            string
		lease           leaseTimings
		wantErrContains string
	}{
		{"the defaults", leaseTimings{15 * s, 10 * s, 2 * s}, ""},
		{"a fast hand-over", leaseTimings{3 * s, 2 * s, s / 2}, ""},
		{"no retry period", leaseTimings{15 * s, 10 * s, 0}, "--leader-elect-retry-period must be positive"},
		{"a deadline within one retry", leaseTimings{15 * s, 2 * s, 2 * s}, "--leader-elect-renew-deadline (2s) must be longer than --leader-elect-retry-period (2s)"},
		{"a lease a standby could take while the leader still renews", leaseTimings{10 * s, 10 * s, 2 * s}, "--leader-elect-lease-duration (10s) must be longer than --leader-elect-renew-deadline (10s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.lease.validate()
			switch {
			case tc.wantErrContains == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.wantErrContains != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErrContains)):
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErrContains)
			}
		})
	}
}

func TestOperatorCacheWatchesTheNamespacesGiven(t *testing.T) {
	all, err := operatorCache(nil)
	if err != nil || all.DefaultNamespaces != nil || len(all.ByObject) != 2 {
		t.Fatalf("no namespaces: %+v, %v; want every namespace, pods and Secrets by label", all, err)
	}
	for obj, want := range map[client.Object]string{&corev1.Pod{}: "app.kubernetes.io/component in (aggregator,ingest,replica),app.kubernetes.io/name=catena",
		&corev1.Secret{}: "app.kubernetes.io/component=certificate,app.kubernetes.io/managed-by=catena-operator,app.kubernetes.io/name=catena"} {
		var got string
		for o, by := range all.ByObject {
			if fmt.Sprintf("%T", o) == fmt.Sprintf("%T", obj) {
				got = by.Label.String()
			}
		}
		if got != want {
			t.Errorf("%T cached by %q, want %q (the operator's own only)", obj, got, want)
		}
	}
	some, err := operatorCache([]string{"shop", "billing"})
	if err != nil || len(some.DefaultNamespaces) != 2 || len(some.ByObject) != 2 {
		t.Fatalf("two namespaces: %+v, %v", some, err)
	}
	if _, ok := some.DefaultNamespaces["billing"]; !ok {
		t.Errorf("billing not watched: %v", some.DefaultNamespaces)
	}
	if _, err := operatorCache([]string{"Shop_1"}); err == nil || !strings.Contains(err.Error(), `"Shop_1" is not a namespace name`) {
		t.Errorf("a bad name: %v", err)
	}
}

func TestNetworkPolicyFlags(t *testing.T) {
	labels := map[string]string{"app.kubernetes.io/name": "catena", "app.kubernetes.io/component": "operator"}
	if o, err := (networkPolicyFlags{podLabels: labels}).options("catena-system"); o != nil || err != nil {
		t.Errorf("off: %+v, %v", o, err)
	}
	o, err := (networkPolicyFlags{enabled: true, podLabels: labels}).options("catena-system")
	if err != nil || o.OperatorNamespace != "catena-system" || o.OperatorPodLabels["app.kubernetes.io/component"] != "operator" {
		t.Errorf("from POD_NAMESPACE: %+v, %v", o, err)
	}
	if o, err := (networkPolicyFlags{enabled: true, namespace: "ops", podLabels: labels}).options("catena-system"); err != nil || o.OperatorNamespace != "ops" {
		t.Errorf("--operator-namespace: %+v, %v", o, err)
	}
	for _, tc := range []struct {
		f    networkPolicyFlags
		want string
	}{
		{networkPolicyFlags{enabled: true, podLabels: labels}, "needs the operator's namespace"},
		{networkPolicyFlags{enabled: true, namespace: "Ops_1", podLabels: labels}, `"Ops_1" is not a namespace name`},
		{networkPolicyFlags{enabled: true, namespace: "ops"}, "needs --operator-pod-labels"},
		{networkPolicyFlags{enabled: true, namespace: "ops", podLabels: map[string]string{"bad key!": "x"}}, "--operator-pod-labels"},
	} {
		if _, err := tc.f.options(""); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.f, err, tc.want)
		}
	}
}

func TestCertificateFlags(t *testing.T) {
	good := certificateFlags{mode: certificatesOperator, secret: "catena-ca", leafLifetime: 90 * 24 * time.Hour, caLifetime: 5 * 365 * 24 * time.Hour, propagation: time.Hour,
		issuer: controllers.IssuerRef{Kind: "ClusterIssuer", Group: "cert-manager.io"}}
	certManager := func(f *certificateFlags) { f.mode, f.issuer.Name = certificatesCertManager, "catena-ca" }
	for _, tc := range []struct {
		name      string
		f         func(*certificateFlags)
		namespace string
		ownFiles  bool
		want      string // "" accepted
	}{
		{"the defaults", func(*certificateFlags) {}, "catena-system", false, ""},
		{"none", func(f *certificateFlags) { f.mode = certificatesNone }, "", false, ""},
		{"an unknown issuer", func(f *certificateFlags) { f.mode = "vault" }, "catena-system", false, `--certificates must be operator, cert-manager or none, got "vault"`},
		{"cert-manager", certManager, "catena-system", false, ""},
		{"cert-manager with an Issuer of each namespace", func(f *certificateFlags) { certManager(f); f.issuer.Kind = "Issuer" }, "catena-system", false, ""},
		{"cert-manager with an external issuer", func(f *certificateFlags) {
			certManager(f)
			f.issuer.Kind, f.issuer.Group = "AWSPCAClusterIssuer", "awspca.cert-manager.io"
		}, "catena-system", false, ""},
		{"cert-manager without an issuer", func(f *certificateFlags) { f.mode = certificatesCertManager }, "catena-system", false, "needs --issuer-name"},
		{"cert-manager with an unknown kind", func(f *certificateFlags) { certManager(f); f.issuer.Kind = "Issuers" }, "catena-system", false, `--issuer-kind must be Issuer or ClusterIssuer for group cert-manager.io, got "Issuers"`},
		{"cert-manager without a namespace", certManager, "", false, "--certificates=cert-manager needs the operator's namespace"},
		{"cert-manager and the operator's own files", certManager, "catena-system", true, "are for --certificates=none"},
		{"no namespace for the CA", func(*certificateFlags) {}, "", false, "needs the operator's namespace"},
		{"the operator's own files as well", func(*certificateFlags) {}, "catena-system", true, "are for --certificates=none"},
		{"a CA shorter-lived than three certificates", func(f *certificateFlags) { f.caLifetime = 2 * f.leafLifetime }, "catena-system", false, "must be at least three times --certificate-lifetime"},
		{"certificates under an hour", func(f *certificateFlags) { f.leafLifetime = time.Minute }, "catena-system", false, "--certificate-lifetime must be at least 1h"},
		{"metrics over TLS without certificates", func(f *certificateFlags) { f.mode, f.metricsTLS = certificatesNone, true }, "", false, "--metrics-tls needs --certificates=operator"},
		{"a bad Secret name", func(f *certificateFlags) { f.secret = "Catena_CA" }, "catena-system", false, `--ca-secret "Catena_CA" is not a Secret name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := good
			tc.f(&f)
			c, err := f.certificates(tc.namespace, tc.ownFiles)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			case tc.want == "" && f.mode == certificatesNone && c != nil:
				// A typed nil in the interface would turn TLS on.
				t.Fatalf("none gave %#v", c)
			case tc.want == "" && f.mode == certificatesOperator:
				if own, ok := c.(*controllers.Certificates); !ok || own.Namespace != tc.namespace || own.SecretName != "catena-ca" {
					t.Fatalf("certificates %#v", c)
				}
			case tc.want == "" && f.mode == certificatesCertManager:
				if cm, ok := c.(*controllers.CertManager); !ok || cm.Namespace != tc.namespace || cm.Issuer != f.issuer ||
					cm.BundleConfigMap != "catena-ca-bundle" || cm.OperatorCertificate != controllers.DefaultOperatorCertificate {
					t.Fatalf("cert-manager %#v", c)
				}
			}
		})
	}
}
