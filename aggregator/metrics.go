package aggregator

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are one worker's Prometheus collectors, by shard.
type metrics struct {
	folded       *prometheus.CounterVec
	skipped      *prometheus.CounterVec
	lag          *prometheus.GaugeVec
	keys         *prometheus.GaugeVec
	checkpoints  *prometheus.CounterVec
	ckptBytes    *prometheus.CounterVec
	ckptSeconds  *prometheus.HistogramVec
	ckptFailures *prometheus.CounterVec
	restores     *prometheus.CounterVec
	loadSeconds  *prometheus.HistogramVec
	replayed     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	shard := []string{"shard"}
	// 1ms .. ~65s: a checkpoint of a few keys to a restore of millions.
	buckets := prometheus.ExponentialBuckets(1e-3, 2, 17)
	m := &metrics{
		folded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "aggregator", Name: "records_folded_total",
			Help: "Source records read and folded into the shard's state (skipped ones included).",
		}, shard),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "aggregator", Name: "records_skipped_total",
			Help: "Source records not aggregated: no key, or not a JSON object where fields are read.",
		}, shard),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "catena", Subsystem: "aggregator", Name: "lag_records",
			Help: "Committed source records not yet folded.",
		}, shard),
		keys: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "catena", Subsystem: "aggregator", Name: "groups",
			Help: "Groups (keys, or key and window) held by the shard.",
		}, shard),
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "aggregator", Name: "checkpoints_total",
			Help: "Checkpoints written, by kind (snapshot or increment).",
		}, []string{"shard", "kind"}),
		ckptBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "aggregator", Name: "checkpoint_bytes_total",
			Help: "Bytes of checkpoint records written.",
		}, shard),
		ckptSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "catena", Subsystem: "aggregator", Name: "checkpoint_seconds",
			Help:    "Time to write a checkpoint (capture, chunks, manifest).",
			Buckets: buckets,
		}, shard),
		ckptFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "aggregator", Name: "checkpoint_failures_total",
			Help: "Checkpoints that failed; the next one is a full snapshot.",
		}, shard),
		restores: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "aggregator", Name: "restores_total",
			Help: "Shard restorations, by whether a checkpoint was found (from=checkpoint) or not (from=empty).",
		}, []string{"shard", "from"}),
		loadSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "catena", Subsystem: "aggregator", Name: "restore_load_seconds",
			Help:    "Time from a shard's start to its state loaded from checkpoints.",
			Buckets: buckets,
		}, shard),
		replayed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "aggregator", Name: "records_replayed_total",
			Help: "Source records re-read after a restore up to where the source was committed when it began.",
		}, shard),
	}
	if reg != nil {
		reg.MustRegister(m.folded, m.skipped, m.lag, m.keys, m.checkpoints, m.ckptBytes, m.ckptSeconds,
			m.ckptFailures, m.restores, m.loadSeconds, m.replayed)
	}
	return m
}

// forShard returns the collectors of one shard.
func (m *metrics) forShard(id uint32) *shardMetrics {
	s := strconv.FormatUint(uint64(id), 10)
	return &shardMetrics{
		folded: m.folded.WithLabelValues(s), skipped: m.skipped.WithLabelValues(s),
		lag: m.lag.WithLabelValues(s), keys: m.keys.WithLabelValues(s),
		snapshots: m.checkpoints.WithLabelValues(s, "snapshot"), increments: m.checkpoints.WithLabelValues(s, "increment"),
		ckptBytes: m.ckptBytes.WithLabelValues(s), ckptSeconds: m.ckptSeconds.WithLabelValues(s),
		ckptFailures:           m.ckptFailures.WithLabelValues(s),
		restoredFromCheckpoint: m.restores.WithLabelValues(s, "checkpoint"), restoredEmpty: m.restores.WithLabelValues(s, "empty"),
		loadSeconds: m.loadSeconds.WithLabelValues(s), replayed: m.replayed.WithLabelValues(s),
	}
}

type shardMetrics struct {
	folded, skipped                       prometheus.Counter
	lag, keys                             prometheus.Gauge
	snapshots, increments, ckptBytes      prometheus.Counter
	ckptSeconds                           prometheus.Observer
	ckptFailures                          prometheus.Counter
	restoredFromCheckpoint, restoredEmpty prometheus.Counter
	loadSeconds                           prometheus.Observer
	replayed                              prometheus.Counter
}
