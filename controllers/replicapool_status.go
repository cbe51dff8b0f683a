package controllers

import (
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// poolUsage is what the pool hosts.
type poolUsage struct {
	// Streams and Chains count the Streams and ReplicationChains on the
	// pool.
	Streams, Chains int32
	// TooLongChains names the Streams on the pool whose replicationFactor
	// exceeds the pool's replicas, sorted.
	TooLongChains []string
}

// poolStatus is the pool's status given its StatefulSet as read (nil when
// it does not exist yet) and what it hosts. Conditions keep their transition times when their
// status does not change.
func poolStatus(pool *streamsv1alpha1.ReplicaPool, sts *appsv1.StatefulSet, usage poolUsage) streamsv1alpha1.ReplicaPoolStatus {
	status := *pool.Status.DeepCopy()
	status.ObservedGeneration = pool.Generation
	status.Streams, status.Chains = usage.Streams, usage.Chains
	status.Selector = labels.SelectorFromSet(poolSelectorLabels(pool)).String()
	status.Replicas, status.ReadyReplicas = 0, 0
	if sts != nil {
		status.Replicas = sts.Status.Replicas
		status.ReadyReplicas = sts.Status.ReadyReplicas
	}

	progressing := metav1.Condition{
		Type:               streamsv1alpha1.ReplicaPoolProgressingCondition,
		Status:             metav1.ConditionTrue,
		ObservedGeneration: pool.Generation,
	}
	switch want := pool.Spec.Replicas; {
	case sts == nil || sts.Status.ObservedGeneration == 0:
		progressing.Reason = streamsv1alpha1.ReplicaPoolCreatingReason
		progressing.Message = "Creating the StatefulSet and its Service"
	case sts.Status.ObservedGeneration < sts.Generation:
		progressing.Reason = streamsv1alpha1.ReplicaPoolRollingUpdateReason
		progressing.Message = "The StatefulSet controller has not yet observed the latest spec"
	case sts.Status.Replicas != want:
		progressing.Reason = streamsv1alpha1.ReplicaPoolScalingReason
		progressing.Message = fmt.Sprintf("%d of %d replica pods exist", sts.Status.Replicas, want)
	case sts.Status.UpdatedReplicas < want || (sts.Status.UpdateRevision != "" && sts.Status.CurrentRevision != sts.Status.UpdateRevision):
		progressing.Reason = streamsv1alpha1.ReplicaPoolRollingUpdateReason
		progressing.Message = fmt.Sprintf("%d of %d replica pods run the current spec", sts.Status.UpdatedReplicas, want)
	default:
		progressing.Status = metav1.ConditionFalse
		progressing.Reason = streamsv1alpha1.ReplicaPoolUpToDateReason
		progressing.Message = "Every replica pod runs the current spec"
	}

	ready := metav1.Condition{
		Type:               streamsv1alpha1.ReplicaPoolReadyCondition,
		ObservedGeneration: pool.Generation,
	}
	if progressing.Status == metav1.ConditionFalse && status.ReadyReplicas >= pool.Spec.Replicas {
		ready.Status = metav1.ConditionTrue
		ready.Reason = streamsv1alpha1.ReplicaPoolReplicasReadyReason
		ready.Message = fmt.Sprintf("%d of %d replica pods are ready", status.ReadyReplicas, pool.Spec.Replicas)
	} else {
		ready.Status = metav1.ConditionFalse
		ready.Reason = streamsv1alpha1.ReplicaPoolReplicasNotReadyReason
		ready.Message = fmt.Sprintf("%d of %d replica pods are ready", status.ReadyReplicas, pool.Spec.Replicas)
	}

	meta.SetStatusCondition(&status.Conditions, ready)
	meta.SetStatusCondition(&status.Conditions, progressing)
	if len(usage.TooLongChains) > 0 {
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{
			Type:               streamsv1alpha1.ReplicaPoolDegradedCondition,
			Status:             metav1.ConditionTrue,
			Reason:             streamsv1alpha1.ReplicaPoolReplicationFactorExceedsReplicasReason,
			Message:            fmt.Sprintf("Streams %s ask for more chain members than the pool's %d replicas", strings.Join(usage.TooLongChains, ", "), pool.Spec.Replicas),
			ObservedGeneration: pool.Generation,
		})
	} else {
		// Pods that never become ready will also be Degraded, once the
		// operator can tell them from pods still starting.
		meta.RemoveStatusCondition(&status.Conditions, streamsv1alpha1.ReplicaPoolDegradedCondition)
	}
	return status
}
