package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// Message is one committed record read back.
type Message struct {
	Stream      string
	Partition   uint32
	Offset      uint64
	Key         []byte
	Value       []byte
	TimestampMs int64
	Headers     []Header
}

// Time is the record timestamp.
func (m Message) Time() time.Time { return time.UnixMilli(m.TimestampMs) }

// FetchResult is the answer to Fetch.
type FetchResult struct {
	Messages []Message
	// Committed is the exclusive end of committed records known by the
	// replica that served the read.
	Committed uint64
	LogStart  uint64
	// NextOffset is where to continue reading.
	NextOffset uint64
}

func toMessages(stream string, partition uint32, recs []*catenapb.Record) []Message {
	if len(recs) == 0 {
		return nil
	}
	ms := make([]Message, len(recs))
	for i, r := range recs {
		ms[i] = Message{Stream: stream, Partition: partition, Offset: r.Offset, Key: r.Key, Value: r.Value, TimestampMs: r.TimestampMs, Headers: messageHeaders(r.Headers)}
	}
	return ms
}

// Fetch reads committed records of one partition from offset. maxBytes 0
// lets the server choose; maxWait > 0 long-polls for records past offset.
func (c *Client) Fetch(ctx context.Context, stream string, partition uint32, offset uint64, maxBytes uint32, maxWait time.Duration) (*FetchResult, error) {
	resp, err := c.ingest.Fetch(ctx, &catenapb.FetchRequest{
		Stream: stream, Partition: partition, Offset: offset,
		MaxBytes: maxBytes, MaxWaitMs: uint32(maxWait / time.Millisecond),
	})
	if err != nil {
		return nil, err
	}
	return &FetchResult{
		Messages:   toMessages(stream, partition, resp.Records),
		Committed:  resp.Committed,
		LogStart:   resp.LogStart,
		NextOffset: resp.NextOffset,
	}, nil
}

// Position is where a subscription starts.
type Position struct {
	kind   posKind
	offset uint64
	tsMs   int64
}

type posKind uint8

const (
	posEarliest posKind = iota
	posLatest
	posOffset
	posTime
)

var (
	// Earliest is the first retained record.
	Earliest = Position{kind: posEarliest}
	// Latest is the committed end: only records committed later are read.
	Latest = Position{kind: posLatest}
)

// AtOffset starts at offset n.
func AtOffset(n uint64) Position { return Position{kind: posOffset, offset: n} }

// AtTime starts at the first record whose timestamp is >= t.
func AtTime(t time.Time) Position { return Position{kind: posTime, tsMs: t.UnixMilli()} }

// AtTimeMs is AtTime with Unix milliseconds.
func AtTimeMs(ms int64) Position { return Position{kind: posTime, tsMs: ms} }

// Request is p as a ListOffsets-style request: the spec, with the offset
// for a position at an offset (spec UNSPECIFIED) and the time for one at
// a time.
func (p Position) Request() (spec catenapb.OffsetSpec, offset uint64, tsMs int64) {
	switch p.kind {
	case posEarliest:
		return catenapb.OffsetSpec_OFFSET_SPEC_EARLIEST, 0, 0
	case posLatest:
		return catenapb.OffsetSpec_OFFSET_SPEC_LATEST, 0, 0
	case posOffset:
		return catenapb.OffsetSpec_OFFSET_SPEC_UNSPECIFIED, p.offset, 0
	default:
		return catenapb.OffsetSpec_OFFSET_SPEC_TIMESTAMP, 0, p.tsMs
	}
}

func (p Position) String() string {
	switch p.kind {
	case posEarliest:
		return "earliest"
	case posLatest:
		return "latest"
	case posOffset:
		return strconv.FormatUint(p.offset, 10)
	default:
		return "@" + strconv.FormatInt(p.tsMs, 10)
	}
}

// ParsePosition parses "earliest", "latest", an offset, or "@UNIX_MS".
func ParsePosition(s string) (Position, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "earliest", "beginning", "start":
		return Earliest, nil
	case "latest", "end":
		return Latest, nil
	}
	if ts, ok := strings.CutPrefix(s, "@"); ok {
		ms, err := strconv.ParseInt(ts, 10, 64)
		if err != nil || ms < 0 {
			return Position{}, fmt.Errorf("invalid position %q: want @UNIX_MILLISECONDS", s)
		}
		return AtTimeMs(ms), nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return Position{}, fmt.Errorf("invalid position %q: want earliest, latest, an offset or @UNIX_MILLISECONDS", s)
	}
	return AtOffset(n), nil
}

// ListOffsets resolves earliest / latest / a timestamp for one partition.
func (c *Client) ListOffsets(ctx context.Context, stream string, partition uint32, spec catenapb.OffsetSpec, tsMs int64) (uint64, error) {
	resp, err := c.ingest.ListOffsets(ctx, &catenapb.ListOffsetsRequest{Stream: stream, Partition: partition, Spec: spec, TimestampMs: tsMs})
	if err != nil {
		return 0, err
	}
	return resp.Offset, nil
}

// Resolve turns pos into an offset of one partition (ListOffsets, except
// for AtOffset).
func (c *Client) Resolve(ctx context.Context, stream string, partition uint32, pos Position) (uint64, error) {
	switch pos.kind {
	case posOffset:
		return pos.offset, nil
	case posEarliest:
		return c.ListOffsets(ctx, stream, partition, catenapb.OffsetSpec_OFFSET_SPEC_EARLIEST, 0)
	case posLatest:
		return c.ListOffsets(ctx, stream, partition, catenapb.OffsetSpec_OFFSET_SPEC_LATEST, 0)
	default:
		return c.ListOffsets(ctx, stream, partition, catenapb.OffsetSpec_OFFSET_SPEC_TIMESTAMP, pos.tsMs)
	}
}

// Describe reports each partition's chain of stream as the replicas see it.
func (c *Client) Describe(ctx context.Context, stream string) (*catenapb.StreamDescription, error) {
	return c.ingest.DescribeStream(ctx, &catenapb.DescribeStreamRequest{Stream: stream})
}

// ListStreams lists stream names.
func (c *Client) ListStreams(ctx context.Context) ([]string, error) {
	resp, err := c.ingest.ListStreams(ctx, &catenapb.ListStreamsRequest{})
	if err != nil {
		return nil, err
	}
	return resp.Streams, nil
}

// CreateStream creates a stream of partitions partitions where the server
// allows it (catena dev; on Kubernetes a stream is a Stream object and this
// fails with FailedPrecondition), and describes it.
func (c *Client) CreateStream(ctx context.Context, stream string, partitions int) (*catenapb.StreamDescription, error) {
	if partitions < 1 || partitions > math.MaxUint32 {
		return nil, status.Errorf(codes.InvalidArgument, "partitions must be at least 1, got %d", partitions)
	}
	return c.ingest.CreateStream(ctx, &catenapb.CreateStreamRequest{Stream: stream, Partitions: uint32(partitions)})
}

// DeleteStream deletes a stream and every copy of its records, where
// CreateStream is allowed.
func (c *Client) DeleteStream(ctx context.Context, stream string) error {
	_, err := c.ingest.DeleteStream(ctx, &catenapb.DeleteStreamRequest{Stream: stream})
	return err
}

// SubscribeOptions tune a Subscription.
type SubscribeOptions struct {
	// MaxBytes per streamed response; 0 lets the server choose.
	MaxBytes uint32
	// ReconnectBackoff is the first delay before re-subscribing after a
	// transient error (doubling up to 2s). Default 50ms.
	ReconnectBackoff time.Duration
}

// Subscription streams committed records of one partition in offset
// order, re-subscribing transparently after transient (Unavailable)
// errors. Not safe for concurrent Next calls.
type Subscription struct {
	c         *Client
	stream    string
	partition uint32
	opts      SubscribeOptions

	ctx    context.Context
	cancel context.CancelFunc

	rpc       catenapb.Ingest_SubscribeClient
	buf       []*catenapb.Record
	offset    uint64 // next offset to deliver
	committed uint64
	mu        sync.Mutex // guards committed/offset for concurrent readers of the getters
}

// Subscribe starts streaming partition of stream from the resolved
// position. The subscription lives until ctx is done or Close.
func (c *Client) Subscribe(ctx context.Context, stream string, partition uint32, from Position, opts ...SubscribeOptions) (*Subscription, error) {
	off, err := c.Resolve(ctx, stream, partition, from)
	if err != nil {
		return nil, err
	}
	var o SubscribeOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.ReconnectBackoff <= 0 {
		o.ReconnectBackoff = 50 * time.Millisecond
	}
	sctx, cancel := context.WithCancel(ctx)
	s := &Subscription{c: c, stream: stream, partition: partition, opts: o, ctx: sctx, cancel: cancel, offset: off}
	if err := s.open(); err != nil {
		cancel()
		return nil, err
	}
	return s, nil
}

func (s *Subscription) open() error {
	rpc, err := s.c.ingest.Subscribe(s.ctx, &catenapb.SubscribeRequest{
		Stream: s.stream, Partition: s.partition, Offset: s.Offset(), MaxBytes: s.opts.MaxBytes,
	})
	if err != nil {
		return err
	}
	s.rpc = rpc
	return nil
}

// Next returns the next record, blocking until one is committed. It
// returns ctx's error after the subscription's context is done or Close.
func (s *Subscription) Next() (Message, error) {
	backoff := s.opts.ReconnectBackoff
	for len(s.buf) == 0 {
		if err := s.ctx.Err(); err != nil {
			return Message{}, err
		}
		var err error
		if s.rpc == nil {
			err = s.open()
		}
		var resp *catenapb.FetchResponse
		if err == nil {
			resp, err = s.rpc.Recv()
		}
		if err == nil {
			s.mu.Lock()
			s.committed = resp.Committed
			if len(resp.Records) == 0 && resp.NextOffset > s.offset {
				s.offset = resp.NextOffset
			}
			s.mu.Unlock()
			s.buf = resp.Records
			backoff = s.opts.ReconnectBackoff
			continue
		}
		s.rpc = nil
		if cerr := s.ctx.Err(); cerr != nil {
			return Message{}, cerr
		}
		if refused := s.c.refusedByTLS(err); refused != nil {
			return Message{}, refused
		}
		if err != io.EOF && status.Code(err) != codes.Unavailable {
			return Message{}, err
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-s.ctx.Done():
			t.Stop()
			return Message{}, s.ctx.Err()
		}
		backoff = min(2*backoff, 2*time.Second)
	}
	r := s.buf[0]
	s.buf[0] = nil
	s.buf = s.buf[1:]
	s.mu.Lock()
	s.offset = r.Offset + 1
	s.mu.Unlock()
	return Message{Stream: s.stream, Partition: s.partition, Offset: r.Offset, Key: r.Key, Value: r.Value, TimestampMs: r.TimestampMs, Headers: messageHeaders(r.Headers)}, nil
}

// Offset is the next offset the subscription will deliver.
func (s *Subscription) Offset() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.offset
}

// Committed is the committed offset reported with the latest response.
func (s *Subscription) Committed() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.committed
}

// Close ends the subscription.
func (s *Subscription) Close() { s.cancel() }

// All iterates records until an error (yielded once, last) or until the
// loop breaks. Context cancellation ends the iteration without an error.
func (s *Subscription) All() iter.Seq2[Message, error] {
	return func(yield func(Message, error) bool) {
		for {
			m, err := s.Next()
			if err != nil {
				if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
					yield(Message{}, err)
				}
				return
			}
			if !yield(m, nil) {
				return
			}
		}
	}
}
