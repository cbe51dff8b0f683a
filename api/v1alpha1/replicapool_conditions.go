package v1alpha1

// Condition types of a ReplicaPool.
const (
	// ReplicaPoolReadyCondition is True when every replica pod exists, runs
	// the current spec and is ready.
	ReplicaPoolReadyCondition = "Ready"
	// ReplicaPoolProgressingCondition is True while the operator creates,
	// scales or rolls the pool's pods.
	ReplicaPoolProgressingCondition = "Progressing"
	// ReplicaPoolDegradedCondition is True when the pool cannot host what is
	// asked of it: pods that do not become ready, or a Stream whose
	// replicationFactor exceeds the pool's replicas.
	ReplicaPoolDegradedCondition = "Degraded"
)

// Reasons of a ReplicaPool's conditions.
const (
	// ReplicaPoolReplicasReadyReason (Ready True): every replica pod is ready.
	ReplicaPoolReplicasReadyReason = "ReplicasReady"
	// ReplicaPoolReplicasNotReadyReason (Ready False, Degraded True): some
	// replica pods are missing or not ready; the message names them.
	ReplicaPoolReplicasNotReadyReason = "ReplicasNotReady"
	// ReplicaPoolCreatingReason (Progressing True): the StatefulSet and its
	// Service are being created.
	ReplicaPoolCreatingReason = "Creating"
	// ReplicaPoolScalingReason (Progressing True): replicas changed and pods
	// are being added or, once no chain member is left on them, removed.
	ReplicaPoolScalingReason = "Scaling"
	// ReplicaPoolRollingUpdateReason (Progressing True): pods are being
	// replaced one at a time, never two members of one chain at once.
	ReplicaPoolRollingUpdateReason = "RollingUpdate"
	// ReplicaPoolUpToDateReason (Progressing False): nothing is in flight.
	ReplicaPoolUpToDateReason = "UpToDate"
	// ReplicaPoolReplicationFactorExceedsReplicasReason (Degraded True): a
	// Stream on the pool asks for longer chains than the pool has pods; the
	// message names the Stream.
	ReplicaPoolReplicationFactorExceedsReplicasReason = "ReplicationFactorExceedsReplicas"
)
