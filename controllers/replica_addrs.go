package controllers

import (
	"fmt"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// replicaAddrs are the gRPC addresses of every replica pod of pool, by
// StatefulSet ordinal:
// <statefulset>-<i>.<headless service>.<namespace>.svc:<replicaPort>. The
// headless Service publishes pods before they are ready, so each name
// resolves as soon as its pod is scheduled.
//
// The ingestion Deployment passes them to `catena ingest --replicas`, which
// discovers chains from the replicas' own Status reports; the chain
// controller reaches replicas at the same addresses (PodDNSAddr, unless
// Options.ReplicaAddr points it elsewhere).
func replicaAddrs(pool *streamsv1alpha1.ReplicaPool) []string {
	addrs := make([]string, 0, pool.Spec.Replicas)
	for i := range pool.Spec.Replicas {
		addrs = append(addrs, PodDNSAddr(pool, pool.PodName(i)))
	}
	return addrs
}

// PodDNSAddr is the address of a replica pod through the pool's headless
// Service: <pod>.<service>.<namespace>.svc:<port>.
func PodDNSAddr(pool *streamsv1alpha1.ReplicaPool, pod string) string {
	return fmt.Sprintf("%s.%s.%s.svc:%d", pod, pool.ServiceName(), pool.Namespace, replicaPort)
}

// poolReplicaAddrs maps every replica pod of pool, and every other replica
// named in members (pods beyond the pool's current size, which may still
// hold a copy), to its address.
func poolReplicaAddrs(pool *streamsv1alpha1.ReplicaPool, addr ReplicaAddrFunc, members ...[]streamsv1alpha1.ChainMember) map[string]string {
	out := map[string]string{}
	for i := range pool.Spec.Replicas {
		out[pool.PodName(i)] = addr(pool, pool.PodName(i))
	}
	for _, ms := range members {
		for _, m := range ms {
			if _, ok := out[m.Name]; !ok {
				out[m.Name] = addr(pool, m.Name)
			}
		}
	}
	return out
}
