package controllers

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

func TestEpochRangeTake(t *testing.T) {
	for _, tc := range []struct {
		name       string
		from, to   uint64 // the range before
		min        uint64
		want       uint64
		ok         bool
		next, last uint64
	}{
		{"nothing reserved yet", 0, 0, 2, 0, false, 0, 0},
		{"the next epoch of the range", 10, 20, 2, 10, true, 11, 20},
		{"skips to the plan's minimum", 10, 20, 15, 15, true, 16, 20},
		{"the last one", 20, 20, 3, 20, true, 21, 20},
		{"used up", 21, 20, 3, 0, false, 21, 20},
		{"the plan needs more than the range holds", 10, 20, 21, 0, false, 10, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := &epochRange{next: tc.from, last: tc.to}
			got, ok := rng.take(tc.min)
			if got != tc.want || ok != tc.ok || rng.next != tc.next || rng.last != tc.last {
				t.Errorf("take(%d) = %d, %v, range %d..%d; want %d, %v, range %d..%d",
					tc.min, got, ok, rng.next, rng.last, tc.want, tc.ok, tc.next, tc.last)
			}
		})
	}
}

func TestReservation(t *testing.T) {
	for _, tc := range []struct {
		name                string
		reserved, min, size uint64
		wantLo, wantHi      uint64
	}{
		{"a new pool", 0, 2, 1024, 2, 1025},
		{"above the last reservation", 1025, 7, 1024, 1026, 2049},
		{"above a chain older than the ranges", 10, 5000, 1024, 5000, 6023},
		{"never epoch 0", 0, 0, 4, 1, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi := reservation(tc.reserved, tc.min, tc.size)
			if lo != tc.wantLo || hi != tc.wantHi {
				t.Errorf("reservation(%d, %d, %d) = %d..%d, want %d..%d", tc.reserved, tc.min, tc.size, lo, hi, tc.wantLo, tc.wantHi)
			}
		})
	}
}

// Two operators (a leader and the one replacing it) drawing epochs for the
// chains of one pool never draw the same epoch, whatever copies of the pool
// they hold.
func TestEpochRangesOfTwoOperatorsNeverOverlap(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, streamsv1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	pool := &streamsv1alpha1.ReplicaPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pool", UID: "u1"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pool).WithStatusSubresource(pool).Build()
	stale := &streamsv1alpha1.ReplicaPool{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), stale); err != nil {
		t.Fatal(err)
	}
	a, b := newEpochRanges(c, c), newEpochRanges(c, c)
	a.size, b.size = 4, 4

	seen := map[uint64]string{}
	draw := func(who string, e *epochRanges, min uint64) uint64 {
		t.Helper()
		// Each draws with the copy of the pool it started with: the
		// reservations of the other make it stale.
		epoch, err := e.draw(ctx, stale, min)
		if err != nil {
			t.Fatal(err)
		}
		if epoch < min {
			t.Fatalf("%s drew %d for a plan of epoch %d", who, epoch, min)
		}
		if other, ok := seen[epoch]; ok {
			t.Fatalf("%s drew epoch %d, already drawn by %s", who, epoch, other)
		}
		seen[epoch] = who
		return epoch
	}
	last := map[string]uint64{}
	increasing := func(who string, epoch uint64) {
		t.Helper()
		if epoch <= last[who] {
			t.Fatalf("%s drew %d after %d: a later decision must have a higher epoch", who, epoch, last[who])
		}
		last[who] = epoch
	}
	for i := range 10 {
		increasing("a", draw("a", a, 2))
		increasing("b", draw("b", b, 2))
		if i == 5 {
			// A chain whose members already run epoch 99.
			increasing("b", draw("b", b, 100))
		}
	}
	var stored streamsv1alpha1.ReplicaPool
	if err := c.Get(ctx, client.ObjectKeyFromObject(pool), &stored); err != nil {
		t.Fatal(err)
	}
	for epoch, who := range seen {
		if epoch > uint64(stored.Status.EpochsReserved) {
			t.Errorf("%s drew %d, above the pool's reserved %d", who, epoch, stored.Status.EpochsReserved)
		}
	}
}
