package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AggregationSpec is the desired state of an Aggregation: a stream
// process that folds the records of a source Stream into per-key
// aggregates, checkpoints them incrementally into an internal Stream and
// is restored from those checkpoints when a worker dies.
//
// Each partition of the source is a shard: one worker owns it at a time,
// keeps that partition's per-key partial aggregates, and checkpoints them
// with the source offset they cover. A key's result merges its partials
// over every shard (count and sum add, min and max combine, distinct
// values unite), so the key may come from a field that is not the record
// key.
//
// +kubebuilder:validation:XValidation:rule="self.aggregates.all(a, a.function == 'Count' || has(a.field))",message="every aggregate other than Count needs a field"
// +kubebuilder:validation:XValidation:rule="self.aggregates.all(a, self.aggregates.exists_one(b, b.name == a.name))",message="aggregate names must be unique"
// +kubebuilder:validation:XValidation:rule="self.source == oldSelf.source",message="source is immutable: create another Aggregation to aggregate another Stream"
type AggregationSpec struct {
	// source names the Stream, in the Aggregation's namespace, whose
	// records are aggregated. Immutable.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=52
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Source string `json:"source"`

	// key says what records are grouped by: the record key when omitted.
	// +optional
	Key AggregationKey `json:"key,omitempty,omitzero"`

	// aggregates are the functions computed per key.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	Aggregates []AggregateSpec `json:"aggregates"`

	// window, when set, groups records also by a tumbling window of their
	// timestamp: each key has one result per window.
	// +optional
	Window *WindowSpec `json:"window,omitempty"`

	// checkpointInterval is how often each shard persists what changed
	// since its last checkpoint, with the source offset it covers. A
	// restore replays at most about this much of the source.
	// +optional
	// +kubebuilder:default="10s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('1h')",message="checkpointInterval must be between 1s and 1h"
	CheckpointInterval metav1.Duration `json:"checkpointInterval,omitempty"`

	// snapshotEvery makes every n-th checkpoint of a shard a full snapshot
	// of its state; the others hold only the keys that changed. A restore
	// reads the latest snapshot and the increments after it.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	SnapshotEvery int32 `json:"snapshotEvery,omitempty"`

	// workers is the number of aggregator pods; the source's partitions are
	// spread over them. More workers than partitions leaves some idle, as
	// warm standbys.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	Workers int32 `json:"workers,omitempty"`

	// pod is added to each worker pod: image pull Secrets, annotations,
	// labels, priority class.
	// +optional
	Pod *PodOptions `json:"pod,omitempty"`

	// failureTimeout is how long a worker may not answer, or make no
	// progress on a shard that has records to read, before its shards are
	// given to another worker and restored there.
	// +optional
	// +kubebuilder:default="10s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="failureTimeout must be at least 1s"
	FailureTimeout metav1.Duration `json:"failureTimeout,omitempty"`

	// resources of each worker's container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
}

// AggregationKey says how a record's grouping key is found.
type AggregationKey struct {
	// field is a dotted path into the record's value, read as a JSON
	// object (for example "user.id"); strings are used as they are, other
	// JSON values by their JSON text. When omitted, the record key is used.
	// Records without the field, or whose value is not a JSON object, are
	// not aggregated and are counted as skipped in the shard's status.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[^.]+(\.[^.]+)*$`
	Field string `json:"field,omitempty"`
}

// AggregateFunction is one of the supported aggregate functions.
// +kubebuilder:validation:Enum=Count;Sum;Min;Max;DistinctCount
type AggregateFunction string

const (
	// AggregateCount counts the key's records.
	AggregateCount AggregateFunction = "Count"
	// AggregateSum adds the field's numeric values.
	AggregateSum AggregateFunction = "Sum"
	// AggregateMin keeps the smallest numeric value of the field.
	AggregateMin AggregateFunction = "Min"
	// AggregateMax keeps the largest numeric value of the field.
	AggregateMax AggregateFunction = "Max"
	// AggregateDistinctCount counts the field's distinct values (exactly:
	// the values themselves are kept).
	AggregateDistinctCount AggregateFunction = "DistinctCount"
)

// AggregateSpec is one aggregate computed per key.
type AggregateSpec struct {
	// name is the result's name, unique in the Aggregation.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-zA-Z_][a-zA-Z0-9_]*$`
	Name string `json:"name"`

	// function is Count, Sum, Min, Max or DistinctCount.
	// +required
	Function AggregateFunction `json:"function"`

	// field is a dotted path into the record's JSON value. Sum, Min and
	// Max read numbers there (records where it is missing or not a number
	// are left out of that aggregate); DistinctCount counts its distinct
	// values. Count ignores it.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[^.]+(\.[^.]+)*$`
	Field string `json:"field,omitempty"`
}

// WindowSpec is a tumbling window over record timestamps.
type WindowSpec struct {
	// tumbling is the window's length: windows start at multiples of it
	// since the Unix epoch.
	// +required
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="window.tumbling must be between 1s and 8760h"
	Tumbling metav1.Duration `json:"tumbling"`
}

// AggregationStatus is the observed state of an Aggregation.
type AggregationStatus struct {
	// observedGeneration is the metadata.generation this status describes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// workers is the number of live aggregator workers.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Workers int32 `json:"workers,omitempty"`

	// selector selects the worker pods (the scale subresource's label
	// selector).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Selector string `json:"selector,omitempty"`

	// checkpointStream is the internal Stream holding the checkpoints.
	// +optional
	CheckpointStream string `json:"checkpointStream,omitempty"`

	// assignmentGeneration grows with every change of assignments.
	// +optional
	// +kubebuilder:validation:Minimum=0
	AssignmentGeneration int64 `json:"assignmentGeneration,omitempty"`

	// assignments say which worker owns which source partitions.
	// +optional
	// +listType=map
	// +listMapKey=worker
	// +kubebuilder:validation:MaxItems=64
	Assignments []WorkerAssignment `json:"assignments,omitempty"`

	// shards report each source partition's progress and latest
	// checkpoint, in partition order.
	// +optional
	// +listType=map
	// +listMapKey=partition
	// +kubebuilder:validation:MaxItems=1024
	Shards []AggregationShardStatus `json:"shards,omitempty"`

	// stableCheckpoint is the globally stable checkpoint: the minimum over
	// shards of their latest checkpoint epochs. Every shard has persisted
	// its state as of this epoch or later; it only grows.
	// +optional
	StableCheckpoint *StableCheckpoint `json:"stableCheckpoint,omitempty"`

	// restorations are the latest shard restorations, newest last.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Restorations []AggregationRestoration `json:"restorations,omitempty"`

	// restoring are the shard moves whose restore on the new owner has not
	// been seen to finish. A move is written here in the same write as the
	// assignment that makes it, and leaves when its restoration is written
	// to restorations: an operator that restarts, or a new leader, still
	// records the restoration of a move the old one made.
	// +optional
	// +listType=map
	// +listMapKey=partition
	// +kubebuilder:validation:MaxItems=1024
	Restoring []ShardMove `json:"restoring,omitempty"`

	// benched are workers that stalled: they are given no shards until the
	// time shown, so that balance does not hand their shards straight back.
	// +optional
	// +listType=map
	// +listMapKey=worker
	// +kubebuilder:validation:MaxItems=64
	Benched []BenchedWorker `json:"benched,omitempty"`

	// endpoint is the address of the workers' Service for
	// `catenactl agg get|list`.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// conditions are Ready, Progressing and Degraded; see
	// aggregation_conditions.go for their reasons.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// WorkerAssignment is the set of source partitions one worker owns.
type WorkerAssignment struct {
	// worker is the worker's pod name.
	// +required
	Worker string `json:"worker"`
	// partitions are the source partitions (shards) it owns.
	// +optional
	// +listType=atomic
	Partitions []int32 `json:"partitions,omitempty"`
}

// CheckpointReference identifies one checkpoint of a shard.
type CheckpointReference struct {
	// manifestOffset is the offset of the checkpoint's manifest record in
	// the checkpoint stream.
	ManifestOffset int64 `json:"manifestOffset"`
	// sourceOffset is the next source offset to read: every record before
	// it is in the checkpoint.
	SourceOffset int64 `json:"sourceOffset"`
	// epoch is the checkpoint's aligned epoch: Unix time divided by the
	// checkpoint interval.
	Epoch int64 `json:"epoch"`
	// snapshot is true for a full snapshot, false for an increment.
	// +optional
	Snapshot bool `json:"snapshot,omitempty"`
	// time the checkpoint was written.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
}

// AggregationShardStatus is one source partition's progress.
type AggregationShardStatus struct {
	// partition of the source stream.
	// +kubebuilder:validation:Minimum=0
	Partition int32 `json:"partition"`
	// worker that owns it.
	// +optional
	Worker string `json:"worker,omitempty"`
	// phase is Restoring, Replaying, Running or Failed.
	// +optional
	Phase string `json:"phase,omitempty"`
	// consumedOffset is the next source offset the worker will fold.
	// +optional
	ConsumedOffset int64 `json:"consumedOffset,omitempty"`
	// lag is the committed source records not yet folded.
	// +optional
	Lag int64 `json:"lag,omitempty"`
	// keys held by the shard.
	// +optional
	Keys int64 `json:"keys,omitempty"`
	// checkpoint is the shard's latest checkpoint.
	// +optional
	Checkpoint *CheckpointReference `json:"checkpoint,omitempty"`
	// lostRecords counts source records that a hard retention limit
	// removed before this shard had checkpointed past them; the results
	// miss them.
	// +optional
	LostRecords int64 `json:"lostRecords,omitempty"`
	// message says why the shard is Failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// StableCheckpoint is the minimum over shards of their latest checkpoint.
type StableCheckpoint struct {
	// epoch is the smallest latest-checkpoint epoch over shards.
	Epoch int64 `json:"epoch"`
	// time is the start of that epoch.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`
	// sourceOffsets are each shard's checkpointed source offset, by
	// partition.
	// +optional
	// +listType=atomic
	SourceOffsets []int64 `json:"sourceOffsets,omitempty"`
}

// ShardMove is a shard given to a new owner, whose restore is awaited.
type ShardMove struct {
	// partition (shard) moved.
	// +kubebuilder:validation:Minimum=0
	Partition int32 `json:"partition"`
	// fromWorker is the owner that died, stalled or gave the shard up;
	// toWorker the new one.
	// +required
	FromWorker string `json:"fromWorker"`
	// +required
	ToWorker string `json:"toWorker"`
	// reason is why the shard moved: WorkerFailed, WorkerStalled,
	// Rebalanced.
	// +optional
	Reason string `json:"reason,omitempty"`
	// time the new owner was assigned the shard: a restore the new owner
	// reports as started before it is an older one.
	Time metav1.MicroTime `json:"time"`
	// generation is the assignment generation that made the move.
	// +kubebuilder:validation:Minimum=1
	Generation int64 `json:"generation"`
}

// BenchedWorker is a worker given no shards for a while.
type BenchedWorker struct {
	// worker is the worker's pod name.
	// +required
	Worker string `json:"worker"`
	// until is when it may be given shards again.
	Until metav1.Time `json:"until"`
	// reason is why: WorkerStalled.
	// +optional
	Reason string `json:"reason,omitempty"`
}

// AggregationRestoration records one shard restored by a new owner.
type AggregationRestoration struct {
	// time the new owner was assigned the shard.
	Time metav1.Time `json:"time"`
	// partition (shard) restored.
	Partition int32 `json:"partition"`
	// fromWorker is the owner that died or stalled; toWorker the new one.
	// +optional
	FromWorker string `json:"fromWorker,omitempty"`
	// +optional
	ToWorker string `json:"toWorker,omitempty"`
	// reason is why the shard moved: WorkerFailed, WorkerStalled,
	// Rebalanced.
	// +optional
	Reason string `json:"reason,omitempty"`
	// checkpoint the state was loaded from; unset when the shard had none
	// and was rebuilt from the start of the source.
	// +optional
	Checkpoint *CheckpointReference `json:"checkpoint,omitempty"`
	// checkpointsLoaded counts the snapshot and increments read.
	// +optional
	CheckpointsLoaded int32 `json:"checkpointsLoaded,omitempty"`
	// skippedCheckpoints names checkpoints passed over as torn or corrupt.
	// +optional
	// +listType=atomic
	SkippedCheckpoints []string `json:"skippedCheckpoints,omitempty"`
	// recordsReplayed is the source records folded after loading, up to
	// where the source was committed when the restore began.
	// +optional
	RecordsReplayed int64 `json:"recordsReplayed,omitempty"`
	// loadDuration is the time to state loaded; replayDuration the time to
	// having replayed.
	// +optional
	LoadDuration metav1.Duration `json:"loadDuration,omitempty"`
	// +optional
	ReplayDuration metav1.Duration `json:"replayDuration,omitempty"`
}

// Aggregation folds a Stream's records into per-key aggregates, with
// incremental checkpoints and restoration of dead workers.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.workers,statuspath=.status.workers,selectorpath=.status.selector
// +kubebuilder:resource:shortName=agg,categories=catena
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.source`
// +kubebuilder:printcolumn:name="Workers",type=integer,JSONPath=`.spec.workers`
// +kubebuilder:printcolumn:name="Stable Epoch",type=integer,JSONPath=`.status.stableCheckpoint.epoch`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 35",message="Aggregation names must be at most 35 characters: the checkpoint Stream is named <aggregation>-checkpoints and a Stream's name is at most 47"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="Aggregation names must start with a letter and contain only lowercase letters, digits and '-': they name a Stream, a StatefulSet and Services"
type Aggregation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec AggregationSpec `json:"spec"`
	// +optional
	Status AggregationStatus `json:"status,omitempty,omitzero"`
}

// AggregationList contains a list of Aggregation.
//
// +kubebuilder:object:root=true
type AggregationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Aggregation `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Aggregation{}, &AggregationList{})
}
