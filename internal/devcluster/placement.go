package devcluster

// Placement returns the chain (head first) of each of a stream's
// partitions over replicas: partition i's chain starts at replica i mod n
// and continues in ring order, so heads and tails rotate over the replicas
// and every replica carries the same share of each role.
func Placement(partitions, replication int, replicas []string) [][]string {
	n := len(replicas)
	if replication > n {
		replication = n
	}
	out := make([][]string, partitions)
	for p := range partitions {
		chain := make([]string, replication)
		for k := range replication {
			chain[k] = replicas[(p+k)%n]
		}
		out[p] = chain
	}
	return out
}
