package controllers

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// streamChildren is what a Stream is made of in this slice of the
// operator: its own pool (nil when it names a shared one), and one
// Partition and one ReplicationChain per partition, all owned by the
// Stream. Membership of the chains is written by the chain controller,
// not here.
type streamChildren struct {
	Pool       *streamsv1alpha1.ReplicaPool
	Partitions []*streamsv1alpha1.Partition
	Chains     []*streamsv1alpha1.ReplicationChain
}

// desiredStreamChildren builds a Stream's children from its spec. It reads
// nothing but the Stream; owner references are set by the caller.
func desiredStreamChildren(stream *streamsv1alpha1.Stream) streamChildren {
	var out streamChildren
	if stream.HasOwnPool() {
		out.Pool = &streamsv1alpha1.ReplicaPool{
			TypeMeta: metav1.TypeMeta{APIVersion: streamsv1alpha1.GroupVersion.String(), Kind: "ReplicaPool"},
			ObjectMeta: metav1.ObjectMeta{
				Name:      stream.OwnPoolName(),
				Namespace: stream.Namespace,
				Labels:    streamLabels(stream),
			},
			Spec: stream.OwnPoolSpec(),
		}
	}
	for i := range stream.Spec.Partitions {
		name := stream.PartitionName(i)
		out.Partitions = append(out.Partitions, &streamsv1alpha1.Partition{
			TypeMeta:   metav1.TypeMeta{APIVersion: streamsv1alpha1.GroupVersion.String(), Kind: "Partition"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: stream.Namespace, Labels: streamLabels(stream)},
			Spec:       streamsv1alpha1.PartitionSpec{Stream: stream.Name, Index: ptr.To(i)},
		})
		out.Chains = append(out.Chains, &streamsv1alpha1.ReplicationChain{
			TypeMeta:   metav1.TypeMeta{APIVersion: streamsv1alpha1.GroupVersion.String(), Kind: "ReplicationChain"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: stream.Namespace, Labels: streamLabels(stream)},
			Spec: streamsv1alpha1.ReplicationChainSpec{
				Stream:            stream.Name,
				Partition:         ptr.To(i),
				Pool:              stream.PoolName(),
				ReplicationFactor: stream.Spec.ReplicationFactor,
			},
		})
	}
	return out
}

// labelStream names the Stream an object belongs to, so that its
// Partitions and ReplicationChains can be listed with a selector.
const labelStream = "streams.catena.io/stream"

func streamLabels(stream *streamsv1alpha1.Stream) map[string]string {
	return map[string]string{
		labelName:      appName,
		labelManagedBy: fieldOwner,
		labelStream:    stream.Name,
	}
}

// streamObservation is what the Stream reconciler read after applying the
// Stream's children.
type streamObservation struct {
	// PoolFound is whether the pool hosting the Stream exists.
	PoolFound bool
	// PoolOwned is whether that pool, for a Stream with a pool of its own,
	// is controlled by the Stream.
	PoolOwned bool
	// PoolReplicas is the pool's spec.replicas, when found.
	PoolReplicas int32
	// PoolReady is whether the pool's Ready condition is True.
	PoolReady bool
	// Partitions and Chains count the Stream's children that exist.
	Partitions, Chains int32
	// PartitionsReady counts the Partitions whose Ready condition is True.
	PartitionsReady int32
	// IngestionFound and IngestServiceFound are whether the ingestion
	// Deployment and Service exist under the Stream's control.
	IngestionFound, IngestServiceFound bool
	// IngestionAvailable is the ingestion Deployment's
	// status.availableReplicas.
	IngestionAvailable int32
	// External is the address clients outside the cluster use ("":
	// none, or none yet).
	External string
	// KafkaReady is whether the Kafka listener's Services and offsets
	// Stream exist under the Stream's control.
	KafkaReady bool
	// IngestionConflict names the ingestion object ("Service orders")
	// whose name is taken by one the Stream does not control; "" when
	// none is.
	IngestionConflict string
	// ShortChains are the chains shorter than the replication factor (their
	// Degraded condition is True), each as "<name>: <its message>", in name
	// order; Reconfiguring the chains whose Progressing condition is True.
	ShortChains, Reconfiguring []string
	// reapply is set when this round applies the Stream's objects whatever
	// their hash.
	reapply bool
}

// streamStatus is the Stream's status given what was observed. Like
// poolStatus, it keeps transition times of unchanged conditions.
func streamStatus(stream *streamsv1alpha1.Stream, obs streamObservation) streamsv1alpha1.StreamStatus {
	status := *stream.Status.DeepCopy()
	status.ObservedGeneration = stream.Generation
	status.Pool = stream.PoolName()
	status.PartitionsReady = obs.PartitionsReady
	status.Endpoints = streamsv1alpha1.StreamEndpoints{}
	if obs.IngestServiceFound {
		status.Endpoints.Producers = ingestEndpoint(stream)
		status.Endpoints.Consumers = ingestEndpoint(stream)
	}
	status.Endpoints.External = obs.External
	if stream.HasKafka() && obs.KafkaReady {
		status.Endpoints.Kafka = kafkaEndpoint(stream)
	}

	gen := stream.Generation
	want := stream.Spec.Partitions
	cond := func(typ string, s metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen}
	}

	// Degraded: the spec cannot be met as it stands.
	var degraded *metav1.Condition
	switch {
	case !obs.PoolFound && !stream.HasOwnPool():
		c := cond(streamsv1alpha1.StreamDegradedCondition, metav1.ConditionTrue, streamsv1alpha1.StreamPoolNotFoundReason,
			fmt.Sprintf("ReplicaPool %s does not exist", stream.PoolName()))
		degraded = &c
	case obs.PoolFound && stream.HasOwnPool() && !obs.PoolOwned:
		c := cond(streamsv1alpha1.StreamDegradedCondition, metav1.ConditionTrue, streamsv1alpha1.StreamPoolConflictReason,
			fmt.Sprintf("ReplicaPool %s exists and is not owned by this Stream", stream.PoolName()))
		degraded = &c
	case obs.PoolFound && obs.PoolReplicas < stream.Spec.ReplicationFactor:
		c := cond(streamsv1alpha1.StreamDegradedCondition, metav1.ConditionTrue, streamsv1alpha1.StreamReplicationFactorExceedsPoolReason,
			fmt.Sprintf("replicationFactor %d exceeds the %d replicas of ReplicaPool %s", stream.Spec.ReplicationFactor, obs.PoolReplicas, stream.PoolName()))
		degraded = &c
	case obs.IngestionConflict != "":
		c := cond(streamsv1alpha1.StreamDegradedCondition, metav1.ConditionTrue, streamsv1alpha1.StreamIngestionConflictReason,
			fmt.Sprintf("%s exists and is not owned by this Stream", obs.IngestionConflict))
		degraded = &c
	case len(obs.ShortChains) > 0:
		c := cond(streamsv1alpha1.StreamDegradedCondition, metav1.ConditionTrue, streamsv1alpha1.StreamUnderReplicatedReason,
			fmt.Sprintf("%d chains have fewer than %d members: %s", len(obs.ShortChains), stream.Spec.ReplicationFactor, strings.Join(obs.ShortChains, "; ")))
		degraded = &c
	}

	// Progressing: children still missing.
	var missing []string
	if !obs.PoolFound && stream.HasOwnPool() {
		missing = append(missing, "pool "+stream.PoolName())
	}
	if obs.Partitions < want {
		missing = append(missing, fmt.Sprintf("%d of %d Partitions", want-obs.Partitions, want))
	}
	if obs.Chains < want {
		missing = append(missing, fmt.Sprintf("%d of %d ReplicationChains", want-obs.Chains, want))
	}
	if !obs.IngestionFound {
		missing = append(missing, "ingestion Deployment "+stream.IngestName())
	}
	if !obs.IngestServiceFound {
		missing = append(missing, "ingestion Service "+stream.IngestServiceName())
	}
	switch {
	case len(missing) > 0:
		meta.SetStatusCondition(&status.Conditions, cond(streamsv1alpha1.StreamProgressingCondition, metav1.ConditionTrue,
			streamsv1alpha1.StreamProvisioningReason, fmt.Sprintf("Missing %s", joinList(missing))))
	case len(obs.Reconfiguring) > 0:
		meta.SetStatusCondition(&status.Conditions, cond(streamsv1alpha1.StreamProgressingCondition, metav1.ConditionTrue,
			streamsv1alpha1.StreamReconfiguringReason, fmt.Sprintf("Chains reconfiguring: %s", joinList(obs.Reconfiguring))))
	default:
		meta.SetStatusCondition(&status.Conditions, cond(streamsv1alpha1.StreamProgressingCondition, metav1.ConditionFalse,
			streamsv1alpha1.StreamUpToDateReason, "Every child of the Stream exists"))
	}

	// Ready: the pool is ready, every partition is served and clients can
	// reach the ingestion tier.
	switch {
	case degraded != nil:
		meta.SetStatusCondition(&status.Conditions, cond(streamsv1alpha1.StreamReadyCondition, metav1.ConditionFalse, degraded.Reason, degraded.Message))
		meta.SetStatusCondition(&status.Conditions, *degraded)
	case !obs.PoolReady:
		meta.SetStatusCondition(&status.Conditions, cond(streamsv1alpha1.StreamReadyCondition, metav1.ConditionFalse,
			streamsv1alpha1.StreamPoolNotReadyReason, fmt.Sprintf("ReplicaPool %s is not ready", stream.PoolName())))
	case obs.PartitionsReady < want:
		meta.SetStatusCondition(&status.Conditions, cond(streamsv1alpha1.StreamReadyCondition, metav1.ConditionFalse,
			streamsv1alpha1.StreamPartitionsNotReadyReason, fmt.Sprintf("%d of %d partitions are ready", obs.PartitionsReady, want)))
	case obs.IngestionAvailable < 1:
		meta.SetStatusCondition(&status.Conditions, cond(streamsv1alpha1.StreamReadyCondition, metav1.ConditionFalse,
			streamsv1alpha1.StreamIngestionNotReadyReason, fmt.Sprintf("Ingestion Deployment %s has no available pod", stream.IngestName())))
	default:
		meta.SetStatusCondition(&status.Conditions, cond(streamsv1alpha1.StreamReadyCondition, metav1.ConditionTrue,
			streamsv1alpha1.StreamPartitionsReadyReason, fmt.Sprintf("%d of %d partitions are ready; %d ingestion pods are available", obs.PartitionsReady, want, obs.IngestionAvailable)))
	}
	if degraded == nil {
		meta.RemoveStatusCondition(&status.Conditions, streamsv1alpha1.StreamDegradedCondition)
	}
	return status
}

func joinList(items []string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	out := items[0]
	for _, it := range items[1 : len(items)-1] {
		out += ", " + it
	}
	return out + " and " + items[len(items)-1]
}

// partitionChangeMatters reports whether an update of a Partition changes
// what its Stream's status is made of (whether it is Ready): its offsets
// and consumer holds, written as the chain runs, do not.
func partitionChangeMatters(old, cur *streamsv1alpha1.Partition) bool {
	return ownedChangeMatters(old, cur) || old.IsReady() != cur.IsReady()
}

// chainChangeMatters reports whether an update of a ReplicationChain
// changes what its Stream's status is made of: whether it is short (and
// the Degraded message saying how), and whether it is reconfiguring. A
// failover changes each chain's status several times (the new epoch, each
// member's confirmation); the Stream looks at the ones that matter only.
func chainChangeMatters(old, cur *streamsv1alpha1.ReplicationChain) bool {
	if ownedChangeMatters(old, cur) {
		return true
	}
	summary := func(c *streamsv1alpha1.ReplicationChain) (metav1.ConditionStatus, string, bool) {
		d := meta.FindStatusCondition(c.Status.Conditions, streamsv1alpha1.ReplicationChainDegradedCondition)
		progressing := meta.IsStatusConditionTrue(c.Status.Conditions, streamsv1alpha1.ReplicationChainProgressingCondition)
		if d == nil {
			return "", "", progressing
		}
		return d.Status, d.Message, progressing
	}
	os, om, op := summary(old)
	cs, cm, cp := summary(cur)
	return os != cs || om != cm || op != cp
}

// ownedChangeMatters: a change of an owned object's spec, owners or
// deletion always matters to its Stream.
func ownedChangeMatters(old, cur client.Object) bool {
	return old.GetGeneration() != cur.GetGeneration() || old.GetDeletionTimestamp().IsZero() != cur.GetDeletionTimestamp().IsZero() ||
		!equality.Semantic.DeepEqual(old.GetOwnerReferences(), cur.GetOwnerReferences())
}
