package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/catena-streams/catena/internal/latency"
)

// metrics are one replica process's Prometheus collectors.
type metrics struct {
	syncSeconds   *prometheus.HistogramVec
	commitSeconds *prometheus.HistogramVec
	bytesIn       *prometheus.CounterVec
	recordsIn     *prometheus.CounterVec
	bytesOut      *prometheus.CounterVec
	recordsOut    *prometheus.CounterVec
	committed     *prometheus.GaugeVec
	epoch         *prometheus.GaugeVec
	logEnd        *prometheus.GaugeVec
	// serveWaitSeconds and serveRefused: history reads of copies from
	// this replica, paced and refused by its serve cap.
	serveWaitSeconds prometheus.Counter
	serveRefused     prometheus.Counter
	// readBackBytes and scrubs: the verification of sealed segments
	// opened from summaries, and scrubs (partition.verifySealed).
	readBackBytes prometheus.Counter
	scrubs        prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	labels := []string{"stream", "partition"}
	buckets := latency.Buckets()
	m := &metrics{
		syncSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "catena", Subsystem: "replica", Name: "append_sync_seconds",
			Help:    "Time to make appended batches durable (one group-commit fsync).",
			Buckets: buckets,
		}, labels),
		commitSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "catena", Subsystem: "replica", Name: "commit_seconds",
			Help:    "Time from an append reaching the head to its commit on every chain member.",
			Buckets: buckets,
		}, labels),
		bytesIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "replica", Name: "bytes_in_total",
			Help: "Batch frame bytes appended to the partition log.",
		}, labels),
		recordsIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "replica", Name: "records_in_total",
			Help: "Records appended to the partition log.",
		}, labels),
		bytesOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "replica", Name: "bytes_out_total",
			Help: "Bytes sent to consumers and to the successor.",
		}, labels),
		recordsOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "replica", Name: "records_out_total",
			Help: "Records served to consumers.",
		}, labels),
		committed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "catena", Subsystem: "replica", Name: "committed_offset",
			Help: "Committed offset (exclusive) known by this member.",
		}, labels),
		epoch: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "catena", Subsystem: "replica", Name: "chain_epoch",
			Help: "Chain epoch installed on this member.",
		}, labels),
		logEnd: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "catena", Subsystem: "replica", Name: "log_end_offset",
			Help: "Next offset of the local log.",
		}, labels),
		serveWaitSeconds: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "replica", Name: "copy_serve_wait_seconds_total",
			Help: "Time history reads of replicas copying from this one waited for its catch-up rate.",
		}),
		serveRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "replica", Name: "copy_serve_refused_total",
			Help: "History reads refused as busy: the reads queued ahead would have held them past their deadline.",
		}),
		readBackBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "replica", Name: "read_back_bytes_total",
			Help: "Bytes of sealed segments read back from the disk and checked: those opened from summaries, and scrubs.",
		}),
		scrubs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "replica", Name: "scrubs_total",
			Help: "Scrubs of a partition's sealed segments that completed (each read them all back as written).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.syncSeconds, m.commitSeconds, m.bytesIn, m.recordsIn, m.bytesOut, m.recordsOut, m.committed, m.epoch, m.logEnd,
			m.serveWaitSeconds, m.serveRefused, m.readBackBytes, m.scrubs)
	}
	return m
}

// partitionMetrics are the children of one partition, resolved once so the
// append path does no label lookups.
type partitionMetrics struct {
	syncSeconds, commitSeconds prometheus.Observer
	bytesIn, recordsIn         prometheus.Counter
	bytesOut, recordsOut       prometheus.Counter
	committed, epoch, logEnd   prometheus.Gauge
}

func (m *metrics) forPartition(stream string, index uint32) *partitionMetrics {
	l := prometheus.Labels{"stream": stream, "partition": strconv.FormatUint(uint64(index), 10)}
	return &partitionMetrics{
		syncSeconds:   m.syncSeconds.With(l),
		commitSeconds: m.commitSeconds.With(l),
		bytesIn:       m.bytesIn.With(l),
		recordsIn:     m.recordsIn.With(l),
		bytesOut:      m.bytesOut.With(l),
		recordsOut:    m.recordsOut.With(l),
		committed:     m.committed.With(l),
		epoch:         m.epoch.With(l),
		logEnd:        m.logEnd.With(l),
	}
}

// forget removes a dropped partition's series: a deleted stream must not
// linger in the replica's metrics.
func (m *metrics) forget(stream string, index uint32) {
	l := prometheus.Labels{"stream": stream, "partition": strconv.FormatUint(uint64(index), 10)}
	for _, v := range []interface{ Delete(prometheus.Labels) bool }{
		m.syncSeconds, m.commitSeconds, m.bytesIn, m.recordsIn, m.bytesOut, m.recordsOut, m.committed, m.epoch, m.logEnd,
	} {
		v.Delete(l)
	}
}

// Descriptions of what a replica reports of its logs when scraped.
var (
	logBytesDesc = prometheus.NewDesc("catena_replica_log_bytes",
		"Bytes of the partition's log on this replica's volume (headers and frames of every retained segment).",
		[]string{"stream", "partition"}, nil)
	logSegmentsDesc = prometheus.NewDesc("catena_replica_log_segments",
		"Segment files of the partition's log on this replica.", []string{"stream", "partition"}, nil)
	logStartDesc = prometheus.NewDesc("catena_replica_log_start_offset",
		"First offset this replica retains (the oldest segment's base).", []string{"stream", "partition"}, nil)
	holdLagDesc = prometheus.NewDesc("catena_replica_consumer_hold_lag",
		"Committed records past a consumer's retention hold: how far the consumer is behind, and what retention keeps for it.",
		[]string{"stream", "partition", "consumer"}, nil)
)

// partitionCollector reports each hosted partition's log usage and its
// consumers' hold lag when scraped: read from the logs then, not kept up
// to date on every append.
type partitionCollector struct{ s *Server }

func (c partitionCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{logBytesDesc, logSegmentsDesc, logStartDesc, holdLagDesc} {
		ch <- d
	}
}

func (c partitionCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.s.openPartitions() {
		p.mu.Lock()
		log := p.log
		holds := p.holds.pbHolds()
		committed := p.committed
		if p.core != nil {
			committed = max(committed, p.core.Status().Committed)
		}
		p.mu.Unlock()
		if log == nil {
			continue
		}
		part := strconv.FormatUint(uint64(p.index), 10)
		bytes, segments := log.Usage()
		ch <- prometheus.MustNewConstMetric(logBytesDesc, prometheus.GaugeValue, float64(bytes), p.stream, part)
		ch <- prometheus.MustNewConstMetric(logSegmentsDesc, prometheus.GaugeValue, float64(segments), p.stream, part)
		ch <- prometheus.MustNewConstMetric(logStartDesc, prometheus.GaugeValue, float64(log.StartOffset()), p.stream, part)
		for _, h := range holds {
			lag := committed - min(h.GetOffset(), committed)
			ch <- prometheus.MustNewConstMetric(holdLagDesc, prometheus.GaugeValue, float64(lag), p.stream, part, h.GetConsumer())
		}
	}
}

var (
	journalGroupsDesc = prometheus.NewDesc("catena_replica_journal_groups_total",
		"Group commits of the replica's journal (--journal): one write and one fdatasync each, for whatever its partitions appended meanwhile.", nil, nil)
	journalBytesDesc = prometheus.NewDesc("catena_replica_journal_bytes_total",
		"Bytes the replica's journal wrote in its groups.", nil, nil)
	journalRollsDesc = prometheus.NewDesc("catena_replica_journal_rolls_total",
		"Journal segments rolled to, by whether the segment was recycled (one a checkpoint freed) or written with zeros first.", []string{"segment"}, nil)
	journalCheckpointsDesc = prometheus.NewDesc("catena_replica_journal_checkpoints_total",
		"Journal checkpoints: the partitions' files fsynced, and the journal before the checkpoint freed.", nil, nil)
	journalBusyDesc = prometheus.NewDesc("catena_replica_journal_busy_seconds_total",
		"Time the replica's journal spent writing and fdatasyncing its groups: its rate is how saturated the group commit is (1: always busy), and over the groups' rate what one group costs.", nil, nil)
	journalEndDesc = prometheus.NewDesc("catena_replica_journal_end_bytes",
		"Journal position after the last durable group: grows by the bytes every group commit writes.", nil, nil)
)

// journalCollector reports the replica's journal when it keeps one.
type journalCollector struct{ s *Server }

func (c journalCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{journalGroupsDesc, journalBytesDesc, journalBusyDesc, journalRollsDesc, journalCheckpointsDesc, journalEndDesc} {
		ch <- d
	}
}

func (c journalCollector) Collect(ch chan<- prometheus.Metric) {
	store := c.s.store
	if store == nil {
		return
	}
	js, ss := store.Journal().Stats(), store.Stats()
	ch <- prometheus.MustNewConstMetric(journalGroupsDesc, prometheus.CounterValue, float64(js.Groups))
	ch <- prometheus.MustNewConstMetric(journalBytesDesc, prometheus.CounterValue, float64(js.Bytes))
	ch <- prometheus.MustNewConstMetric(journalBusyDesc, prometheus.CounterValue, js.Busy.Seconds())
	ch <- prometheus.MustNewConstMetric(journalRollsDesc, prometheus.CounterValue, float64(js.Recycled), "recycled")
	ch <- prometheus.MustNewConstMetric(journalRollsDesc, prometheus.CounterValue, float64(js.Rolls-js.Recycled), "zeroed")
	ch <- prometheus.MustNewConstMetric(journalCheckpointsDesc, prometheus.CounterValue, float64(ss.Checkpoints))
	ch <- prometheus.MustNewConstMetric(journalEndDesc, prometheus.GaugeValue, float64(store.Journal().End()))
}
