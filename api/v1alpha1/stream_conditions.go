package v1alpha1

// Condition types of a Stream. Each carries the observedGeneration it was
// computed for.
const (
	// StreamReadyCondition is True when every partition's chain has
	// replicationFactor members in chain at its target epoch and the
	// ingestion Deployment has an available pod: producers can write and
	// consumers can read every partition.
	StreamReadyCondition = "Ready"
	// StreamProgressingCondition is True while the operator is bringing the
	// Stream to its spec: creating its pool, partitions, chains or
	// ingestion, or reconfiguring a chain.
	StreamProgressingCondition = "Progressing"
	// StreamDegradedCondition is True when some partition is not fully
	// replicated or not served, or the spec cannot be met as it stands.
	StreamDegradedCondition = "Degraded"
)

// Reasons of a Stream's conditions.
const (
	// StreamPartitionsReadyReason (Ready True, Degraded False): every
	// partition is served by a full chain.
	StreamPartitionsReadyReason = "PartitionsReady"
	// StreamPartitionsNotReadyReason (Ready False): some partitions have no
	// chain at the target epoch yet; the message counts them.
	StreamPartitionsNotReadyReason = "PartitionsNotReady"
	// StreamProvisioningReason (Progressing True): the pool, Partitions,
	// ReplicationChains or ingestion are being created, or partitions
	// added.
	StreamProvisioningReason = "Provisioning"
	// StreamReconfiguringReason (Progressing True): a chain's target epoch
	// is not yet confirmed by all its members.
	StreamReconfiguringReason = "Reconfiguring"
	// StreamUpToDateReason (Progressing False): nothing is in flight.
	StreamUpToDateReason = "UpToDate"
	// StreamPoolNotFoundReason (Ready False, Degraded True): spec.pool names
	// a ReplicaPool that does not exist in the Stream's namespace.
	StreamPoolNotFoundReason = "PoolNotFound"
	// StreamPoolConflictReason (Ready False, Degraded True): the name of the
	// Stream's own pool is taken by a ReplicaPool the Stream does not own.
	StreamPoolConflictReason = "PoolConflict"
	// StreamPoolNotReadyReason (Ready False): the pool's replica pods are
	// not ready.
	StreamPoolNotReadyReason = "PoolNotReady"
	// StreamReplicationFactorExceedsPoolReason (Ready False, Degraded True):
	// the shared pool has fewer replicas than replicationFactor, which the
	// API server cannot check because it sees one object at a time.
	StreamReplicationFactorExceedsPoolReason = "ReplicationFactorExceedsPool"
	// StreamIngestionNotReadyReason (Ready False): the ingestion Deployment
	// has no available pod, so producers and consumers cannot connect.
	StreamIngestionNotReadyReason = "IngestionNotReady"
	// StreamIngestionConflictReason (Ready False, Degraded True): the name
	// of the Stream's ingestion Deployment, Service or PodDisruptionBudget
	// is taken by an object the Stream does not own.
	StreamIngestionConflictReason = "IngestionConflict"
	// StreamUnderReplicatedReason (Degraded True): some chains have fewer
	// members in chain than replicationFactor; writes still complete on the
	// remaining members.
	StreamUnderReplicatedReason = "UnderReplicated"
)
