package controllers

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// Gauges of the partitions' health, per Stream, read from the operator's
// cache at each scrape: what a platform team alerts on.
var (
	partitionsDesc = prometheus.NewDesc("catena_operator_partitions",
		"Partitions of each Stream (chains the operator masters).", []string{"namespace", "stream"}, nil)
	underReplicatedDesc = prometheus.NewDesc("catena_operator_partitions_under_replicated",
		"Partitions with fewer full copies in chain (members InChain) than the Stream's replication factor: a failure, a member catching up, or no spare to replace a lost one.",
		[]string{"namespace", "stream"}, nil)
	refusingWritesDesc = prometheus.NewDesc("catena_operator_partitions_refusing_writes",
		"Partitions with fewer full copies in chain than the Stream's minimum chain length: their head refuses appends until the chain regrows.",
		[]string{"namespace", "stream"}, nil)
	reconfiguringDesc = prometheus.NewDesc("catena_operator_partitions_reconfiguring",
		"Partitions whose latest membership some member has not yet confirmed: a repair in progress.",
		[]string{"namespace", "stream"}, nil)
)

// partitionCounts are one Stream's partitions by health.
type partitionCounts struct {
	total, underReplicated, refusingWrites, reconfiguring int
}

// countPartitions counts each Stream's chains by health; minLength is the
// fewest full copies that take writes for a Stream (false: the Stream is
// not known, and its chains are not counted).
func countPartitions(chains []streamsv1alpha1.ReplicationChain, minLength func(types.NamespacedName) (int, bool)) map[types.NamespacedName]partitionCounts {
	out := map[types.NamespacedName]partitionCounts{}
	for i := range chains {
		c := &chains[i]
		stream := types.NamespacedName{Namespace: c.Namespace, Name: c.Spec.Stream}
		minLen, ok := minLength(stream)
		if !ok {
			continue
		}
		n := out[stream]
		n.total++
		full, unconfirmed := 0, false
		for _, m := range c.Status.Members {
			if m.State == streamsv1alpha1.MemberInChain {
				full++
			}
			if m.ConfirmedEpoch < c.Status.TargetEpoch {
				unconfirmed = true
			}
		}
		if full < int(c.Spec.ReplicationFactor) {
			n.underReplicated++
		}
		if full < minLen {
			n.refusingWrites++
		}
		if unconfirmed {
			n.reconfiguring++
		}
		out[stream] = n
	}
	return out
}

// partitionCollector serves the gauges from a reader (the manager's cache).
type partitionCollector struct {
	reader client.Reader
}

func (p *partitionCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{partitionsDesc, underReplicatedDesc, refusingWritesDesc, reconfiguringDesc} {
		ch <- d
	}
}

func (p *partitionCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var streams streamsv1alpha1.StreamList
	var chains streamsv1alpha1.ReplicationChainList
	if p.reader.List(ctx, &streams) != nil || p.reader.List(ctx, &chains) != nil {
		return // not synced yet, or stopping: no sample rather than a wrong one
	}
	minLen := map[types.NamespacedName]int{}
	for i := range streams.Items {
		s := &streams.Items[i]
		minLen[client.ObjectKeyFromObject(s)] = minChainLength(s)
	}
	counts := countPartitions(chains.Items, func(k types.NamespacedName) (int, bool) { n, ok := minLen[k]; return n, ok })
	for k, n := range counts {
		for d, v := range map[*prometheus.Desc]int{partitionsDesc: n.total, underReplicatedDesc: n.underReplicated, refusingWritesDesc: n.refusingWrites, reconfiguringDesc: n.reconfiguring} {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), k.Namespace, k.Name)
		}
	}
}

// registerPartitionCollector registers the gauges once per process: a second
// manager in the same process (the test suites run several) keeps the
// first's.
func registerPartitionCollector(reg prometheus.Registerer, reader client.Reader) error {
	err := reg.Register(&partitionCollector{reader: reader})
	if are := (prometheus.AlreadyRegisteredError{}); errors.As(err, &are) {
		return nil
	}
	return err
}
