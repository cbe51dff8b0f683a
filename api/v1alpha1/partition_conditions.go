package v1alpha1

// Condition types of a Partition.
const (
	// PartitionReadyCondition is True when the partition's chain has
	// replicationFactor members in chain, all at the target epoch, and none
	// refuses to serve the partition.
	PartitionReadyCondition = "Ready"
)

// Reasons of a Partition's conditions.
const (
	// PartitionChainReadyReason (Ready True): the chain is complete and
	// every member confirmed its epoch.
	PartitionChainReadyReason = "ChainReady"
	// PartitionChainReconfiguringReason (Ready False): the chain's target
	// epoch is not yet confirmed by all its members.
	PartitionChainReconfiguringReason = "ChainReconfiguring"
	// PartitionUnderReplicatedReason (Ready False): fewer members are in
	// chain than replicationFactor.
	PartitionUnderReplicatedReason = "UnderReplicated"
	// PartitionReplicaErrorReason (Ready False): a member refuses to serve
	// the partition, for example after finding a corrupt frame; the message
	// carries the member's error.
	PartitionReplicaErrorReason = "ReplicaError"
)
