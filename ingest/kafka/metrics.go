package kafka

import (
	"errors"
	"reflect"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/catena-streams/catena/internal/latency"
)

// metrics are the listener's Prometheus collectors (docs/operator.md).
type metrics struct {
	requests *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	conns    prometheus.Gauge
}

func newMetrics() *metrics {
	return &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "kafka", Name: "requests_total",
			Help: "Kafka requests the listener took, by API (ones it cannot parse close their connection and are not counted).",
		}, []string{"api"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "catena", Subsystem: "kafka", Name: "request_seconds",
			Help:    "Time from a Kafka request's arrival to its answer being ready (a produce: to its records' commit; a fetch: its long poll; a join: the rebalance), by API.",
			Buckets: requestBuckets,
		}, []string{"api"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "catena", Subsystem: "kafka", Name: "errors_total",
			Help: "Error codes in the listener's answers, by API and Kafka error: one per code in an answer (a produce refused for two partitions counts two).",
		}, []string{"api", "code"}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "catena", Subsystem: "kafka", Name: "connections",
			Help: "Kafka client connections open.",
		}),
	}
}

// requestBuckets are latency's, from 50 µs, and on to 52 s: a fetch's long
// poll (30 s at most) and a JoinGroup's rebalance wait that long.
var requestBuckets = append(latency.Buckets(), 6.5536, 13.1072, 26.2144, 52.4288)

// register adds the collectors to reg (nil: none).
func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	for _, c := range []prometheus.Collector{m.requests, m.seconds, m.errors, m.conns} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// took counts a request the listener parsed and serves.
func (m *metrics) took(h header) {
	m.requests.WithLabelValues(kmsg.NameForKey(h.key)).Inc()
}

// answered records a request's answer (nil: none is sent, acks=0).
func (m *metrics) answered(h header, resp kmsg.Response) {
	m.seconds.WithLabelValues(kmsg.NameForKey(h.key)).Observe(time.Since(h.start).Seconds())
	if resp != nil {
		m.countErrors(h, resp)
	}
}

// countErrors counts the error codes in resp, a response to h. Handlers
// set only the fields their version sends, so that none counts twice.
func (m *metrics) countErrors(h header, resp kmsg.Response) {
	api := kmsg.NameForKey(h.key)
	errorCodes(reflect.ValueOf(resp), func(code int16) {
		name := strconv.Itoa(int(code))
		var ke *kerr.Error
		if errors.As(kerr.ErrorForCode(code), &ke) {
			name = ke.Message
		}
		m.errors.WithLabelValues(api, name).Inc()
	})
}

// errorCodes calls fn with every non-zero ErrorCode in v, at any depth
// (a response's own, its topics', its partitions').
func errorCodes(v reflect.Value, fn func(int16)) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			errorCodes(v.Elem(), fn)
		}
	case reflect.Struct:
		t := v.Type()
		for i := range v.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			fv := v.Field(i)
			if f.Name == "ErrorCode" && fv.Kind() == reflect.Int16 {
				if c := fv.Int(); c != 0 {
					fn(int16(c))
				}
				continue
			}
			errorCodes(fv, fn)
		}
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return // record batches, metadata: bytes
		}
		for i := range v.Len() {
			errorCodes(v.Index(i), fn)
		}
	}
}
