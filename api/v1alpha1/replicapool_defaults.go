package v1alpha1

import "k8s.io/apimachinery/pkg/api/resource"

// Defaults of a pool. The schema applies them to a ReplicaPool (its
// +kubebuilder:default markers carry the same values, and the envtest suite
// checks they agree); SetDefaults applies them to a Stream's own pool, whose
// fields have no schema defaults because they must stay absent when the
// Stream names a shared pool.
const (
	// DefaultReplicas is the number of replica pods of a pool.
	DefaultReplicas int32 = 3
	// DefaultStorageSize is the volume size of each replica pod.
	DefaultStorageSize = "10Gi"
	// DefaultNodeSpread spreads replica pods evenly across nodes.
	DefaultNodeSpread = SpreadRequired
	// DefaultZoneSpread spreads replica pods across zones when it can.
	DefaultZoneSpread = SpreadPreferred
)

// Limits of a pool, enforced by the schema.
const (
	// MaxReplicas is the most replica pods a pool may have.
	MaxReplicas int32 = 64
	// MinStorageSize is the smallest volume a replica pod may have.
	MinStorageSize = "1Gi"
	// MaxReplicaPoolNameLength keeps every name derived from a pool within
	// 63 characters: the StatefulSet adds "-<ordinal>" for its pods and
	// "-<10-character hash>" for its controller-revision-hash label.
	MaxReplicaPoolNameLength = 52
)

// SetDefaults fills every field the user left empty with its default.
func (s *ReplicaPoolSpec) SetDefaults() {
	if s.Replicas == 0 {
		s.Replicas = DefaultReplicas
	}
	if s.Storage.Size.IsZero() {
		s.Storage.Size = resource.MustParse(DefaultStorageSize)
	}
	if s.Placement.NodeSpread == "" {
		s.Placement.NodeSpread = DefaultNodeSpread
	}
	if s.Placement.ZoneSpread == "" {
		s.Placement.ZoneSpread = DefaultZoneSpread
	}
}
