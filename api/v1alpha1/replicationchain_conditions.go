package v1alpha1

// Condition types of a ReplicationChain.
const (
	// ReplicationChainReadyCondition is True when replicationFactor members
	// are in chain and all have confirmed the target epoch.
	ReplicationChainReadyCondition = "Ready"
	// ReplicationChainProgressingCondition is True while a reconfiguration
	// is in flight: the target epoch is written and some member has not
	// confirmed it, or a member is catching up.
	ReplicationChainProgressingCondition = "Progressing"
	// ReplicationChainDegradedCondition is True when fewer than
	// replicationFactor members are in chain.
	ReplicationChainDegradedCondition = "Degraded"
)

// Reasons of a ReplicationChain's conditions. Why the membership last
// changed is not a condition but status.lastReconfiguration.reason (see
// ReconfigurationReason).
const (
	// ReplicationChainConvergedReason (Ready True, Progressing False): every
	// member in chain confirmed the target epoch.
	ReplicationChainConvergedReason = "Converged"
	// ReplicationChainAwaitingConfirmationReason (Ready False, Progressing
	// True): the operator wrote a new epoch; the message names the members
	// that have not confirmed it.
	ReplicationChainAwaitingConfirmationReason = "AwaitingConfirmation"
	// ReplicationChainCatchingUpReason (Progressing True): a returning or
	// replacement member is copying the log before entering at the tail.
	ReplicationChainCatchingUpReason = "CatchingUp"
	// ReplicationChainUnderReplicatedReason (Degraded True): fewer members
	// are in chain than replicationFactor, and no replica is free to join.
	ReplicationChainUnderReplicatedReason = "UnderReplicated"
	// ReplicationChainFullyReplicatedReason (Degraded False): the chain has
	// replicationFactor members in chain.
	ReplicationChainFullyReplicatedReason = "FullyReplicated"
)
