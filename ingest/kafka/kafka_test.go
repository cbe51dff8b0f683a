package kafka

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/ingest/groups"
	"github.com/catena-streams/catena/rpc/catenapb"
)

type partOff struct {
	partition int32
	offset    int64
}

// produceAll produces n keyed records with cl and returns every
// acknowledged one by partition and offset.
func produceAll(t *testing.T, cl *kgo.Client, n int, tag string) map[partOff]*kgo.Record {
	t.Helper()
	ctx := ctxT(t, 60*time.Second)
	var mu sync.Mutex
	acked := map[partOff]*kgo.Record{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		r := &kgo.Record{Topic: "s", Key: fmt.Appendf(nil, "key-%d", i%37), Value: fmt.Appendf(nil, "%s-%d-%s", tag, i, bytes.Repeat([]byte("v"), i%300))}
		cl.Produce(ctx, r, func(r *kgo.Record, err error) {
			defer wg.Done()
			if err != nil {
				t.Errorf("record %s not acknowledged: %v", r.Value[:min(len(r.Value), 20)], err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			k := partOff{r.Partition, r.Offset}
			if prev, dup := acked[k]; dup {
				t.Errorf("%s and %s both acknowledged at partition %d offset %d", prev.Value, r.Value, r.Partition, r.Offset)
			}
			acked[k] = r
		})
	}
	wg.Wait()
	return acked
}

// consumeAll reads partitions 0..n-1 from the start until it holds want
// records, failing on any record read twice.
func consumeAll(t *testing.T, c *cluster, partitions, want int) map[partOff]*kgo.Record {
	t.Helper()
	offsets := map[string]map[int32]kgo.Offset{"s": {}}
	for p := range partitions {
		offsets["s"][int32(p)] = kgo.NewOffset().AtStart()
	}
	cl := c.client(kgo.ConsumePartitions(offsets), kgo.FetchMaxWait(500*time.Millisecond))
	ctx := ctxT(t, 60*time.Second)
	got := map[partOff]*kgo.Record{}
	for len(got) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records before the deadline", len(got), want)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Errorf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) {
			k := partOff{r.Partition, r.Offset}
			if _, dup := got[k]; dup {
				t.Errorf("partition %d offset %d read twice", r.Partition, r.Offset)
			}
			got[k] = r
		})
	}
	return got
}

// Every record an unchanged franz-go producer had acknowledged (idempotent,
// acks=all, its defaults) is read back by a franz-go consumer exactly once,
// at the offset it was acknowledged at, with its key, value and timestamp,
// whatever compression the producer used.
func TestFranzGoProducesAndConsumesWithEveryCodec(t *testing.T) {
	c := startCluster(t, 4)
	total := map[partOff]*kgo.Record{}
	for _, codec := range []kgo.CompressionCodec{kgo.NoCompression(), kgo.GzipCompression(), kgo.SnappyCompression(), kgo.Lz4Compression(), kgo.ZstdCompression()} {
		cl := c.client(kgo.ProducerBatchCompression(codec), kgo.ProducerLinger(2*time.Millisecond))
		acked := produceAll(t, cl, 400, fmt.Sprintf("codec%d", len(total)))
		if len(acked) != 400 {
			t.Fatalf("%d of 400 records acknowledged", len(acked))
		}
		for k, r := range acked {
			total[k] = r
		}
	}
	got := consumeAll(t, c, 4, len(total))
	if len(got) != len(total) {
		t.Fatalf("read %d records, %d were acknowledged", len(got), len(total))
	}
	for k, want := range total {
		r := got[k]
		if r == nil {
			t.Errorf("acknowledged record at partition %d offset %d not read", k.partition, k.offset)
			continue
		}
		if !bytes.Equal(r.Key, want.Key) || !bytes.Equal(r.Value, want.Value) {
			t.Errorf("partition %d offset %d: read %q=%q, acknowledged %q=%q", k.partition, k.offset, r.Key, r.Value, want.Key, want.Value)
		}
		if !r.Timestamp.Equal(want.Timestamp.Truncate(time.Millisecond)) {
			t.Errorf("partition %d offset %d: timestamp %v, produced %v", k.partition, k.offset, r.Timestamp, want.Timestamp)
		}
	}
	// A key's records share a partition (the client's partitioner).
	part := map[string]int32{}
	for _, r := range got {
		if p, ok := part[string(r.Key)]; ok && p != r.Partition {
			t.Errorf("key %s in partitions %d and %d", r.Key, p, r.Partition)
		}
		part[string(r.Key)] = r.Partition
	}
}

// rawProduce is one idempotent batch of n records for partition 0, as a
// producer with id pid sends it at sequence seq.
func rawProduce(pid int64, seq int32, n int, mutate func(b []byte)) *kmsg.ProduceRequest {
	return rawProduceAt(pid, 0, seq, n, mutate)
}

// rawProduceAt is rawProduce at a producer epoch.
func rawProduceAt(pid int64, epoch int16, seq int32, n int, mutate func(b []byte)) *kmsg.ProduceRequest {
	recs := make([][]byte, n)
	for i := range recs {
		recs[i] = fmt.Appendf(nil, "rec-%d-%d", seq, i)
	}
	batch := encodeTestBatch(pid, seq, recs, nil)
	if pid >= 0 {
		batch[51], batch[52] = byte(uint16(epoch)>>8), byte(epoch) // ProducerEpoch
		crc := crc32Checksum(batch[21:])
		batch[17], batch[18], batch[19], batch[20] = byte(crc>>24), byte(crc>>16), byte(crc>>8), byte(crc)
	}
	if mutate != nil {
		mutate(batch)
	}
	req := kmsg.NewPtrProduceRequest()
	req.Acks, req.TimeoutMillis = -1, 10000
	t := kmsg.NewProduceRequestTopic()
	t.Topic = "s"
	p := kmsg.NewProduceRequestTopicPartition()
	p.Partition, p.Records = 0, batch
	t.Partitions = append(t.Partitions, p)
	req.Topics = append(req.Topics, t)
	return req
}

// encodeTestBatch encodes an uncompressed record batch v2 with kmsg.
func encodeTestBatch(pid int64, seq int32, values [][]byte, headers []kmsg.Header) []byte {
	var body []byte
	for i, v := range values {
		r := kmsg.NewRecord()
		r.OffsetDelta, r.Value, r.Headers = int32(i), v, headers
		one := r.AppendTo(nil)
		body = appendVarint(body, int64(len(one)-1))
		body = append(body, one[1:]...)
	}
	now := time.Now().UnixMilli()
	b := kmsg.RecordBatch{Length: int32(49 + len(body)), PartitionLeaderEpoch: -1, Magic: 2, LastOffsetDelta: int32(len(values) - 1),
		FirstTimestamp: now, MaxTimestamp: now, ProducerID: pid, ProducerEpoch: 0, FirstSequence: seq, NumRecords: int32(len(values)), Records: body}
	if pid < 0 {
		b.ProducerEpoch, b.FirstSequence = -1, -1
	}
	out := b.AppendTo(nil)
	crc := crc32Checksum(out[21:])
	out[17], out[18], out[19], out[20] = byte(crc>>24), byte(crc>>16), byte(crc>>8), byte(crc)
	return out
}

func partitionResult(t *testing.T, resp kmsg.Response) kmsg.ProduceResponseTopicPartition {
	t.Helper()
	pr := resp.(*kmsg.ProduceResponse)
	if len(pr.Topics) != 1 || len(pr.Topics[0].Partitions) != 1 {
		t.Fatalf("produce answer has %d topics", len(pr.Topics))
	}
	return pr.Topics[0].Partitions[0]
}

// A retried idempotent batch (same producer id and sequence) is stored
// once and answered with the offset of the first attempt; a later batch
// goes after it; a batch whose sequence goes back behind a stored one is
// refused with OUT_OF_ORDER_SEQUENCE_NUMBER. Nothing is stored twice.
func TestIdempotentRetriesAreStoredOnce(t *testing.T) {
	c := startCluster(t, 1)
	cl := c.client()
	ctx := ctxT(t, 30*time.Second)
	pidResp, err := kmsg.NewPtrInitProducerIDRequest().RequestWith(ctx, cl)
	if err != nil || pidResp.ErrorCode != 0 || pidResp.ProducerID <= 0 {
		t.Fatalf("InitProducerId: %v, %+v", err, pidResp)
	}
	pid := pidResp.ProducerID
	first, err := cl.Request(ctx, rawProduce(pid, 0, 5, nil))
	if err != nil {
		t.Fatal(err)
	}
	p0 := partitionResult(t, first)
	if p0.ErrorCode != 0 || p0.BaseOffset != 0 {
		t.Fatalf("first batch: error %d, base offset %d", p0.ErrorCode, p0.BaseOffset)
	}
	retry, err := cl.Request(ctx, rawProduce(pid, 0, 5, nil))
	if err != nil {
		t.Fatal(err)
	}
	if p := partitionResult(t, retry); p.ErrorCode != 0 || p.BaseOffset != 0 {
		t.Fatalf("retried batch: error %d, base offset %d, want 0 and 0", p.ErrorCode, p.BaseOffset)
	}
	next, err := cl.Request(ctx, rawProduce(pid, 5, 3, nil))
	if err != nil {
		t.Fatal(err)
	}
	if p := partitionResult(t, next); p.ErrorCode != 0 || p.BaseOffset != 5 {
		t.Fatalf("next batch: error %d, base offset %d, want 0 and 5", p.ErrorCode, p.BaseOffset)
	}
	// A batch at sequence 20, then one at 10: never stored, and below a
	// stored sequence, so storing it would break the producer's order.
	if _, err := cl.Request(ctx, rawProduce(pid, 20, 1, nil)); err != nil {
		t.Fatal(err)
	}
	back, err := cl.Request(ctx, rawProduce(pid, 10, 1, nil))
	if err != nil {
		t.Fatal(err)
	}
	if p := partitionResult(t, back); p.ErrorCode != kerr.OutOfOrderSequenceNumber.Code {
		t.Fatalf("a batch behind a stored sequence: error %d, want OUT_OF_ORDER_SEQUENCE_NUMBER", p.ErrorCode)
	}
	c.waitCommitted(0, 9) // 5 + 3 + 1: the retry and the late batch not stored
	// The Java client and sarama bump the epoch themselves after a failed
	// batch and start the sequences again at 0, under the same id: new
	// records, to be stored, not answered as duplicates of epoch 0's.
	bumped, err := cl.Request(ctx, rawProduceAt(pid, 1, 0, 4, nil))
	if err != nil {
		t.Fatal(err)
	}
	if p := partitionResult(t, bumped); p.ErrorCode != 0 || p.BaseOffset != 9 {
		t.Fatalf("epoch 1's first batch: error %d, base offset %d, want 0 and 9", p.ErrorCode, p.BaseOffset)
	}
	c.waitCommitted(0, 13)
}

// Bad input gets a Kafka error with the reason and stores nothing.
func TestBadProduceIsRefusedAndStoresNothing(t *testing.T) {
	c := startCluster(t, 2)
	cl := c.client()
	ctx := ctxT(t, 30*time.Second)
	if _, err := cl.Request(ctx, rawProduce(-1, -1, 2, nil)); err != nil {
		t.Fatal(err)
	}
	c.waitCommitted(0, 2)
	base := uint64(2)
	for _, tc := range []struct {
		name string
		req  func() *kmsg.ProduceRequest
		want *kerr.Error
	}{
		{"bad CRC", func() *kmsg.ProduceRequest {
			return rawProduce(-1, -1, 2, func(b []byte) { b[len(b)-1] ^= 0xff })
		}, kerr.CorruptMessage},
		{"unknown topic", func() *kmsg.ProduceRequest {
			r := rawProduce(-1, -1, 2, nil)
			r.Topics[0].Topic = "nope"
			return r
		}, kerr.UnknownTopicOrPartition},
		{"partition past the stream's", func() *kmsg.ProduceRequest {
			r := rawProduce(-1, -1, 2, nil)
			r.Topics[0].Partitions[0].Partition = 2
			return r
		}, kerr.UnknownTopicOrPartition},
		{"old message format", func() *kmsg.ProduceRequest {
			return rawProduce(-1, -1, 2, func(b []byte) { b[16] = 1 })
		}, kerr.UnsupportedForMessageFormat},
		{"transactional batch", func() *kmsg.ProduceRequest {
			r := rawProduce(-1, -1, 2, nil)
			b := r.Topics[0].Partitions[0].Records
			b[22] |= attrTransactional
			crc := crc32Checksum(b[21:])
			b[17], b[18], b[19], b[20] = byte(crc>>24), byte(crc>>16), byte(crc>>8), byte(crc)
			return r
		}, kerr.InvalidRecord},
		{"more records than one append takes", func() *kmsg.ProduceRequest {
			return rawProduce(-1, -1, maxPartitionRecords+1, nil)
		}, kerr.MessageTooLarge},
		{"a producer id never given out", func() *kmsg.ProduceRequest {
			return rawProduce(1<<50, 0, 2, nil)
		}, kerr.UnknownProducerID},
		{"truncated batch", func() *kmsg.ProduceRequest {
			r := rawProduce(-1, -1, 2, nil)
			r.Topics[0].Partitions[0].Records = r.Topics[0].Partitions[0].Records[:40]
			return r
		}, kerr.InvalidRecord},
	} {
		resp, err := cl.Request(ctx, tc.req())
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		p := partitionResult(t, resp)
		if p.ErrorCode != tc.want.Code {
			t.Errorf("%s: error %d (%s), want %s", tc.name, p.ErrorCode, kerr.ErrorForCode(p.ErrorCode), tc.want)
		}
		if p.ErrorMessage == nil || *p.ErrorMessage == "" {
			t.Errorf("%s: no error message", tc.name)
		}
	}
	if got := c.committed(0); got != base {
		t.Fatalf("partition 0 holds %d records after the refusals, %d before", got, base)
	}
}

// A gzip batch that inflates past the limit is refused, not decoded.
func TestDecompressionIsBounded(t *testing.T) {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	zeros := make([]byte, 1<<20)
	for range maxDecompressedBytes>>20 + 1 {
		_, _ = w.Write(zeros)
	}
	_ = w.Close()
	if _, err := decompress(codecGzip, buf.Bytes(), maxDecompressedBytes); err != errTooLarge {
		t.Fatalf("a %d-byte gzip of %d MiB: %v, want errTooLarge", buf.Len(), maxDecompressedBytes>>20+1, err)
	}
	if _, err := decompress(7, nil, maxDecompressedBytes); err == nil {
		t.Fatal("unknown codec accepted")
	}
}

// ListOffsets, Metadata and a long-polling Fetch, as a client sees them.
func TestOffsetsMetadataAndLongPoll(t *testing.T) {
	c := startCluster(t, 3)
	cl := c.client()
	ctx := ctxT(t, 30*time.Second)
	meta, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(meta.Brokers) != 1 || fmt.Sprintf("%s:%d", meta.Brokers[0].Host, meta.Brokers[0].Port) != c.addr {
		t.Fatalf("brokers %+v, want the listener %s", meta.Brokers, c.addr)
	}
	var topics []kmsg.MetadataResponseTopic
	for _, tp := range meta.Topics {
		if tp.IsInternal != (*tp.Topic == groups.DefaultOffsetsStream) {
			t.Fatalf("topic %s listed with internal %v", *tp.Topic, tp.IsInternal)
		}
		if !tp.IsInternal {
			topics = append(topics, tp)
		}
	}
	if len(topics) != 1 || *topics[0].Topic != "s" || len(topics[0].Partitions) != 3 {
		t.Fatalf("topics %+v, want s with 3 partitions", meta.Topics)
	}

	// A fetch at the end waits for the next record.
	fetched := make(chan error, 1)
	go func() {
		req := fetchRequest("s", 0, 0)
		req.MaxWaitMillis, req.MinBytes, req.MaxBytes = 10000, 1, 1<<20
		resp, err := req.RequestWith(ctx, cl)
		if err == nil {
			p := resp.Topics[0].Partitions[0]
			if p.ErrorCode != 0 || len(p.RecordBatches) == 0 || p.HighWatermark != 2 {
				err = fmt.Errorf("long-poll answered error %d, %d bytes of batches, high watermark %d", p.ErrorCode, len(p.RecordBatches), p.HighWatermark)
			}
		}
		fetched <- err
	}()
	// Not a wait for a condition: the fetch is given 300 ms in which it
	// must not answer (nothing was produced), then the produce it waits for.
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-fetched:
		t.Fatalf("fetch answered before anything was produced: %v", err)
	default:
	}
	if resp, err := cl.Request(ctx, rawProduce(-1, -1, 2, nil)); err != nil || partitionResult(t, resp).ErrorCode != 0 {
		t.Fatalf("produce: %v", err)
	}
	if err := <-fetched; err != nil {
		t.Fatal(err)
	}

	lo := kmsg.NewPtrListOffsetsRequest()
	lt := kmsg.NewListOffsetsRequestTopic()
	lt.Topic = "s"
	for _, ts := range []int64{-1, -2} {
		lp := kmsg.NewListOffsetsRequestTopicPartition()
		lp.Partition, lp.Timestamp = 0, ts
		lt.Partitions = append(lt.Partitions, lp)
	}
	lo.Topics = append(lo.Topics, lt)
	offs, err := lo.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if ps := offs.Topics[0].Partitions; ps[0].ErrorCode != 0 || ps[0].Offset != 2 || ps[1].ErrorCode != 0 || ps[1].Offset != 0 {
		t.Fatalf("latest and earliest: %+v, want 2 and 0", ps)
	}

	// A fetch past the end is out of range, so the client resets.
	req := fetchRequest("s", 0, 50)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if code := resp.Topics[0].Partitions[0].ErrorCode; code != kerr.OffsetOutOfRange.Code {
		t.Fatalf("fetch at 50 of 2: error %d, want OFFSET_OUT_OF_RANGE", code)
	}
	// A partition past the stream's, and a topic that does not exist.
	req.Topics[0].Partitions[0].Partition, req.Topics[0].Partitions[0].FetchOffset = 3, 0
	if resp, err = req.RequestWith(ctx, cl); err != nil {
		t.Fatal(err)
	}
	if code := resp.Topics[0].Partitions[0].ErrorCode; code != kerr.UnknownTopicOrPartition.Code {
		t.Fatalf("fetch of partition 3 of 3: error %d, want UNKNOWN_TOPIC_OR_PARTITION", code)
	}
	req.Topics[0].Topic, req.Topics[0].Partitions[0].Partition = "nope", 0
	if resp, err = req.RequestWith(ctx, cl); err != nil {
		t.Fatal(err)
	}
	if code := resp.Topics[0].Partitions[0].ErrorCode; code != kerr.UnknownTopicOrPartition.Code {
		t.Fatalf("fetch of an unknown topic: error %d, want UNKNOWN_TOPIC_OR_PARTITION", code)
	}
}

// ApiVersions lists exactly what is served; transactions are not.
func TestApiVersionsAndTransactionsRefused(t *testing.T) {
	c := startCluster(t, 1)
	cl := c.client()
	ctx := ctxT(t, 30*time.Second)
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ApiKeys) != len(supported) {
		t.Fatalf("ApiVersions lists %d APIs, %d are served", len(resp.ApiKeys), len(supported))
	}
	for _, k := range resp.ApiKeys {
		if v := supported[k.ApiKey]; v.min != k.MinVersion || v.max != k.MaxVersion {
			t.Errorf("%s: v%d-v%d listed, v%d-v%d served", kmsg.NameForKey(k.ApiKey), k.MinVersion, k.MaxVersion, v.min, v.max)
		}
	}
	init := kmsg.NewPtrInitProducerIDRequest()
	init.TransactionalID = kmsg.StringPtr("txn")
	// Straight to the broker: a client would first look for a transaction
	// coordinator, and FindCoordinator is not served.
	raw, err := cl.Broker(brokerID).Request(ctx, init)
	if err != nil {
		t.Fatal(err)
	}
	if ir := raw.(*kmsg.InitProducerIDResponse); ir.ErrorCode == 0 {
		t.Fatal("a transactional producer was given an id")
	}
}

func appendVarint(b []byte, v int64) []byte { return binary.AppendVarint(b, v) }

func crc32Checksum(b []byte) uint32 { return crc32.Checksum(b, crc32c) }

// The access policy is asked for every operation, with the Ingest method
// it amounts to: a refused produce stores nothing, a refused read returns
// nothing, each with TOPIC_AUTHORIZATION_FAILED.
func TestRefusedCallersGetAuthorizationErrors(t *testing.T) {
	var mu sync.Mutex
	asked := map[string]bool{}
	c := startCluster(t, 1, func(o *Options) {
		o.Authorize = func(_ context.Context, method string, req any) error {
			mu.Lock()
			asked[method] = true
			mu.Unlock()
			if method == catenapb.Ingest_Produce_FullMethodName || method == catenapb.Ingest_Fetch_FullMethodName {
				return status.Error(codes.PermissionDenied, "identity \"x\" may not")
			}
			return nil
		}
	})
	cl := c.client()
	ctx := ctxT(t, 30*time.Second)
	resp, err := cl.Request(ctx, rawProduce(-1, -1, 2, nil))
	if err != nil {
		t.Fatal(err)
	}
	if p := partitionResult(t, resp); p.ErrorCode != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("refused produce: error %d, want TOPIC_AUTHORIZATION_FAILED", p.ErrorCode)
	}
	if got := c.committed(0); got != 0 {
		t.Fatalf("a refused produce stored %d records", got)
	}
	fr, err := fetchRequest("s", 0, 0).RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if code := fr.Topics[0].Partitions[0].ErrorCode; code != kerr.TopicAuthorizationFailed.Code {
		t.Fatalf("refused fetch: error %d, want TOPIC_AUTHORIZATION_FAILED", code)
	}
	mr := kmsg.NewPtrMetadataRequest()
	mt := kmsg.NewMetadataRequestTopic()
	mt.Topic = kmsg.StringPtr("s")
	mr.Topics = append(mr.Topics, mt)
	if _, err := mr.RequestWith(ctx, cl); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !asked[catenapb.Ingest_DescribeStream_FullMethodName] {
		t.Errorf("metadata was served without asking the policy (asked: %v)", asked)
	}
}

// fetchRequest is a Fetch of one partition from offset, 1 MiB at most.
func fetchRequest(topic string, partition int32, offset int64) *kmsg.FetchRequest {
	req := kmsg.NewPtrFetchRequest()
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic = topic
	fp := kmsg.NewFetchRequestTopicPartition()
	fp.Partition, fp.FetchOffset, fp.PartitionMaxBytes = partition, offset, 1<<20
	ft.Partitions = append(ft.Partitions, fp)
	req.Topics = append(req.Topics, ft)
	return req
}

// TestListOffsetsByTimestamp answers as Kafka: the first record at or
// after the time, with its own timestamp; -1 and -1 after every record.
func TestListOffsetsByTimestamp(t *testing.T) {
	c := startCluster(t, 1)
	cl := c.client(kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx := ctxT(t, 30*time.Second)
	t0 := time.UnixMilli(1_760_000_000_000)
	// One batch of three records 10 s apart: the index finds the batch,
	// the records in it are read to find the first at or after the time.
	var recs []*kgo.Record
	for i := range 3 {
		recs = append(recs, &kgo.Record{Topic: "s", Partition: 0, Value: []byte{byte(i)}, Timestamp: t0.Add(time.Duration(i) * 10 * time.Second)})
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		at         time.Time
		offset, ts int64
	}{
		{t0.Add(-time.Hour), 0, t0.UnixMilli()},
		{t0.Add(5 * time.Second), 1, t0.Add(10 * time.Second).UnixMilli()},
		{t0.Add(20 * time.Second), 2, t0.Add(20 * time.Second).UnixMilli()},
		{t0.Add(time.Hour), -1, -1},
	} {
		req := kmsg.NewPtrListOffsetsRequest()
		rt := kmsg.NewListOffsetsRequestTopic()
		rt.Topic = "s"
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition, rp.Timestamp = 0, tc.at.UnixMilli()
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			t.Fatal(err)
		}
		p := resp.Topics[0].Partitions[0]
		if p.ErrorCode != 0 || p.Offset != tc.offset || p.Timestamp != tc.ts {
			t.Errorf("at %v: error %d, offset %d, timestamp %d; want offset %d, timestamp %d", tc.at, p.ErrorCode, p.Offset, p.Timestamp, tc.offset, tc.ts)
		}
	}
}
