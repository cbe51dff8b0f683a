package ingest

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/internal/latency"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// metrics are one ingestion process's Prometheus collectors. Together with
// the replicas' commit and fsync histograms they split a producer's latency
// into its parts: waiting in ingestion for the partition's append in flight
// to be answered, the head's round trip (every member's write and fsync),
// and the rest of the produce call.
type metrics struct {
	produceSeconds *prometheus.HistogramVec
	waitSeconds    *prometheus.HistogramVec
	appendSeconds  *prometheus.HistogramVec
	appends        *prometheus.CounterVec
	answeredBy     *prometheus.CounterVec
	records        *prometheus.CounterVec
	produceErrors  *prometheus.CounterVec
	// discoveryRounds counts route refreshes by what started them:
	// "interval" (the periodic round) or "request" (anything that found
	// the routes stale: an append unanswered for a while, a failed append
	// session, a read, a call naming a stream the table lacks).
	discoveryRounds *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	labels := []string{"stream", "partition"}
	buckets := latency.Buckets()
	m := &metrics{
		produceSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "catena", Subsystem: "ingest", Name: "produce_seconds",
			Help:    "Time from a produce request's arrival to its answer, for requests whose every record was committed.",
			Buckets: buckets,
		}, []string{"stream"}),
		waitSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "catena", Subsystem: "ingest", Name: "append_wait_seconds",
			Help:    "Time records waited in ingestion before the append carrying them was sent to the partition's head.",
			Buckets: buckets,
		}, labels),
		appendSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "catena", Subsystem: "ingest", Name: "append_seconds",
			Help:    "Time from sending an append to the partition's head to its completion (committed on every member): the tail's, or the head's answer when that came first.",
			Buckets: buckets,
		}, labels),
		appends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "ingest", Name: "appends_total",
			Help: "Appends completed (committed on every member).",
		}, labels),
		answeredBy: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "ingest", Name: "appends_completed_by_total",
			Help: "Appends completed, by what told ingestion first: tail (its completion) or head (its answer, which climbs back up the chain; a chain of one, or no completion stream).",
		}, []string{"stream", "partition", "by"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "ingest", Name: "append_records_total",
			Help: "Records in completed appends (over appends_total: records per append).",
		}, labels),
		produceErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "ingest", Name: "produce_errors_total",
			Help: "Records produced and answered with an error, by gRPC code, from gRPC producers and Kafka clients alike, once a Kafka request reaches ingestion (a whole request refused counts each of its records; stream is empty for a stream ingestion does not know).",
		}, []string{"stream", "code"}),
		discoveryRounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "ingest", Name: "discovery_rounds_total",
			Help: "Rounds of Status calls to every replica that refresh the route table, by what started them: interval (the periodic round) or request (an append unanswered for a while, a failed append session, a read, a call naming a stream the table lacks).",
		}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.produceSeconds, m.waitSeconds, m.appendSeconds, m.appends, m.answeredBy, m.records, m.produceErrors, m.discoveryRounds)
	}
	return m
}

// appenderMetrics are one partition's children, resolved once so that the
// append path does no label lookups.
type appenderMetrics struct {
	waitSeconds, appendSeconds prometheus.Observer
	appends, records           prometheus.Counter
	byTail, byHead             prometheus.Counter
}

func (m *metrics) forPartition(stream string, partition uint32) appenderMetrics {
	lv := []string{stream, strconv.FormatUint(uint64(partition), 10)}
	return appenderMetrics{
		waitSeconds:   m.waitSeconds.WithLabelValues(lv...),
		appendSeconds: m.appendSeconds.WithLabelValues(lv...),
		appends:       m.appends.WithLabelValues(lv...),
		records:       m.records.WithLabelValues(lv...),
		byTail:        m.answeredBy.WithLabelValues(stream, lv[1], "tail"),
		byHead:        m.answeredBy.WithLabelValues(stream, lv[1], "head"),
	}
}

// countProduceErrors counts the records of a produce answered with an
// error: every record of a refused request (err), or those whose result
// carries an error code. stream is the request's, "" when ingestion does
// not know it (a name a client made up must not make a series).
func (m *metrics) countProduceErrors(stream string, records int, resp *catenapb.ProduceResponse, err error) {
	if err != nil {
		m.produceErrors.WithLabelValues(stream, status.Code(err).String()).Add(float64(max(records, 1)))
		return
	}
	for _, r := range resp.GetResults() {
		if r.GetErrorCode() != 0 {
			m.produceErrors.WithLabelValues(stream, codes.Code(r.GetErrorCode()).String()).Inc()
		}
	}
}
