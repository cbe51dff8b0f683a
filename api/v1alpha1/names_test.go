package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The name limits in the schema exist so that every object derived from a
// name is valid; check it for the longest names the schema lets through.
func TestDerivedNamesFit(t *testing.T) {
	stream := &Stream{ObjectMeta: metav1.ObjectMeta{Name: "s" + strings.Repeat("x", MaxStreamNameLength-1)}}
	pool := &ReplicaPool{ObjectMeta: metav1.ObjectMeta{Name: stream.OwnPoolName()}}
	const revisionHash = "-5d8f7b9c6d" // StatefulSet controller-revision-hash suffix

	for _, c := range []struct {
		what string
		name string
		errs []string
	}{
		{"own pool name", pool.Name, validation.IsDNS1035Label(pool.Name)},
		{"StatefulSet revision label", pool.StatefulSetName() + revisionHash, validation.IsValidLabelValue(pool.StatefulSetName() + revisionHash)},
		{"pool Service", pool.ServiceName(), validation.IsDNS1035Label(pool.ServiceName())},
		{"last replica pod hostname", pool.PodName(MaxReplicas - 1), validation.IsDNS1123Label(pool.PodName(MaxReplicas - 1))},
		{"ingestion Service", stream.IngestName(), validation.IsDNS1035Label(stream.IngestName())},
		{"last Partition", stream.PartitionName(MaxPartitions - 1), validation.IsDNS1123Label(stream.PartitionName(MaxPartitions - 1))},
		{"stream label value", stream.Name, validation.IsValidLabelValue(stream.Name)},
	} {
		if len(c.errs) > 0 {
			t.Errorf("%s %q (%d characters) is invalid: %v", c.what, c.name, len(c.name), c.errs)
		}
	}
	if len(pool.Name) > MaxReplicaPoolNameLength {
		t.Errorf("own pool name %q is longer than a ReplicaPool may be (%d)", pool.Name, MaxReplicaPoolNameLength)
	}
}

func TestOwnPoolSpec(t *testing.T) {
	replicas := int32(5)
	for _, c := range []struct {
		name         string
		spec         StreamSpec
		wantReplicas int32
		wantSize     string
		wantNode     SpreadPolicy
	}{
		{"all defaults", StreamSpec{Partitions: 1}, DefaultReplicas, DefaultStorageSize, DefaultNodeSpread},
		{"replicas given", StreamSpec{Partitions: 1, Replicas: &replicas}, 5, DefaultStorageSize, DefaultNodeSpread},
		{"storage and placement given", StreamSpec{
			Partitions: 1,
			Storage:    &StorageSpec{Size: resource.MustParse("20Gi")},
			Placement:  &PlacementSpec{NodeSpread: SpreadNone},
		}, DefaultReplicas, "20Gi", SpreadNone},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Stream{ObjectMeta: metav1.ObjectMeta{Name: "orders"}, Spec: c.spec}
			got := s.OwnPoolSpec()
			if got.Replicas != c.wantReplicas || got.Storage.Size.String() != c.wantSize || got.Placement.NodeSpread != c.wantNode {
				t.Errorf("OwnPoolSpec() = replicas %d, size %s, nodeSpread %s; want %d, %s, %s",
					got.Replicas, got.Storage.Size.String(), got.Placement.NodeSpread, c.wantReplicas, c.wantSize, c.wantNode)
			}
			if got.Placement.ZoneSpread != DefaultZoneSpread {
				t.Errorf("zoneSpread = %s, want %s", got.Placement.ZoneSpread, DefaultZoneSpread)
			}
			if s.PoolName() != "orders-pool" {
				t.Errorf("PoolName() = %q, want orders-pool", s.PoolName())
			}
		})
	}
	for _, rate := range []*int32{nil, new(int32(0)), new(int32(400))} {
		s := &Stream{Spec: StreamSpec{Partitions: 1, CatchUpMiBPerSecond: rate}}
		if got := s.OwnPoolSpec().CatchUpMiBPerSecond; (got == nil) != (rate == nil) || (got != nil && (*got != *rate || got == rate)) {
			t.Errorf("catchUpMiBPerSecond %v: the own pool's is %v, want a copy of it", rate, got)
		}
	}
	if c := (&Stream{Spec: StreamSpec{Pool: "shared"}}); c.HasOwnPool() || c.PoolName() != "shared" {
		t.Errorf("a Stream naming pool shared: HasOwnPool %v, PoolName %q", c.HasOwnPool(), c.PoolName())
	}
}
