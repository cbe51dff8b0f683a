package devcluster

import (
	"reflect"
	"testing"
)

func TestPlacement(t *testing.T) {
	ids := []string{"r0", "r1", "r2"}
	tests := []struct {
		name           string
		partitions, rf int
		replicas       []string
		want           [][]string
	}{
		{"one partition", 1, 3, ids, [][]string{{"r0", "r1", "r2"}}},
		{"rotates heads and tails", 4, 3, ids, [][]string{{"r0", "r1", "r2"}, {"r1", "r2", "r0"}, {"r2", "r0", "r1"}, {"r0", "r1", "r2"}}},
		{"shorter chains", 3, 2, ids, [][]string{{"r0", "r1"}, {"r1", "r2"}, {"r2", "r0"}}},
		{"replication capped at replicas", 2, 5, ids[:2], [][]string{{"r0", "r1"}, {"r1", "r0"}}},
		{"chain of one", 2, 1, ids, [][]string{{"r0"}, {"r1"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Placement(tc.partitions, tc.rf, tc.replicas); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Placement(%d, %d, %v) = %v, want %v", tc.partitions, tc.rf, tc.replicas, got, tc.want)
			}
		})
	}
}

func TestPlacementBalancesRoles(t *testing.T) {
	ids := []string{"r0", "r1", "r2"}
	heads, tails := map[string]int{}, map[string]int{}
	for _, c := range Placement(12, 3, ids) {
		heads[c[0]]++
		tails[c[len(c)-1]]++
	}
	for _, id := range ids {
		if heads[id] != 4 || tails[id] != 4 {
			t.Fatalf("replica %s heads %d tails %d, want 4 and 4", id, heads[id], tails[id])
		}
	}
}
