package kafka

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/ingest"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// TestHeadersBothWays: record headers produced by a Kafka client are
// stored and read back by Catena's Go client, and those produced by the
// Go client are read back by the Kafka client: in order, repeated keys
// and empty values kept, through a chain of three replicas.
func TestHeadersBothWays(t *testing.T) {
	c := startCluster(t, 1)
	ctx := ctxT(t, 60*time.Second)
	kafkaHeaders := []kgo.RecordHeader{{Key: "trace", Value: []byte("t-1")}, {Key: "trace", Value: []byte("t-2")}, {Key: "empty", Value: []byte{}}}
	prod := c.client(kgo.DefaultProduceTopic("s"))
	if err := prod.ProduceSync(ctx,
		&kgo.Record{Value: []byte("with"), Headers: kafkaHeaders},
		&kgo.Record{Value: []byte("without")},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}

	native, err := client.Dial(context.Background(), c.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer native.Close()
	p := client.NewProducer(native, "s", client.ProducerOptions{})
	if _, err := p.Send(ctx, client.Record{Value: []byte("native"), Headers: []client.Header{{Key: "k", Value: []byte("v")}, {Key: "k", Value: []byte("w")}}}).Wait(); err != nil {
		t.Fatal(err)
	}
	p.Close()

	res, err := native.Fetch(ctx, "s", 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range res.Messages {
		got = append(got, fmt.Sprintf("%s%v", m.Value, m.Headers))
	}
	if want := "[with[{trace [116 45 49]} {trace [116 45 50]} {empty []}] without[] native[{k [118]} {k [119]}]]"; fmt.Sprint(got) != want {
		t.Fatalf("the Go client read %v\nwant %s", got, want)
	}

	cons := c.client(kgo.ConsumeTopics("s"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var read []string
	for len(read) < 3 && ctx.Err() == nil {
		cons.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			var hs []string
			for _, h := range r.Headers {
				hs = append(hs, h.Key+"="+string(h.Value))
			}
			read = append(read, fmt.Sprintf("%s%v", r.Value, hs))
		})
	}
	if want := "[with[trace=t-1 trace=t-2 empty=] without[] native[k=v k=w]]"; fmt.Sprint(read) != want {
		t.Fatalf("franz-go read %v\nwant %s", read, want)
	}
}

// TestHeadersCountTowardTheRecordLimit: a record whose key and value fit
// but whose headers take it past the stream's limit is refused, with the
// reason, and nothing is stored.
func TestHeadersCountTowardTheRecordLimit(t *testing.T) {
	c := startCluster(t, 1)
	ctx := ctxT(t, 30*time.Second)
	big := &catenapb.ProduceRecord{Value: make([]byte, 1<<19), Headers: []*catenapb.RecordHeader{{Key: "h", Value: make([]byte, 1<<19)}}}
	_, err := c.ing.Produce(ctx, &catenapb.ProduceRequest{Stream: "s", Records: []*catenapb.ProduceRecord{big}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "headers") {
		t.Fatalf("a record over the limit with its headers: %v, want InvalidArgument naming headers", err)
	}
	if got := c.committed(0); got != 0 {
		t.Fatalf("a refused record stored %d records", got)
	}
}

// TestHeaderKeysMustBeUTF8: a Kafka client may send any bytes as a header
// key; read back in a protobuf string they would make every read of the
// partition fail, so the batch is refused and nothing is stored.
func TestHeaderKeysMustBeUTF8(t *testing.T) {
	c := startCluster(t, 1)
	cl := c.client()
	ctx := ctxT(t, 30*time.Second)
	req := rawProduce(-1, -1, 1, nil)
	req.Topics[0].Partitions[0].Records = encodeTestBatch(-1, -1, [][]byte{[]byte("v")}, []kmsg.Header{{Key: "\xff\xfe", Value: []byte("x")}})
	resp, err := cl.Request(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if p := partitionResult(t, resp); p.ErrorCode != kerr.InvalidRecord.Code {
		t.Fatalf("a header key that is not UTF-8: error %d, want INVALID_RECORD", p.ErrorCode)
	}
	if got := c.committed(0); got != 0 {
		t.Fatalf("a refused batch stored %d records", got)
	}
}

// TestRequestsWhoseHeadersTogetherExceedABatchAreSentApart: each produce
// request fits a batch's header bound; two queued together must not be
// merged into one append past it (the head would refuse it, failing
// both).
func TestRequestsWhoseHeadersTogetherExceedABatchAreSentApart(t *testing.T) {
	c := startCluster(t, 1)
	ctx := ctxT(t, 60*time.Second)
	req := func(tag string) *catenapb.ProduceRequest {
		r := &catenapb.ProduceRequest{Stream: "s"}
		for i := range 40000 {
			r.Records = append(r.Records, &catenapb.ProduceRecord{Value: []byte(tag), Headers: []*catenapb.RecordHeader{{Key: "i", Value: []byte{byte(i)}}}})
		}
		return r
	}
	a, err := c.ing.Enqueue(ctx, req("a"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.ing.Enqueue(ctx, req("b"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*ingest.Pending{a, b} {
		resp, err := p.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.GetResults() {
			if r.GetErrorCode() != 0 {
				t.Fatalf("a record was refused: %s", r.GetErrorMessage())
			}
		}
	}
	if got := c.committed(0); got != 80000 {
		t.Fatalf("stored %d records, want 80000", got)
	}
}
