package kafka

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/grpc/codes"

	"github.com/catena-streams/catena/ingest"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// defaultProduceTimeout bounds a Produce whose request names no timeout,
// and maxProduceTimeout any Produce.
const (
	defaultProduceTimeout = 30 * time.Second
	maxProduceTimeout     = 5 * time.Minute
)

// Record batch attributes (Kafka's RecordBatch v2).
const (
	attrCodecMask     = 0x07
	attrLogAppendTime = 0x08
	attrTransactional = 0x10
	attrControl       = 0x20
)

var crc32c = crc32.MakeTable(crc32.Castagnoli)

// batchError is a partition's records that cannot be stored as sent.
type batchError struct {
	code *kerr.Error
	msg  string
}

func (e *batchError) Error() string { return e.msg }

func invalid(format string, args ...any) *batchError {
	return &batchError{kerr.InvalidRecord, fmt.Sprintf(format, args...)}
}

// maxPartitionRecords bounds the records of one partition in one request,
// checked before any batch is decompressed (a small compressed batch can
// claim millions of tiny records).
const maxPartitionRecords = 1 << 16

// catenaProducer is the Catena producer id of a Kafka producer id and
// epoch. The epoch is part of it because the Java client and sarama bump
// the epoch themselves after a failed batch, keeping the id and starting
// every partition's sequences at 0 again: under the id alone those new
// records would look like the old ones to the head's de-duplication window
// and be answered as duplicates without being stored. InitProducerId hands
// out ids below 2^47, so id and epoch fit in 64 bits, never 0.
func catenaProducer(id int64, epoch int16) uint64 {
	return uint64(id)<<16 | uint64(uint16(epoch))
}

// partitionRecords decodes a partition's record batches (magic 2, any
// codec) into the records of one Catena produce request. Idempotent
// batches (a producer id and first sequence) carry their producer and
// sequences over: Catena's head keeps a window of each producer's
// sequences per partition, so a retried batch is answered with the
// offsets it was stored at. A Kafka sequence s becomes Catena sequence
// s+1 (0 is "none" to Catena).
func partitionRecords(stream string, partition uint32, batches []byte) (*catenapb.ProduceRequest, error) {
	req := &catenapb.ProduceRequest{Stream: stream}
	producerSet := false
	records := 0
	for len(batches) > 0 {
		if len(batches) < 61 {
			return nil, invalid("record batch is truncated (%d bytes left)", len(batches))
		}
		length := int(int32(binary.BigEndian.Uint32(batches[8:])))
		if length < 49 || 12+length > len(batches) {
			return nil, invalid("record batch claims %d bytes, %d are left", length, len(batches)-12)
		}
		raw := batches[:12+length]
		batches = batches[12+length:]
		var b kmsg.RecordBatch
		if err := b.ReadFrom(raw); err != nil {
			return nil, invalid("record batch: %v", err)
		}
		if b.Magic != 2 {
			return nil, &batchError{kerr.UnsupportedForMessageFormat, fmt.Sprintf("record batch magic %d: only record batches v2 (magic 2, Kafka 0.11 and later) are accepted", b.Magic)}
		}
		if got := crc32.Checksum(raw[21:], crc32c); got != uint32(b.CRC) {
			return nil, &batchError{kerr.CorruptMessage, fmt.Sprintf("record batch CRC is %08x, its content sums to %08x", uint32(b.CRC), got)}
		}
		if b.Attributes&attrTransactional != 0 || b.Attributes&attrControl != 0 {
			return nil, invalid("transactional and control batches are not supported: Catena has no Kafka transactions")
		}
		idempotent := b.ProducerID >= 0 && b.FirstSequence >= 0
		producer := uint64(0)
		if idempotent {
			if b.ProducerID >= 1<<47 || b.ProducerEpoch < 0 {
				return nil, &batchError{kerr.UnknownProducerID, fmt.Sprintf("producer id %d epoch %d was not given out by this cluster (InitProducerId)", b.ProducerID, b.ProducerEpoch)}
			}
			producer = catenaProducer(b.ProducerID, b.ProducerEpoch)
		}
		records += int(b.NumRecords)
		if b.NumRecords < 0 || records > maxPartitionRecords {
			return nil, &batchError{kerr.MessageTooLarge, fmt.Sprintf("more than %d records for one partition in one request", maxPartitionRecords)}
		}
		if producerSet && producer != req.ProducerId {
			return nil, invalid("batches of one partition in one request come from different producers")
		}
		req.ProducerId, producerSet = producer, true
		recs, err := decompress(int(b.Attributes&attrCodecMask), b.Records, maxDecompressedBytes)
		if err != nil {
			return nil, invalid("record batch: %v", err)
		}
		for i := range int(b.NumRecords) {
			var r kmsg.Record
			if recs, err = nextRecord(recs, &r); err != nil {
				return nil, invalid("record %d of a batch: %v", i, err)
			}
			ts := b.FirstTimestamp + r.TimestampDelta64
			if b.Attributes&attrLogAppendTime != 0 || ts <= 0 {
				ts = 0 // ingestion stamps it
			}
			p := partition
			pr := &catenapb.ProduceRecord{Key: r.Key, Value: r.Value, TimestampMs: ts, Partition: &p}
			for _, h := range r.Headers {
				// A null header value is stored as an empty one.
				pr.Headers = append(pr.Headers, &catenapb.RecordHeader{Key: h.Key, Value: h.Value})
			}
			if idempotent {
				pr.Sequence = uint64(b.FirstSequence) + uint64(i) + 1
			}
			req.Records = append(req.Records, pr)
		}
		if len(recs) != 0 {
			return nil, invalid("record batch holds %d bytes past its %d records", len(recs), b.NumRecords)
		}
	}
	if len(req.Records) == 0 {
		return nil, invalid("no records")
	}
	if !ingest.OneAppend(req.Records) {
		// Split into several appends, its records could be stored in
		// part and at offsets that are not consecutive; a Kafka client
		// reads base offset + i.
		return nil, &batchError{kerr.MessageTooLarge, fmt.Sprintf("a partition's records in one request must fit one append (%d records, at most 4 MiB); send smaller batches", len(req.Records))}
	}
	return req, nil
}

// nextRecord decodes the record at the start of b into r and returns the
// rest.
func nextRecord(b []byte, r *kmsg.Record) ([]byte, error) {
	n, k := binary.Varint(b)
	if k <= 0 || n < 0 || int64(len(b)-k) < n {
		return nil, errors.New("record length is truncated")
	}
	end := k + int(n)
	if err := r.ReadFrom(b[:end]); err != nil {
		return nil, err
	}
	return b[end:], nil
}

// produce queues every partition's records now, in the connection's order,
// and answers once each is committed (acks=1 and acks=all alike: Catena
// acknowledges only what every member of the chain stored), or not at all
// for acks=0.
func (cn *conn) produce(h header, r *kmsg.ProduceRequest) {
	timeout := time.Duration(r.TimeoutMillis) * time.Millisecond
	if timeout <= 0 || timeout > maxProduceTimeout {
		timeout = min(max(timeout, defaultProduceTimeout), maxProduceTimeout)
	}
	ctx, cancel := context.WithTimeout(cn.ctx, timeout)
	resp := r.ResponseKind().(*kmsg.ProduceResponse)
	type waiting struct {
		out     *kmsg.ProduceResponseTopicPartition
		pending *ingest.Pending
	}
	var waits []waiting
	for _, t := range r.Topics {
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = t.Topic
		rt.Partitions = make([]kmsg.ProduceResponseTopicPartition, len(t.Partitions))
		for i, p := range t.Partitions {
			out := &rt.Partitions[i]
			*out = kmsg.NewProduceResponseTopicPartition()
			out.Partition, out.BaseOffset, out.LogAppendTime, out.LogStartOffset = p.Partition, -1, -1, -1
			fail := func(code *kerr.Error, msg string) {
				out.ErrorCode, out.ErrorMessage = code.Code, errString(msg)
			}
			if r.TransactionID != nil {
				fail(kerr.TransactionalIDAuthorizationFailed, "Kafka transactions are not supported by Catena")
				continue
			}
			if t.Topic == cn.srv.offsetsStream {
				// Written by the group coordinator only, as Kafka's
				// __consumer_offsets is.
				fail(kerr.InvalidTopicException, fmt.Sprintf("stream %q is the consumer groups' internal offsets stream", t.Topic))
				continue
			}
			if info, err := cn.srv.ing.Stream(ctx, t.Topic); err != nil {
				fail(kafkaError(err, opProduce))
				continue
			} else if p.Partition < 0 || int(p.Partition) >= info.Partitions {
				fail(kerr.UnknownTopicOrPartition, fmt.Sprintf("stream %q has %d partitions; partition %d does not exist", t.Topic, info.Partitions, p.Partition))
				continue
			}
			// Asked before anything is decompressed: a refused caller
			// costs no more than its request's bytes.
			if err := cn.authorize(ctx, catenapb.Ingest_Produce_FullMethodName, &catenapb.ProduceRequest{Stream: t.Topic}); err != nil {
				fail(kafkaError(err, opProduce))
				continue
			}
			req, err := partitionRecords(t.Topic, uint32(p.Partition), p.Records)
			if err != nil {
				var be *batchError
				if errors.As(err, &be) {
					fail(be.code, be.msg)
				} else {
					fail(kerr.InvalidRecord, err.Error())
				}
				continue
			}
			pending, err := cn.srv.ing.EnqueueInOrder(ctx, req)
			if err != nil {
				fail(kafkaError(err, opProduce))
				continue
			}
			waits = append(waits, waiting{out, pending})
		}
		resp.Topics = append(resp.Topics, rt)
	}
	cn.later(h, func(context.Context) kmsg.Response {
		defer cancel()
		for _, w := range waits {
			res, err := w.pending.Wait(ctx)
			if err != nil {
				code, msg := kafkaError(err, opProduce)
				w.out.ErrorCode, w.out.ErrorMessage = code.Code, errString(msg)
				continue
			}
			results := res.GetResults()
			if len(results) == 0 {
				continue
			}
			w.out.BaseOffset = int64(results[0].GetOffset())
			for _, rr := range results {
				if rr.GetErrorCode() != 0 {
					code, msg := kafkaCode(codes.Code(rr.GetErrorCode()), opProduce), rr.GetErrorMessage()
					w.out.ErrorCode, w.out.ErrorMessage, w.out.BaseOffset = code.Code, errString(msg), -1
					break
				}
			}
		}
		if r.Acks == 0 {
			// No answer is sent, but the request held its place among
			// the connection's requests in flight until it was done: a
			// client that never reads answers is still held back. Its
			// refusals still count.
			if cn.ctx.Err() == nil {
				cn.srv.metrics.countErrors(h, resp)
			}
			return nil
		}
		return resp
	})
}

// authorize asks Options.Authorize, when set, whether the connection's
// caller may make the Ingest call method with req.
func (cn *conn) authorize(ctx context.Context, method string, req any) error {
	if cn.srv.opts.Authorize == nil {
		return nil
	}
	return cn.srv.opts.Authorize(ctx, method, req)
}
