package controllers

import (
	"context"
	"errors"
	"maps"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/catena-streams/catena/internal/pki"
)

var testIssuer = IssuerRef{Name: "catena-ca", Kind: "ClusterIssuer", Group: "cert-manager.io"}

func TestDesiredCertificate(t *testing.T) {
	key := types.NamespacedName{Namespace: "shop", Name: "orders-ingest-tls"}
	l := pki.Leaf{Identity: "spiffe://catena/ns/shop/ingest/orders", DNSNames: []string{"orders-ingest.shop.svc", "metrics.catena.invalid"}, IPs: []net.IP{net.ParseIP("192.0.2.7")}}
	labels := map[string]string{"app.kubernetes.io/name": "catena", "catena.io/stream": "orders"}
	u := desiredCertificate(key, l, testIssuer, 2160*time.Hour, labels)

	if u.GroupVersionKind() != certificateGVK || u.GetNamespace() != "shop" || u.GetName() != "orders-ingest-tls" || u.GetLabels()["catena.io/stream"] != "orders" {
		t.Fatalf("object %v %s/%s %v", u.GroupVersionKind(), u.GetNamespace(), u.GetName(), u.GetLabels())
	}
	for _, tc := range []struct {
		path []string
		want any
	}{
		{[]string{"secretName"}, "orders-ingest-tls"},
		{[]string{"issuerRef", "name"}, "catena-ca"},
		{[]string{"issuerRef", "kind"}, "ClusterIssuer"},
		{[]string{"issuerRef", "group"}, "cert-manager.io"},
		{[]string{"duration"}, "2160h0m0s"},
		{[]string{"renewBeforePercentage"}, int64(33)},
		{[]string{"privateKey", "algorithm"}, "ECDSA"},
		{[]string{"privateKey", "size"}, int64(256)},
		{[]string{"privateKey", "rotationPolicy"}, "Always"},
		{[]string{"secretTemplate", "labels", "catena.io/stream"}, "orders"},
	} {
		got, found, err := unstructured.NestedFieldNoCopy(u.Object, append([]string{"spec"}, tc.path...)...)
		if err != nil || !found || got != tc.want {
			t.Errorf("spec.%v = %#v (found %v, %v), want %#v", tc.path, got, found, err, tc.want)
		}
	}
	for _, tc := range []struct {
		field string
		want  []string
	}{
		{"uris", []string{"spiffe://catena/ns/shop/ingest/orders"}},
		{"dnsNames", []string{"orders-ingest.shop.svc", "metrics.catena.invalid"}},
		{"ipAddresses", []string{"192.0.2.7"}},
		{"usages", []string{"digital signature", "server auth", "client auth"}},
	} {
		got, _, err := unstructured.NestedStringSlice(u.Object, "spec", tc.field)
		if err != nil || !equalStrings(got, tc.want) {
			t.Errorf("spec.%s = %v (%v), want %v", tc.field, got, err, tc.want)
		}
	}

	// A client's certificate names no host: the lists are left out.
	user := desiredCertificate(key, pki.Leaf{Identity: "spiffe://catena/ns/shop/stream/orders/user/app"}, testIssuer, time.Hour, labels)
	spec := user.Object["spec"].(map[string]any)
	if _, ok := spec["dnsNames"]; ok {
		t.Error("a client certificate asks for DNS names")
	}
	if _, ok := spec["ipAddresses"]; ok {
		t.Error("a client certificate asks for IP addresses")
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestContainsAll(t *testing.T) {
	want := map[string]any{"dnsNames": []any{"a", "b"}, "privateKey": map[string]any{"size": int64(256)}, "duration": "1h0m0s"}
	for _, tc := range []struct {
		name string
		have any
		ok   bool
	}{
		{"the same", map[string]any{"dnsNames": []any{"a", "b"}, "privateKey": map[string]any{"size": int64(256)}, "duration": "1h0m0s"}, true},
		{"defaults added", map[string]any{"dnsNames": []any{"a", "b"}, "privateKey": map[string]any{"size": int64(256), "encoding": "PKCS1"}, "duration": "1h0m0s", "revisionHistoryLimit": int64(1)}, true},
		{"a name fewer", map[string]any{"dnsNames": []any{"a"}, "privateKey": map[string]any{"size": int64(256)}, "duration": "1h0m0s"}, false},
		{"names reordered", map[string]any{"dnsNames": []any{"b", "a"}, "privateKey": map[string]any{"size": int64(256)}, "duration": "1h0m0s"}, false},
		{"a field missing", map[string]any{"dnsNames": []any{"a", "b"}, "privateKey": map[string]any{"size": int64(256)}}, false},
		{"another key size", map[string]any{"dnsNames": []any{"a", "b"}, "privateKey": map[string]any{"size": int64(384)}, "duration": "1h0m0s"}, false},
		{"no spec", nil, false},
	} {
		if got := containsAll(tc.have, want); got != tc.ok {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.ok)
		}
	}
}

// TestCertManagerLeaves walks a leaf's life in cert-manager mode: the
// Certificate is created once and updated only when what it must name
// changes; the Secret cert-manager writes is made the owner's; someone
// else's Certificate is never touched; a leaf no longer wanted loses its
// Certificate and its Secret.
func TestCertManagerLeaves(t *testing.T) {
	env := newLedgerTestEnv(t)
	ctx := context.Background()
	c := &CertManager{Client: env.client, Reader: env.client, Scheme: env.client.Scheme(), Issuer: testIssuer, Namespace: "ops", LeafLifetime: 100 * time.Hour}
	key := types.NamespacedName{Namespace: "ns", Name: "orders-ingest-tls"}
	read := func() *unstructured.Unstructured {
		t.Helper()
		u := newCertificate()
		if err := env.client.Get(ctx, key, u); err != nil {
			t.Fatal(err)
		}
		return u
	}
	ensure := func(name string, l pki.Leaf, labels map[string]string) time.Time {
		t.Helper()
		wake, err := c.ensureLeaf(ctx, env.stream, name, l, labels)
		if err != nil {
			t.Fatal(err)
		}
		return wake
	}
	issuedBy := func(crt string) map[string]string { return map[string]string{certificateNameAnnotation: crt} }

	leaf := ingestLeaf(env.stream)
	if wake := ensure(key.Name, leaf, nil); wake.IsZero() {
		t.Fatal("no second look while the Secret is not issued: its creation wakes no owner")
	}
	first := read()
	if !metav1.IsControlledBy(first, env.stream) {
		t.Fatalf("owners %v", first.GetOwnerReferences())
	}
	ensure(key.Name, leaf, nil)
	if got := read(); got.GetResourceVersion() != first.GetResourceVersion() {
		t.Fatal("an unchanged Certificate was written again")
	}
	leaf.DNSNames = append(leaf.DNSNames, "orders.example.com")
	ensure(key.Name, leaf, nil)
	if names, _, _ := unstructured.NestedStringSlice(read().Object, "spec", "dnsNames"); names[len(names)-1] != "orders.example.com" {
		t.Fatalf("dnsNames %v after a new advertised host", names)
	}

	// cert-manager writes the Secret, with the template's labels: the
	// owner is added as a plain owner (never controller: with
	// --enable-certificate-owner-ref cert-manager makes the Certificate
	// the controller, and the API server refuses two).
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: key.Name, Labels: CertificateLabels(), Annotations: issuedBy(key.Name)}}
	if err := env.client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if wake := ensure(key.Name, leaf, nil); !wake.IsZero() {
		t.Fatalf("a wake of %v once issued: renewals are cert-manager's", wake)
	}
	if err := env.client.Get(ctx, key, secret); err != nil || !ownedBy(secret, env.stream) || metav1.GetControllerOf(secret) != nil {
		t.Fatalf("Secret owners %v, %v", secret.OwnerReferences, err)
	}
	other := types.NamespacedName{Namespace: "ns", Name: "orders-user-app"}
	userLabels := map[string]string{labelStream: "orders"}
	templated := CertificateLabels()
	maps.Copy(templated, userLabels)
	byCertManager := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: other.Name, Labels: templated, Annotations: issuedBy(other.Name),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "cert-manager.io/v1", Kind: "Certificate", Name: other.Name, UID: "crt-uid", Controller: ptr.To(true)}}}}
	if err := env.client.Create(ctx, byCertManager); err != nil {
		t.Fatal(err)
	}
	ensure(other.Name, userLeaf(env.stream, "app"), userLabels)
	if err := env.client.Get(ctx, other, byCertManager); err != nil || !ownedBy(byCertManager, env.stream) || metav1.GetControllerOf(byCertManager).Kind != "Certificate" {
		t.Fatalf("Secret owners %v, %v", byCertManager.OwnerReferences, err)
	}

	// Someone else's Secret of a leaf's name, without the operator's labels
	// (so not in the cache): cert-manager would write over it.
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "orders-user-ops"}, Data: map[string][]byte{"token": []byte("x")}}
	if err := env.client.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ensureLeaf(ctx, env.stream, foreign.Name, userLeaf(env.stream, "ops"), userLabels); err == nil || !strings.Contains(err.Error(), "neither cert-manager's") {
		t.Fatalf("someone else's Secret: %v", err)
	}
	if err := env.client.Get(ctx, types.NamespacedName{Namespace: "ns", Name: foreign.Name}, newCertificate()); !apierrors.IsNotFound(err) {
		t.Fatalf("a Certificate was made over someone else's Secret: %v", err)
	}

	// A Secret the operator's own CA issued (a switch of issuer): it stops
	// being controlled by the owner before cert-manager is asked.
	own := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "orders-aggregator-tls", Labels: CertificateLabels()}}
	if err := controllerutil.SetControllerReference(env.stream, own, env.client.Scheme()); err != nil {
		t.Fatal(err)
	}
	if err := env.client.Create(ctx, own); err != nil {
		t.Fatal(err)
	}
	ensure(own.Name, leaf, nil)
	if err := env.client.Get(ctx, client.ObjectKeyFromObject(own), own); err != nil || !ownedBy(own, env.stream) || metav1.GetControllerOf(own) != nil {
		t.Fatalf("own CA's Secret owners %v, %v", own.OwnerReferences, err)
	}
	if err := env.client.Get(ctx, client.ObjectKeyFromObject(own), newCertificate()); err != nil {
		t.Fatalf("no Certificate for the own CA's Secret: %v", err)
	}
	// Back to the own CA: it refuses cert-manager's Secret and says how.
	if _, _, err := readOwnedSecret(ctx, env.client, env.stream, other.Name); err == nil || !strings.Contains(err.Error(), "delete that Certificate") {
		t.Fatalf("the own CA on cert-manager's Secret: %v", err)
	}

	// Someone else's Certificate of that name.
	theirs := newCertificate()
	theirs.SetNamespace("ns")
	theirs.SetName("orders-ca-for-someone")
	if err := env.client.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ensureLeaf(ctx, env.stream, "orders-ca-for-someone", leaf, nil); err == nil {
		t.Fatal("someone else's Certificate was taken over")
	}

	// The user leaves spec.access.
	selector := CertificateLabels()
	selector[labelStream] = "orders"
	if err := c.pruneLeaves(ctx, env.stream, selector, map[string]bool{}); err != nil {
		t.Fatal(err)
	}
	if err := env.client.Get(ctx, other, newCertificate()); !apierrors.IsNotFound(err) {
		t.Fatalf("the user's Certificate: %v", err)
	}
	if err := env.client.Get(ctx, other, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the user's Secret: %v", err)
	}
	if err := env.client.Get(ctx, key, newCertificate()); err != nil {
		t.Fatalf("the ingestion Certificate went too: %v", err)
	}
}

// TestCertManagerOperatorCertificate: the operator asks for its own
// certificate, loads it once issued, publishes the bundle, and wakes the
// controllers when the bundle changes.
func TestCertManagerOperatorCertificate(t *testing.T) {
	env := newLedgerTestEnv(t)
	ctx := context.Background()
	c := &CertManager{Client: env.client, Reader: env.client, Scheme: env.client.Scheme(), Issuer: testIssuer, Namespace: "ops",
		OperatorCertificate: DefaultOperatorCertificate, BundleConfigMap: "catena-ca-bundle", LeafLifetime: 100 * time.Hour}
	key := types.NamespacedName{Namespace: "ops", Name: DefaultOperatorCertificate}
	if loaded, err := c.syncOwn(ctx, key); loaded || err != nil {
		t.Fatalf("before issuance: %v, %v", loaded, err)
	}
	// An issuer that cannot serve (no ca.crt, not Ready) does not hold
	// every reconcile for the wait: the reason comes at once.
	c.lastErr = errors.New("secret ops/catena-operator-tls has no ca.crt")
	// (Waiting would end in the context's deadline instead.)
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := c.currentBundle(short); err == nil || !strings.Contains(err.Error(), "has no ca.crt") {
		t.Fatalf("bundle before any load, with a failure: %v", err)
	}
	c.lastErr = nil
	crt := newCertificate()
	if err := env.client.Get(ctx, key, crt); err != nil {
		t.Fatal(err)
	}
	if uris, _, _ := unstructured.NestedStringSlice(crt.Object, "spec", "uris"); !equalStrings(uris, []string{"spiffe://catena/ns/ops/operator"}) {
		t.Fatalf("uris %v", uris)
	}

	issue := func(ca *pki.CA) {
		t.Helper()
		certPEM, keyPEM, err := ca.Issue(pki.Leaf{Identity: c.OperatorIdentity(), Lifetime: time.Hour}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: key.Name}}
		if _, err := controllerutil.CreateOrUpdate(ctx, env.client, s, func() error {
			s.Labels, s.Data = CertificateLabels(), pki.LeafData(certPEM, keyPEM, ca)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	first := newTestCA(t)
	issue(first)
	if loaded, err := c.syncOwn(ctx, key); !loaded || err != nil {
		t.Fatalf("after issuance: %v, %v", loaded, err)
	}
	bundle, err := c.currentBundle(ctx)
	if err != nil || string(bundle) != string(first.Bundle) {
		t.Fatalf("bundle %q, %v", bundle, err)
	}
	cm := &corev1.ConfigMap{}
	if err := env.client.Get(ctx, types.NamespacedName{Namespace: "ops", Name: "catena-ca-bundle"}, cm); err != nil || cm.Data[pki.BundleKey] != string(first.Bundle) {
		t.Fatalf("published %v, %v", cm.Data, err)
	}
	if pair, _ := c.ClientTLS().GetClientCertificate(nil); pair == nil || len(pair.Certificate) == 0 {
		t.Fatal("no client certificate once issued")
	}

	// A new root (the issuer's CA replaced): every follower is woken.
	woken := c.followers.add()
	if _, err := c.syncOwn(ctx, key); err != nil {
		t.Fatal(err)
	}
	if len(woken) != 0 {
		t.Fatal("an unchanged bundle woke the followers")
	}
	issue(newTestCA(t))
	if _, err := c.syncOwn(ctx, key); err != nil {
		t.Fatal(err)
	}
	if len(woken) != 1 {
		t.Fatal("a new bundle woke no follower")
	}
}

func newTestCA(t *testing.T) *pki.CA {
	t.Helper()
	data, _, _, err := pki.PlanCA(nil, "test", time.Now(), time.Time{}, pki.Rotation{Lifetime: 1000 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := pki.ParseCA(data)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

var _ client.Object = newCertificate()
