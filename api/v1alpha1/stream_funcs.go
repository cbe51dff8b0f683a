package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// HasOwnPool reports whether the Stream lives on a pool of its own, created
// and owned by the operator, rather than on a shared ReplicaPool.
func (s *Stream) HasOwnPool() bool { return s.Spec.Pool == "" }

// OwnPoolName is the name of the ReplicaPool the operator creates for a
// Stream that names no pool.
func (s *Stream) OwnPoolName() string { return s.Name + ownPoolSuffix }

// PoolName is the name of the ReplicaPool hosting the Stream.
func (s *Stream) PoolName() string {
	if s.HasOwnPool() {
		return s.OwnPoolName()
	}
	return s.Spec.Pool
}

// OwnPoolSpec is the spec of the Stream's own pool: its replicas, storage,
// resources and placement, with defaults where omitted.
func (s *Stream) OwnPoolSpec() ReplicaPoolSpec {
	var spec ReplicaPoolSpec
	if s.Spec.Replicas != nil {
		spec.Replicas = *s.Spec.Replicas
	}
	if s.Spec.Storage != nil {
		spec.Storage = *s.Spec.Storage.DeepCopy()
	}
	if s.Spec.Resources != nil {
		spec.Resources = *s.Spec.Resources.DeepCopy()
	}
	if s.Spec.Placement != nil {
		spec.Placement = *s.Spec.Placement.DeepCopy()
	}
	spec.Pod = s.Spec.Pod.DeepCopy()
	if r := s.Spec.CatchUpMiBPerSecond; r != nil {
		v := *r
		spec.CatchUpMiBPerSecond = &v
	}
	spec.Journal = s.Spec.Journal
	spec.SetDefaults()
	return spec
}

// IngestName is the name of the Stream's ingestion Deployment and of its
// PodDisruptionBudget.
func (s *Stream) IngestName() string { return s.Name + ingestSuffix }

// IngestServiceName is the name of the Stream's ingestion Service, the
// Stream's own, so that clients address a Stream by its name.
func (s *Stream) IngestServiceName() string { return s.Name }

// HasKafka reports whether the Stream's ingestion pods serve Kafka
// (spec.ingestion.kafka.enabled).
func (s *Stream) HasKafka() bool {
	return s.Spec.Ingestion.Kafka != nil && s.Spec.Ingestion.Kafka.Enabled
}

// KafkaServiceName is the name of the headless Service of the Stream's
// ingestion pods when they serve Kafka: it names each ready pod (the
// brokers) and lets the pods find one another (the group coordinators).
func (s *Stream) KafkaServiceName() string { return s.Name + "-kafka" }

// GroupsStreamName is the name of the Stream the consumer groups of the
// Stream's Kafka listener keep their committed offsets in.
func (s *Stream) GroupsStreamName() string { return s.Name + "-groups" }

// VolumesFinalizer holds a Stream whose volumeReclaimPolicy is Delete until
// the operator has deleted the PersistentVolumeClaims of its own pool.
const VolumesFinalizer = "streams.catena.io/volumes"

// DeletesVolumes reports whether deleting the Stream deletes its records:
// the volumes of its own pool, or its partitions on a shared pool.
func (s *Stream) DeletesVolumes() bool {
	return s.Spec.VolumeReclaimPolicy == VolumeReclaimDelete
}

// PartitionName is the name of the Partition and of the ReplicationChain of
// the partition with the given index.
func (s *Stream) PartitionName(index int32) string { return PartitionName(s.Name, index) }

// IsReady reports whether the Stream's Ready condition is True for its
// current generation.
func (s *Stream) IsReady() bool {
	c := meta.FindStatusCondition(s.Status.Conditions, StreamReadyCondition)
	return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == s.Generation
}

// Names of the certificates the operator issues for a Stream
// (docs/security.md).

// IngestTLSSecretName is the Secret holding the ingestion pods' certificate.
func (s *Stream) IngestTLSSecretName() string { return s.IngestName() + "-tls" }

// UserSecretName is the Secret holding user's client certificate.
func (s *Stream) UserSecretName(user string) string { return s.Name + "-user-" + user }

// CABundleName is the ConfigMap holding ca.crt, the CA bundle clients
// verify the Stream's ingestion endpoints with.
func (s *Stream) CABundleName() string { return s.Name + "-ca" }
