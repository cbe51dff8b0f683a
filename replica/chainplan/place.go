package chainplan

// Placement of new chains, for both masters (the operator over a pool's
// pods, catena dev over its replica processes): pure, like the planner.

// Roles is how many chains a replica serves, by role.
type Roles struct {
	Members, Heads, Tails int
}

// Load is the chains each replica serves, by replica id.
type Load map[string]Roles

// LoadOf counts the chains' memberships (each head first); a chain with
// no members counts nothing.
func LoadOf(chains ...[]string) Load {
	load := Load{}
	for _, c := range chains {
		load.Add(c)
	}
	return load
}

// Add counts one more chain of members, head first.
func (l Load) Add(members []string) {
	for i, m := range members {
		r := l[m]
		r.Members++
		if i == 0 {
			r.Heads++
		}
		if i == len(members)-1 {
			r.Tails++
		}
		l[m] = r
	}
}

// Place picks the members of a new chain of length rf, head first, from
// replicas in their given order (a pool's pods in ordinal order). It
// balances every chain the replicas serve, of any stream: a chain is a
// ring segment of rf consecutive replicas, and the segment chosen is the
// one whose head heads the fewest chains plus whose tail ends the fewest
// (then whose replicas serve the fewest, then the first). Ring segments
// keep the roles balanced together, which picking each role greedily does
// not (the last chain can find the only replica short of a tail already
// taken as its head), and weighing head and tail at once keeps tails even
// when streams of different replication factors share the replicas. A
// pool's StatefulSet spreads consecutive pods across nodes and zones. It
// returns fewer than rf members only when there are fewer replicas.
func Place(replicas []string, load Load, rf int) []string {
	n := len(replicas)
	rf = min(rf, n)
	if rf <= 0 {
		return nil
	}
	cost := func(start int) (roles, members int) {
		h, tl := load[replicas[start]].Heads, load[replicas[(start+rf-1)%n]].Tails
		roles = (h+1)*(h+1) + (tl+1)*(tl+1)
		for k := range rf {
			members += load[replicas[(start+k)%n]].Members
		}
		return roles, members
	}
	best := 0
	bestRoles, bestMembers := cost(0)
	for start := 1; start < n; start++ {
		if r, m := cost(start); r < bestRoles || (r == bestRoles && m < bestMembers) {
			best, bestRoles, bestMembers = start, r, m
		}
	}
	chosen := make([]string, rf)
	for k := range rf {
		chosen[k] = replicas[(best+k)%n]
	}
	return chosen
}

// MinChainLength is the fewest full copies a partition of replication
// factor replication must have to take writes: requested, capped at the
// factor, or a majority of the factor when requested is 0. A majority
// keeps a write acknowledged on at least two copies of three while one
// member is out, and refuses writes (rather than keep a lone copy) when
// two are.
func MinChainLength(replication, requested int) int {
	replication = max(replication, 1)
	if requested >= 1 {
		return min(requested, replication)
	}
	return replication/2 + 1
}
