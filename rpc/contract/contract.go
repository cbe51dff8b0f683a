// Package contract holds the rules that several Catena roles must agree
// on and that are not messages of the wire protocol itself: which names
// are valid, and the machine-readable reasons a replica gives for a
// refusal that its callers act on. It is a leaf: it imports nothing of
// Catena, so replicas, ingestion, clients and the operator can share it
// without importing each other.
package contract

import (
	"fmt"
	"regexp"
)

// MaxHoldsPerPartition bounds the consumer holds a replica keeps for one
// partition; a hold past it is refused (RESOURCE_EXHAUSTED).
const MaxHoldsPerPartition = 1024

// MaxConsumerNameLen bounds a consumer name (a Kubernetes object name's
// bound: "<namespace>/<name>" fits).
const MaxConsumerNameLen = 253

var consumerRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/-]*[a-z0-9])?$`)

// ValidateConsumer checks a consumer name: 1-253 characters of a-z, 0-9,
// '.', '-', '_' and '/', starting and ending with a letter or digit (so
// that "<namespace>/<aggregation>" names one). Replicas check it before
// storing a hold; ingestion before it asks any member.
func ValidateConsumer(name string) error {
	if len(name) == 0 || len(name) > MaxConsumerNameLen || !consumerRE.MatchString(name) {
		return fmt.Errorf("consumer name %q must be 1-%d characters of a-z, 0-9, '.', '-', '_' and '/', starting and ending with a letter or digit", name, MaxConsumerNameLen)
	}
	return nil
}

// ReasonChainTooShort is the machine-readable reason (gRPC ErrorInfo and
// AppendResponse.error_reason) of a head's refusal of an append when its
// chain has fewer members than the stream's minimum chain length
// (WritesAllowed false). Ingestion acts on it to fail the records at once
// with the head's message, rather than retrying until the producer's
// deadline hides the reason.
const ReasonChainTooShort = "CHAIN_TOO_SHORT"

// TooShortMessage is the head's refusal message for a chain of have
// members when need are required.
func TooShortMessage(stream string, partition uint32, have, need int) string {
	return fmt.Sprintf("partition %s/%d has %d of the %d members required for writes", stream, partition, have, need)
}

// PartitionFor maps a record's key to one of a stream's partitions:
// FNV-1a (32-bit) of the key, modulo the partition count. Ingestion routes
// keyed records with it, and a producer that batches per partition routes
// them itself with the same function, so that a key keeps one partition
// (hence one order) whoever routes it.
func PartitionFor(key []byte, partitions uint32) uint32 {
	const (
		offset32 = 2166136261
		prime32  = 16777619
	)
	h := uint32(offset32)
	for _, c := range key {
		h ^= uint32(c)
		h *= prime32
	}
	return h % partitions
}

// Reasons (gRPC ErrorInfo) of the Groups service's refusals that a
// group member acts on; they are Kafka's names for the same refusals.
const (
	// GroupMemberIDRequired: join again with the member id the refusal's
	// metadata carries under "member_id".
	GroupMemberIDRequired = "MEMBER_ID_REQUIRED"
	// GroupUnknownMember: the member was removed; join with no id.
	GroupUnknownMember = "UNKNOWN_MEMBER_ID"
	// GroupIllegalGeneration: a newer generation started; join again.
	GroupIllegalGeneration = "ILLEGAL_GENERATION"
	// GroupRebalanceInProgress: the group is rebalancing; join again.
	GroupRebalanceInProgress = "REBALANCE_IN_PROGRESS"
	// GroupCoordinatorLoading: the coordinator is loading the committed
	// offsets; retry.
	GroupCoordinatorLoading = "COORDINATOR_LOAD_IN_PROGRESS"
	// GroupNotCoordinator: another ingestion node coordinates the group
	// and the request could not be forwarded to it (the nodes' lists
	// differ for a moment while one comes or goes); retry.
	GroupNotCoordinator = "NOT_COORDINATOR"
)

// Features a replica reports in Status (StatusResponse.features).
const (
	// FeatureRecordHeaders: the replica stores and reads frames whose
	// records carry headers. A replica without it refuses such frames, so
	// ingestion sends headers only to chains whose members all have it
	// (a rolling upgrade must not stall a chain).
	FeatureRecordHeaders = "record-headers"
)
