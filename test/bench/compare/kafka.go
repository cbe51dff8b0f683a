package main

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ---------------------------------------------------------------- Kafka protocol

// kafkaName is the row of an unchanged Kafka client, franz-go, producing to
// the same catena dev through its Kafka listener (docs/kafka.md).
const kafkaName = "Catena (Kafka protocol, franz-go)"

// kafkaRatioName labels its ratio to Catena's own client.
const kafkaRatioName = "Kafka/native"

// kafkaSystem produces with franz-go's kgo to catena dev's Kafka listener:
// acks=all and idempotent (kgo's defaults; the listener answers acks=1
// and acks=all alike, once every member of the chain has the records).
// Each producer of a workload is its own kgo.Client, as each Kafka
// producer is its own client (its own connection and producer id), made
// and closed within the run, as the peer's producers each have their own
// connection.
//
// Two of kgo's defaults are set to the native client's so that the row
// measures the protocol path rather than a different batching policy:
// linger 1 ms (kgo's is 10 ms; the native client's 1 ms) and no compression
// (kgo's is snappy; the native client does not compress, and the driver's
// zero-filled records would shrink to almost nothing). Everything else is
// kgo's default: its partitioner (keyless records stick to a partition for
// 64 KiB, adaptively), batches up to 1 MB per partition, and five produce
// requests in flight to the one broker (the listener) once it answered
// Produce v4 or later.
type kafkaSystem struct {
	addr string // the listener's address (dev.json's "kafka")
}

func (s *kafkaSystem) Name() string { return kafkaName }

func (s *kafkaSystem) Run(ctx context.Context, w workload) (result, error) {
	var clients []*kgo.Client
	defer func() {
		for _, cl := range clients {
			cl.Close()
		}
	}()
	linger := time.Millisecond
	if w.Sync {
		linger = 0 // as the native row's Linger -1: each record goes at once
	}
	return drive(w, func(i int) func(payload []byte) (func() error, error) {
		cl, err := kgo.NewClient(
			kgo.SeedBrokers(s.addr),
			kgo.DefaultProduceTopic("bench"),
			kgo.RequiredAcks(kgo.AllISRAcks()),
			kgo.ProducerLinger(linger),
			kgo.ProducerBatchCompression(kgo.NoCompression()),
			// The driver bounds what awaits an ack; kgo's own bound is
			// set well above it so that it never stalls a Produce on its
			// own (a promise runs before kgo counts its record done).
			kgo.MaxBufferedRecords(2*w.inFlight()+16),
		)
		if err != nil {
			return func([]byte) (func() error, error) { return nil, err }
		}
		clients = append(clients, cl)
		return func(payload []byte) (func() error, error) {
			done := make(chan error, 1)
			cl.Produce(ctx, &kgo.Record{Value: payload}, func(_ *kgo.Record, err error) { done <- err })
			return func() error { return <-done }, nil
		}
	})
}
