package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReplicationChainSpec identifies the partition whose chain this is. The
// operator writes it; it never changes.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a ReplicationChain's stream, partition, pool and replicationFactor are immutable"
type ReplicationChainSpec struct {
	// stream is the name of the Stream, in the same namespace; the Stream
	// owns the ReplicationChain.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=47
	Stream string `json:"stream,omitempty"`

	// partition is the index of the partition within its Stream.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1023
	Partition *int32 `json:"partition,omitempty"`

	// pool is the ReplicaPool whose pods host the members.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=52
	Pool string `json:"pool,omitempty"`

	// replicationFactor is the number of members the chain should have: the
	// Stream's replicationFactor.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=7
	ReplicationFactor int32 `json:"replicationFactor,omitempty"`
}

// MemberState is where a member stands in its chain.
// +kubebuilder:validation:Enum=InChain;CatchingUp;Failed
type MemberState string

const (
	// MemberInChain serves its position in the chain at the target epoch.
	MemberInChain MemberState = "InChain"
	// MemberCatchingUp is copying the log from the chain (after a return or
	// as a replacement) and will enter at the tail once it has caught up.
	MemberCatchingUp MemberState = "CatchingUp"
	// MemberFailed does not answer or reports an error; the operator takes
	// it out of the chain.
	MemberFailed MemberState = "Failed"
)

// ChainMember is one member of a chain: a replica pod, its state and the
// epoch it has confirmed.
type ChainMember struct {
	// name is the replica pod hosting the member.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name,omitempty"`

	// state is InChain, CatchingUp or Failed.
	// +required
	State MemberState `json:"state,omitempty"`

	// confirmedEpoch is the latest epoch the member has applied, as it
	// reported it. Equal to targetEpoch once the member has taken the
	// current configuration.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ConfirmedEpoch int64 `json:"confirmedEpoch,omitempty"`

	// node is the Kubernetes node the member's pod was last seen scheduled
	// on: with nodeSpread Required no two members of a chain share one.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node,omitempty"`
}

// ReconfigurationReason is why the operator changed a chain.
// +kubebuilder:validation:Enum=Created;HeadFailed;MiddleFailed;TailFailed;MemberReturned;MemberReplaced;Rebalanced
type ReconfigurationReason string

const (
	// ReconfigurationCreated is the chain's first configuration.
	ReconfigurationCreated ReconfigurationReason = "Created"
	// ReconfigurationHeadFailed: the head failed and its successor became
	// head.
	ReconfigurationHeadFailed ReconfigurationReason = "HeadFailed"
	// ReconfigurationMiddleFailed: a middle member failed and its
	// predecessor now links to its successor.
	ReconfigurationMiddleFailed ReconfigurationReason = "MiddleFailed"
	// ReconfigurationTailFailed: the tail failed and its predecessor became
	// tail.
	ReconfigurationTailFailed ReconfigurationReason = "TailFailed"
	// ReconfigurationMemberReturned: a failed member came back with its
	// volume, truncated to where it agreed with the chain, caught up and
	// re-entered at the tail.
	ReconfigurationMemberReturned ReconfigurationReason = "MemberReturned"
	// ReconfigurationMemberReplaced: a member lost for good was replaced by
	// another replica, which copied the log and entered at the tail.
	ReconfigurationMemberReplaced ReconfigurationReason = "MemberReplaced"
	// ReconfigurationRebalanced: the operator moved a member to spread
	// heads and tails across the pool.
	ReconfigurationRebalanced ReconfigurationReason = "Rebalanced"
)

// Reconfiguration records one change of a chain.
type Reconfiguration struct {
	// time is when the operator wrote the new configuration.
	// +required
	Time metav1.Time `json:"time,omitzero"`

	// epoch is the epoch of the new configuration.
	// +required
	// +kubebuilder:validation:Minimum=1
	Epoch int64 `json:"epoch,omitempty"`

	// reason is why the chain changed.
	// +required
	Reason ReconfigurationReason `json:"reason,omitempty"`

	// message says what changed, for people: which member left or joined.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`
}

// ReplicationChainStatus is the chain's membership: the configuration the
// operator proposes (members and targetEpoch) and what each member has
// confirmed. A reconfiguration is complete when every member in the chain
// has confirmed targetEpoch; until then the operator can finish or redo it
// from this status after a restart.
// +kubebuilder:validation:XValidation:rule="!has(self.members) || self.members.all(m, !has(m.confirmedEpoch) || m.confirmedEpoch <= (has(self.targetEpoch) ? self.targetEpoch : 0))",message="a member cannot have confirmed an epoch above targetEpoch"
type ReplicationChainStatus struct {
	// observedGeneration is the metadata.generation this status describes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// targetEpoch is the epoch of the configuration the operator wrote to the
	// members. It only grows: a member refuses messages from older epochs.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="targetEpoch only grows"
	TargetEpoch int64 `json:"targetEpoch,omitempty"`

	// members are the chain's members in order, head first, tail last.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=7
	// +kubebuilder:validation:XValidation:rule="self.all(m, self.exists_one(n, n.name == m.name))",message="members must be distinct replica pods"
	Members []ChainMember `json:"members,omitempty"`

	// lastReconfiguration is the latest change of membership.
	// +optional
	LastReconfiguration *Reconfiguration `json:"lastReconfiguration,omitempty"`

	// conditions are Ready, Progressing and Degraded; see
	// replicationchain_conditions.go for their reasons.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// The name rule below parses the name's suffix rather than comparing the
// name with stream + '-' + string(index): the API server's cost estimator
// cannot bound the length of string(int) and refuses such a CRD.

// ReplicationChain is the membership of one partition's chain: the ordered
// members, head first, and the epoch of their configuration. The operator is
// each chain's master: it writes targetEpoch and members, and records what
// each member confirms. One per Partition, with the same name, owned by the
// Stream.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=chain,categories=catena
// +kubebuilder:printcolumn:name="Stream",type=string,JSONPath=`.spec.stream`
// +kubebuilder:printcolumn:name="Partition",type=integer,JSONPath=`.spec.partition`
// +kubebuilder:printcolumn:name="Epoch",type=integer,JSONPath=`.status.targetEpoch`
// +kubebuilder:printcolumn:name="Head",type=string,JSONPath=`.status.members[0].name`
// +kubebuilder:printcolumn:name="Last Change",type=string,JSONPath=`.status.lastReconfiguration.reason`
// +kubebuilder:printcolumn:name="Changed",type=date,JSONPath=`.status.lastReconfiguration.time`,priority=1
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.startsWith(self.spec.stream + '-') && self.metadata.name.substring(size(self.spec.stream) + 1).matches('^(0|[1-9][0-9]*)$') && int(self.metadata.name.substring(size(self.spec.stream) + 1)) == self.spec.partition",message="a ReplicationChain is named <stream>-<partition>"
type ReplicationChain struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec identifies the partition.
	// +required
	Spec ReplicationChainSpec `json:"spec"`

	// status is the chain's membership and what its members confirmed.
	// +optional
	Status ReplicationChainStatus `json:"status,omitempty,omitzero"`
}

// ReplicationChainList is a list of ReplicationChains.
//
// +kubebuilder:object:root=true
type ReplicationChainList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ReplicationChain `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ReplicationChain{}, &ReplicationChainList{})
}
