package kafka

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/catena-streams/catena/ingest"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// gathered is a registry's samples by metric name and label set
// ("name{k=v,...}" with labels in name order).
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			key := f.GetName() + "{"
			for i, l := range m.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += l.GetName() + "=" + l.GetValue()
			}
			key += "}"
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// TestTheListenerCountsRequestsAndTheirErrors: an operator watching the
// Kafka listener sees its requests by API, their time, the error codes
// it answered them with (partitions' too), and its open connections.
// Records a Kafka client produces also go through ingestion's queues like
// a gRPC producer's: those ingestion refuses count in
// catena_ingest_produce_errors_total as theirs do (they did not: only the
// gRPC Produce call counted), and answered requests in
// catena_ingest_produce_seconds.
func TestTheListenerCountsRequestsAndTheirErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := startClusterWith(t, 1, clusterOptions{ingest: func(o *ingest.Options) { o.Registerer = reg }}, func(o *Options) { o.Registerer = reg })
	c.configure("small", &catenapb.StreamConfig{Partitions: 1, Durability: catenapb.Durability_DURABILITY_FSYNC, MaxRecordBytes: 100})
	waitFor(t, 30*time.Second, "ingestion to discover stream small", func() bool {
		_, err := c.ing.Stream(context.Background(), "small")
		return err == nil
	})
	cl := c.client(kgo.RecordRetries(0))
	ctx := ctxT(t, 30*time.Second)
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "s", Value: []byte("fits")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "small", Value: make([]byte, 1000)}).FirstErr(); err == nil {
		t.Fatal("a record above the stream's limit was stored")
	}
	m := gathered(t, reg)
	if got := m["catena_ingest_produce_errors_total{code=InvalidArgument,stream=small}"]; got != 1 {
		t.Errorf("catena_ingest_produce_errors_total{stream=small,code=InvalidArgument} = %v after one refused record, want 1", got)
	}
	if got := m["catena_ingest_produce_seconds{stream=s}"]; got < 1 {
		t.Errorf("catena_ingest_produce_seconds{stream=s} counted %v requests, want the answered produce", got)
	}
	for _, want := range []string{
		"catena_kafka_requests_total{api=Produce}",
		"catena_kafka_requests_total{api=Metadata}",
		"catena_kafka_request_seconds{api=Produce}",
	} {
		if m[want] < 1 {
			t.Errorf("%s = %v, want at least 1", want, m[want])
		}
	}
	if got := m["catena_kafka_errors_total{api=Produce,code=INVALID_RECORD}"]; got != 1 {
		t.Errorf("catena_kafka_errors_total{api=Produce,code=INVALID_RECORD} = %v, want 1 (the refused partition)", got)
	}
	if got := m["catena_kafka_requests_total{api=Produce}"]; got != 2 {
		t.Errorf("catena_kafka_requests_total{api=Produce} = %v, want 2", got)
	}
	if got := m["catena_kafka_connections{}"]; got < 1 {
		t.Errorf("catena_kafka_connections = %v with a client connected", got)
	}

	// A refusal no answer carries (acks=0) counts as well.
	noAck := c.client(kgo.RequiredAcks(kgo.NoAck()), kgo.DisableIdempotentWrite())
	if err := noAck.ProduceSync(ctx, &kgo.Record{Topic: "small", Value: make([]byte, 1000)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the acks=0 refusal to be counted", func() bool {
		return gathered(t, reg)["catena_kafka_errors_total{api=Produce,code=INVALID_RECORD}"] == 2
	})
	// An answer of a version whose error is top-level only (FindCoordinator
	// v3) counts it once.
	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.Version, fc.CoordinatorKey = 3, ""
	if _, err := fc.RequestWith(ctx, cl); err != nil {
		t.Fatal(err)
	}
	if got := gathered(t, reg)["catena_kafka_errors_total{api=FindCoordinator,code=INVALID_GROUP_ID}"]; got != 1 {
		t.Errorf("a FindCoordinator v3 refusal counted %v times, want 1", got)
	}
	cl.Close()
	noAck.Close()
	waitFor(t, 10*time.Second, "the closed clients' connections to be counted out", func() bool {
		return gathered(t, reg)["catena_kafka_connections{}"] == 0
	})
}
