package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
)

// PartitionName is the name of the Partition, and of the ReplicationChain,
// of partition index of the named Stream: <stream>-<index>. The schema of
// both kinds holds their names to it.
func PartitionName(stream string, index int32) string {
	return fmt.Sprintf("%s-%d", stream, index)
}

// IsReady reports whether the Partition's Ready condition is True.
func (p *Partition) IsReady() bool {
	return meta.IsStatusConditionTrue(p.Status.Conditions, PartitionReadyCondition)
}
