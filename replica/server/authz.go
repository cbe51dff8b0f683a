package server

import "github.com/catena-streams/catena/rpc/catenapb"

// Classes of the Replica service's methods, for a transport.Policy: who may
// call each is the process's flags (catena replica --allow-*), which the
// operator sets to the identities it issues (docs/security.md).
const (
	// ClassAdmin changes what a replica stores or which chain it serves:
	// the chain master's calls (the operator, or catena dev).
	ClassAdmin = "admin"
	// ClassReplication carries a chain's records between members: the
	// replicas of the same pool.
	ClassReplication = "replication"
	// ClassData appends, reads and holds records for producers and
	// consumers: ingestion nodes (and the operator, which releases a
	// deleted Aggregation's holds).
	ClassData = "data"
	// ClassStatus reports what the replica hosts: every caller above.
	ClassStatus = "status"
)

// MethodClasses maps each Replica method to its class.
func MethodClasses() map[string]string {
	return map[string]string{
		catenapb.Replica_Configure_FullMethodName: ClassAdmin,
		catenapb.Replica_EpochEnd_FullMethodName:  ClassAdmin,
		catenapb.Replica_Truncate_FullMethodName:  ClassAdmin,
		catenapb.Replica_Drop_FullMethodName:      ClassAdmin,
		catenapb.Replica_CatchUp_FullMethodName:   ClassAdmin,
		catenapb.Replica_Reach_FullMethodName:     ClassAdmin,

		catenapb.Replica_Replicate_FullMethodName:  ClassReplication,
		catenapb.Replica_ReadFrames_FullMethodName: ClassReplication,

		catenapb.Replica_Append_FullMethodName:                ClassData,
		catenapb.Replica_AppendStream_FullMethodName:          ClassData,
		catenapb.Replica_Completions_FullMethodName:           ClassData,
		catenapb.Replica_Read_FullMethodName:                  ClassData,
		catenapb.Replica_ListOffsets_FullMethodName:           ClassData,
		catenapb.Replica_HoldRetention_FullMethodName:         ClassData,
		catenapb.Replica_ReleaseRetention_FullMethodName:      ClassData,
		catenapb.Replica_ReportHeadUnreachable_FullMethodName: ClassData,

		catenapb.Replica_Status_FullMethodName: ClassStatus,
	}
}
