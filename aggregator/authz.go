package aggregator

import "github.com/catena-streams/catena/rpc/catenapb"

// Classes of the Aggregator service's methods, for a transport.Policy: who
// may call each is the process's flags (catena aggregator --allow-*), which
// the operator sets (docs/security.md).
const (
	// ClassAdmin assigns shards: the operator.
	ClassAdmin = "admin"
	// ClassStatus reports the worker's shards: the operator.
	ClassStatus = "status"
	// ClassQuery reads results: the source Stream's consumers, and the
	// Aggregation's other workers, which fan a query out to the owners of
	// its keys.
	ClassQuery = "query"
)

// MethodClasses maps each Aggregator method to its class.
func MethodClasses() map[string]string {
	return map[string]string{
		catenapb.Aggregator_Assign_FullMethodName: ClassAdmin,
		catenapb.Aggregator_Status_FullMethodName: ClassStatus,
		catenapb.Aggregator_Get_FullMethodName:    ClassQuery,
		catenapb.Aggregator_List_FullMethodName:   ClassQuery,
	}
}
