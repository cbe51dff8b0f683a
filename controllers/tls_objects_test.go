package controllers

import (
	"net"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/rpc/transport"
)

const testOperator = "spiffe://catena/ns/catena-system/operator"

func accessStream(access *streamsv1alpha1.StreamAccess) *streamsv1alpha1.Stream {
	return &streamsv1alpha1.Stream{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "payments"}, Spec: streamsv1alpha1.StreamSpec{Access: access}}
}

func TestIngestAccessArgs(t *testing.T) {
	const (
		workers = "spiffe://catena/ns/shop/aggregation/*"
		billing = "spiffe://catena/ns/shop/stream/payments/user/billing"
		audit   = "spiffe://catena/ns/shop/stream/payments/user/audit"
	)
	others := "--allow-other-streams=" + workers + "," + testOperator
	for _, tc := range []struct {
		name   string
		access *streamsv1alpha1.StreamAccess
		want   []string
	}{
		{"no access list: open to anyone", nil, []string{"--stream=payments",
			"--allow-produce=anyone", "--allow-consume=anyone", "--allow-metadata=anyone", others}},
		{"an empty list: Catena's own components only", &streamsv1alpha1.StreamAccess{}, []string{"--stream=payments",
			"--allow-produce=", "--allow-consume=" + workers + "," + testOperator, "--allow-metadata=" + workers + "," + testOperator, others}},
		{"users", &streamsv1alpha1.StreamAccess{Users: []streamsv1alpha1.StreamUser{
			{Name: "billing", Operations: []streamsv1alpha1.StreamOperation{streamsv1alpha1.OperationProduce, streamsv1alpha1.OperationConsume}},
			{Name: "audit", Operations: []streamsv1alpha1.StreamOperation{streamsv1alpha1.OperationConsume}},
		}}, []string{"--stream=payments",
			"--allow-produce=" + billing,
			"--allow-consume=" + billing + "," + audit + "," + workers + "," + testOperator,
			"--allow-metadata=" + billing + "," + audit + "," + workers + "," + testOperator, others}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ingestAccessArgs(accessStream(tc.access), testOperator)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestWorkerAccessArgs(t *testing.T) {
	agg := &streamsv1alpha1.Aggregation{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "totals"}}
	self := "spiffe://catena/ns/shop/aggregation/totals"
	open := workerAccessArgs(agg, accessStream(nil), testOperator)
	if diff := cmp.Diff([]string{"--allow-admin=" + testOperator, "--allow-status=" + testOperator, "--allow-query=anyone," + self}, open); diff != "" {
		t.Errorf("an open source (-want +got):\n%s", diff)
	}
	closed := workerAccessArgs(agg, accessStream(&streamsv1alpha1.StreamAccess{Users: []streamsv1alpha1.StreamUser{
		{Name: "writer", Operations: []streamsv1alpha1.StreamOperation{streamsv1alpha1.OperationProduce}},
		{Name: "audit", Operations: []streamsv1alpha1.StreamOperation{streamsv1alpha1.OperationConsume}},
	}}), testOperator)
	if got, want := closed[2], "--allow-query=spiffe://catena/ns/shop/stream/payments/user/audit,"+self; got != want {
		t.Errorf("a source with users: %s, want %s (its consumers read the results, its producers do not)", got, want)
	}
}

func TestReplicaAccessArgsAdmitIngestionByNamespace(t *testing.T) {
	pool := &streamsv1alpha1.ReplicaPool{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders"}}
	args := replicaAccessArgs(pool, testOperator)
	want := []string{"--allow-admin=" + testOperator, "--allow-replication=spiffe://catena/ns/shop/pool/orders",
		"--allow-data=spiffe://catena/ns/shop/ingest/*," + testOperator,
		"--allow-status=spiffe://catena/ns/shop/pool/orders,spiffe://catena/ns/shop/ingest/*," + testOperator}
	if diff := cmp.Diff(want, args); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	data := transport.ParseAllow(args[2][len("--allow-data="):])
	for id, ok := range map[string]bool{
		"spiffe://catena/ns/shop/ingest/payments":  true,
		"spiffe://catena/ns/other/ingest/payments": false,
		"spiffe://catena/ns/shop/stream/x/user/y":  false,
		testOperator: true,
	} {
		if got := transport.Admits(data, id, true); got != ok {
			t.Errorf("--allow-data admits %s: %v, want %v", id, got, ok)
		}
	}
}

func TestIngestLeafNamesTheExternalAddress(t *testing.T) {
	s := accessStream(nil)
	s.Spec.Ingestion.External = &streamsv1alpha1.ExternalListener{Type: corev1.ServiceTypeNodePort, AdvertisedHost: "payments.shop.example"}
	s.Status.Endpoints.External = "192.0.2.10:31234"
	l := ingestLeaf(s)
	wantDNS := []string{"payments", "payments.shop", "payments.shop.svc", "payments.shop.svc.cluster.local", transport.MetricsServerName, "payments.shop.example"}
	if diff := cmp.Diff(wantDNS, l.DNSNames); diff != "" {
		t.Errorf("DNS names (-want +got):\n%s", diff)
	}
	if len(l.IPs) != 1 || !l.IPs[0].Equal(net.ParseIP("192.0.2.10")) {
		t.Errorf("IPs %v, want the address status reports", l.IPs)
	}
	if l.Identity != "spiffe://catena/ns/shop/ingest/payments" {
		t.Errorf("identity %s", l.Identity)
	}
	// A cluster name is never put in the certificate (the API refuses it
	// too): it would let this Stream's ingestion pose as another Service.
	for _, h := range []string{"orders-0.orders.bank.svc", "payments.bank.svc.cluster.local", "gateway"} {
		s.Spec.Ingestion.External.AdvertisedHost = h
		if l := ingestLeaf(s); slices.Contains(l.DNSNames, h) {
			t.Errorf("advertisedHost %s is in the certificate", h)
		}
	}
	s.Spec.Ingestion.External = nil
	if l := ingestLeaf(s); len(l.IPs) != 0 || len(l.DNSNames) != 5 {
		t.Errorf("without an external listener: %v %v", l.DNSNames, l.IPs)
	}
}

// TestMountTLSLetsTheContainerReadTheKey: Secret files belong to root
// unless the pod has an fsGroup, and the key is not world-readable, so a
// pod running as 65532 (ingestion, workers) needs fsGroup to read it.
func TestMountTLSLetsTheContainerReadTheKey(t *testing.T) {
	spec := corev1.PodSpec{SecurityContext: restrictedPod(), Containers: []corev1.Container{{Name: "c"}}}
	mountTLS(&spec, "s")
	if g := spec.SecurityContext.FSGroup; g == nil || *g != *spec.SecurityContext.RunAsGroup {
		t.Fatalf("fsGroup %v, want the container's group %d", g, *spec.SecurityContext.RunAsGroup)
	}
	if m := *spec.Volumes[0].Secret.DefaultMode; m&0o004 != 0 || m&0o040 == 0 {
		t.Errorf("mode %o: the key must be group-readable and not world-readable", m)
	}
}
