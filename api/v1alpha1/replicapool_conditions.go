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
	// ReplicaPoolNodeLossCondition is True while replicas of the pool are
	// lost with their node (deleted, or NotReady past the operator's
	// grace) and not replaced yet; the message names them and what they
	// wait for. False (reason Replaced) says which replica was replaced
	// last, and why.
	ReplicaPoolNodeLossCondition = "NodeLoss"
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
	// ReplicaPoolReplacingReason (NodeLoss True): a lost replica's claim
	// and pod were just deleted; the pod comes back on another node with
	// an empty volume and its chains copy it in.
	ReplicaPoolReplacingReason = "Replacing"
	// ReplicaPoolReplacementWaitingReason (NodeLoss True): lost replicas
	// wait (for failure detection, for another replica to be back in its
	// chains, or because their volumes may hold a chain's last copy).
	ReplicaPoolReplacementWaitingReason = "ReplacementWaiting"
	// ReplicaPoolReplacementOffReason (NodeLoss True): the annotation
	// streams.catena.io/replace-lost-replicas=false on the pool or one of
	// its Streams turned replacement off; a person replaces them.
	ReplicaPoolReplacementOffReason = "ReplacementOff"
	// ReplicaPoolReplacedReason (NodeLoss False): no replica is lost now;
	// the message says which was replaced last.
	ReplicaPoolReplacedReason = "Replaced"
	// ReplicaPoolNoneLostReason (NodeLoss False): replicas that were lost
	// came back with their node before they were replaced.
	ReplicaPoolNoneLostReason = "NoneLost"
)
