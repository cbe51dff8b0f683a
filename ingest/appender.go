package ingest

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/internal/writetrace"
	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
)

const (
	// appenderMaxInFlight bounds requests sent to a head and not yet
	// answered, per partition; more waiting records are merged into the
	// next request, so load turns into larger batches rather than more.
	// One: whatever arrives during a chain round trip goes in the next
	// append, as one frame, one write and one forward on every member.
	// With 8, at 9.3k records/s of 1 KiB (4 producers, 4 partitions) the
	// heads took ~2k appends/s of one or two records each and the CPU was
	// busy with their per-message costs: the head's commit time was
	// 12-15 ms (each fsync 2 ms) and the producers' p50/p99 26-36/76-136
	// ms. With 1: commit 7 ms, p50/p99 18-19/64-74 ms, and full speed
	// unchanged (70-75k records/s), three runs each on the same 2 cores.
	appenderMaxInFlight = 1
	// stallAfter is how long an append may go unanswered (by default:
	// Options.StallAfter) before the
	// appender asks discovery, every stallAfter, whether its chain has
	// moved on: a head that hangs (paused, cut off) never fails the
	// stream, and waiting for the periodic round (1 s) after the chain
	// master's reconfiguration kept an isolated head's partition from
	// writes for 3.2 s in the fault campaign. Rounds are shared by every
	// partition and one runs at a time, so a stalled cluster costs a few
	// Status calls per replica per second, not one per partition.
	stallAfter = 150 * time.Millisecond
	// headReportTimeout bounds a report of an unreachable head.
	headReportTimeout = 300 * time.Millisecond
	// retryOrderHold is how long a producer's later records stay parked
	// at a partition after ingestion failed some of its records there, or
	// after the latest of their retries came (see heldBack). A producer
	// retries within its MaxRetryBackoff (1 s by default) of each failure;
	// past it, the producer is taken to have given up on the failed
	// records, and the parked ones go.
	retryOrderHold = 5 * time.Second
	// maxHeldBack bounds the failed chunks remembered per producer and
	// partition; past it the producer's order there is no longer held
	// (the head still refuses what would take it back).
	maxHeldBack = 1024
)

// headKey names a head under one epoch: how long appends have failed is
// counted per head and epoch, never carried over to a new head.
type headKey struct {
	id    string
	epoch uint64
}

func keyOf(pr *partitionRoute) headKey { return headKey{pr.head().GetId(), pr.epoch} }

// errChainMoved ends a session whose chain has a newer epoch in the route
// table: the table is already fresh, so the next session starts at once.
type errChainMoved struct {
	stream    string
	partition uint32
	from, to  uint64
}

func (e *errChainMoved) Error() string {
	return fmt.Sprintf("chain of partition %s/%d moved from epoch %d to %d", e.stream, e.partition, e.from, e.to)
}

// chunk is one produce request's records for one partition.
type chunk struct {
	recs     []partlog.Record // aliasing the produce request
	bytes    int
	headers  int       // the records' headers, all together
	queued   time.Time // when its produce request arrived
	deadline time.Time
	offsets  []uint64
	dups     []bool
	err      error
	done     chan struct{}
	// alone: the head refused an append that carried it with others; it
	// is sent in an append of its own, so that only the one at fault fails.
	alone bool
	// inOrder: its producer resends in order itself (EnqueueInOrder); held
	// back, it is refused rather than parked.
	inOrder bool
}

func (c *chunk) fail(err error) {
	c.err = err
	close(c.done)
}

// sent is one AppendRequest on the wire and the chunks it carries.
type sent struct {
	id     uint64
	chunks []*chunk
	req    *catenapb.AppendRequest
	at     time.Time // last sent to a head
	// assigned: the head's first answer gave the chunks their offsets,
	// under epoch; the records are committed once a completion of that
	// epoch reaches end (one past the highest offset).
	assigned   bool
	epoch, end uint64
}

// count is the number of records s carries.
func (s *sent) count() int {
	n := 0
	for _, c := range s.chunks {
		n += len(c.recs)
	}
	return n
}

// build (re)makes s's request from its chunks: their records as one log
// frame under epoch 0 at offset 0, which the head checks, gives its epoch
// and offsets, and writes without decoding a message per record or
// encoding them again. Only the run goroutine calls it.
func (a *appender) build(s *sent) error {
	all := a.scratch[:0]
	size := partlog.FrameHeaderSize
	for _, c := range s.chunks {
		all = append(all, c.recs...)
		size += c.bytes + len(c.recs)*partlog.MaxRecordOverhead
	}
	defer func() { clear(all); a.scratch = all[:0] }() // keep the slice, not the records' bytes
	frame, err := partlog.AppendBatch(a.buffer(size), 0, 0, all)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "partition %s/%d: records cannot be sent as one batch: %v", a.stream, a.partition, err)
	}
	s.req = &catenapb.AppendRequest{Stream: a.stream, Partition: a.partition, RequestId: s.id, Frame: frame}
	return nil
}

// buffer returns an empty buffer of at least size bytes, a recycled one if
// there is one that large: a partition under load sends frames of similar
// sizes, and reusing their memory saves touching fresh pages for each.
func (a *appender) buffer(size int) []byte {
	for i, b := range a.spare {
		if cap(b) >= size {
			a.spare = append(a.spare[:i], a.spare[i+1:]...)
			return b[:0]
		}
	}
	// A power of two, so that the next, slightly larger frame fits too.
	return make([]byte, 0, 1<<bits.Len(uint(size-1)))
}

// recycle keeps an answered request's frame for a later build; the
// largest few are kept.
func (a *appender) recycle(b []byte) {
	if cap(b) == 0 {
		return
	}
	if len(a.spare) < maxSpareFrames {
		a.spare = append(a.spare, b)
		return
	}
	for i := range a.spare {
		if cap(a.spare[i]) < cap(b) {
			a.spare[i] = b
			return
		}
	}
}

// maxSpareFrames bounds the recycled frames an appender keeps.
const maxSpareFrames = 2

// fail fails every chunk of s with err.
func (s *sent) fail(err error) {
	for _, c := range s.chunks {
		c.fail(err)
	}
}

// appender sends one partition's records to the head of its chain, in
// queue order, over an AppendStream. After any failure it re-learns the
// chain and re-sends everything unanswered, in the same order, before
// anything new: the head's de-duplication turns what it already stored into
// duplicates with their original offsets, so order and exactly-once both
// hold across head changes.
type appender struct {
	srv       *Server
	stream    string
	partition uint32
	metrics   appenderMetrics

	mu     sync.Mutex
	queue  []*chunk
	wake   chan struct{}
	nextID uint64
	// held: producers some of whose records this partition failed with an
	// error they retry, and whose later records wait for those retries;
	// heldTimer wakes the run goroutine when the earliest hold lapses.
	held      map[uint64]*heldBack
	heldTimer *time.Timer

	// scratch gathers a request's records while it is encoded; spare holds
	// answered requests' frames for reuse.
	scratch []partlog.Record
	spare   [][]byte

	// progressed: the current session had an answer from the head (only
	// the run goroutine touches it).
	progressed bool
	// route is the route the latest session used (nil: none known).
	// downSince is when sessions to the head downOf names began failing
	// without an answer (zero while one answers); lastReport when a head
	// was last reported unreachable. Only the run goroutine touches them.
	route                 *partitionRoute
	downOf                headKey
	downSince, lastReport time.Time
	// roundTrip is a moving average of this partition's appends' times
	// from send to completion (run goroutine only): how long an answered
	// append waits for its chain when nothing is wrong (refreshAfter).
	roundTrip time.Duration
	// committed is the highest committed offset this appender has had
	// records acknowledged up to: reads through this ingestion must see
	// them from then on (Fetch).
	committed atomic.Uint64
}

// acknowledged records that the partition is committed up to c.
func (a *appender) acknowledged(c uint64) {
	for old := a.committed.Load(); c > old && !a.committed.CompareAndSwap(old, c); old = a.committed.Load() {
	}
}

// assign takes the head's answer (early or final) of s: its offsets.
func (s *sent) assign(resp *catenapb.AppendResponse) {
	k := 0
	for _, c := range s.chunks {
		n := len(c.recs)
		c.offsets, c.dups = resp.GetOffsets()[k:k+n], resp.GetDuplicate()[k:k+n]
		k += n
	}
	s.assigned, s.epoch, s.end = true, resp.GetEpoch(), slices.Max(resp.GetOffsets())+1
}

// complete answers s's producers: its records are committed up to
// committed, as the tail's completion (byTail) or the head's answer said.
func (a *appender) complete(s *sent, committed uint64, byTail bool) {
	writetrace.Mark(writetrace.IngestDone, a.partition, s.end)
	took := time.Since(s.at)
	a.roundTrip += (took - a.roundTrip) / 8
	a.metrics.appendSeconds.Observe(took.Seconds())
	a.metrics.appends.Inc()
	if byTail {
		a.metrics.byTail.Inc()
	} else {
		a.metrics.byHead.Inc()
	}
	a.metrics.records.Add(float64(s.count()))
	a.acknowledged(committed)
	for _, c := range s.chunks {
		close(c.done)
	}
	// Answered: nothing refers to its frame any more (gRPC copied it when
	// it was sent).
	a.recycle(s.req.GetFrame())
}

func newAppender(srv *Server, stream string, partition uint32) *appender {
	a := &appender{srv: srv, stream: stream, partition: partition, metrics: srv.metrics.forPartition(stream, partition), wake: make(chan struct{}, 1)}
	go a.run()
	return a
}

// enqueue queues c in its producer's sequence order: before the first
// queued chunk of the same producer that starts at a higher sequence. A
// producer retries each request on its own, so the retry of an unanswered
// request can arrive after the request sent next; sent in arrival order,
// the later records would be stored first. (What was already sent is not
// reordered: the head refuses the retry then, and says why.) A retry that
// its producer's parked chunks wait for lets them go (heldBack).
func (a *appender) enqueue(c *chunk) {
	a.mu.Lock()
	now := time.Now()
	a.releaseLocked(c, now)
	if c.inOrder && a.parkedLocked(c, now) {
		err := a.heldError(c, now)
		a.mu.Unlock()
		c.fail(err)
		return
	}
	a.insertLocked(c)
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// insertLocked queues c before the first queued chunk of its producer that
// starts at a higher sequence (at the end if none does). Callers hold a.mu.
func (a *appender) insertLocked(c *chunk) {
	at := len(a.queue)
	if p, first := chunkProducer(c); p != 0 {
		for i, q := range a.queue {
			if qp, qfirst := chunkProducer(q); qp == p && qfirst > first {
				at = i
				break
			}
		}
	}
	a.queue = slices.Insert(a.queue, at, c)
}

// heldBack is what a partition remembers of a producer some of whose
// records it failed with an error the producer retries (its chain below
// the minimum length, no head in time): the first sequences of those
// chunks, whose retries have not come yet. The producer's later records
// must not reach the partition before those retries: the head would store
// them and then refuse each retry as taking the producer back
// (OUT_OF_RANGE), failing records the producer was only asked to retry. So
// the producer's later chunks are parked in the queue (take passes them
// over; in flight, they are taken back into it) until the retry of the
// earliest failed chunk is queued, then the next. A parked chunk waits,
// answered when it is stored, and is not refused: refusing it made it a
// retry in turn, and a producer that kept sending formed a train of
// requests each refused once, which never drained. Kafka's idempotent
// producer keeps the same order by per-partition sequences, the broker
// refusing a batch whose predecessor it lacks; a Catena producer numbers
// its records per producer, so only the node that failed the records
// knows that the gap is one.
type heldBack struct {
	pending []uint64 // ascending
	// until is when the hold lapses: retryOrderHold after the latest
	// failure or retry, so that a producer that gave up on its records
	// does not park the rest for longer.
	until time.Time
}

// holdBackLocked remembers that c, a chunk of a producer, failed and will
// be retried. Records sent without a producer id are ingestion's own
// (retried under new sequences, in no order to keep). Callers hold a.mu.
func (a *appender) holdBackLocked(c *chunk, now time.Time) {
	p, first := chunkProducer(c)
	if p == 0 || p == a.srv.ownProducer {
		return
	}
	if a.held == nil {
		a.held = map[uint64]*heldBack{}
	}
	h, _, _ := a.heldLocked(c, now) // a lapsed hold is gone
	if h == nil {
		h = &heldBack{}
		a.held[p] = h
	}
	a.extendLocked(h, now)
	i, found := slices.BinarySearch(h.pending, first)
	if found {
		return
	}
	if len(h.pending) >= maxHeldBack {
		delete(a.held, p)
		return
	}
	h.pending = slices.Insert(h.pending, i, first)
}

// extendLocked moves h's lapse to retryOrderHold from now. Callers hold
// a.mu.
func (a *appender) extendLocked(h *heldBack, now time.Time) {
	h.until = now.Add(retryOrderHold)
	a.armHeldTimerLocked(now)
}

// armHeldTimerLocked drops lapsed holds and arranges for the run goroutine
// to be woken when the earliest of the others lapses: chunks parked by it
// may go then, and nothing else would wake it. Callers hold a.mu.
func (a *appender) armHeldTimerLocked(now time.Time) {
	var next time.Time
	for p, h := range a.held {
		switch {
		case now.After(h.until):
			delete(a.held, p)
		case next.IsZero() || h.until.Before(next):
			next = h.until
		}
	}
	if next.IsZero() {
		if a.heldTimer != nil {
			a.heldTimer.Stop()
		}
		return
	}
	d := next.Sub(now) + time.Millisecond
	if a.heldTimer == nil {
		a.heldTimer = time.AfterFunc(d, func() {
			select {
			case a.wake <- struct{}{}:
			default:
			}
		})
		return
	}
	a.heldTimer.Reset(d)
}

// heldError is the error of an in-order producer's chunk held back behind
// the retry of an earlier one (ABORTED: Kafka's NOT_LEADER_FOR_PARTITION,
// which producers retry). Callers hold a.mu.
func (a *appender) heldError(c *chunk, now time.Time) error {
	h, p, _ := a.heldLocked(c, now)
	return status.Errorf(codes.Aborted, "partition %s/%d: producer %d's earlier sequence %d failed here and has not been retried yet; retry this record after it",
		a.stream, a.partition, p, h.pending[0])
}

// heldLocked returns c's producer's hold, if it has one that has not
// lapsed (one that has is dropped). Callers hold a.mu.
func (a *appender) heldLocked(c *chunk, now time.Time) (*heldBack, uint64, uint64) {
	p, first := chunkProducer(c)
	h := a.held[p]
	if p == 0 || h == nil {
		return nil, p, first
	}
	if now.After(h.until) {
		delete(a.held, p)
		return nil, p, first
	}
	return h, p, first
}

// parkedLocked reports whether c waits for the retry of an earlier chunk
// of its producer. Callers hold a.mu.
func (a *appender) parkedLocked(c *chunk, now time.Time) bool {
	h, _, first := a.heldLocked(c, now)
	return h != nil && first > h.pending[0]
}

// releaseLocked takes c, if it starts at or before the earliest failed
// chunk its producer's hold waits for, as that chunk's retry: every failed
// chunk it covers is no longer waited for. Callers hold a.mu.
func (a *appender) releaseLocked(c *chunk, now time.Time) {
	h, p, first := a.heldLocked(c, now)
	if h == nil || first > h.pending[0] {
		return
	}
	last := first
	for _, r := range c.recs {
		last = max(last, r.Sequence)
	}
	i, _ := slices.BinarySearch(h.pending, last+1)
	if i == 0 {
		return // an older chunk (a duplicate, or one before the failures)
	}
	h.pending = h.pending[i:]
	if len(h.pending) == 0 {
		delete(a.held, p)
		a.armHeldTimerLocked(now)
		return
	}
	a.extendLocked(h, now) // the producer is retrying: wait for the rest
}

// holdBack fails failed, chunks taken out of inflight and the queue, with
// cause, an error their producers retry, having first parked those
// producers' later records: their chunks in inflight that come later in
// their order are taken back into the queue (they may have been stored;
// sent again after the retries, they are answered as duplicates), and
// later chunks queued stay there until the retries come. A retry already
// in flight or queued counts as come. It returns the survivors of
// inflight. Only the run goroutine calls it.
func (a *appender) holdBack(failed []*chunk, cause error, inflight []*sent) []*sent {
	now := time.Now()
	a.mu.Lock()
	for _, c := range failed {
		a.holdBackLocked(c, now)
	}
	// held reports whether c now waits for an earlier chunk's retry; an
	// in-order producer's chunk is refused then (refused).
	var refused []*chunk
	var refusedErrs []error
	held := func(c *chunk) bool {
		a.releaseLocked(c, now)
		if !a.parkedLocked(c, now) {
			return false
		}
		if c.inOrder {
			refused, refusedErrs = append(refused, c), append(refusedErrs, a.heldError(c, now))
		}
		return true
	}
	var parked []*chunk // taken back from the requests in flight
	out, changed := dropChunks(inflight, func(c *chunk) bool {
		if !held(c) {
			return false
		}
		if !c.inOrder {
			parked = append(parked, c)
		}
		return true
	})
	q := a.queue[:0]
	for _, c := range a.queue {
		if held(c) && c.inOrder {
			continue // refused; parked ones stay where they are
		}
		q = append(q, c)
	}
	clear(a.queue[len(q):])
	a.queue = q
	// Each at its place in its producer's order, behind a retry already
	// queued.
	for _, c := range parked {
		a.insertLocked(c)
	}
	a.mu.Unlock()
	for _, c := range failed {
		c.fail(cause)
	}
	for i, c := range refused {
		c.fail(refusedErrs[i])
	}
	return a.rebuild(out, changed)
}

// dropChunks removes from each request of inflight the chunks drop reports,
// and returns the requests left and those of them that lost chunks.
func dropChunks(inflight []*sent, drop func(*chunk) bool) (out, changed []*sent) {
	out = inflight[:0]
	for _, s := range inflight {
		keep := s.chunks[:0]
		for _, c := range s.chunks {
			if !drop(c) {
				keep = append(keep, c)
			}
		}
		if len(keep) == 0 {
			continue
		}
		if len(keep) != len(s.chunks) {
			clear(s.chunks[len(keep):])
			s.chunks = keep
			changed = append(changed, s)
		}
		out = append(out, s)
	}
	return out, changed
}

// rebuild makes the requests of changed, unanswered ones that lost chunks,
// again from the rest, and returns out without those it could not make
// (their chunks failed). Only the run goroutine calls it.
func (a *appender) rebuild(out, changed []*sent) []*sent {
	if len(changed) == 0 {
		return out
	}
	final := out[:0]
	for _, s := range out {
		if slices.Contains(changed, s) {
			a.recycle(s.req.GetFrame()) // unanswered, and about to be replaced
			if err := a.build(s); err != nil {
				s.fail(err)
				continue
			}
		}
		final = append(final, s)
	}
	return final
}

// take removes queued chunks, up to maxAppendBytes, into one request;
// chunks parked behind their producer's retries stay (nil: none to take).
func (a *appender) take() *sent {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.queue) == 0 {
		return nil
	}
	var now time.Time
	if len(a.held) > 0 {
		now = time.Now()
		a.armHeldTimerLocked(now) // drops lapsed holds
	}
	s := &sent{}
	size, count, headers := 0, 0, 0
	// skipped: producers one of whose chunks is parked; their later chunks
	// stay too, whatever the queue's order.
	var skipped map[uint64]bool
	// last is each producer's highest sequence in the request so far: a
	// chunk that would take a producer back (overlapping retries) waits
	// for the next request, since the head refuses such a request whole.
	var last map[uint64]uint64
	rest := a.queue[:0] // what stays queued, in order
	i := 0
	for ; i < len(a.queue); i++ {
		c := a.queue[i]
		if len(a.held) > 0 {
			// In its producer's order: a retry queued behind another
			// one (its original failed later, by its deadline) is come
			// once that one is.
			p, _ := chunkProducer(c)
			if !skipped[p] {
				a.releaseLocked(c, now)
			}
			if skipped[p] || a.parkedLocked(c, now) {
				if skipped == nil {
					skipped = map[uint64]bool{}
				}
				skipped[p] = true
				rest = append(rest, c)
				continue
			}
		}
		if n := len(s.chunks); n > 0 && (size+c.bytes > maxAppendBytes || count+len(c.recs) > partlog.MaxBatchRecords ||
			headers+c.headers > partlog.MaxBatchHeaders || c.alone || s.chunks[n-1].alone) {
			break
		}
		if p, first := chunkProducer(c); p != 0 {
			if l, ok := last[p]; ok && first <= l {
				break
			}
			if last == nil {
				last = map[uint64]uint64{}
			}
			for _, r := range c.recs {
				last[p] = max(last[p], r.Sequence)
			}
		}
		s.chunks = append(s.chunks, c)
		size += c.bytes
		count += len(c.recs)
		headers += c.headers
	}
	if len(rest) == 0 {
		a.queue = a.queue[i:] // nothing parked: the queue's tail, as it is
	} else {
		rest = append(rest, a.queue[i:]...)
		clear(a.queue[len(rest):])
		a.queue = rest
	}
	if len(a.queue) == 0 {
		a.queue = nil
	}
	if len(s.chunks) == 0 {
		return nil
	}
	a.nextID++
	s.id = a.nextID
	return s
}

// chunkProducer is the producer of c's records (one produce request has
// one) and its first sequence; 0 for records without a producer.
func chunkProducer(c *chunk) (producer, first uint64) {
	if len(c.recs) == 0 {
		return 0, 0
	}
	return c.recs[0].ProducerID, c.recs[0].Sequence
}

// expire fails queued and unanswered chunks past their deadline, keeping
// the rest in order. Returns the survivors of inflight.
func (a *appender) expire(inflight []*sent, now time.Time, cause error) []*sent {
	var expired []*chunk
	gone := func(c *chunk) bool {
		if now.After(c.deadline) {
			expired = append(expired, c) // failed by holdBack
			return true
		}
		return false
	}
	out := a.rebuild(dropChunks(inflight, gone))
	a.mu.Lock()
	q := a.queue[:0]
	for _, c := range a.queue {
		if !gone(c) {
			q = append(q, c)
		}
	}
	clear(a.queue[len(q):])
	a.queue = q
	a.mu.Unlock()
	if len(expired) == 0 {
		return out
	}
	return a.holdBack(expired, status.Errorf(codes.Unavailable, "partition %s/%d: no chain head accepted the records in time: %v", a.stream, a.partition, cause), out)
}

// connect waits until conn, to the head of pr, is ready. Opening a stream
// on a connection that is still connecting waits for the attempt, and an
// attempt to a head cut off mid-connection (its packets dropped) lasts the
// connect timeout, 5 s: the fault campaign saw isolated heads keep their
// partitions from writes for 5.05 s that way. So the wait watches, every
// stallAfter, for the chain to have moved on (errChainMoved), and reports
// the head as a stalled append does meanwhile.
func (a *appender) connect(ctx context.Context, conn *grpc.ClientConn, pr *partitionRoute) error {
	start := time.Now()
	if !a.downSince.IsZero() && a.downOf == keyOf(pr) {
		start = a.downSince
	}
	for {
		st := conn.GetState()
		switch st {
		case connectivity.Ready:
			return nil
		case connectivity.Idle:
			conn.Connect()
		case connectivity.TransientFailure, connectivity.Shutdown:
			return fmt.Errorf("head %s is unreachable (connection %s)", pr.head().GetId(), st)
		}
		wctx, cancel := context.WithTimeout(ctx, a.srv.stallAfter)
		changed := conn.WaitForStateChange(wctx, st)
		cancel()
		if err := ctx.Err(); err != nil {
			return err
		}
		if changed {
			continue
		}
		if err := a.movedFrom(pr); err != nil {
			return err
		}
		a.srv.disc.requestRefresh()
		a.reportHead(pr, time.Since(start))
	}
}

// refreshAfter is how long s may go unanswered before the appender asks
// discovery for a round (every replica's Status) in case its chain moved.
// A head that has not assigned s's offsets may hang: stallAfter. One that
// has is reachable and s waits for its chain, which on a loaded machine
// takes as long as the partition's appends usually take; asking after
// stallAfter then made every slow partition start a round. Over 256
// partitions at full speed that was 140 rounds in 18 s, each a Status of
// every partition on every replica and a wake-up of every appender. So an
// assigned append waits four of its partition's usual round trips, at
// least stallAfter and at most the discovery interval, when the periodic
// round asks anyway.
func (a *appender) refreshAfter(s *sent) time.Duration {
	if !s.assigned {
		return a.srv.stallAfter
	}
	return min(max(4*a.roundTrip, a.srv.stallAfter), a.srv.disc.interval)
}

// movedFrom is an errChainMoved when the latest route table has a newer
// epoch for the partition than pr, else nil.
func (a *appender) movedFrom(pr *partitionRoute) error {
	if np := a.currentRoute(); np != nil && np.epoch > pr.epoch {
		return &errChainMoved{stream: a.stream, partition: a.partition, from: pr.epoch, to: np.epoch}
	}
	return nil
}

// hasWork reports whether records wait for a head: unanswered or queued.
func (a *appender) hasWork(inflight []*sent) bool {
	if len(inflight) > 0 {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.queue) > 0
}

// currentRoute is the partition's route in the latest table (nil when
// unknown).
func (a *appender) currentRoute() *partitionRoute {
	sr := a.srv.disc.current().streams[a.stream]
	if sr == nil || int(a.partition) >= len(sr.partitions) {
		return nil
	}
	return sr.partitions[a.partition]
}

// silence is how long the head at addr has answered nothing, counted from
// sent (when the oldest unanswered append went to it): a head process that
// answered any partition's append since is reachable, however long this
// partition's append waits for its offsets. On a machine loaded past its
// capacity every append waits, and a per-partition count reported live,
// busy heads, which the master removed from every chain as soon as one
// also missed a probe (TestAHeadThatAnswersOtherPartitionsIsNotReported).
func (a *appender) silence(addr string, sent time.Time) time.Duration {
	return a.srv.heads.SilentSince(addr, sent)
}

// reportHead tells the head's successor in pr that this ingestion node's
// appends to the head have gone unanswered for down (ReportHeadUnreachable),
// at most every stallAfter: the chain's master takes it for a second
// witness against a head that misses its probes, so a dead or cut-off head
// is removed as fast as a middle. Best effort, off the appender's
// goroutine, and gathered with the other chains' reports for the same
// successor into one call (headReporter).
func (a *appender) reportHead(pr *partitionRoute, down time.Duration) {
	if pr == nil || len(pr.members) < 2 || down < a.srv.stallAfter || time.Since(a.lastReport) < a.srv.stallAfter || a.srv.ctx.Err() != nil {
		return
	}
	a.lastReport = time.Now()
	head, succ := pr.members[0], pr.members[1]
	a.srv.reports.add(succ.GetAddr(), head.GetId(), &catenapb.HeadReportChain{Stream: a.stream, Partition: a.partition, Epoch: pr.epoch, DownMs: uint64(down.Milliseconds())})
}

func (a *appender) run() {
	ctx := a.srv.ctx
	var inflight []*sent
	backoff := retryMin
	for ctx.Err() == nil {
		var err error
		a.progressed = false
		inflight, err = a.session(ctx, inflight)
		if ctx.Err() != nil {
			break
		}
		// Back-off grows only across sessions that got nowhere: a session
		// that worked and then lost its head (a failure after a healthy
		// stretch) retries at once, or every failure would cost the full
		// retryMax once a few have happened.
		if err == nil || a.progressed {
			backoff = retryMin
		}
		if a.progressed {
			a.downSince = time.Time{} // a head answered: nothing is down
		}
		if err == nil {
			continue
		}
		a.srv.logger.V(1).Info("Append stream to head ended; re-learning the chain", "stream", a.stream, "partition", a.partition, "error", err.Error())
		inflight = a.expire(inflight, time.Now(), err)
		if moved := (*errChainMoved)(nil); errors.As(err, &moved) {
			continue // the route table names the new head already
		}
		// The head this session used could not take the work: report it
		// (not whatever head the table names now), counting from when
		// sessions to it began failing.
		if pr := a.route; pr != nil && a.hasWork(inflight) {
			if a.downSince.IsZero() || a.downOf != keyOf(pr) {
				a.downSince, a.downOf = time.Now(), keyOf(pr)
			}
			a.reportHead(pr, time.Since(a.downSince))
		}
		ch := a.srv.disc.requestRefresh()
		select {
		case <-ctx.Done():
		case <-ch:
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, retryMax)
	}
	shutdown := status.Error(codes.Unavailable, "ingestion is shutting down")
	for _, s := range inflight {
		for _, c := range s.chunks {
			c.fail(shutdown)
		}
	}
	a.mu.Lock()
	for _, c := range a.queue {
		c.fail(shutdown)
	}
	a.queue = nil
	a.mu.Unlock()
}

// session runs one AppendStream to the current head: re-sends inflight,
// then sends new requests as they come, and resolves chunks as answers
// arrive. It returns the requests still unanswered and why it ended (nil
// when it is merely idle and should be started again).
func (a *appender) session(ctx context.Context, inflight []*sent) ([]*sent, error) {
	// Wait for work before connecting anywhere.
	if len(inflight) == 0 {
		a.mu.Lock()
		idle := len(a.queue) == 0
		a.mu.Unlock()
		if idle {
			select {
			case <-ctx.Done():
				return inflight, nil
			case <-a.wake:
			}
		}
	}
	a.route = nil
	sr := a.srv.disc.current().streams[a.stream]
	if sr == nil || int(a.partition) >= len(sr.partitions) || sr.partitions[a.partition].head() == nil {
		return inflight, fmt.Errorf("partition %s/%d has no known chain", a.stream, a.partition)
	}
	pr := sr.partitions[a.partition]
	a.route = pr
	head := pr.head()
	conn, err := a.srv.pool.Get(head.GetAddr())
	if err != nil {
		return inflight, err
	}
	// run paces the sessions; a head that was down and is back must not
	// wait out gRPC's reconnect back-off on top (see linkOnce).
	conn.ResetConnectBackoff()
	if err := a.connect(ctx, conn, pr); err != nil {
		return inflight, err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := catenapb.NewReplicaClient(conn).AppendStream(sctx)
	if err != nil {
		return inflight, fmt.Errorf("failed to open append stream to %s: %w", head.GetId(), err)
	}
	// Two answers per request: the early one (offsets assigned) and the
	// final one (committed).
	answers := make(chan *catenapb.AppendResponse, 2*appenderMaxInFlight)
	recvErr := make(chan error, 1)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			a.srv.heads.Mark(head.GetAddr())
			select {
			case answers <- resp:
			case <-sctx.Done():
				return
			}
		}
	}()
	// The tail's completions of this epoch: an assigned request's records
	// are committed once one reaches their end, usually well before the
	// head's final answer, which climbs back up the chain
	// (docs/architecture.md, "Completion at the tail"). Nil for a chain of
	// one, whose head answers as soon as it commits.
	completions := a.watchCompletions(sctx, pr)
	send := func(s *sent) error {
		s.req.Epoch = pr.epoch
		s.req.AnswerAssigned = completions != nil
		s.assigned = false
		s.at = time.Now()
		if err := stream.Send(s.req); err != nil {
			return fmt.Errorf("failed to send to head %s: %w", head.GetId(), err)
		}
		return nil
	}
	for _, s := range inflight {
		if err := send(s); err != nil {
			return inflight, err
		}
	}
	// completed is the highest completion heard in this session; requests
	// up to resolvedThrough are answered already (by a completion), so the
	// head's final answers to them are passed over.
	var completed, resolvedThrough uint64
	resolve := func() {
		for len(inflight) > 0 {
			s := inflight[0]
			if !s.assigned || s.epoch != pr.epoch || s.end > completed {
				break
			}
			a.progressed = true
			a.complete(s, completed, true)
			resolvedThrough = s.id
			inflight[0] = nil
			inflight = inflight[1:]
		}
		if len(inflight) == 0 {
			inflight = nil
		}
	}
	// idle ends the session quietly when nothing is in flight or queued
	// for idleStreamTimeout, keeping no stream open for a partition nobody
	// writes to.
	idle := func() bool {
		a.mu.Lock()
		idle := len(inflight) == 0 && len(a.queue) == 0
		a.mu.Unlock()
		if !idle {
			return false
		}
		select {
		case <-a.wake:
			return false
		case <-time.After(idleStreamTimeout):
		case <-ctx.Done():
		}
		return true
	}
	stallTimer := time.NewTimer(a.srv.stallAfter)
	defer stallTimer.Stop()
	var lastKick time.Time
	for {
		for len(inflight) < appenderMaxInFlight {
			s := a.take()
			if s == nil {
				break
			}
			if err := a.build(s); err != nil {
				s.fail(err)
				continue
			}
			inflight = append(inflight, s)
			if err := send(s); err != nil {
				return inflight, err
			}
			for _, c := range s.chunks {
				a.metrics.waitSeconds.Observe(s.at.Sub(c.queued).Seconds())
			}
		}
		var wake <-chan struct{}
		if len(inflight) < appenderMaxInFlight {
			wake = a.wake
		}
		var stalled <-chan time.Time
		if len(inflight) > 0 {
			// Not a timeout: the append stays in flight (and is answered
			// if the head recovers); this only looks for a newer epoch.
			stallTimer.Reset(max(time.Until(inflight[0].at.Add(a.srv.stallAfter)), a.srv.stallAfter-time.Since(lastKick)))
			stalled = stallTimer.C
		}
		select {
		case <-ctx.Done():
			return inflight, nil
		case <-stalled:
			lastKick = time.Now()
			if time.Since(inflight[0].at) >= a.refreshAfter(inflight[0]) {
				a.srv.disc.requestRefresh()
			}
			// A head that assigned the oldest append's offsets answered:
			// it is reachable, and the wait is for its chain (a slow
			// member, a loaded machine), which the master's probes of
			// the members judge. Reporting it then only cost every
			// replica a report per partition per stallAfter under load.
			// So is a head that answers other partitions' appends.
			if !inflight[0].assigned {
				a.reportHead(pr, a.silence(head.GetAddr(), inflight[0].at))
			}
		case <-a.srv.disc.updatedChan():
			// A head that hangs (paused, partitioned) never fails the
			// stream; a newer epoch in the replicas' reports ends it.
			if err := a.movedFrom(pr); err != nil {
				return inflight, err
			}
		case <-wake:
		case err := <-recvErr:
			return inflight, fmt.Errorf("append stream to head %s broke: %w", head.GetId(), err)
		case c := <-completions:
			completed = max(completed, c)
			resolve()
			if idle() {
				return nil, nil
			}
		case resp := <-answers:
			done, failedAll, err := a.answered(resp, head, inflight, resolvedThrough)
			switch {
			case failedAll:
				return nil, err
			case err != nil:
				return inflight, err
			}
			switch {
			case done == nil:
				// An early answer, or the final answer of a request a
				// completion answered.
				resolve()
			case done == inflight[0]:
				inflight[0] = nil
				inflight = inflight[1:]
				if len(inflight) == 0 {
					inflight = nil
				}
			}
			if idle() {
				return nil, nil
			}
		}
	}
}

// answered takes one of the head's answers to the requests in flight:
// an early one assigns a request its offsets (done nil); a final one
// answers the oldest request (done is it), unless a completion answered it
// already (its id at most resolvedThrough: done nil). An error that ends
// the session is returned; failedAll says it failed every request in
// flight (their chunks are failed).
func (a *appender) answered(resp *catenapb.AppendResponse, head *catenapb.Member, inflight []*sent, resolvedThrough uint64) (done *sent, failedAll bool, err error) {
	counts := func(s *sent) error {
		if n := s.count(); len(resp.GetOffsets()) != n || len(resp.GetDuplicate()) != n {
			return fmt.Errorf("head %s answered %d offsets for %d records", head.GetId(), len(resp.GetOffsets()), n)
		}
		return nil
	}
	code := codes.Code(resp.GetErrorCode())
	if resp.GetAssigned() {
		i := slices.IndexFunc(inflight, func(s *sent) bool { return s.id == resp.GetRequestId() })
		if i < 0 || code != codes.OK {
			return nil, false, fmt.Errorf("head %s answered request %d early, which is not in flight", head.GetId(), resp.GetRequestId())
		}
		if err := counts(inflight[i]); err != nil {
			return nil, false, err
		}
		inflight[i].assign(resp)
		a.traceAssigned(inflight[i])
		a.progressed = true
		return nil, false, nil
	}
	if resp.GetRequestId() <= resolvedThrough {
		if code != codes.OK {
			return nil, false, status.Error(code, resp.GetErrorMessage()) // the head ends the stream too
		}
		return nil, false, nil
	}
	if len(inflight) == 0 || resp.GetRequestId() != inflight[0].id {
		return nil, false, fmt.Errorf("head %s answered request %d out of order", head.GetId(), resp.GetRequestId())
	}
	s := inflight[0]
	a.progressed = true
	if code != codes.OK {
		err := status.Error(code, resp.GetErrorMessage())
		if resp.GetErrorReason() == contract.ReasonChainTooShort {
			// The chain is below its minimum length: every request on
			// this stream is refused (the head ends the stream after
			// this answer, storing none of the later ones). The producer
			// gets the head's reason and retries on its own schedule.
			var failed []*chunk
			for _, r := range inflight {
				failed = append(failed, r.chunks...)
			}
			a.holdBack(failed, err, nil)
			return nil, true, err
		}
		if code != codes.InvalidArgument && code != codes.OutOfRange {
			return nil, false, err // the head ends the stream too
		}
		if len(s.chunks) > 1 && len(inflight) == 1 {
			// The head refuses an append whole, for any record in it,
			// and stores nothing: one producer's record out of order (or
			// invalid) must not fail the others merged with it. Nothing
			// later was sent, so the chunks go again, first, one an
			// append.
			a.mu.Lock()
			for _, c := range s.chunks {
				c.alone = true
			}
			a.queue = append(slices.Clone(s.chunks), a.queue...)
			a.mu.Unlock()
			a.recycle(s.req.GetFrame())
			return s, false, nil
		}
		s.fail(err)
		a.recycle(s.req.GetFrame())
		return s, false, nil
	}
	if err := counts(s); err != nil {
		return nil, false, err
	}
	early := s.assigned
	s.assign(resp)
	if !early {
		a.traceAssigned(s) // a chain of one answers once
	}
	a.complete(s, max(resp.GetCommitted(), s.end), false)
	return s, false, nil
}

// traceAssigned marks, once the head assigned s its offsets, when it was
// sent and when that answer came (writetrace names appends by their end).
func (a *appender) traceAssigned(s *sent) {
	if writetrace.On() {
		writetrace.MarkAt(writetrace.IngestSent, a.partition, s.end, s.at)
		writetrace.Mark(writetrace.IngestAssigned, a.partition, s.end)
	}
}

// watchCompletions follows the completions of pr's epoch from its tail,
// until ctx ends, on a channel holding the latest (nil for a chain of one).
// A tail not yet at the epoch (or already past it) refuses; the watch
// tries again, and the head's final answers stand in meanwhile.
func (a *appender) watchCompletions(ctx context.Context, pr *partitionRoute) <-chan uint64 {
	tail := pr.tail()
	if tail == nil || len(pr.members) < 2 {
		return nil
	}
	latest := make(chan uint64, 1)
	push := func(v uint64) {
		// The only sender: after draining, there is room.
		select {
		case latest <- v:
		default:
			select {
			case old := <-latest:
				v = max(v, old)
			default:
			}
			latest <- v
		}
	}
	go func() {
		backoff := retryMin
		for ctx.Err() == nil {
			err := func() error {
				conn, err := a.srv.pool.Get(tail.GetAddr())
				if err != nil {
					return err
				}
				stream, err := catenapb.NewReplicaClient(conn).Completions(ctx, &catenapb.CompletionsRequest{Stream: a.stream, Partition: a.partition, Epoch: pr.epoch})
				if err != nil {
					return err
				}
				for {
					c, err := stream.Recv()
					if err != nil {
						return err
					}
					if c.GetEpoch() == pr.epoch {
						writetrace.Mark(writetrace.IngestCompleted, a.partition, c.GetCommitted())
						push(c.GetCommitted())
						backoff = retryMin
					}
				}
			}()
			if ctx.Err() != nil {
				return
			}
			a.srv.logger.V(1).Info("Completions from the tail ended; the head's answers stand in", "stream", a.stream, "partition", a.partition,
				"tail", tail.GetId(), "epoch", pr.epoch, "error", err.Error())
			switch status.Code(err) {
			case codes.Unimplemented:
				return // a tail older than completions: the head's answers it is
			case codes.FailedPrecondition:
				a.srv.disc.requestRefresh() // the tail is at another epoch
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, retryMax)
		}
	}()
	return latest
}

// idleStreamTimeout closes an append stream unused for this long.
const idleStreamTimeout = 30 * time.Second
