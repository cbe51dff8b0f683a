package controllers

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/catena-streams/catena/internal/pki"
)

// TestEnsureLeafLooksAgainWhenTheSecretChanges: a Secret found good is not
// parsed again on every reconcile, but any change to it (a hand edit, a
// restore), to what it must name, or to the CA, is looked at.
func TestEnsureLeafLooksAgainWhenTheSecretChanges(t *testing.T) {
	env := newLedgerTestEnv(t)
	ctx := context.Background()
	ca := newTestCA(t)
	c := &Certificates{Client: env.client, Scheme: env.client.Scheme(), Namespace: "ops", LeafLifetime: 100 * time.Hour}
	c.load(ca)
	leaf := ingestLeaf(env.stream)
	read := func() *corev1.Secret {
		t.Helper()
		var s corev1.Secret
		if err := env.client.Get(ctx, types.NamespacedName{Namespace: "ns", Name: "orders-ingest-tls"}, &s); err != nil {
			t.Fatal(err)
		}
		return &s
	}
	ensure := func(l pki.Leaf) {
		t.Helper()
		if _, err := c.ensureLeaf(ctx, env.stream, "orders-ingest-tls", l, nil); err != nil {
			t.Fatal(err)
		}
	}

	ensure(leaf)
	first := read()
	ensure(leaf)
	ensure(leaf)
	if got := read(); got.ResourceVersion != first.ResourceVersion {
		t.Fatal("a good certificate was written again")
	}

	// A hand edit that breaks it: a new resourceVersion, looked at.
	first.Data[pki.CertKey] = []byte("garbage")
	if err := env.client.Update(ctx, first); err != nil {
		t.Fatal(err)
	}
	ensure(leaf)
	if got := read(); string(got.Data[pki.CertKey]) == "garbage" {
		t.Fatal("a broken certificate was kept")
	}

	// New names on an unchanged Secret: issued again.
	before := read()
	leaf.DNSNames = append(leaf.DNSNames, "orders.example.com")
	ensure(leaf)
	if got := read(); got.ResourceVersion == before.ResourceVersion {
		t.Fatal("a certificate lacking a name it must serve was kept")
	}

	// A rotated CA (another bundle): the bundle is handed out.
	next := *ca
	next.Bundle = append(append([]byte{}, ca.Bundle...), newTestCA(t).Bundle...)
	c.load(&next)
	ensure(leaf)
	if got := read(); string(got.Data[pki.BundleKey]) != string(next.Bundle) {
		t.Fatal("the new bundle was not handed out")
	}
}
