package kafka

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/catena-streams/catena/rpc/catenapb"
)

const (
	// defaultFetchMaxBytes is Kafka's fetch.max.bytes default, for
	// requests that name none (before v3).
	defaultFetchMaxBytes = 50 << 20
	// maxFetchWait bounds a Fetch's long-poll whatever the client asks.
	maxFetchWait = 30 * time.Second
	// fetchParallel is how many partitions of one Fetch are read at once.
	fetchParallel = 16
	// maxFetchBytes and maxPartitionFetchBytes cap what a client may ask
	// for, whatever its MaxBytes and PartitionMaxBytes say.
	maxFetchBytes          = 64 << 20
	maxPartitionFetchBytes = 16 << 20
)

// fetchPart is one partition of a Fetch being answered.
type fetchPart struct {
	out       *kmsg.FetchResponseTopicPartition
	stream    string
	partition uint32
	next      uint64 // where the next read starts
	maxBytes  int
	recs      []*catenapb.Record
	bytes     int
	failed    bool
}

// fetch reads every named partition's committed records from the given
// offsets. It answers at once when they hold at least MinBytes, or else
// long-polls them all until they do or MaxWaitMillis passes (Kafka's
// semantics). Fetch sessions are not kept: the answer's session id is 0,
// so clients send full requests.
func (cn *conn) fetch(ctx context.Context, r *kmsg.FetchRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.FetchResponse)
	var parts []*fetchPart
	for _, t := range r.Topics {
		rt := kmsg.NewFetchResponseTopic()
		rt.Topic = t.Topic
		rt.Partitions = make([]kmsg.FetchResponseTopicPartition, len(t.Partitions))
		authErr := cn.authorize(ctx, catenapb.Ingest_Fetch_FullMethodName, &catenapb.FetchRequest{Stream: t.Topic})
		partitions := -1
		if authErr == nil {
			info, err := cn.srv.ing.Stream(ctx, t.Topic)
			if err != nil {
				authErr = err // the topic's error, for each partition
			} else {
				partitions = info.Partitions
			}
		}
		for i, p := range t.Partitions {
			out := &rt.Partitions[i]
			*out = kmsg.NewFetchResponseTopicPartition()
			out.Partition, out.HighWatermark, out.LastStableOffset, out.LogStartOffset, out.PreferredReadReplica = p.Partition, -1, -1, -1, -1
			out.RecordBatches = []byte{} // empty, not null: librdkafka refuses a null record set
			switch {
			case authErr != nil:
				code, _ := kafkaError(authErr, opRead)
				out.ErrorCode = code.Code
			case p.Partition < 0 || int(p.Partition) >= partitions:
				out.ErrorCode = kerr.UnknownTopicOrPartition.Code
			case p.FetchOffset < 0:
				out.ErrorCode = kerr.OffsetOutOfRange.Code
			default:
				parts = append(parts, &fetchPart{out: out, stream: t.Topic, partition: uint32(p.Partition), next: uint64(p.FetchOffset), maxBytes: min(max(int(p.PartitionMaxBytes), 1), maxPartitionFetchBytes)})
			}
		}
		resp.Topics = append(resp.Topics, rt)
	}
	maxBytes := int(r.MaxBytes)
	if r.Version < 3 || maxBytes <= 0 {
		maxBytes = defaultFetchMaxBytes
	}
	maxBytes = min(maxBytes, maxFetchBytes)
	wait := min(time.Duration(r.MaxWaitMillis)*time.Millisecond, maxFetchWait)
	deadline := time.Now().Add(wait)

	// Whatever is there now, from every partition.
	var mu sync.Mutex
	total := 0
	sem := make(chan struct{}, fetchParallel)
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			n := cn.readPart(ctx, p, 0)
			mu.Lock()
			total += n
			mu.Unlock()
		}()
	}
	wg.Wait()

	// Then, if that is too little, wait for more on all of them at once.
	if total < int(r.MinBytes) && wait > 0 {
		pctx, cancel := context.WithDeadline(ctx, deadline)
		enough := make(chan struct{})
		var once sync.Once
		for _, p := range parts {
			if p.failed {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case sem <- struct{}{}:
					defer func() { <-sem }()
				case <-pctx.Done():
					return
				}
				n := cn.readPart(pctx, p, time.Until(deadline))
				mu.Lock()
				total += n
				reached := total >= int(r.MinBytes)
				mu.Unlock()
				if reached {
					once.Do(func() { close(enough) })
				}
			}()
		}
		all := make(chan struct{})
		go func() { wg.Wait(); close(all) }()
		select {
		case <-enough:
		case <-all:
		case <-pctx.Done():
		}
		cancel()
		<-all
	}

	// Answer in request order, within the request's byte limit (the
	// first partition with records always goes, as in Kafka, so that a
	// record larger than the limit is still read).
	room := maxBytes
	for _, p := range parts {
		if p.failed || len(p.recs) == 0 {
			continue
		}
		if room <= 0 || (p.bytes > room && room < maxBytes) {
			continue // read again by the next Fetch
		}
		p.out.RecordBatches = appendBatch(nil, p.recs)
		room -= p.bytes
	}
	return resp
}

// readPart reads p's committed records from p.next, long-polling for
// wait, appends them to p and returns their bytes. A failure is recorded
// in p's answer; a read cut short by the end of the wait is not one.
func (cn *conn) readPart(ctx context.Context, p *fetchPart, wait time.Duration) int {
	room := p.maxBytes - p.bytes
	if room <= 0 {
		return 0
	}
	resp, err := cn.srv.ing.Fetch(ctx, &catenapb.FetchRequest{Stream: p.stream, Partition: p.partition, Offset: p.next, MaxBytes: uint32(room), MaxWaitMs: uint32(wait / time.Millisecond)})
	if err != nil {
		if ctx.Err() != nil && len(p.recs) > 0 {
			return 0
		}
		if ctx.Err() != nil && wait > 0 {
			return 0 // the long-poll ended with nothing new
		}
		code, _ := kafkaError(err, opRead)
		p.out.ErrorCode, p.failed = code.Code, true
		return 0
	}
	p.out.HighWatermark = int64(resp.GetCommitted())
	p.out.LastStableOffset = p.out.HighWatermark
	p.out.LogStartOffset = int64(resp.GetLogStart())
	if len(resp.GetRecords()) == 0 {
		if p.next > resp.GetCommitted() && cn.pastTheEnd(ctx, p) {
			// Past the end: the client resets (auto.offset.reset).
			p.out.ErrorCode, p.failed = kerr.OffsetOutOfRange.Code, true
		}
		return 0
	}
	n := 0
	for _, rec := range resp.GetRecords() {
		n += len(rec.GetKey()) + len(rec.GetValue()) + 20
		for _, h := range rec.GetHeaders() {
			n += len(h.GetKey()) + len(h.GetValue()) + 4
		}
	}
	p.recs = append(p.recs, resp.GetRecords()...)
	p.bytes += n
	p.next = resp.GetNextOffset()
	return n
}

// pastTheEnd confirms that p.next is beyond the partition's committed
// offset. The member that answered a read may know less than was committed
// (a middle learns of commits a round trip after the tail; a new tail after
// a failover; another ingestion node's acknowledgements), and a consumer
// told OFFSET_OUT_OF_RANGE resets: with auto.offset.reset=latest it would
// skip records. So the answer is checked against LATEST, which a member
// gives only when its committed offset is exact.
func (cn *conn) pastTheEnd(ctx context.Context, p *fetchPart) bool {
	resp, err := cn.srv.ing.ListOffsets(ctx, &catenapb.ListOffsetsRequest{Stream: p.stream, Partition: p.partition, Spec: catenapb.OffsetSpec_OFFSET_SPEC_LATEST})
	if err != nil {
		return false // not confirmed: an empty answer, and the client asks again
	}
	if latest := int64(resp.GetOffset()); latest > p.out.HighWatermark {
		p.out.HighWatermark, p.out.LastStableOffset = latest, latest
	}
	return p.next > resp.GetOffset()
}

// appendBatch appends recs (consecutive offsets) as one uncompressed
// record batch v2, encoded by kmsg: no producer id (it is not the
// client's), no partition leader epoch (Catena's epochs are not Kafka's).
func appendBatch(dst []byte, recs []*catenapb.Record) []byte {
	first := recs[0]
	maxTs := first.GetTimestampMs()
	var body, one []byte
	for i, r := range recs {
		maxTs = max(maxTs, r.GetTimestampMs())
		kr := kmsg.NewRecord()
		kr.TimestampDelta64 = r.GetTimestampMs() - first.GetTimestampMs()
		kr.OffsetDelta = int32(i)
		if len(r.GetKey()) > 0 {
			kr.Key = r.GetKey()
		}
		kr.Value = r.GetValue()
		if kr.Value == nil {
			kr.Value = []byte{} // an empty value, not a null one
		}
		for _, h := range r.GetHeaders() {
			v := h.GetValue()
			if v == nil {
				v = []byte{}
			}
			kr.Headers = append(kr.Headers, kmsg.Header{Key: h.GetKey(), Value: v})
		}
		// kmsg writes the length it is given: encode with 0 (one
		// byte), then write the real length before the rest.
		one = kr.AppendTo(one[:0])
		body = binary.AppendVarint(body, int64(len(one)-1))
		body = append(body, one[1:]...)
	}
	b := kmsg.RecordBatch{
		FirstOffset:          int64(first.GetOffset()),
		Length:               int32(49 + len(body)),
		PartitionLeaderEpoch: -1,
		Magic:                2,
		LastOffsetDelta:      int32(len(recs) - 1),
		FirstTimestamp:       first.GetTimestampMs(),
		MaxTimestamp:         maxTs,
		ProducerID:           -1,
		ProducerEpoch:        -1,
		FirstSequence:        -1,
		NumRecords:           int32(len(recs)),
		Records:              body,
	}
	start := len(dst)
	dst = b.AppendTo(dst)
	binary.BigEndian.PutUint32(dst[start+17:], crc32.Checksum(dst[start+21:], crc32c))
	return dst
}
