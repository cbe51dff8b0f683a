package pki

import (
	"crypto/x509"
	"net"
	"testing"
	"time"
)

var (
	t0  = time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	rot = Rotation{Lifetime: 300 * time.Hour, Propagation: time.Hour}
)

func mustPlanCA(t *testing.T, data map[string][]byte, now time.Time) (map[string][]byte, bool, time.Time) {
	t.Helper()
	return mustPlanCATrusted(t, data, now, t0)
}

func mustPlanCATrusted(t *testing.T, data map[string][]byte, now, trustedSince time.Time) (map[string][]byte, bool, time.Time) {
	t.Helper()
	out, changed, wake, err := PlanCA(data, "catena-test", now, trustedSince, rot)
	if err != nil {
		t.Fatal(err)
	}
	return out, changed, wake
}

func bundleSubjects(t *testing.T, data map[string][]byte) []string {
	t.Helper()
	certs, err := ParseBundle(data[BundleKey])
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range certs {
		out = append(out, string(c.Raw))
	}
	return out
}

func certOf(t *testing.T, pemCert []byte) *x509.Certificate {
	t.Helper()
	c, err := parseCert(pemCert)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCARotatesInTwoSteps walks the CA's life: created, kept, the next CA
// trusted first, signing only after the propagation time, the old one
// trusted until it expires.
func TestCARotatesInTwoSteps(t *testing.T) {
	created, changed, wake := mustPlanCA(t, nil, t0)
	if !changed || len(bundleSubjects(t, created)) != 1 {
		t.Fatalf("a new CA: changed=%v, bundle of %d", changed, len(bundleSubjects(t, created)))
	}
	first := certOf(t, created[CertKey])
	if want := RenewAt(first); !wake.Equal(want) {
		t.Fatalf("wake %v, want the CA's renewal %v", wake, want)
	}

	// Before two thirds: nothing to do.
	same, changed, _ := mustPlanCA(t, created, t0.Add(100*time.Hour))
	if changed || !equalData(same, created) {
		t.Fatal("a young CA was changed")
	}

	// At two thirds: the next CA is trusted, not signing.
	at := RenewAt(first)
	step1, changed, wake := mustPlanCA(t, created, at)
	if !changed || len(step1[NextCertKey]) == 0 {
		t.Fatal("no next CA at two thirds of the CA's life")
	}
	if string(step1[CertKey]) != string(created[CertKey]) {
		t.Fatal("the next CA signs before it is trusted everywhere")
	}
	if got := len(bundleSubjects(t, step1)); got != 2 {
		t.Fatalf("bundle of %d during rotation, want 2", got)
	}
	if !wake.Equal(at.Add(rot.Propagation)) {
		t.Fatalf("wake %v, want the end of propagation %v", wake, at.Add(rot.Propagation))
	}

	// Within propagation: unchanged.
	if _, changed, _ := mustPlanCA(t, step1, at.Add(rot.Propagation/2)); changed {
		t.Fatal("changed during propagation")
	}

	// An operator that was down while the clock ran: it hands the bundle
	// out first, then waits the propagation time again.
	if _, changed, wake := mustPlanCATrusted(t, step1, at.Add(5*rot.Propagation), time.Time{}); changed || !wake.Equal(at.Add(6*rot.Propagation)) {
		t.Fatalf("switched (%v) before this operator handed the bundle out; wake %v", changed, wake)
	}
	if _, changed, _ := mustPlanCATrusted(t, step1, at.Add(5*rot.Propagation), at.Add(5*rot.Propagation)); changed {
		t.Fatal("switched as soon as the bundle was handed out")
	}
	if _, changed, _ := mustPlanCATrusted(t, step1, at.Add(6*rot.Propagation), at.Add(5*rot.Propagation)); !changed {
		t.Fatal("did not switch a propagation time after the bundle was handed out")
	}

	// After propagation: the next CA signs; both stay trusted.
	step2, changed, wake := mustPlanCA(t, step1, at.Add(rot.Propagation))
	if !changed || string(step2[CertKey]) != string(step1[NextCertKey]) || len(step2[NextCertKey]) != 0 {
		t.Fatal("the next CA did not take over signing")
	}
	if got := len(bundleSubjects(t, step2)); got != 2 {
		t.Fatalf("bundle of %d after the switch, want 2 (the old CA until it expires)", got)
	}
	if !wake.Equal(first.NotAfter) {
		t.Fatalf("wake %v, want the old CA's expiry %v", wake, first.NotAfter)
	}
	if bundleSubjects(t, step2)[0] != string(certOf(t, step2[CertKey]).Raw) {
		t.Fatal("the signing CA is not first in the bundle")
	}

	// After the old CA expires it leaves the bundle.
	step3, changed, _ := mustPlanCA(t, step2, first.NotAfter.Add(time.Second))
	if !changed || len(bundleSubjects(t, step3)) != 1 {
		t.Fatal("the expired CA stayed in the bundle")
	}
}

func TestPlanCARefusesACAThatDoesNotLoad(t *testing.T) {
	created, _, _ := mustPlanCA(t, nil, t0)
	for name, data := range map[string]map[string][]byte{
		"key of another CA": {CertKey: created[CertKey], KeyKey: mustNewCAKey(t), BundleKey: created[BundleKey]},
		"empty bundle":      {CertKey: created[CertKey], KeyKey: created[KeyKey]},
		"garbage":           {CertKey: []byte("x"), KeyKey: []byte("y")},
	} {
		if _, _, _, err := PlanCA(data, "catena-test", t0, t0, rot); err == nil {
			t.Errorf("%s: a CA that does not load was replaced; want an error", name)
		}
	}
}

func mustNewCAKey(t *testing.T) []byte {
	_, key, err := newCA("other", t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func TestPlanLeaf(t *testing.T) {
	caData, _, _ := mustPlanCA(t, nil, t0)
	ca, err := ParseCA(caData)
	if err != nil {
		t.Fatal(err)
	}
	leaf := Leaf{Identity: "spiffe://catena/ns/shop/pool/orders", DNSNames: []string{"*.orders.shop.svc", "orders.shop.svc"}, Lifetime: 90 * time.Hour}
	certPEM, keyPEM, err := ca.Issue(leaf, t0)
	if err != nil {
		t.Fatal(err)
	}
	good := LeafData(certPEM, keyPEM, ca)
	other, _, _ := mustPlanCA(t, nil, t0)
	otherCA, _ := ParseCA(other)
	otherCert, otherKey, _ := otherCA.Issue(leaf, t0)
	rotated := *ca
	rotated.Bundle = append(append([]byte{}, ca.Bundle...), other[BundleKey]...)

	for _, tc := range []struct {
		name string
		data map[string][]byte
		want Leaf
		ca   *CA
		now  time.Time
		act  LeafAction
	}{
		{"none", nil, leaf, ca, t0, LeafIssue},
		{"good", good, leaf, ca, t0.Add(time.Hour), LeafKeep},
		{"key of another certificate", map[string][]byte{CertKey: certPEM, KeyKey: otherKey, BundleKey: ca.Bundle}, leaf, ca, t0, LeafIssue},
		{"identity changed", good, Leaf{Identity: "spiffe://catena/ns/shop/pool/other", DNSNames: leaf.DNSNames, Lifetime: leaf.Lifetime}, ca, t0, LeafIssue},
		{"names changed", good, Leaf{Identity: leaf.Identity, DNSNames: []string{"orders.shop.svc"}, Lifetime: leaf.Lifetime}, ca, t0, LeafIssue},
		{"names reordered", good, Leaf{Identity: leaf.Identity, DNSNames: []string{"orders.shop.svc", "*.orders.shop.svc"}, Lifetime: leaf.Lifetime}, ca, t0, LeafKeep},
		{"an IP added", good, Leaf{Identity: leaf.Identity, DNSNames: leaf.DNSNames, IPs: []net.IP{net.IPv4(10, 0, 0, 1)}, Lifetime: leaf.Lifetime}, ca, t0, LeafIssue},
		{"signed by another CA", map[string][]byte{CertKey: otherCert, KeyKey: otherKey, BundleKey: ca.Bundle}, leaf, ca, t0, LeafIssue},
		{"bundle grew", good, leaf, &rotated, t0, LeafBundle},
		{"just before two thirds", good, leaf, ca, t0.Add(55 * time.Hour), LeafKeep},
		{"two thirds", good, leaf, ca, t0.Add(60 * time.Hour), LeafIssue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			act, reason, _ := PlanLeaf(tc.data, tc.want, tc.ca, tc.now)
			if act != tc.act {
				t.Fatalf("action %d (%s), want %d", act, reason, tc.act)
			}
		})
	}
}

// TestIssuedCertificatesVerify checks a leaf against the bundle as a peer
// would: the name, the identity and both key usages.
func TestIssuedCertificatesVerify(t *testing.T) {
	caData, _, _ := mustPlanCA(t, nil, t0)
	ca, _ := ParseCA(caData)
	certPEM, _, err := ca.Issue(Leaf{Identity: "spiffe://catena/ns/shop/ingest/payments", DNSNames: []string{"payments-ingest.shop.svc"}, IPs: []net.IP{net.IPv4(192, 0, 2, 7)}, Lifetime: time.Hour}, t0)
	if err != nil {
		t.Fatal(err)
	}
	c := certOf(t, certPEM)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.Bundle)
	for _, name := range []string{"payments-ingest.shop.svc", "192.0.2.7"} {
		if _, err := c.Verify(x509.VerifyOptions{Roots: roots, DNSName: name, CurrentTime: t0, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if c.Subject.CommonName != "payments" || c.URIs[0].String() != "spiffe://catena/ns/shop/ingest/payments" {
		t.Errorf("subject %q, URIs %v", c.Subject.CommonName, c.URIs)
	}
	if _, _, err := ca.Issue(Leaf{Identity: "not a uri", Lifetime: time.Hour}, t0); err == nil {
		t.Error("an identity that is not a URI was issued")
	}
}
