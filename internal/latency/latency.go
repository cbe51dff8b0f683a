// Package latency holds the data path's shared histogram buckets.
package latency

import "github.com/prometheus/client_golang/prometheus"

// Buckets are the upper bounds of every data-path latency histogram
// (ingestion's and the replicas'): 50 µs doubling to about 3.3 s, which
// fsyncs, commits and produce calls on local disks span. One definition, so
// that a produce call's parts line up bucket for bucket (docs/operator.md).
func Buckets() []float64 { return prometheus.ExponentialBuckets(50e-6, 2, 17) }
