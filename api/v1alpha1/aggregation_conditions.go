package v1alpha1

// Condition types of an Aggregation.
const (
	// AggregationReadyCondition is True when every shard has an owner that
	// runs it (restored and following the source).
	AggregationReadyCondition = "Ready"
	// AggregationProgressingCondition is True while shards are being
	// assigned, restored or replayed.
	AggregationProgressingCondition = "Progressing"
	// AggregationDegradedCondition is True when a shard has no live owner,
	// has failed, or lost records to a hard retention limit.
	AggregationDegradedCondition = "Degraded"
)

// Reasons of an Aggregation's conditions.
const (
	// AggregationRunningReason (Ready True): every shard runs.
	AggregationRunningReason = "Running"
	// AggregationSourceNotFoundReason (Ready False, Degraded True): the
	// source Stream does not exist.
	AggregationSourceNotFoundReason = "SourceNotFound"
	// AggregationProvisioningReason (Progressing True): the checkpoint
	// stream or the workers are being created.
	AggregationProvisioningReason = "Provisioning"
	// AggregationRestoringReason (Progressing True): some shard is loading
	// a checkpoint or replaying the source.
	AggregationRestoringReason = "Restoring"
	// AggregationNoWorkersReason (Ready False, Degraded True): no worker
	// answers; shards wait for one.
	AggregationNoWorkersReason = "NoWorkers"
	// AggregationShardFailedReason (Ready False, Degraded True): a shard
	// stopped on an error; the message names it.
	AggregationShardFailedReason = "ShardFailed"
	// AggregationRecordsLostReason (Degraded True): a hard retention limit
	// trimmed source records some shard had not checkpointed past.
	AggregationRecordsLostReason = "RecordsLost"
	// AggregationCheckpointConflictReason (Ready False, Degraded True): a
	// Stream the Aggregation does not own holds the checkpoint Stream's
	// name; nothing is assigned, so that no worker writes into it.
	AggregationCheckpointConflictReason = "CheckpointStreamConflict"
	// AggregationUpToDateReason (Progressing False, Degraded False).
	AggregationUpToDateReason = "UpToDate"
)

// Reasons of an AggregationRestoration.
const (
	RestorationWorkerFailed  = "WorkerFailed"
	RestorationWorkerStalled = "WorkerStalled"
	RestorationRebalanced    = "Rebalanced"
)
