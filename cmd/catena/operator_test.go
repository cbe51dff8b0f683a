package main

import (
	"strings"
	"testing"
	"time"
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
	if err != nil || all.DefaultNamespaces != nil || len(all.ByObject) != 1 {
		t.Fatalf("no namespaces: %+v, %v; want every namespace, pods by label", all, err)
	}
	some, err := operatorCache([]string{"shop", "billing"})
	if err != nil || len(some.DefaultNamespaces) != 2 || len(some.ByObject) != 1 {
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
