package ingest

import (
	"github.com/catena-streams/catena/rpc/catenapb"
)

// Classes of the Ingest service's methods, for a transport.Policy: who may
// call each is the process's flags (catena ingest --allow-*), which the
// operator sets from the Stream's spec.access (docs/security.md).
const (
	// ClassProduce stores records.
	ClassProduce = "produce"
	// ClassConsume reads records and keeps a consumer's position (its
	// retention holds).
	ClassConsume = "consume"
	// ClassMetadata describes and lists streams.
	ClassMetadata = "metadata"
	// ClassAdmin creates and deletes streams (catena dev only).
	ClassAdmin = "admin"
)

// MethodClasses maps each Ingest method to its class.
func MethodClasses() map[string]string {
	return map[string]string{
		catenapb.Ingest_Produce_FullMethodName:       ClassProduce,
		catenapb.Ingest_ProduceStream_FullMethodName: ClassProduce,

		catenapb.Ingest_Fetch_FullMethodName:                ClassConsume,
		catenapb.Ingest_Subscribe_FullMethodName:            ClassConsume,
		catenapb.Ingest_ListOffsets_FullMethodName:          ClassConsume,
		catenapb.Ingest_CommitConsumerOffset_FullMethodName: ClassConsume,
		catenapb.Ingest_ListConsumers_FullMethodName:        ClassConsume,
		catenapb.Ingest_DeleteConsumer_FullMethodName:       ClassConsume,

		catenapb.Ingest_DescribeStream_FullMethodName: ClassMetadata,
		catenapb.Ingest_ListStreams_FullMethodName:    ClassMetadata,

		// Consumer groups (catena.v1.Groups, served beside Ingest).
		catenapb.Groups_ListGroups_FullMethodName:         ClassMetadata,
		catenapb.Groups_DescribeGroup_FullMethodName:      ClassConsume,
		catenapb.Groups_ResetGroupOffsets_FullMethodName:  ClassConsume,
		catenapb.Groups_DeleteGroup_FullMethodName:        ClassConsume,
		catenapb.Groups_JoinGroup_FullMethodName:          ClassConsume,
		catenapb.Groups_SyncGroup_FullMethodName:          ClassConsume,
		catenapb.Groups_Heartbeat_FullMethodName:          ClassConsume,
		catenapb.Groups_LeaveGroup_FullMethodName:         ClassConsume,
		catenapb.Groups_CommitGroupOffsets_FullMethodName: ClassConsume,

		catenapb.Ingest_CreateStream_FullMethodName: ClassAdmin,
		catenapb.Ingest_DeleteStream_FullMethodName: ClassAdmin,
	}
}

// ForStream judges requests by the Stream they name, for a
// transport.Policy's ForRequest: those about own keep the class's list;
// those about any other Stream (an ingestion node reaches every Stream of
// its pool), and those about no Stream in particular (ListStreams names
// them all), are allowed to others only. On Kubernetes own is the Stream
// the node serves, whose spec.access the class lists come from, and others
// are the namespace's aggregation workers (they write their checkpoint
// Streams through the source's ingestion) and the operator.
func ForStream(own string, others []string) func(class string, req any) ([]string, bool) {
	return func(_ string, req any) ([]string, bool) {
		if r, ok := req.(interface{ GetStream() string }); ok && r.GetStream() == own {
			return nil, false
		}
		return others, true
	}
}
