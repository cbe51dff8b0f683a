package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StatefulSetName is the name of the pool's StatefulSet: the pool's own.
func (p *ReplicaPool) StatefulSetName() string { return p.Name }

// ServiceName is the name of the pool's headless Service, which gives each
// replica pod a stable DNS name: the pool's own.
func (p *ReplicaPool) ServiceName() string { return p.Name }

// PodName is the name of the replica pod with the given StatefulSet ordinal.
func (p *ReplicaPool) PodName(ordinal int32) string {
	return fmt.Sprintf("%s-%d", p.StatefulSetName(), ordinal)
}

// IsReady reports whether the pool's Ready condition is True for its
// current generation.
func (p *ReplicaPool) IsReady() bool {
	c := meta.FindStatusCondition(p.Status.Conditions, ReplicaPoolReadyCondition)
	return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == p.Generation
}

// TLSSecretName is the Secret holding the pool's replica certificate.
func (p *ReplicaPool) TLSSecretName() string { return p.Name + "-replica-tls" }
