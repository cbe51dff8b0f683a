package client

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
)

// Record is one record to produce.
type Record struct {
	Key   []byte
	Value []byte
	// TimestampMs is Unix milliseconds; zero lets the ingestion node stamp it.
	TimestampMs int64
	// Partition, when non-nil, bypasses key routing (see PartitionOf).
	// Records with neither key nor partition go to one partition for about
	// 256 KiB of such records, then the next.
	Partition *uint32
	// Headers are stored with the record, in order (a key may repeat);
	// their keys and values count toward the stream's record size limit.
	Headers []Header
}

// Header is one application header of a record (Kafka's record headers).
type Header struct {
	Key   string
	Value []byte
}

func wireHeaders(hs []Header) []*catenapb.RecordHeader {
	if len(hs) == 0 {
		return nil
	}
	out := make([]*catenapb.RecordHeader, len(hs))
	for i, h := range hs {
		out[i] = &catenapb.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return out
}

func messageHeaders(hs []*catenapb.RecordHeader) []Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]Header, len(hs))
	for i, h := range hs {
		out[i] = Header{Key: h.GetKey(), Value: h.GetValue()}
	}
	return out
}

// PartitionOf returns a pointer to p, for Record.Partition.
func PartitionOf(p uint32) *uint32 { return &p }

// Ack is the acknowledgement of one stored record.
type Ack struct {
	Stream    string
	Partition uint32
	Offset    uint64
	Key       []byte
	// Duplicate: the record had already been stored by an earlier attempt
	// (Offset is the original offset).
	Duplicate bool
}

// ProducerOptions tune a Producer. Zero values select the defaults.
type ProducerOptions struct {
	// Linger is how long a batch waits for more records once its first
	// record arrived. Default 1ms; negative means no wait.
	Linger time.Duration
	// LingerIdle ends the wait early once no record has been sent to the
	// producer for this long: a caller that sent a burst and now waits for
	// its acknowledgements (a window of records in flight) gets them
	// without waiting out the rest of Linger, while records that keep
	// coming still gather for all of it. Default Linger/20 (50 µs with the default Linger); negative: wait
	// the whole Linger.
	LingerIdle time.Duration
	// MaxBatchBytes bounds the key+value bytes of one request. Default 512 KiB.
	MaxBatchBytes int
	// MaxBatchRecords bounds the records of one request. Default 8192.
	MaxBatchRecords int
	// PartitionBatchBytes bounds the key+value bytes of one partition's
	// batch once the producer routes records itself; a request carries one
	// or more whole batches. Default MaxBatchBytes. See Producer.
	PartitionBatchBytes int
	// MaxInFlight is the number of Produce requests outstanding at once.
	// Default 6. Use 1 for strict ordering across retries.
	MaxInFlight int
	// MaxBufferedBytes bounds unacknowledged bytes; Send blocks (up to its
	// ctx) beyond it. Default 64 MiB.
	MaxBufferedBytes int
	// RetryTimeout bounds how long a record is retried after it was
	// batched. Default 30s.
	RetryTimeout time.Duration
	// RequestTimeout bounds one Produce attempt. Default 10s.
	RequestTimeout time.Duration
	// RetryBackoff is the first retry delay (doubling up to MaxRetryBackoff,
	// with jitter). Defaults 10ms and 1s. After ingestion fails records it
	// parks the producer's later records to that partition while it waits
	// for their retries, until 5 s after the last failure or retry there
	// (docs/architecture.md); with MaxRetryBackoff above that, a retry can
	// come too late and be refused (OUT_OF_RANGE) behind a later record.
	RetryBackoff    time.Duration
	MaxRetryBackoff time.Duration
	// ProducerID overrides the random producer id (tests, resuming). Zero
	// means random.
	ProducerID uint64
}

func (o *ProducerOptions) setDefaults() {
	if o.Linger == 0 {
		o.Linger = time.Millisecond
	} else if o.Linger < 0 {
		o.Linger = 0
	}
	if o.LingerIdle == 0 {
		o.LingerIdle = o.Linger / 20
	} else if o.LingerIdle < 0 {
		o.LingerIdle = 0
	}
	if o.MaxBatchBytes <= 0 {
		o.MaxBatchBytes = 512 << 10
	}
	if o.MaxBatchRecords <= 0 {
		o.MaxBatchRecords = 8192
	}
	if o.PartitionBatchBytes <= 0 {
		o.PartitionBatchBytes = o.MaxBatchBytes
	}
	o.PartitionBatchBytes = min(o.PartitionBatchBytes, o.MaxBatchBytes)
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 6
	}
	if o.MaxBufferedBytes <= 0 {
		o.MaxBufferedBytes = 64 << 20
	}
	if o.RetryTimeout <= 0 {
		o.RetryTimeout = 30 * time.Second
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 10 * time.Second
	}
	if o.RetryBackoff <= 0 {
		o.RetryBackoff = 10 * time.Millisecond
	}
	if o.MaxRetryBackoff <= 0 {
		o.MaxRetryBackoff = time.Second
	}
	if o.MaxRetryBackoff < o.RetryBackoff {
		o.MaxRetryBackoff = o.RetryBackoff
	}
}

// ErrProducerClosed fails Sends after Close.
var ErrProducerClosed = errors.New("catena: producer closed")

// RecordError is a per-record rejection reported by the server (or a
// retryable one that outlived the retry timeout, see RetryTimeoutError).
// status.Code(err) returns Code.
type RecordError struct {
	Code    codes.Code
	Message string
}

func (e *RecordError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("catena: record rejected: %s", e.Code)
	}
	return fmt.Sprintf("catena: record rejected: %s: %s", e.Code, e.Message)
}

// GRPCStatus lets status.Code / status.Convert see the server's code.
func (e *RecordError) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// RetryTimeoutError fails a record whose retryable errors lasted past
// ProducerOptions.RetryTimeout. Last is the final error (unwrapped by
// errors.Is/As and status.Code).
type RetryTimeoutError struct {
	Attempts int
	Elapsed  time.Duration
	Last     error
}

func (e *RetryTimeoutError) Error() string {
	return fmt.Sprintf("catena: record not acknowledged after %d attempts in %s: %v",
		e.Attempts, e.Elapsed.Round(time.Millisecond), e.Last)
}

func (e *RetryTimeoutError) Unwrap() error { return e.Last }

// retryableRPC: the whole request may be retried.
func retryableRPC(c codes.Code) bool {
	switch c {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted:
		return true
	}
	return false
}

// retryableRecord: a per-record error_code that may be retried.
func retryableRecord(c codes.Code) bool {
	switch c {
	case codes.Unavailable, codes.FailedPrecondition, codes.Aborted, codes.DeadlineExceeded:
		return true
	}
	return false
}

// Future is the pending result of one Send. Futures of one batch are
// resolved together.
type Future struct {
	b   *batch
	pr  catenapb.ProduceRecord // the wire record (embedded: one allocation per Send)
	ack Ack
	err error
	at  time.Time
}

// Wait blocks until the record is acknowledged or failed.
func (f *Future) Wait() (Ack, error) {
	<-f.b.done
	return f.ack, f.err
}

// Done is closed once the result is available.
func (f *Future) Done() <-chan struct{} { return f.b.done }

// Result returns the outcome; only valid after Done is closed.
func (f *Future) Result() (Ack, error) { return f.ack, f.err }

// CompletedAt is when the producer learned the outcome (valid after Done),
// for latency measurements.
func (f *Future) CompletedAt() time.Time { return f.at }

// Sequence is the record's producer sequence number (0 if it was never
// accepted by the producer).
func (f *Future) Sequence() uint64 { return f.pr.Sequence }

// batch is records of one partition (or, before the producer routes
// records itself, of any partitions: unrouted) that travel together in one
// Produce request.
type batch struct {
	part    uint32
	futs    []*Future
	bytes   int
	created time.Time
	done    chan struct{}
}

// request is one Produce request: one or more batches.
type request struct {
	batches []*batch
	// num is the producer's number for it; prev the number of the request
	// dispatched before it if that one was still unanswered then, and
	// prevSeq that request's highest sequence (for ingestion nodes that
	// order by sequence).
	num, prev, prevSeq uint64
	lastSeq            uint64 // its highest sequence
	done               chan struct{}
}

// unrouted is the batch key of records that ingestion routes: every record
// until the producer knows the stream's partition count.
const unrouted = ^uint32(0)

// stickyBytes is how many bytes of keyless records go to one partition
// before the next takes over, as ingestion does for records it routes.
const stickyBytes = 256 << 10

var failedBatch = func() *batch {
	b := &batch{done: make(chan struct{})}
	close(b.done)
	return b
}()

// recordOverhead approximates the per-record wire overhead in batch sizing.
const recordOverhead = 24

// Producer batches and pipelines records to one stream, idempotently.
// Safe for concurrent use.
//
// Until ingestion's first answer tells it the stream's partition count, and
// while it has been sent only records without key or partition, the
// producer sends records in the order they were sent, up to MaxBatchBytes
// a request, and ingestion routes them (keyless records then share
// ingestion's sticky partition with other producers': routed per producer
// instead, four producers' keyless records went 2-24% slower in
// bench-compare). Once it knows the count and is sent a record with a key
// or partition, it routes every record itself, as ingestion would (a key's
// partition is contract.PartitionFor; keyless records stick to one
// partition for stickyBytes), and batches per partition, up to
// PartitionBatchBytes: a request carries whole batches, oldest first. Under load, then, each
// partition's records travel in a few large appends instead of a thin
// slice of every request (with 256 partitions, 4 producers and 6 requests
// in flight each, a slice was about 20 records). Order holds per
// partition: a partition's batches are sent in order, and ingestion admits
// a producer's requests in the order they were sent (prev_request). If the
// count grows, keys move to the partitions the new count gives them (as
// ingestion's routing does); if ingestion refuses a request, or answers
// without the count (an older ingestion node), the producer routes nothing
// more until an answer gives it again. Requests already in flight to an
// older node when the producer learns that may reach a partition out of
// order; the partition refuses such records (OUT_OF_RANGE) rather than
// store them out of order.
type Producer struct {
	c      *Client
	stream string
	id     uint64
	opts   ProducerOptions

	ctx    context.Context // cancelled once Close finished, failing stragglers
	cancel context.CancelFunc

	mu       sync.Mutex
	seq      uint64
	parts    uint32            // the stream's partition count (0: unknown, ingestion routes)
	partIDs  []uint32          // 0..parts-1: Record.Partition points into it
	routing  bool              // the producer routes records itself (parts known, a keyed record seen)
	sticky   uint32            // keyless records' partition, and the bytes given to it
	given    int               //
	open     map[uint32]*batch // accumulating, per partition
	ready    []*batch          // cut, oldest first, waiting for an in-flight slot
	live     map[*batch]struct{}
	buffered int
	spaceCh  chan struct{} // closed (and replaced) when buffered bytes drop
	closed   bool
	lastCap  int
	lastSend time.Time // when Send last queued a record (LingerIdle)

	kick chan struct{}
	sem  chan struct{}
	wg   sync.WaitGroup

	lastSent *request // owned by the flusher goroutine
	reqNum   uint64   // owned by the flusher goroutine

	// ps is the open ProduceStream, if any (producestream.go);
	// unaryUntil (nanoseconds after monoStart) is when to try one again
	// after ingestion said it does not serve one.
	psMu       sync.Mutex
	ps         *produceStream
	unaryUntil atomic.Int64
}

// NewProducer starts a producer for stream with a random non-zero
// producer id. Close it to flush and release its goroutine.
func NewProducer(c *Client, stream string, opts ProducerOptions) *Producer {
	opts.setDefaults()
	id := opts.ProducerID
	for id == 0 {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			panic("catena: crypto/rand: " + err.Error())
		}
		id = binary.LittleEndian.Uint64(b[:])
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Producer{
		c: c, stream: stream, id: id, opts: opts,
		ctx: ctx, cancel: cancel,
		live:    make(map[*batch]struct{}),
		open:    make(map[uint32]*batch),
		spaceCh: make(chan struct{}),
		kick:    make(chan struct{}, 1),
		sem:     make(chan struct{}, opts.MaxInFlight),
		lastCap: 64,
	}
	p.wg.Add(1)
	go p.flusher()
	return p
}

// ID is the producer id sent with every request.
func (p *Producer) ID() uint64 { return p.id }

// Stream is the stream this producer writes to.
func (p *Producer) Stream() string { return p.stream }

// Send queues r and returns its Future. ctx bounds only the wait for
// buffer space (MaxBufferedBytes); once queued a record is retried up to
// RetryTimeout. r.Key and r.Value must not be modified until the Future
// is done, nor r.Headers' values.
func (p *Producer) Send(ctx context.Context, r Record) *Future {
	f := &Future{}
	f.pr.Key, f.pr.Value, f.pr.TimestampMs, f.pr.Partition = r.Key, r.Value, r.TimestampMs, r.Partition
	f.pr.Headers = wireHeaders(r.Headers)
	if err := ctx.Err(); err != nil {
		f.fail(err)
		return f
	}
	for _, h := range r.Headers {
		// A protobuf string: not UTF-8, it would fail the whole request
		// it is sent in, other records included.
		if !utf8.ValidString(h.Key) {
			f.fail(status.Errorf(codes.InvalidArgument, "catena: header key %q is not UTF-8", h.Key))
			return f
		}
	}
	size := len(r.Key) + len(r.Value) + recordOverhead
	for _, h := range r.Headers {
		size += len(h.Key) + len(h.Value) + 4
	}
	kick := false
	p.mu.Lock()
	for {
		if p.closed {
			p.mu.Unlock()
			f.fail(ErrProducerClosed)
			return f
		}
		if p.buffered == 0 || p.buffered+size <= p.opts.MaxBufferedBytes {
			break
		}
		ch := p.spaceCh
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			f.fail(ctx.Err())
			return f
		}
		p.mu.Lock()
	}
	p.seq++
	f.pr.Sequence = p.seq
	p.lastSend = time.Now()
	p.buffered += size
	part := p.routeLocked(&f.pr, size)
	limit := p.opts.PartitionBatchBytes
	if part == unrouted {
		limit = p.opts.MaxBatchBytes
	}
	b := p.open[part]
	if b != nil && b.bytes+size > limit {
		p.ready = append(p.ready, b)
		b = nil
		kick = true
	}
	if b == nil {
		b = p.newBatchLocked(part)
		p.open[part] = b
		kick = true
	}
	f.b = b
	b.futs = append(b.futs, f)
	b.bytes += size
	if len(b.futs) >= p.opts.MaxBatchRecords || b.bytes >= limit {
		p.ready = append(p.ready, b)
		delete(p.open, part)
		kick = true
	}
	p.mu.Unlock()
	if kick {
		p.wake()
	}
	return f
}

// SendSync sends r and waits for its acknowledgement (or ctx).
func (p *Producer) SendSync(ctx context.Context, r Record) (Ack, error) {
	f := p.Send(ctx, r)
	select {
	case <-f.Done():
		return f.Result()
	case <-ctx.Done():
		return Ack{}, ctx.Err()
	}
}

// Flush sends everything queued now and waits until every record Sent
// before the call is resolved (acknowledged or failed), or ctx is done.
func (p *Producer) Flush(ctx context.Context) error {
	p.mu.Lock()
	p.cutLocked()
	wait := make([]*batch, 0, len(p.live))
	for b := range p.live {
		wait = append(wait, b)
	}
	p.mu.Unlock()
	p.wake()
	for _, b := range wait {
		select {
		case <-b.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Close flushes, waits for every outstanding record to resolve (at most
// about RetryTimeout), and stops the producer. Later Sends fail with
// ErrProducerClosed. It does not close the Client.
func (p *Producer) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.wake()
	p.wg.Wait()
	p.closeProduceStream()
	p.cancel()
	return nil
}

func (p *Producer) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *Producer) newBatchLocked(part uint32) *batch {
	b := &batch{
		part:    part,
		futs:    make([]*Future, 0, p.lastCap),
		created: time.Now(),
		done:    make(chan struct{}),
	}
	p.live[b] = struct{}{}
	return b
}

func (f *Future) fail(err error) {
	f.err = err
	f.b = failedBatch
}

// routeLocked picks the batch key of a record: unrouted while the
// partition count is unknown (ingestion routes it, and every record keeps
// the order it was sent in), else its partition, which it names in the
// record so that ingestion routes it there whatever count it has by then.
func (p *Producer) routeLocked(r *catenapb.ProduceRecord, size int) uint32 {
	if !p.routing {
		if p.parts == 0 || (len(r.Key) == 0 && r.Partition == nil) {
			return unrouted
		}
		// The first record with a key or partition once the count is
		// known: what is open now leaves before anything routed.
		p.cutLocked()
		p.routing = true
		p.sticky = mrand.Uint32N(p.parts)
	}
	var part uint32
	switch {
	case r.Partition != nil:
		return *r.Partition
	case len(r.Key) > 0:
		part = contract.PartitionFor(r.Key, p.parts)
	default:
		if p.given >= stickyBytes {
			p.sticky, p.given = (p.sticky+1)%p.parts, 0
		}
		p.given += size
		part = p.sticky
	}
	r.Partition = &p.partIDs[part]
	return part
}

// learnPartitions takes the stream's partition count from an answer.
func (p *Producer) learnPartitions(n uint32) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n == 0 || n == p.parts {
		return
	}
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(i)
	}
	p.parts, p.partIDs = n, ids
	p.sticky %= n
}

// forgetPartitions stops routing after ingestion refused a request (a
// stream re-created with fewer partitions refuses the ones past its
// count): open batches are cut first, so that nothing routed by ingestion
// overtakes them.
func (p *Producer) forgetPartitions() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.parts != 0 {
		p.cutLocked()
		p.parts, p.partIDs, p.routing = 0, nil, false
	}
}

// cutLocked moves every open batch to ready, oldest first.
func (p *Producer) cutLocked() {
	cut := make([]*batch, 0, len(p.open))
	for _, b := range p.open {
		cut = append(cut, b)
	}
	clear(p.open)
	slices.SortFunc(cut, func(a, b *batch) int { return a.created.Compare(b.created) })
	p.ready = append(p.ready, cut...)
}

// oldestOpenLocked returns when the oldest open batch was made (zero: none).
func (p *Producer) oldestOpenLocked() time.Time {
	var t time.Time
	for _, b := range p.open {
		if t.IsZero() || b.created.Before(t) {
			t = b.created
		}
	}
	return t
}

// takeLocked makes the next request: ready batches in order while they
// fit, then, if every ready batch went in, open ones, oldest first (they
// would otherwise follow in the next request). A partition's batches thus
// leave in the order they were made.
func (p *Producer) takeLocked() *request {
	r := &request{done: make(chan struct{})}
	bytes, recs := 0, 0
	fits := func(b *batch) bool {
		return len(r.batches) == 0 || (bytes+b.bytes <= p.opts.MaxBatchBytes && recs+len(b.futs) <= p.opts.MaxBatchRecords)
	}
	i := 0
	for ; i < len(p.ready) && fits(p.ready[i]); i++ {
		b := p.ready[i]
		r.batches = append(r.batches, b)
		bytes, recs = bytes+b.bytes, recs+len(b.futs)
	}
	clear(p.ready[:i])
	p.ready = p.ready[i:]
	if len(p.ready) > 0 || len(p.open) == 0 {
		if len(p.ready) == 0 {
			p.ready = nil
		}
		return r
	}
	p.ready = nil
	open := make([]*batch, 0, len(p.open))
	for _, b := range p.open {
		open = append(open, b)
	}
	slices.SortFunc(open, func(a, b *batch) int { return a.created.Compare(b.created) })
	for _, b := range open {
		if !fits(b) {
			break
		}
		delete(p.open, b.part)
		r.batches = append(r.batches, b)
		bytes, recs = bytes+b.bytes, recs+len(b.futs)
	}
	return r
}

// flusher makes requests and starts one goroutine per request, keeping at
// most MaxInFlight requests outstanding.
func (p *Producer) flusher() {
	defer p.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		p.sem <- struct{}{}
		r := p.nextRequest(timer)
		if r == nil {
			<-p.sem
			return
		}
		p.mu.Lock()
		for _, b := range r.batches {
			if n := len(b.futs); n > p.lastCap {
				p.lastCap = min(n, p.opts.MaxBatchRecords)
			}
		}
		p.mu.Unlock()
		// Requests travel on their own goroutines and may overtake one
		// another; naming the unanswered predecessor lets ingestion
		// restore the order.
		p.reqNum++
		r.num = p.reqNum
		if last := p.lastSent; last != nil {
			select {
			case <-last.done:
			default:
				r.prev, r.prevSeq = last.num, last.lastSeq
			}
		}
		for _, b := range r.batches {
			r.lastSeq = max(r.lastSeq, b.futs[len(b.futs)-1].pr.Sequence)
		}
		p.lastSent = r
		p.wg.Add(1)
		go p.sendRequest(r)
	}
}

// nextRequest returns the next request to send once one is due (a batch
// is full, or the oldest open one has lingered), waiting for it; nil once
// closed and drained. Open batches are taken only as a request is made,
// oldest first and as many as fit: under load, the rest keep filling
// while they wait for a request slot, instead of leaving as slivers.
func (p *Producer) nextRequest(timer *time.Timer) *request {
	for {
		p.mu.Lock()
		if p.closed {
			p.cutLocked()
		}
		var wait time.Duration
		if oldest := p.oldestOpenLocked(); !oldest.IsZero() {
			wait = max(p.opts.Linger-time.Since(oldest), 0)
			if idle := p.opts.LingerIdle; idle > 0 && wait > 0 {
				wait = min(wait, max(idle-time.Since(p.lastSend), 0))
			}
		}
		if len(p.ready) > 0 || (len(p.open) > 0 && wait == 0) {
			r := p.takeLocked()
			p.mu.Unlock()
			return r
		}
		closed, open := p.closed, len(p.open) > 0
		p.mu.Unlock()
		if closed {
			return nil
		}
		if !open {
			<-p.kick
			continue
		}
		timer.Reset(wait)
		select {
		case <-p.kick:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		case <-timer.C:
		}
	}
}

// sendRequest sends r, retrying its unacknowledged records with the same
// producer id and sequences until they resolve or RetryTimeout passes.
func (p *Producer) sendRequest(r *request) {
	defer func() {
		p.complete(r)
		<-p.sem
		p.wg.Done()
	}()
	todo := r.batches[0].futs
	created := r.batches[0].created
	if len(r.batches) > 1 {
		todo = nil
		for _, b := range r.batches {
			todo = append(todo, b.futs...)
			if b.created.Before(created) {
				created = b.created
			}
		}
		// In sequence order, as one batch's are (each partition's
		// records keep theirs).
		slices.SortFunc(todo, func(a, b *Future) int { return cmp.Compare(a.pr.Sequence, b.pr.Sequence) })
	}
	req := &catenapb.ProduceRequest{Stream: p.stream, ProducerId: p.id, PrevSequence: r.prevSeq, Request: r.num, PrevRequest: r.prev, Records: make([]*catenapb.ProduceRecord, len(todo))}
	for i, f := range todo {
		req.Records[i] = &f.pr
	}
	deadline := created.Add(p.opts.RetryTimeout)
	backoff := p.opts.RetryBackoff
	var lastErr error
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(p.ctx, p.opts.RequestTimeout)
		cutShort := false // this attempt ends at the retry deadline
		if d, ok := ctx.Deadline(); ok && d.After(deadline) && time.Until(deadline) > 0 {
			cancel()
			ctx, cancel = context.WithDeadline(p.ctx, deadline)
			cutShort = true
		}
		resp, err := p.produce(ctx, req)
		cancel()
		req.PrevSequence, req.PrevRequest = 0, 0 // a retry waits for no one
		now := time.Now()
		switch {
		case err == nil && resp.GetPartitions() != 0:
			p.learnPartitions(resp.GetPartitions())
		case err == nil || status.Code(err) == codes.InvalidArgument:
			// An ingestion node that does not say the count (an older
			// one, behind the same address in a rolling upgrade) orders
			// requests by sequence only, which per-partition batches do
			// not keep.
			p.forgetPartitions()
		}
		if err != nil {
			if refused := p.c.refusedByTLS(err); refused != nil {
				resolveErr(todo, refused, now)
				return
			}
			if !retryableRPC(status.Code(err)) || p.ctx.Err() != nil {
				resolveErr(todo, err, now)
				return
			}
			// An attempt cut short by the retry deadline says only that
			// time ran out; the previous error says why.
			if !cutShort || status.Code(err) != codes.DeadlineExceeded || lastErr == nil {
				lastErr = err
			}
		} else if len(resp.Results) != len(todo) {
			resolveErr(todo, fmt.Errorf("catena: protocol error: %d results for %d records", len(resp.Results), len(todo)), now)
			return
		} else {
			var retry []*Future
			for i, r := range resp.Results {
				f := todo[i]
				if r.ErrorCode == 0 {
					f.ack = Ack{Stream: p.stream, Partition: r.Partition, Offset: r.Offset, Key: f.pr.Key, Duplicate: r.Duplicate}
					f.at = now
					continue
				}
				rerr := &RecordError{Code: codes.Code(r.ErrorCode), Message: r.ErrorMessage}
				if retryableRecord(rerr.Code) {
					retry = append(retry, f)
					lastErr = rerr
					continue
				}
				f.err, f.at = rerr, now
			}
			if len(retry) == 0 {
				return
			}
			if len(retry) != len(todo) {
				todo = retry
				req = &catenapb.ProduceRequest{Stream: p.stream, ProducerId: p.id, Request: r.num, Records: make([]*catenapb.ProduceRecord, len(todo))}
				for i, f := range todo {
					req.Records[i] = &f.pr
				}
			}
		}
		// Retry with backoff and jitter, within the deadline.
		sleep := backoff/2 + mrand.N(backoff/2+1)
		backoff = min(2*backoff, p.opts.MaxRetryBackoff)
		if now.Add(sleep).After(deadline) {
			resolveErr(todo, &RetryTimeoutError{Attempts: attempt, Elapsed: now.Sub(created), Last: lastErr}, now)
			return
		}
		t := time.NewTimer(sleep)
		select {
		case <-t.C:
		case <-p.ctx.Done():
			t.Stop()
			resolveErr(todo, fmt.Errorf("catena: producer aborted: %w", lastErr), time.Now())
			return
		}
	}
}

func resolveErr(fs []*Future, err error, at time.Time) {
	for _, f := range fs {
		f.err, f.at = err, at
	}
}

// complete publishes r's results and releases its buffer space.
func (p *Producer) complete(r *request) {
	for _, b := range r.batches {
		b.futs = nil // let resolved futures be collected independently
		close(b.done)
	}
	close(r.done)
	p.mu.Lock()
	for _, b := range r.batches {
		p.buffered -= b.bytes
		delete(p.live, b)
	}
	close(p.spaceCh)
	p.spaceCh = make(chan struct{})
	p.mu.Unlock()
}
