package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StreamSpec is the desired state of a Stream.
//
// A Stream either names a shared ReplicaPool in pool, or describes a pool of
// its own with replicas, storage, resources and placement, which the
// operator creates and owns (named by OwnPoolName). A Stream applied alone,
// with none of these, gets a pool of its own with the defaults.
//
// +kubebuilder:validation:XValidation:rule="!has(self.pool) || !(has(self.replicas) || has(self.storage) || has(self.resources) || has(self.placement) || has(self.catchUpMiBPerSecond) || has(self.journal))",message="replicas, storage, resources, placement, catchUpMiBPerSecond and journal describe the Stream's own pool: omit them when pool names a shared ReplicaPool"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.journal) || !oldSelf.journal || (has(self.journal) && self.journal)",message="journal cannot be turned off once on: the replicas' volumes hold journals with acknowledged records, and a replica does not start on one without it"
// +kubebuilder:validation:XValidation:rule="has(self.pool) || self.replicationFactor <= (has(self.replicas) ? self.replicas : 3)",message="replicationFactor must not exceed replicas (3 when omitted): each member of a partition's chain needs its own replica pod"
// +kubebuilder:validation:XValidation:rule="!has(self.segmentBytes) || !has(self.retention) || ((!has(self.retention.bytes) || quantity(string(self.segmentBytes)).compareTo(quantity(string(self.retention.bytes))) < 0) && (!has(self.retention.hardBytes) || quantity(string(self.segmentBytes)).compareTo(quantity(string(self.retention.hardBytes))) < 0))",message="segmentBytes must be below retention's bytes and hardBytes: retention deletes whole segments, and one as large as the limit leaves the partition nearly empty when it goes"
// +kubebuilder:validation:XValidation:rule="!has(self.minChainLength) || self.minChainLength <= self.replicationFactor",message="minChainLength must not exceed replicationFactor: a chain never has more members"
// +kubebuilder:validation:XValidation:rule="has(self.pool) == has(oldSelf.pool) && (!has(self.pool) || self.pool == oldSelf.pool)",message="pool is immutable: a Stream's partitions cannot move to another pool"
type StreamSpec struct {
	// pool names the ReplicaPool, in the Stream's namespace, that hosts the
	// Stream's chains. When omitted, the Stream gets a pool of its own from
	// replicas, storage, resources and placement. Immutable. The API server
	// cannot see the named pool, so replicationFactor above its replicas is
	// reported by the operator as the Degraded condition with reason
	// ReplicationFactorExceedsPool.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=52
	Pool string `json:"pool,omitempty"`

	// partitions is the number of partitions. It may grow but not shrink:
	// records are routed by key hash, and a removed partition's records
	// would be lost.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	// +kubebuilder:validation:XValidation:rule="self >= oldSelf",message="partitions may grow but not shrink"
	Partitions int32 `json:"partitions,omitempty"`

	// replicationFactor is the number of members in each partition's chain,
	// each on a different replica pod. A record is acknowledged once every
	// member holds it durably. Immutable.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=7
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="replicationFactor is immutable"
	ReplicationFactor int32 `json:"replicationFactor,omitempty"`

	// minChainLength is the fewest full copies a partition's chain must
	// have for its head to take writes: below it, appends are refused
	// (FAILED_PRECONDITION, reason CHAIN_TOO_SHORT) rather than acknowledged
	// with fewer copies, and the chain's Degraded condition says so. A
	// majority of replicationFactor when omitted (2 of 3, 3 of 5); 1 keeps
	// a partition writable down to its last member. At most
	// replicationFactor.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=7
	MinChainLength *int32 `json:"minChainLength,omitempty"`
	// retention bounds how much of each partition is kept. Records are kept
	// for ever when omitted.
	// +optional
	Retention *RetentionSpec `json:"retention,omitempty"`

	// segmentBytes is the size at which each partition's log rolls over
	// to a new segment file, as a quantity from 1Mi to 1Gi such as 256Mi,
	// below retention's byte limits. Retention removes whole segments, a
	// scrub and a restart's recovery read one at a time, and each segment
	// is an open file on each member (retained bytes / segmentBytes per
	// partition). Omitted: an eighth of the smallest byte limit of
	// retention, from 1Mi to 256Mi, and 256Mi without one. A change
	// reaches the members under the same epoch, as a retention change
	// does, and a segment rolls when its next append would take it past
	// the size then in force.
	// +optional
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self)) && quantity(string(self)).compareTo(quantity('1Mi')) >= 0 && quantity(string(self)).compareTo(quantity('1Gi')) <= 0",message="segmentBytes must be a quantity from 1Mi to 1Gi, such as 64Mi or 256Mi"
	SegmentBytes *resource.Quantity `json:"segmentBytes,omitempty"`

	// durability says when a member makes a record durable.
	// +optional
	// +kubebuilder:default={mode: Fsync}
	Durability DurabilitySpec `json:"durability,omitempty,omitzero"`

	// ingestion is the ingestion Deployment that producers and consumers
	// connect to.
	// +optional
	// +kubebuilder:default={}
	Ingestion IngestionSpec `json:"ingestion,omitempty,omitzero"`

	// pod is added to each pod the Stream runs: its ingestion pods, and
	// the replica pods of its own pool when it has one (a pool named by
	// spec.pool has its own spec.pod).
	// +optional
	Pod *PodOptions `json:"pod,omitempty"`

	// access says who may produce to and consume from the Stream through
	// its ingestion endpoints, when the operator issues certificates (its
	// default, docs/security.md). Omitted: anyone who reaches an endpoint,
	// over TLS, with a client certificate or without. Set, even empty:
	// only the users it lists, each with a client certificate the operator
	// issues, and Catena's own components (the namespace's aggregation
	// workers and the operator). A change takes effect as the ingestion
	// pods roll.
	// +optional
	Access *StreamAccess `json:"access,omitempty"`

	// volumeReclaimPolicy says what becomes of the Stream's records when
	// the Stream is deleted. Retain (the default) keeps them: with a pool of
	// its own, its PersistentVolumeClaims stay after the Stream, its pool
	// and StatefulSet are gone (delete them by hand with
	//   kubectl delete pvc -n <namespace> -l app.kubernetes.io/name=catena,app.kubernetes.io/component=replica,app.kubernetes.io/instance=<stream>-pool
	// ); on a shared pool, its partitions stay on the pool's volumes, and a
	// Stream created again with the same name finds them. Delete deletes
	// them: the claims of its own pool (and with them the volumes whose
	// StorageClass reclaim policy is Delete), or, on a shared pool, every
	// replica's copy of its partitions (Replica.Drop). The operator holds
	// the Stream with the finalizer streams.catena.io/volumes until it has;
	// a replica pod that stays down holds it too (an Event names it), until
	// it returns or the finalizer is removed by hand.
	// +optional
	// +kubebuilder:default=Retain
	VolumeReclaimPolicy VolumeReclaimPolicy `json:"volumeReclaimPolicy,omitempty"`

	// replicas is the number of replica pods of the Stream's own pool; 3
	// when omitted. Only without pool.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	Replicas *int32 `json:"replicas,omitempty"`

	// storage is the volume of each pod of the Stream's own pool. Only
	// without pool.
	// +optional
	Storage *StorageSpec `json:"storage,omitempty"`

	// resources are the requests and limits of each replica container of the
	// Stream's own pool. Only without pool.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// placement spreads the pods of the Stream's own pool across nodes and
	// zones. Only without pool.
	// +optional
	Placement *PlacementSpec `json:"placement,omitempty"`

	// catchUpMiBPerSecond caps how fast each replica of the Stream's own
	// pool copies the partitions it catches up on, and serves them to
	// replicas copying from it, as a ReplicaPool's does (0: no cap;
	// omitted: 160 MiB/s). Only without pool.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	CatchUpMiBPerSecond *int32 `json:"catchUpMiBPerSecond,omitempty"`

	// journal makes each replica of the Stream's own pool keep one
	// journal for all its partitions, as a ReplicaPool's does. Only
	// without pool; once on, it cannot be turned off.
	// +optional
	Journal bool `json:"journal,omitempty"`
}

// StreamAccess lists who may use a Stream.
type StreamAccess struct {
	// users each get a client certificate from the operator: the Secret
	// <stream>-user-<name> holds tls.crt, tls.key and ca.crt (the CA
	// bundle that verifies the ingestion endpoint), for the identity
	// spiffe://catena/ns/<namespace>/stream/<stream>/user/<name>. The
	// operator renews it in place; a user removed from the list loses its
	// Secret and its access.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Users []StreamUser `json:"users,omitempty"`
}

// StreamUser is one client of a Stream and what it may do.
type StreamUser struct {
	// name of the user, a DNS label.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// operations the user may perform: Produce, Consume (reading, and
	// keeping a consumer's position), or both.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=2
	Operations []StreamOperation `json:"operations"`
}

// StreamOperation is what a Stream's user may do.
// +kubebuilder:validation:Enum=Produce;Consume
type StreamOperation string

// Operations on a Stream.
const (
	OperationProduce StreamOperation = "Produce"
	OperationConsume StreamOperation = "Consume"
)

// Allows reports whether the user may perform op.
func (u StreamUser) Allows(op StreamOperation) bool {
	for _, o := range u.Operations {
		if o == op {
			return true
		}
	}
	return false
}

// VolumeReclaimPolicy says what becomes of the volumes of a Stream's own
// pool when the Stream is deleted.
// +kubebuilder:validation:Enum=Retain;Delete
type VolumeReclaimPolicy string

const (
	// VolumeReclaimRetain keeps the PersistentVolumeClaims of the Stream's
	// own pool after the Stream is deleted.
	VolumeReclaimRetain VolumeReclaimPolicy = "Retain"
	// VolumeReclaimDelete deletes the PersistentVolumeClaims of the
	// Stream's own pool when the Stream is deleted.
	VolumeReclaimDelete VolumeReclaimPolicy = "Delete"
)

// RetentionSpec bounds each partition's log. Whichever bound is reached
// first trims the oldest segments; a segment is removed whole, so a
// partition may hold up to about an eighth more, or 1Mi more below 8Mi
// (segments are an eighth of the smallest byte limit, at least 1Mi, and
// are sealed once their first records are an eighth of the shortest time
// old). Records that a consumer holds
// (it committed an offset below them) are kept past time and bytes, up to
// hardTime and hardBytes; a trim forced past a hold is reported in the
// Partition's status.
// +kubebuilder:validation:MinProperties=1
// +kubebuilder:validation:XValidation:rule="!has(self.hardTime) || !has(self.time) || duration(self.hardTime) >= duration(self.time)",message="hardTime must be at least time: the hard limit only overrides consumer holds, past the soft one"
// +kubebuilder:validation:XValidation:rule="!has(self.hardBytes) || !has(self.bytes) || quantity(string(self.hardBytes)).compareTo(quantity(string(self.bytes))) >= 0",message="hardBytes must be at least bytes: the hard limit only overrides consumer holds, past the soft one"
type RetentionSpec struct {
	// time is how long records are kept, as a duration such as 168h or 30m
	// (units h, m, s, ms), at least 1m.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(h|m|s|ms))+$') && duration(self) >= duration('1m')",message="time must be a duration such as 168h or 30m (units h, m, s, ms) of at least 1m"
	Time *metav1.Duration `json:"time,omitempty"`

	// bytes is the most each partition keeps, as a quantity such as 50Gi, at
	// least 1Mi.
	// +optional
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self)) && quantity(string(self)).compareTo(quantity('1Mi')) >= 0",message="bytes must be a quantity of at least 1Mi, such as 512Mi or 50Gi"
	Bytes *resource.Quantity `json:"bytes,omitempty"`

	// hardTime is how long records that a consumer still holds may be kept
	// past time, as a duration such as 720h (units h, m, s, ms), at least
	// 1m and at least time. Omitted: held records are kept until their
	// consumers move on or are deleted.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(h|m|s|ms))+$') && duration(self) >= duration('1m')",message="hardTime must be a duration such as 720h or 30m (units h, m, s, ms) of at least 1m"
	HardTime *metav1.Duration `json:"hardTime,omitempty"`

	// hardBytes is the most each partition keeps even when consumers hold
	// more, as a quantity such as 200Gi, at least 1Mi and at least bytes.
	// Omitted: held records are kept until their consumers move on or are
	// deleted.
	// +optional
	// +kubebuilder:validation:XValidation:rule="isQuantity(string(self)) && quantity(string(self)).compareTo(quantity('1Mi')) >= 0",message="hardBytes must be a quantity of at least 1Mi, such as 512Mi or 200Gi"
	HardBytes *resource.Quantity `json:"hardBytes,omitempty"`
}

// DurabilityMode says when a member fsyncs what it appended.
// +kubebuilder:validation:Enum=Fsync;Interval
type DurabilityMode string

const (
	// DurabilityFsync fsyncs on every member before a record is
	// acknowledged: an acknowledged record survives the loss of power of
	// every member but one.
	DurabilityFsync DurabilityMode = "Fsync"
	// DurabilityInterval fsyncs every fsyncInterval and acknowledges once a
	// record is written on every member: faster, and a record survives as
	// long as one member's machine does not lose power before its fsync.
	DurabilityInterval DurabilityMode = "Interval"
)

// DurabilitySpec says when a member makes a record durable.
// +kubebuilder:validation:XValidation:rule="has(self.mode) && self.mode == 'Interval' ? has(self.fsyncInterval) : !has(self.fsyncInterval)",message="fsyncInterval is required when mode is Interval and must be omitted otherwise"
type DurabilitySpec struct {
	// mode is Fsync (fsync before acknowledging, the default) or Interval
	// (fsync every fsyncInterval).
	// +optional
	// +kubebuilder:default=Fsync
	Mode DurabilityMode `json:"mode,omitempty"`

	// fsyncInterval is the time between fsyncs in Interval mode, as a
	// duration such as 10ms or 1s, from 1ms to 10s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(s|ms))+$') && duration(self) >= duration('1ms') && duration(self) <= duration('10s')",message="fsyncInterval must be a duration such as 10ms or 1s (units s, ms) from 1ms to 10s"
	FsyncInterval *metav1.Duration `json:"fsyncInterval,omitempty"`
}

// IngestionSpec is the Stream's ingestion Deployment.
type IngestionSpec struct {
	// replicas is the number of ingestion pods. Any of them accepts any
	// producer or consumer of the Stream.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=32
	Replicas int32 `json:"replicas,omitempty"`

	// resources are the requests and limits of each ingestion container.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// external exposes ingestion to clients outside the cluster: a Service
	// <stream>-external of type NodePort or LoadBalancer in front of the
	// ingestion pods, whose address status.endpoints.external reports.
	// Clients reach only ingestion, never a replica, so one address is
	// all they need.
	// +optional
	External *ExternalListener `json:"external,omitempty"`

	// kafka serves the Kafka wire protocol on the ingestion pods beside
	// Catena's own, for unchanged Kafka clients (docs/kafka.md).
	// +optional
	Kafka *KafkaListener `json:"kafka,omitempty"`
}

// KafkaListener is the Kafka listener of a Stream's ingestion pods.
type KafkaListener struct {
	// enabled serves Kafka on port 9092 of the ingestion Service (the
	// bootstrap address status.endpoints.kafka reports): each ingestion
	// pod is a broker, advertised under its own name, and coordinates a
	// share of the consumer groups, whose committed offsets the operator
	// keeps in a Stream <stream>-groups on the same pool. Topics are the
	// Streams of the pool. In the cluster only: the external Service does
	// not carry it.
	// +optional
	Enabled bool `json:"enabled,omitempty"`
}

// ExternalListener is how a Stream's ingestion is reached from outside the
// cluster.
// +kubebuilder:validation:XValidation:rule="self.type == 'NodePort' || !has(self.nodePort)",message="nodePort is only for type NodePort"
// +kubebuilder:validation:XValidation:rule="self.type == 'LoadBalancer' || !has(self.loadBalancerSourceRanges)",message="loadBalancerSourceRanges is only for type LoadBalancer"
type ExternalListener struct {
	// type is NodePort (a port on every node) or LoadBalancer (the
	// cloud's load balancer).
	// +required
	// +kubebuilder:validation:Enum=NodePort;LoadBalancer
	Type corev1.ServiceType `json:"type"`

	// nodePort is the node port for type NodePort, in the cluster's node
	// port range (by default 30000-32767); empty: the cluster picks one.
	// +optional
	// +kubebuilder:validation:Minimum=30000
	// +kubebuilder:validation:Maximum=32767
	NodePort int32 `json:"nodePort,omitempty"`

	// advertisedHost is the host name or address (no port) clients
	// outside should use, when it is not the one Kubernetes reports (a DNS
	// name in front of the nodes or the load balancer). Empty: the
	// internal address of the node of a ready ingestion pod for NodePort
	// (on most clouds not reachable from outside: set this), the load
	// balancer's for LoadBalancer. The ingestion pods' certificate names
	// it, so it may not be one of the cluster's own names (a single label,
	// *.svc, *.cluster.local): that would let the Stream's ingestion pose
	// as another namespace's Service.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^([a-zA-Z0-9]([a-zA-Z0-9.-]*[a-zA-Z0-9])?|[0-9a-fA-F:.]*:[0-9a-fA-F:.]*)$`
	// +kubebuilder:validation:XValidation:rule="self.contains(':') || (self.contains('.') && !self.lowerAscii().endsWith('.svc') && !self.lowerAscii().contains('.svc.') && !self.lowerAscii().endsWith('.cluster.local'))",message="advertisedHost must be a name clients outside the cluster resolve (with a dot, not *.svc or *.cluster.local) or an address"
	AdvertisedHost string `json:"advertisedHost,omitempty"`

	// annotations go on the Service: a cloud load balancer's settings.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`

	// loadBalancerSourceRanges restrict a LoadBalancer to these client
	// CIDRs.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=43
	LoadBalancerSourceRanges []string `json:"loadBalancerSourceRanges,omitempty"`
}

// StreamEndpoints are the addresses clients connect to.
type StreamEndpoints struct {
	// producers is the host:port producers send records to.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Producers string `json:"producers,omitempty"`

	// consumers is the host:port consumers read committed records from.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Consumers string `json:"consumers,omitempty"`

	// external is the host:port clients outside the cluster use
	// (spec.ingestion.external), once Kubernetes has given one.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	External string `json:"external,omitempty"`

	// kafka is the bootstrap host:port of the Stream's Kafka listener
	// (spec.ingestion.kafka).
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Kafka string `json:"kafka,omitempty"`
}

// StreamStatus is the observed state of a Stream.
type StreamStatus struct {
	// observedGeneration is the metadata.generation this status describes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// pool is the ReplicaPool hosting the Stream: spec.pool, or the Stream's
	// own pool.
	// +optional
	// +kubebuilder:validation:MaxLength=52
	Pool string `json:"pool,omitempty"`

	// partitionsReady is the number of partitions whose chain has
	// replicationFactor members in chain at its target epoch.
	// +optional
	// +kubebuilder:validation:Minimum=0
	PartitionsReady int32 `json:"partitionsReady,omitempty"`

	// endpoints are the addresses of the Stream's ingestion Service.
	// +optional
	Endpoints StreamEndpoints `json:"endpoints,omitempty,omitzero"`

	// conditions are Ready, Progressing and Degraded; see
	// stream_conditions.go for their reasons.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Stream is a partitioned, chain-replicated log that producers append to
// and consumers read from.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=str,categories=catena
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.status.pool`
// +kubebuilder:printcolumn:name="Partitions",type=integer,JSONPath=`.spec.partitions`
// +kubebuilder:printcolumn:name="Ready Partitions",type=integer,JSONPath=`.status.partitionsReady`
// +kubebuilder:printcolumn:name="RF",type=integer,JSONPath=`.spec.replicationFactor`
// +kubebuilder:printcolumn:name="Durability",type=string,JSONPath=`.spec.durability.mode`,priority=1
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoints.producers`,priority=1
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 47",message="Stream names must be at most 47 characters: the Stream's own pool is named <stream>-pool and a pool's name is at most 52"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.ingestion) || !has(self.spec.ingestion.kafka) || !self.spec.ingestion.kafka.enabled || size(self.metadata.name) <= 40",message="a Stream with a Kafka listener has a name of at most 40 characters: its consumer groups' offsets are kept in a Stream named <stream>-groups"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="Stream names must start with a letter and contain only lowercase letters, digits and '-': they name Services"
type Stream struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state of the Stream.
	// +required
	Spec StreamSpec `json:"spec"`

	// status is the observed state of the Stream, written by the operator.
	// +optional
	Status StreamStatus `json:"status,omitempty,omitzero"`
}

// StreamList is a list of Streams.
//
// +kubebuilder:object:root=true
type StreamList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Stream `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Stream{}, &StreamList{})
}
