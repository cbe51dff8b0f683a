package v1alpha1

// Suffixes of the objects the operator creates for an Aggregation.
const (
	aggCheckpointsSuffix = "-checkpoints"
	aggWorkersSuffix     = "-aggregator"
)

// CheckpointStreamName is the internal Stream holding the Aggregation's
// checkpoints. It lives on the source Stream's pool.
func (a *Aggregation) CheckpointStreamName() string { return a.Name + aggCheckpointsSuffix }

// WorkersName is the name of the workers' StatefulSet and of their
// headless Service.
func (a *Aggregation) WorkersName() string { return a.Name + aggWorkersSuffix }

// ConsumerName is the name under which the Aggregation holds retention on
// its source and checkpoint streams.
func (a *Aggregation) ConsumerName() string { return "aggregation." + a.Namespace + "." + a.Name }

// TLSSecretName is the Secret holding the workers' certificate.
func (a *Aggregation) TLSSecretName() string { return a.WorkersName() + "-tls" }
