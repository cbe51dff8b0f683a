package controllers

import (
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// NetworkPolicyOptions turn on a NetworkPolicy per ReplicaPool: its
// replica port (chain links, appends and reads, and the admin RPCs that
// rewrite chains) is reachable only from the pool's own pods, the
// ingestion pods of its namespace and the operator's pods; the metrics
// port from anywhere. It takes a CNI that enforces NetworkPolicies, and it
// complements, not replaces, mutual TLS and --allow-* on the replicas
// (docs/security.md).
type NetworkPolicyOptions struct {
	// OperatorNamespace and OperatorPodLabels select the operator's pods.
	OperatorNamespace string
	OperatorPodLabels map[string]string
}

// desiredNetworkPolicy is the pool's NetworkPolicy under opts.
func desiredNetworkPolicy(pool *streamsv1alpha1.ReplicaPool, opts NetworkPolicyOptions) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	port := func(p int32) []networkingv1.NetworkPolicyPort {
		return []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr.To(intstr.FromInt32(p))}}
	}
	return &networkingv1.NetworkPolicy{
		TypeMeta: metav1.TypeMeta{APIVersion: networkingv1.SchemeGroupVersion.String(), Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      pool.StatefulSetName(),
			Namespace: pool.Namespace,
			Labels:    poolLabels(pool),
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: poolSelectorLabels(pool)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{
					Ports: port(replicaPort),
					From: []networkingv1.NetworkPolicyPeer{
						// Members: replication links and catch-up copies.
						{PodSelector: &metav1.LabelSelector{MatchLabels: poolSelectorLabels(pool)}},
						// Ingestion of the namespace's Streams: appends and
						// reads.
						{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{labelName: appName, labelComponent: componentIngest}}},
						// The operator: Status, Configure and the other
						// admin calls.
						{
							NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: opts.OperatorNamespace}},
							PodSelector:       &metav1.LabelSelector{MatchLabels: opts.OperatorPodLabels},
						},
					},
				},
				// Prometheus, wherever it runs.
				{Ports: port(metricsPort)},
			},
		},
	}
}
