package chainplan

import (
	"fmt"
	"testing"
)

func TestPlaceBalancesRolesAcrossStreams(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pods   int
		rf     int
		chains int // placed one after the other, each seeing the others
		// want: heads, tails and members of every pod.
		wantHeads, wantTails, wantMembers []int
	}{
		{"one stream fills a pool of its size", 3, 3, 3, []int{1, 1, 1}, []int{1, 1, 1}, []int{3, 3, 3}},
		{"two streams share a pool", 3, 3, 6, []int{2, 2, 2}, []int{2, 2, 2}, []int{6, 6, 6}},
		{"a pool larger than the chains", 5, 3, 5, []int{1, 1, 1, 1, 1}, []int{1, 1, 1, 1, 1}, []int{3, 3, 3, 3, 3}},
		{"more chains than pods, not a multiple", 4, 2, 6, []int{2, 1, 2, 1}, []int{1, 2, 1, 2}, []int{3, 3, 3, 3}},
		{"replication factor 1", 3, 1, 4, []int{2, 1, 1}, []int{2, 1, 1}, []int{2, 1, 1}},
		{"factor above the pool's size takes every pod", 2, 3, 2, []int{1, 1}, []int{1, 1}, []int{2, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pods []string
			for i := range tc.pods {
				pods = append(pods, fmt.Sprintf("p-%d", i))
			}
			load := Load{}
			for range tc.chains {
				members := Place(pods, load, tc.rf)
				if want := min(tc.rf, tc.pods); len(members) != want {
					t.Fatalf("placed %v, want %d members", members, want)
				}
				seen := map[string]bool{}
				for _, m := range members {
					if seen[m] {
						t.Fatalf("placed %v: a pod twice", members)
					}
					seen[m] = true
				}
				load.Add(members)
			}
			spread := func(f func(Roles) int) int {
				lo, hi := f(load[pods[0]]), f(load[pods[0]])
				for _, p := range pods {
					lo, hi = min(lo, f(load[p])), max(hi, f(load[p]))
				}
				return hi - lo
			}
			if h, tl, m := spread(func(l Roles) int { return l.Heads }), spread(func(l Roles) int { return l.Tails }), spread(func(l Roles) int { return l.Members }); h > 1 || tl > 1 || m > 1 {
				t.Errorf("unbalanced: heads differ by %d, tails by %d, members by %d", h, tl, m)
			}
			for i, p := range pods {
				l := load[p]
				if l.Heads != tc.wantHeads[i] || l.Tails != tc.wantTails[i] || l.Members != tc.wantMembers[i] {
					t.Errorf("%s: heads %d tails %d members %d, want %d %d %d", p, l.Heads, l.Tails, l.Members, tc.wantHeads[i], tc.wantTails[i], tc.wantMembers[i])
				}
			}
		})
	}
}

func TestPlaceBalancesStreamsOfDifferentFactors(t *testing.T) {
	// The shared-pool sample: orders (12 partitions, factor 3) and clicks
	// (24, factor 2) on 5 pods, their placements interleaved as the two
	// Streams' chains are reconciled.
	pods := []string{"p-0", "p-1", "p-2", "p-3", "p-4"}
	for name, factorOf := range map[string]func(i int) int{
		"interleaved":  func(i int) int { return 2 + btoi(i%3 == 0) },
		"orders first": func(i int) int { return 2 + btoi(i < 12) },
		"clicks first": func(i int) int { return 2 + btoi(i >= 24) },
	} {
		t.Run(name, func(t *testing.T) {
			load := Load{}
			for i := range 36 {
				load.Add(Place(pods, load, factorOf(i)))
			}
			// Ring segments of two lengths cannot always even heads and
			// tails to one apart; two of about seven each is the bound.
			expectBalanced(t, pods, load, 2)
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func expectBalanced(t *testing.T, pods []string, load Load, most int) {
	t.Helper()
	lo, hi := map[string]int{}, map[string]int{}
	for i, p := range pods {
		for role, v := range map[string]int{"heads": load[p].Heads, "tails": load[p].Tails, "members": load[p].Members} {
			if i == 0 || v < lo[role] {
				lo[role] = v
			}
			if i == 0 || v > hi[role] {
				hi[role] = v
			}
		}
	}
	for _, role := range []string{"heads", "tails", "members"} {
		if hi[role]-lo[role] > most {
			t.Errorf("%s differ by %d across pods: %+v", role, hi[role]-lo[role], load)
		}
	}
}

func TestPlaceEmpty(t *testing.T) {
	if got := Place(nil, Load{}, 3); got != nil {
		t.Errorf("no replicas: placed %v", got)
	}
	if got := Place([]string{"r0"}, Load{}, 0); got != nil {
		t.Errorf("factor 0: placed %v", got)
	}
}
