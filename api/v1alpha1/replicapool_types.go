package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReplicaPoolSpec is the desired state of a ReplicaPool: a StatefulSet of
// replica pods, each with its own persistent volume, hosting members of the
// chains of many streams.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.journal) || !oldSelf.journal || (has(self.journal) && self.journal)",message="journal cannot be turned off once on: the replicas' volumes hold journals with acknowledged records, and a replica does not start on one without it"
type ReplicaPoolSpec struct {
	// replicas is the number of replica pods. A Stream on this pool needs at
	// least replicationFactor of them, since each member of a partition's
	// chain runs on a different pod.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	Replicas int32 `json:"replicas,omitempty"`

	// storage is the persistent volume of each replica pod, where it keeps
	// the partition logs.
	// +optional
	// +kubebuilder:default={}
	Storage StorageSpec `json:"storage,omitempty,omitzero"`

	// resources are the CPU and memory requests and limits of each replica
	// container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty,omitzero"`

	// placement spreads the replica pods across nodes and zones, so that one
	// failure takes out as few members of a chain as possible.
	// +optional
	// +kubebuilder:default={}
	Placement PlacementSpec `json:"placement,omitempty,omitzero"`

	// pod is added to each replica pod: image pull Secrets, annotations,
	// labels, priority class.
	// +optional
	Pod *PodOptions `json:"pod,omitempty"`

	// catchUpMiBPerSecond caps how fast each replica copies the partitions
	// it catches up on outside their chains (a replica back from a failure,
	// or one replacing a replica lost with its volume), all of them
	// together, and, separately, how fast it serves the history of its
	// partitions to all the replicas copying from it, so that copies leave
	// CPU and disk to the writes of the chains at both ends. 0 removes the cap. Omitted:
	// the replica's default, 160 MiB/s.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	CatchUpMiBPerSecond *int32 `json:"catchUpMiBPerSecond,omitempty"`

	// journal makes each replica keep one journal on its volume for all
	// its partitions (catena replica --journal; docs/journal.md): an
	// append is durable once the journal's group commit holds it, instead
	// of after an fsync of its partition's files, which are fsynced now
	// and then. Faster with many partitions per replica, slower with few.
	// Turning it on restarts the replicas one by one; once on, it cannot
	// be turned off.
	// +optional
	Journal bool `json:"journal,omitempty"`
}

// StorageSpec is the persistent volume of each replica pod.
// +kubebuilder:validation:XValidation:rule="has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)",message="storageClassName is immutable: the volumes of existing replicas cannot move to another class"
type StorageSpec struct {
	// size is the capacity of each replica's volume, as a quantity such as
	// 10Gi. It may grow (when the storage class allows volume expansion) but
	// not shrink.
	// +optional
	// +kubebuilder:default="10Gi"
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self)) && quantity(string(self)).compareTo(quantity('1Gi')) >= 0",message="size must be a quantity of at least 1Gi, such as 10Gi or 500Gi"
	// +kubebuilder:validation:XValidation:rule="!isQuantity(string(self)) || !isQuantity(string(oldSelf)) || quantity(string(self)).compareTo(quantity(string(oldSelf))) >= 0",message="size may grow but not shrink"
	Size resource.Quantity `json:"size,omitempty,omitzero"`

	// storageClassName names the StorageClass of the replica volumes; the
	// cluster's default class when omitted. Local persistent volumes suit
	// Catena best: each replica already keeps its own copy of its logs.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	StorageClassName string `json:"storageClassName,omitempty"`
}

// SpreadPolicy says how strictly replica pods are spread across a topology
// domain (nodes or zones).
// +kubebuilder:validation:Enum=Required;Preferred;None
type SpreadPolicy string

const (
	// SpreadRequired never breaks the spread, leaving a pod pending rather
	// than doing so: across nodes, at most one replica pod per node
	// (required pod anti-affinity), so no node failure takes down two
	// members of a chain; across zones, pod counts of any two zones within
	// one of each other (a DoNotSchedule topology spread).
	SpreadRequired SpreadPolicy = "Required"
	// SpreadPreferred spreads pods the same way when the scheduler can
	// (preferred anti-affinity, a ScheduleAnyway topology spread) and
	// schedules them anyway when it cannot.
	SpreadPreferred SpreadPolicy = "Preferred"
	// SpreadNone does not spread pods across the domain.
	SpreadNone SpreadPolicy = "None"
)

// PlacementSpec says where replica pods may run and how they spread.
type PlacementSpec struct {
	// nodeSpread spreads replica pods across nodes (kubernetes.io/hostname).
	// +optional
	// +kubebuilder:default=Required
	NodeSpread SpreadPolicy `json:"nodeSpread,omitempty"`

	// zoneSpread spreads replica pods across zones
	// (topology.kubernetes.io/zone).
	// +optional
	// +kubebuilder:default=Preferred
	ZoneSpread SpreadPolicy `json:"zoneSpread,omitempty"`

	// nodeSelector restricts replica pods to nodes with these labels.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// tolerations let replica pods run on nodes with matching taints.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
}

// ReplicaPoolStatus is the observed state of a ReplicaPool.
type ReplicaPoolStatus struct {
	// observedGeneration is the metadata.generation this status describes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// replicas is the number of replica pods that exist.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Replicas int32 `json:"replicas,omitempty"`

	// readyReplicas is the number of replica pods that are ready.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// streams is the number of Streams hosted on this pool.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Streams int32 `json:"streams,omitempty"`

	// chains is the number of partition chains with a member on this pool.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Chains int32 `json:"chains,omitempty"`

	// selector selects the pool's replica pods (the scale subresource's
	// label selector).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Selector string `json:"selector,omitempty"`

	// conditions are Ready, Progressing and Degraded; see
	// replicapool_conditions.go for their reasons.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ReplicaPool is a StatefulSet of Catena replica pods, each with its own
// persistent volume, that hosts the partition chains of many Streams.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=rpool,categories=catena
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Ready Replicas",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Streams",type=integer,JSONPath=`.status.streams`
// +kubebuilder:printcolumn:name="Chains",type=integer,JSONPath=`.status.chains`
// +kubebuilder:printcolumn:name="Storage",type=string,JSONPath=`.spec.storage.size`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 52",message="ReplicaPool names must be at most 52 characters: the StatefulSet's pods and revision labels append to it and must stay within 63"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="ReplicaPool names must start with a letter and contain only lowercase letters, digits and '-': they name a Service"
type ReplicaPool struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state of the pool.
	// +required
	Spec ReplicaPoolSpec `json:"spec"`

	// status is the observed state of the pool, written by the operator.
	// +optional
	Status ReplicaPoolStatus `json:"status,omitempty,omitzero"`
}

// ReplicaPoolList is a list of ReplicaPools.
//
// +kubebuilder:object:root=true
type ReplicaPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ReplicaPool `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ReplicaPool{}, &ReplicaPoolList{})
}
