package controllers

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

func TestPoolStatus(t *testing.T) {
	sts := func(observed, gen int64, replicas, ready, updated int32, cur, upd string) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{
			ObjectMeta: metav1.ObjectMeta{Generation: gen},
			Status: appsv1.StatefulSetStatus{ObservedGeneration: observed, Replicas: replicas, ReadyReplicas: ready,
				UpdatedReplicas: updated, CurrentRevision: cur, UpdateRevision: upd},
		}
	}
	tests := []struct {
		name                             string
		sts                              *appsv1.StatefulSet
		wantReplicas, wantReady          int32
		wantReadyStatus, wantProgressing metav1.ConditionStatus
		wantReadyReason, wantProgReason  string
	}{
		{"no StatefulSet yet", nil, 0, 0, metav1.ConditionFalse, metav1.ConditionTrue,
			streamsv1alpha1.ReplicaPoolReplicasNotReadyReason, streamsv1alpha1.ReplicaPoolCreatingReason},
		{"StatefulSet not yet observed", sts(0, 1, 0, 0, 0, "", ""), 0, 0, metav1.ConditionFalse, metav1.ConditionTrue,
			streamsv1alpha1.ReplicaPoolReplicasNotReadyReason, streamsv1alpha1.ReplicaPoolCreatingReason},
		{"scaling up", sts(1, 1, 1, 1, 1, "a", "a"), 1, 1, metav1.ConditionFalse, metav1.ConditionTrue,
			streamsv1alpha1.ReplicaPoolReplicasNotReadyReason, streamsv1alpha1.ReplicaPoolScalingReason},
		{"new spec not yet observed", sts(1, 2, 3, 3, 3, "a", "a"), 3, 3, metav1.ConditionFalse, metav1.ConditionTrue,
			streamsv1alpha1.ReplicaPoolReplicasNotReadyReason, streamsv1alpha1.ReplicaPoolRollingUpdateReason},
		{"rolling update", sts(2, 2, 3, 3, 1, "a", "b"), 3, 3, metav1.ConditionFalse, metav1.ConditionTrue,
			streamsv1alpha1.ReplicaPoolReplicasNotReadyReason, streamsv1alpha1.ReplicaPoolRollingUpdateReason},
		{"all pods exist, one not ready", sts(2, 2, 3, 2, 3, "b", "b"), 3, 2, metav1.ConditionFalse, metav1.ConditionFalse,
			streamsv1alpha1.ReplicaPoolReplicasNotReadyReason, streamsv1alpha1.ReplicaPoolUpToDateReason},
		{"ready", sts(2, 2, 3, 3, 3, "b", "b"), 3, 3, metav1.ConditionTrue, metav1.ConditionFalse,
			streamsv1alpha1.ReplicaPoolReplicasReadyReason, streamsv1alpha1.ReplicaPoolUpToDateReason},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := testPool(nil)
			got := poolStatus(pool, tt.sts, poolUsage{})
			if got.ObservedGeneration != pool.Generation {
				t.Errorf("observedGeneration = %d, want %d", got.ObservedGeneration, pool.Generation)
			}
			if got.Replicas != tt.wantReplicas || got.ReadyReplicas != tt.wantReady {
				t.Errorf("replicas %d ready %d, want %d and %d", got.Replicas, got.ReadyReplicas, tt.wantReplicas, tt.wantReady)
			}
			// The scale subresource's selector: the pool's replica pods.
			if want := labels.SelectorFromSet(poolSelectorLabels(pool)).String(); got.Selector != want || !strings.Contains(want, "app.kubernetes.io/component=replica") {
				t.Errorf("selector %q, want %q", got.Selector, want)
			}
			expectCondition(t, got.Conditions, streamsv1alpha1.ReplicaPoolReadyCondition, tt.wantReadyStatus, tt.wantReadyReason, pool.Generation)
			expectCondition(t, got.Conditions, streamsv1alpha1.ReplicaPoolProgressingCondition, tt.wantProgressing, tt.wantProgReason, pool.Generation)
		})
	}
}

func TestPoolStatusUsage(t *testing.T) {
	tests := []struct {
		name         string
		usage        poolUsage
		wantDegraded bool
	}{
		{"empty pool", poolUsage{}, false},
		{"two Streams within the pool's replicas", poolUsage{Streams: 2, Chains: 36}, false},
		{"a Stream with longer chains than the pool has pods", poolUsage{Streams: 2, Chains: 36, TooLongChains: []string{"clicks"}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := testPool(nil)
			got := poolStatus(pool, nil, tt.usage)
			if got.Streams != tt.usage.Streams || got.Chains != tt.usage.Chains {
				t.Errorf("streams %d chains %d, want %d and %d", got.Streams, got.Chains, tt.usage.Streams, tt.usage.Chains)
			}
			if tt.wantDegraded {
				expectCondition(t, got.Conditions, streamsv1alpha1.ReplicaPoolDegradedCondition, metav1.ConditionTrue,
					streamsv1alpha1.ReplicaPoolReplicationFactorExceedsReplicasReason, pool.Generation)
				return
			}
			for _, c := range got.Conditions {
				if c.Type == streamsv1alpha1.ReplicaPoolDegradedCondition {
					t.Errorf("Degraded = %+v, want none", c)
				}
			}
		})
	}

	t.Run("Degraded goes away with the too long Stream", func(t *testing.T) {
		pool := testPool(nil)
		pool.Status = poolStatus(pool, nil, poolUsage{Streams: 1, TooLongChains: []string{"clicks"}})
		got := poolStatus(pool, nil, poolUsage{})
		for _, c := range got.Conditions {
			if c.Type == streamsv1alpha1.ReplicaPoolDegradedCondition {
				t.Errorf("Degraded = %+v, want none", c)
			}
		}
	})
}
