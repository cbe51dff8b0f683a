package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PartitionSpec identifies a partition. The operator writes it; it never
// changes.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a Partition's stream and index are immutable"
type PartitionSpec struct {
	// stream is the name of the Stream this partition belongs to, in the
	// same namespace; the Stream owns the Partition.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=47
	Stream string `json:"stream,omitempty"`

	// index is the partition's number within its Stream, from 0.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1023
	Index *int32 `json:"index,omitempty"`
}

// PartitionStatus is what the chain members report about the partition.
// The offsets and the epoch only grow, and the schema holds them to it.
type PartitionStatus struct {
	// observedGeneration is the metadata.generation this status describes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// head is the replica pod at the head of the partition's chain, which
	// assigns offsets.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Head string `json:"head,omitempty"`

	// tail is the replica pod at the tail of the partition's chain.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Tail string `json:"tail,omitempty"`

	// chainEpoch is the epoch of the chain configuration every member has
	// confirmed. It only grows.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="chainEpoch only grows"
	ChainEpoch int64 `json:"chainEpoch,omitempty"`

	// committedOffset is the offset below which every record is durable on
	// every member of the chain, and readable by consumers. It only grows.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="committedOffset never goes backwards"
	CommittedOffset int64 `json:"committedOffset,omitempty"`

	// logStartOffset is the first offset still held after retention trimmed
	// older records. It only grows.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="logStartOffset never goes backwards"
	LogStartOffset int64 `json:"logStartOffset,omitempty"`

	// consumers are the consumers' holds on the partition: each keeps the
	// records from its offset on, up to the Stream's hard retention limits.
	// The lowest offset any member reports, sorted by consumer.
	// +optional
	// +listType=map
	// +listMapKey=consumer
	// +kubebuilder:validation:MaxItems=64
	Consumers []ConsumerHold `json:"consumers,omitempty"`

	// consumersTruncated is set when more consumers hold the partition than
	// consumers lists (catenactl consumers list shows them all).
	// +optional
	ConsumersTruncated bool `json:"consumersTruncated,omitempty"`

	// forcedTrims are the trims a hard retention limit made past a
	// consumer's hold: which consumer lost which records. The latest last.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	ForcedTrims []ForcedTrim `json:"forcedTrims,omitempty"`

	// conditions is Ready; see partition_conditions.go for its reasons.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ConsumerHold is a consumer's hold on a partition: it still needs every
// record from offset on.
type ConsumerHold struct {
	// consumer names the consumer (CommitConsumerOffset).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Consumer string `json:"consumer"`

	// offset is the first offset the consumer still needs.
	// +required
	// +kubebuilder:validation:Minimum=0
	Offset int64 `json:"offset"`
}

// ForcedTrim is a trim a hard retention limit made past a consumer's hold.
type ForcedTrim struct {
	// consumer names the consumer that held the trimmed records.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Consumer string `json:"consumer"`

	// holdOffset is the offset the consumer held from.
	// +required
	// +kubebuilder:validation:Minimum=0
	HoldOffset int64 `json:"holdOffset"`

	// logStartOffset is where the log started after the trim: the records
	// from holdOffset up to it are gone.
	// +required
	// +kubebuilder:validation:Minimum=0
	LogStartOffset int64 `json:"logStartOffset"`

	// time is when the (latest) trim happened.
	// +required
	Time metav1.Time `json:"time"`
}

// The name rule below parses the name's suffix rather than comparing the
// name with stream + '-' + string(index): the API server's cost estimator
// cannot bound the length of string(int) and refuses such a CRD.

// Partition is one partition of a Stream: an ordered log stored by the
// members of its ReplicationChain. The operator creates one per partition,
// named <stream>-<index> and owned by the Stream.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=part,categories=catena
// +kubebuilder:printcolumn:name="Stream",type=string,JSONPath=`.spec.stream`
// +kubebuilder:printcolumn:name="Index",type=integer,JSONPath=`.spec.index`
// +kubebuilder:printcolumn:name="Head",type=string,JSONPath=`.status.head`
// +kubebuilder:printcolumn:name="Tail",type=string,JSONPath=`.status.tail`
// +kubebuilder:printcolumn:name="Epoch",type=integer,JSONPath=`.status.chainEpoch`
// +kubebuilder:printcolumn:name="Committed",type=integer,JSONPath=`.status.committedOffset`
// +kubebuilder:printcolumn:name="Log Start",type=integer,JSONPath=`.status.logStartOffset`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.startsWith(self.spec.stream + '-') && self.metadata.name.substring(size(self.spec.stream) + 1).matches('^(0|[1-9][0-9]*)$') && int(self.metadata.name.substring(size(self.spec.stream) + 1)) == self.spec.index",message="a Partition is named <stream>-<index>"
type Partition struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec identifies the partition.
	// +required
	Spec PartitionSpec `json:"spec"`

	// status is what the chain members report, written by the operator.
	// +optional
	Status PartitionStatus `json:"status,omitempty,omitzero"`
}

// PartitionList is a list of Partitions.
//
// +kubebuilder:object:root=true
type PartitionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Partition `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Partition{}, &PartitionList{})
}
