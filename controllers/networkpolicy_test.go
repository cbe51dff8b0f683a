package controllers

import (
	"testing"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The replica port admits the pool's pods, ingestion of the namespace and
// the operator's pods in its namespace; the metrics port anyone.
func TestDesiredNetworkPolicy(t *testing.T) {
	pool := testPool(nil)
	np := desiredNetworkPolicy(pool, NetworkPolicyOptions{OperatorNamespace: "ops", OperatorPodLabels: map[string]string{"app.kubernetes.io/component": "operator"}})
	sts := desiredStatefulSet(pool, "img")
	if !labels.SelectorFromSet(np.Spec.PodSelector.MatchLabels).Matches(labels.Set(sts.Spec.Template.Labels)) {
		t.Fatalf("the policy selects %v, the pool's pods are %v", np.Spec.PodSelector.MatchLabels, sts.Spec.Template.Labels)
	}
	if len(np.Spec.Ingress) != 2 {
		t.Fatalf("ingress rules: %+v", np.Spec.Ingress)
	}
	replica, metrics := np.Spec.Ingress[0], np.Spec.Ingress[1]
	if *replica.Ports[0].Port != intstr.FromInt32(replicaPort) || *metrics.Ports[0].Port != intstr.FromInt32(metricsPort) || len(metrics.From) != 0 {
		t.Errorf("ports: %+v / %+v", replica, metrics)
	}
	admits := func(podLabels map[string]string, namespace string) bool {
		for _, peer := range replica.From {
			if !labels.SelectorFromSet(peer.PodSelector.MatchLabels).Matches(labels.Set(podLabels)) {
				continue
			}
			if peer.NamespaceSelector == nil {
				if namespace == pool.Namespace {
					return true
				}
				continue
			}
			if peer.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] == namespace {
				return true
			}
		}
		return false
	}
	ingest := desiredIngestDeployment(testStream(nil), pool, "img").Spec.Template.Labels
	for _, tc := range []struct {
		who       string
		labels    map[string]string
		namespace string
		want      bool
	}{
		{"a member", sts.Spec.Template.Labels, pool.Namespace, true},
		{"ingestion", ingest, pool.Namespace, true},
		{"the operator", map[string]string{"app.kubernetes.io/component": "operator"}, "ops", true},
		{"a pod labelled as the operator elsewhere", map[string]string{"app.kubernetes.io/component": "operator"}, pool.Namespace, false},
		{"any other pod", map[string]string{"app": "web"}, pool.Namespace, false},
		{"an aggregator worker", desiredWorkers(testAggregation(), "img").Spec.Template.Labels, pool.Namespace, false},
	} {
		if got := admits(tc.labels, tc.namespace); got != tc.want {
			t.Errorf("%s (%v in %s): admitted %v, want %v", tc.who, tc.labels, tc.namespace, got, tc.want)
		}
	}
}
