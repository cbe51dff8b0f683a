package v1alpha1

// Defaults of a Stream, applied by the schema (its +kubebuilder:default
// markers carry the same values, and the envtest suite checks they agree).
const (
	// DefaultReplicationFactor is the number of members in each chain.
	DefaultReplicationFactor int32 = 3
	// DefaultDurabilityMode fsyncs on every member before acknowledging.
	DefaultDurabilityMode = DurabilityFsync
	// DefaultIngestionReplicas is the number of ingestion pods, two so that
	// producers ride out the loss of one.
	DefaultIngestionReplicas int32 = 2
	// DefaultVolumeReclaimPolicy keeps a Stream's volumes after it is
	// deleted: deleting records takes a second, explicit step.
	DefaultVolumeReclaimPolicy = VolumeReclaimRetain
)

// Limits of a Stream, enforced by the schema.
const (
	// MaxPartitions is the most partitions a Stream may have.
	MaxPartitions int32 = 1024
	// MaxReplicationFactor is the longest chain: every member adds a hop to
	// each write's latency.
	MaxReplicationFactor int32 = 7
	// MaxStreamNameLength keeps the Stream's own pool name, <stream>-pool,
	// within MaxReplicaPoolNameLength. The other names derived from it are
	// shorter than a DNS label (63): the ingestion Deployment
	// <stream>-ingest (54) and Service <stream>.
	MaxStreamNameLength = MaxReplicaPoolNameLength - len(ownPoolSuffix)
)

// ownPoolSuffix names a Stream's own pool after the Stream.
const ownPoolSuffix = "-pool"

// ingestSuffix names a Stream's ingestion Deployment and its
// PodDisruptionBudget.
const ingestSuffix = "-ingest"
