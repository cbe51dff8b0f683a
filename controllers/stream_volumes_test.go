package controllers

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

func TestPlanVolumeCleanup(t *testing.T) {
	deleting := func(s *streamsv1alpha1.StreamSpec) { s.VolumeReclaimPolicy = streamsv1alpha1.VolumeReclaimDelete }
	stream := testStream(deleting)
	stream.UID = "stream-uid"
	ownedPool := &streamsv1alpha1.ReplicaPool{ObjectMeta: metav1.ObjectMeta{Name: "events-pool", Namespace: "ns", OwnerReferences: []metav1.OwnerReference{{
		APIVersion: streamsv1alpha1.GroupVersion.String(), Kind: "Stream", Name: "events", UID: "stream-uid", Controller: ptr.To(true),
	}}}}
	foreignPool := &streamsv1alpha1.ReplicaPool{ObjectMeta: metav1.ObjectMeta{Name: "events-pool", Namespace: "ns"}}
	claim := func(name string) corev1.PersistentVolumeClaim {
		return corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}}
	}
	gone := claim("data-events-pool-2")
	gone.DeletionTimestamp = ptr.To(metav1.Now())
	otherNS := claim("data-events-pool-3")
	otherNS.Namespace = "elsewhere"
	claims := []corev1.PersistentVolumeClaim{
		claim("data-events-pool-1"), claim("data-events-pool-0"), gone, otherNS,
		claim("scratch-events-pool-0"), // labelled like the pool's, not made by its StatefulSet
	}

	tests := []struct {
		name       string
		stream     *streamsv1alpha1.Stream
		pool       *streamsv1alpha1.ReplicaPool
		wantDelete []string
		wantKeep   bool
	}{
		{"Delete, own pool present", stream, ownedPool, []string{"data-events-pool-0", "data-events-pool-1"}, false},
		{"Delete, own pool already gone", stream, nil, []string{"data-events-pool-0", "data-events-pool-1"}, false},
		{"Delete, pool name taken by a pool the Stream does not own", stream, foreignPool, nil, true},
		{"Retain", testStream(func(s *streamsv1alpha1.StreamSpec) { s.VolumeReclaimPolicy = streamsv1alpha1.VolumeReclaimRetain }), ownedPool, nil, true},
		{"policy unset", testStream(nil), ownedPool, nil, true},
		{"Delete on a shared pool, which the API server refuses", testStream(func(s *streamsv1alpha1.StreamSpec) {
			deleting(s)
			s.Pool = "events-pool"
		}), foreignPool, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := planVolumeCleanup(tt.stream, tt.pool, claims)
			if diff := cmp.Diff(tt.wantDelete, got.Delete); diff != "" {
				t.Errorf("claims to delete mismatch (-want +got):\n%s", diff)
			}
			if (got.Keep != "") != tt.wantKeep {
				t.Errorf("keep = %q, want a reason: %v", got.Keep, tt.wantKeep)
			}
		})
	}
}

func TestDeletesVolumes(t *testing.T) {
	for _, tt := range []struct {
		name string
		spec func(*streamsv1alpha1.StreamSpec)
		want bool
	}{
		{"own pool, Delete", func(s *streamsv1alpha1.StreamSpec) { s.VolumeReclaimPolicy = streamsv1alpha1.VolumeReclaimDelete }, true},
		{"own pool, Retain", func(s *streamsv1alpha1.StreamSpec) { s.VolumeReclaimPolicy = streamsv1alpha1.VolumeReclaimRetain }, false},
		{"own pool, unset", nil, false},
		{"shared pool, Delete", func(s *streamsv1alpha1.StreamSpec) {
			s.VolumeReclaimPolicy, s.Pool = streamsv1alpha1.VolumeReclaimDelete, "shared"
		}, true},
		{"shared pool, Retain", func(s *streamsv1alpha1.StreamSpec) { s.Pool = "shared" }, false},
	} {
		if got := testStream(tt.spec).DeletesVolumes(); got != tt.want {
			t.Errorf("%s: DeletesVolumes() = %v, want %v", tt.name, got, tt.want)
		}
	}
}
