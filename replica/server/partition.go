package server

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/internal/writetrace"
	"github.com/catena-streams/catena/replica/chain"
	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
	"github.com/catena-streams/catena/rpc/headers"
)

// partition drives one partition replica: it owns the log, feeds the pure
// chain core with events and carries out the effects the core returns, in
// the core's order: persist, forward, acknowledge, publish.
type partition struct {
	srv    *Server
	stream string
	index  uint32
	dir    string
	log    *partlog.Log
	logger logr.Logger
	m      *partitionMetrics

	syncReq chan struct{} // capacity 1: "something was appended"
	// syncEvery carries a new fsync interval to the sync loop (0: fsync
	// per group commit); capacity 1, the latest value wins.
	syncEvery chan time.Duration
	stop      chan struct{} // closed when the partition shuts down
	wg        sync.WaitGroup

	mu    sync.Mutex
	core  *chain.Replica
	meta  *chainMeta
	dedup *dedupTable
	// dedupSaved is the log end of the last de-duplication snapshot
	// written or loaded (0: none).
	dedupSaved uint64
	committed  uint64 // mirror of the core's committed offset, for readers
	// committedExact is false while a partition restored after a crash
	// has only its recorded committed offset, which may lag what it knew
	// (see committedTableFile); a new epoch brings the chain's.
	committedExact bool
	// legacyCommitted: the committed offset came from a version-1
	// per-partition record, removed once the replica's table holds it
	// (set at start-up, then committedMu).
	legacyCommitted bool
	fwdEnd          uint64 // what the core has released for forwarding
	ackUp           uint64 // what the core has released for acknowledging upstream
	changed         chan struct{}
	failed          error // non-nil: the partition refuses to serve (corrupt, crash-stopped)
	linkStop        context.CancelFunc
	inBuf           []partlog.Record
	freshBuf        []partlog.Record
	freshIdx        []int
	recBuf          []partlog.Record // decoded records of a forwarded frame, reused
	// copy is the catch-up copy outside the chain, if one was started.
	copy *copier
	// linkDownSince is when the link to the successor of the current epoch
	// went down (or was started and is not up yet); zero while it is up or
	// there is no successor. Status reports it to the master.
	linkDownSince time.Time
	// linkErr is why the link last failed (nil while it is up).
	linkErr error
	// stalledSince is when the successor last acknowledged, while records
	// forwarded to it are unacknowledged (zero: none outstanding).
	stalledSince time.Time
	// recent holds frames appended here and not yet sent to the successor,
	// so the link forwards them from memory rather than reading them back
	// from the log; it falls back to the log (catch-up, a reset link) when
	// the frames it needs are not here.
	recent       []recentFrame
	recentBytes  int
	hasSuccessor bool // under the current epoch; set with the link
	// restored is set while the partition runs on the membership it
	// reopened from its volume, with neighbours, and no epoch installed
	// since. A crash or a power cut can have cost it writes that a neighbour
	// kept, or cost a neighbour writes it kept (members sync in parallel),
	// and at the same epoch equal lengths do not mean equal records. So it
	// takes no write, forwards nothing and accepts no link until the chain's
	// master, having compared the members' logs, installs a new epoch.
	restored bool
	// headReports are ingestion nodes' latest reports that the head (this
	// member's predecessor) cannot be reached, by reporter.
	headReports map[string]headReport
	// holdsMu serialises changes of holds (each persisted before it is
	// published) with retention, which must see every hold stored before
	// it trims. Taken before mu, never while holding it.
	holdsMu sync.Mutex
	// holds are the consumer holds and forced trims: written with holdsMu
	// and mu held, read under either.
	holds holdState
	// truncations counts log truncations (chain repair): a sync that began
	// before one must not report durability after it.
	truncations atomic.Uint64
}

type partitionStatus = catenapb.PartitionStatus

type recentFrame struct {
	base, end uint64
	b         []byte
}

// recentMaxBytes bounds the frames kept for forwarding from memory.
const recentMaxBytes = 64 << 20

// remember keeps a frame for the link if this member has a successor.
// Callers hold p.mu.
func (p *partition) remember(base, end uint64, frame []byte) {
	if !p.hasSuccessor {
		return
	}
	p.recent = append(p.recent, recentFrame{base, end, frame})
	p.recentBytes += len(frame)
	for p.recentBytes > recentMaxBytes && len(p.recent) > 0 {
		p.recentBytes -= len(p.recent[0].b)
		p.recent[0] = recentFrame{}
		p.recent = p.recent[1:]
	}
}

// takeRecent returns remembered frames starting exactly at from and ending
// at or before end, up to about maxBytes, and forgets frames before from.
// Callers hold p.mu.
func (p *partition) takeRecent(from, end uint64, maxBytes int) [][]byte {
	i := 0
	for i < len(p.recent) && p.recent[i].end <= from {
		p.recentBytes -= len(p.recent[i].b)
		p.recent[i] = recentFrame{}
		i++
	}
	p.recent = p.recent[i:]
	if len(p.recent) == 0 || p.recent[0].base != from {
		return nil
	}
	var out [][]byte
	size := 0
	for _, f := range p.recent {
		if f.end > end || (len(out) > 0 && size+len(f.b) > maxBytes) {
			break
		}
		out = append(out, f.b)
		size += len(f.b)
	}
	return out
}

// broadcast wakes everyone waiting for a change. Callers hold p.mu.
func (p *partition) broadcast() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// apply carries out the publishing side of the core's effects. Append
// effects are handled by the caller, which holds the bytes. Callers hold p.mu.
func (p *partition) apply(eff chain.Effects) {
	changed := false
	for _, r := range eff.Forward {
		if r.End > p.fwdEnd {
			p.fwdEnd = r.End
			changed = true
			if p.stalledSince.IsZero() {
				p.stalledSince = time.Now()
			}
		}
	}
	if eff.AckUpstream != nil && *eff.AckUpstream > p.ackUp {
		p.ackUp = *eff.AckUpstream
		changed = true
	}
	if eff.Committed != nil && *eff.Committed > p.committed {
		p.committed = *eff.Committed
		p.m.committed.Set(float64(p.committed))
		changed = true
	}
	if eff.DurableDown != nil {
		changed = true // the link sends it (read from the core)
	}
	if changed {
		p.broadcast()
	}
}

// applyConfig applies the settings of a (possibly changed) stream config
// that an open partition uses beyond its chain membership: durability and
// the log's segment size and retention. Callers hold p.mu.
func (p *partition) applyConfig(cfg *catenapb.StreamConfig) error {
	if p.log == nil {
		return nil
	}
	opts := logOptions(p.dir, cfg)
	if err := p.log.SetLimits(partlog.Limits{SegmentBytes: opts.SegmentBytes, RetentionBytes: opts.RetentionBytes, RetentionTime: opts.RetentionTime}); err != nil {
		return err
	}
	for {
		select {
		case p.syncEvery <- syncInterval(cfg):
			return nil
		default:
			select { // replace a value the loop has not taken yet
			case <-p.syncEvery:
			default:
			}
		}
	}
}

func (p *partition) requestSync() {
	select {
	case p.syncReq <- struct{}{}:
	default:
	}
}

// syncLoop is the group commit: one fsync covers everything appended since
// the previous one, however many batches that is. Under interval durability
// durability is reported at append, and the loop fsyncs what was appended
// at most once an interval: an append arms a timer for the end of the
// interval since the last fsync, and a partition nobody writes to wakes no
// one. (A ticker per partition woke every partition every interval: with
// 256 partitions and a 1 ms interval, 256,000 wake-ups a second per
// replica, and the 256-partition row of make bench ran slower than with an
// fsync per append, docs/benchmarks.md.)
//
// The interval may change while the partition is open (setSyncInterval: a
// Stream's durability edited live). Every fsync, on the interval too,
// reports what it covered durable, so records appended under fsync
// durability just before a change to interval durability still complete.
func (p *partition) syncLoop(interval time.Duration) {
	defer p.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var (
		armed <-chan time.Time // the timer, while a sync is due on it
		// lastSync starts at the open: a recovered log is durable.
		lastSync = time.Now()
	)
	for {
		select {
		case <-p.stop:
			return
		case d := <-p.syncEvery:
			if d != interval {
				interval = d
				timer.Stop()
				armed = nil
				p.requestSync() // what waits for an fsync gets it now
			}
			continue
		case <-armed:
			armed = nil
		case <-p.syncReq:
			if interval > 0 {
				if armed == nil {
					timer.Reset(max(time.Until(lastSync.Add(interval)), 0))
					armed = timer.C
				}
				continue
			}
		}
		// Let what the append that woke this loop made runnable go first:
		// the link's forward of the same frames above all. An fsync holds
		// this goroutine's P for its whole length, and a process with one
		// P (catena dev gives each its share of the cores, one on two;
		// GOMAXPROCS=1 anywhere) runs nothing else meanwhile. A middle
		// readies its link and then this loop, which the scheduler runs
		// first: the forward sat behind the fsync and reached the tail
		// 150 us later, on the path of every write (docs/benchmarks.md,
		// 2026-12-05, fourth session).
		runtime.Gosched()
		gen := p.truncations.Load()
		end := p.log.NextOffset()
		start := time.Now()
		if err := p.log.Sync(); err != nil {
			p.crashStop(fmt.Errorf("failed to fsync partition %s/%d: %w", p.stream, p.index, err))
			return
		}
		lastSync = start
		if writetrace.On() {
			writetrace.MarkAt(writetrace.SyncStarted, p.index, end, start)
			writetrace.Mark(writetrace.Synced, p.index, end)
		}
		p.m.syncSeconds.Observe(time.Since(start).Seconds())
		p.mu.Lock()
		if p.truncations.Load() == gen {
			p.apply(p.core.Durable(end))
		} else {
			p.requestSync()
		}
		p.mu.Unlock()
		if len(p.syncReq) > 0 {
			// An append waits for the next fsync: zeros can wait.
			continue
		}
		if err := p.log.Preallocate(); err != nil {
			p.crashStop(fmt.Errorf("failed to zero-fill partition %s/%d ahead: %w", p.stream, p.index, err))
			return
		}
	}
}

// appended is called, holding p.mu, after frames were written to the log.
func (p *partition) appended() {
	if p.meta.config.GetDurability() == catenapb.Durability_DURABILITY_INTERVAL {
		// Written on every member is the durability this stream asked
		// for; the sync loop fsyncs it within the interval.
		p.apply(p.core.Durable(p.log.NextOffset()))
	}
	p.requestSync()
}

// crashStop handles a write or fsync failure: its outcome is unknown, so the
// replica must never acknowledge again. The partition stops serving at once
// and the server's fatal handler (by default: exit) takes the process down.
func (p *partition) crashStop(err error) {
	p.mu.Lock()
	if p.failed == nil {
		p.failed = err
		p.broadcast()
	}
	p.mu.Unlock()
	p.srv.fatal(err)
}

// usable returns an error status when the partition cannot serve. Callers hold p.mu.
func (p *partition) usable() error {
	if p.failed != nil {
		if errors.Is(p.failed, partlog.ErrCorrupt) {
			return status.Errorf(codes.DataLoss, "partition %s/%d refuses to serve: %v", p.stream, p.index, p.failed)
		}
		return status.Errorf(codes.Unavailable, "partition %s/%d is stopped: %v", p.stream, p.index, p.failed)
	}
	if p.core == nil || p.meta == nil {
		return status.Errorf(codes.Unavailable, "partition %s/%d is not configured", p.stream, p.index)
	}
	return nil
}

// maxRecordBytes is the stream's record size limit (key plus value).
func (p *partition) maxRecordBytes() int {
	if n := p.meta.config.GetMaxRecordBytes(); n > 0 && int(n) <= partlog.MaxRecordBytes {
		return int(n)
	}
	return partlog.MaxRecordBytes
}

// Append stores a batch at the head and returns once it is committed.
func (p *partition) Append(ctx context.Context, req *catenapb.AppendRequest) (*catenapb.AppendResponse, error) {
	start := time.Now()
	p.mu.Lock()
	cuts := p.truncations.Load()
	resp, epoch, waitEnd, err := p.appendLocked(req)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	if err := p.waitCommitted(ctx, epoch, waitEnd, cuts); err != nil {
		return nil, err
	}
	resp.Committed = p.committed
	p.mu.Unlock()
	p.m.commitSeconds.Observe(time.Since(start).Seconds())
	return resp, nil
}

// appendLocked validates a batch, drops records already stored (idempotent
// retries, answered with their original offsets), assigns offsets to the
// rest and writes them. It returns the response to send once every offset
// below waitEnd is committed under the returned epoch. Nothing is written
// unless every record is valid. Callers hold p.mu.
func (p *partition) appendLocked(req *catenapb.AppendRequest) (resp *catenapb.AppendResponse, epoch, waitEnd uint64, err error) {
	in, sent, err := p.requestRecords(req)
	// Keep the buffer, not the request's bytes its records point to.
	defer func() { clear(in); p.inBuf = in[:0] }()
	if err != nil {
		return nil, 0, 0, err
	}
	n := len(in)
	if n > partlog.MaxBatchRecords {
		return nil, 0, 0, status.Errorf(codes.InvalidArgument, "append of %d records exceeds the limit of %d per batch; split it; nothing was stored", n, partlog.MaxBatchRecords)
	}
	if err := p.usable(); err != nil {
		return nil, 0, 0, err
	}
	limit := p.maxRecordBytes()
	total, headers := 0, 0
	for i := range in {
		sz := partlog.RecordBytes(&in[i])
		if sz > limit {
			return nil, 0, 0, status.Errorf(codes.InvalidArgument, "record %d is %d bytes (key, value and headers), above the stream's limit of %d bytes; nothing was stored", i, sz, limit)
		}
		total += sz
		headers += len(in[i].Headers)
	}
	if headers > partlog.MaxBatchHeaders {
		return nil, 0, 0, status.Errorf(codes.InvalidArgument, "append of %d headers exceeds the limit of %d per batch; split it; nothing was stored", headers, partlog.MaxBatchHeaders)
	}
	if total > maxAppendBytes {
		return nil, 0, 0, status.Errorf(codes.InvalidArgument, "append of %d bytes exceeds the %d-byte batch limit; split it", total, maxAppendBytes)
	}
	epoch = p.meta.Epoch
	if req.GetEpoch() != 0 && req.GetEpoch() != epoch {
		return nil, 0, 0, status.Errorf(codes.FailedPrecondition, "append for epoch %d, but partition %s/%d is at epoch %d", req.GetEpoch(), p.stream, p.index, epoch)
	}
	if role := p.core.Status().Role; role != chain.RoleHead && role != chain.RoleSole {
		return nil, 0, 0, status.Errorf(codes.FailedPrecondition, "replica %s is %s, not head, of partition %s/%d at epoch %d", p.srv.id, role, p.stream, p.index, epoch)
	}
	if need, have := int(p.meta.config.GetMinChainLength()), len(p.meta.Members); have < need {
		st := status.Newf(codes.FailedPrecondition, "%s (epoch %d); nothing was stored", contract.TooShortMessage(p.stream, p.index, have, need), epoch)
		if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: contract.ReasonChainTooShort, Domain: errorDomain}); err == nil {
			st = d
		}
		return nil, 0, 0, st.Err()
	}
	if p.restored {
		return nil, 0, 0, p.restoredError()
	}

	resp = &catenapb.AppendResponse{RequestId: req.GetRequestId(), Offsets: make([]uint64, n), Duplicate: make([]bool, n)}
	fresh := p.freshBuf[:0]
	freshIdx := p.freshIdx[:0]
	type producerSeq struct{ producer, seq uint64 }
	var inRequest map[producerSeq]int // repeats inside one request
	var lastFresh map[uint64]uint64   // each producer's last new sequence in it
	for i := range in {
		producer, seq := in[i].ProducerID, in[i].Sequence
		if producer != 0 {
			off, found, tooOld, outOfOrder := p.dedup.lookup(producer, seq)
			if found {
				resp.Offsets[i], resp.Duplicate[i] = off, true
				waitEnd = max(waitEnd, off+1)
				continue
			}
			if tooOld {
				return nil, 0, 0, status.Errorf(codes.OutOfRange, "sequence %d of producer %d is older than the de-duplication window of partition %s/%d; it cannot be told apart from a stored record; nothing was stored", seq, producer, p.stream, p.index)
			}
			if outOfOrder {
				return nil, 0, 0, status.Errorf(codes.OutOfRange, "sequence %d of producer %d arrived after a later sequence of the same producer was stored in partition %s/%d; storing it would break the producer's order; nothing was stored", seq, producer, p.stream, p.index)
			}
			if j, ok := inRequest[producerSeq{producer, seq}]; ok {
				resp.Duplicate[i] = true
				resp.Offsets[i] = uint64(j) // an index until offsets are known
				continue
			}
			if last, ok := lastFresh[producer]; ok && seq < last {
				// A later record of the producer comes first in this very
				// request (a retry merged behind a request sent after it):
				// stored so, it would follow records produced later.
				return nil, 0, 0, status.Errorf(codes.OutOfRange, "sequence %d of producer %d follows its sequence %d in the same request to partition %s/%d; storing it would break the producer's order; nothing was stored", seq, producer, last, p.stream, p.index)
			}
			if inRequest == nil {
				inRequest, lastFresh = map[producerSeq]int{}, map[uint64]uint64{}
			}
			inRequest[producerSeq{producer, seq}] = i
			lastFresh[producer] = seq
		}
		fresh = append(fresh, in[i])
		freshIdx = append(freshIdx, i)
	}
	// Keep the buffers, not the request's bytes they point to.
	defer func() { clear(fresh); p.freshBuf, p.freshIdx = fresh[:0], freshIdx[:0] }()
	if len(fresh) > 0 {
		base, eff, err := p.core.Propose(uint64(len(fresh)))
		if err != nil {
			return nil, 0, 0, coreStatus(err, p)
		}
		// A fresh buffer per frame: the link may forward it from memory.
		var frame []byte
		if sent != nil && len(fresh) == n {
			// Every record is new: the sender's frame is the one to write,
			// with this epoch and these offsets. The request is this
			// call's alone (gRPC decoded it into fresh memory).
			frame, err = sent, partlog.Reframe(sent, epoch, base)
		} else {
			frame, err = partlog.AppendBatch(nil, epoch, base, fresh) // sized exactly, one allocation
		}
		if err != nil {
			// Every limit was checked before the offsets were assigned, so
			// this is a broken invariant, and the core has moved on.
			go p.crashStop(fmt.Errorf("failed to encode a batch of partition %s/%d after assigning its offsets: %w", p.stream, p.index, err))
			return nil, 0, 0, status.Errorf(codes.Internal, "replica %s stopped: failed to encode a checked batch: %v", p.srv.id, err)
		}
		if err := p.log.Append(frame); err != nil {
			// The offsets were assigned in the core but the write failed with
			// an unknown outcome: only a crash-stop keeps the chain honest.
			go p.crashStop(fmt.Errorf("failed to append to partition %s/%d: %w", p.stream, p.index, err))
			return nil, 0, 0, status.Errorf(codes.Unavailable, "replica %s stopped: append failed", p.srv.id)
		}
		for k, idx := range freshIdx {
			off := base + uint64(k)
			resp.Offsets[idx] = off
			p.dedup.add(fresh[k].ProducerID, fresh[k].Sequence, off)
		}
		p.remember(base, base+uint64(len(fresh)), frame)
		waitEnd = max(waitEnd, base+uint64(len(fresh)))
		p.m.recordsIn.Add(float64(len(fresh)))
		p.m.bytesIn.Add(float64(len(frame)))
		p.m.logEnd.Set(float64(base + uint64(len(fresh))))
		p.apply(eff)
		p.appended()
	}
	if inRequest != nil {
		for i := range in {
			if j, ok := inRequest[producerSeq{in[i].ProducerID, in[i].Sequence}]; ok && j != i && resp.Duplicate[i] {
				resp.Offsets[i] = resp.Offsets[j]
			}
		}
	}
	return resp, epoch, waitEnd, nil
}

// requestRecords returns an append's records, aliasing the request: its
// frame checked and decoded (and the frame, which the head may write as it
// came), or its record messages, a zero timestamp set to now.
func (p *partition) requestRecords(req *catenapb.AppendRequest) ([]partlog.Record, []byte, error) {
	in := p.inBuf[:0]
	msgs, frame := req.GetRecords(), req.GetFrame()
	switch {
	case len(msgs) > 0 && len(frame) > 0:
		return in, nil, status.Error(codes.InvalidArgument, "append carries both records and a frame; send one; nothing was stored")
	case len(frame) > 0:
		h, in, err := partlog.DecodeBatchInto(frame, in)
		if err == nil && (h.Epoch != 0 || h.BaseOffset != 0) {
			err = fmt.Errorf("frame at epoch %d, base offset %d: a sender's frame has both 0", h.Epoch, h.BaseOffset)
		}
		if err != nil {
			clear(in[:cap(in)]) // a frame that failed to decode may have filled some past len
			return in, nil, status.Errorf(codes.InvalidArgument, "append frame for partition %s/%d is malformed: %v; nothing was stored", p.stream, p.index, err)
		}
		return in, frame, nil
	case len(msgs) == 0:
		return in, nil, status.Error(codes.InvalidArgument, "append carries no records")
	}
	now := time.Now().UnixMilli()
	for _, r := range msgs {
		ts := r.GetTimestampMs()
		if ts == 0 {
			ts = now
		}
		in = append(in, partlog.Record{TimestampMs: ts, ProducerID: r.GetProducerId(), Sequence: r.GetSequence(), Key: r.GetKey(), Value: r.GetValue(), Headers: headers.ToLog(r.GetHeaders())})
	}
	return in, nil, nil
}

// waitCommitted waits, holding p.mu on entry and on a nil return, until
// offsets below end are committed. It gives up when this replica stops being
// head under the epoch the append was made in: whether the records survive
// is then for the new chain to decide, and the producer's idempotent retry
// finds out.
func (p *partition) waitCommitted(ctx context.Context, epoch, end, cuts uint64) error {
	for {
		done, ch, err := p.commitState(epoch, end, cuts)
		switch {
		case err != nil:
			p.mu.Unlock()
			return err
		case done:
			return nil
		}
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-p.stop:
			return status.Errorf(codes.Unavailable, "replica %s is shutting down", p.srv.id)
		}
		p.mu.Lock()
	}
}

// commitState says whether records below end, appended here under epoch
// when the log had been cut cuts times (p.truncations), are committed; if not, the channel that closes at the next change, or
// why they never will be through this replica (it stopped, or the chain
// was reconfigured without it at the head). Callers hold p.mu.
func (p *partition) commitState(epoch, end, cuts uint64) (done bool, changed <-chan struct{}, err error) {
	if p.truncations.Load() != cuts {
		// Cut since the append (a repair outside the chain): what lies at
		// those offsets now may be other records, committed or not.
		return false, nil, status.Errorf(codes.Unavailable, "partition %s/%d's log was cut since the write was appended; retry", p.stream, p.index)
	}
	if p.committed >= end {
		return true, nil, nil
	}
	if err := p.usable(); err != nil {
		return false, nil, err
	}
	select {
	case <-p.stop:
		return false, nil, status.Errorf(codes.Unavailable, "replica %s is shutting down", p.srv.id)
	default:
	}
	if p.meta.Epoch != epoch {
		if st := p.core.Status(); st.Role != chain.RoleHead && st.Role != chain.RoleSole {
			return false, nil, status.Errorf(codes.Unavailable, "chain of partition %s/%d was reconfigured (epoch %d to %d) before the write completed; retry", p.stream, p.index, epoch, p.meta.Epoch)
		}
	}
	return false, p.changed, nil
}

// errorDomain names Catena in gRPC ErrorInfo details.
const errorDomain = "streams.catena.io"

// errorReason returns the ErrorInfo reason carried by err, if any.
func errorReason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// permanent reports whether an append error is final for the records it
// names (bad input, an out-of-order or too old sequence): a retry would
// fail the same way. Other errors (not head, another epoch, stopping) are
// cured by re-learning the chain and retrying.
func permanent(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.OutOfRange:
		return true
	}
	return false
}

// maxAppendBytes bounds the records of one Append; ingestion splits larger
// produce requests. It stays well below partlog.MaxFrameBytes.
const maxAppendBytes = 8 << 20

// coreStatus maps a chain core error to a gRPC status naming the partition.
func coreStatus(err error, p *partition) error {
	code := codes.FailedPrecondition
	switch {
	case errors.Is(err, chain.ErrFutureEpoch):
		code = codes.Unavailable
	case errors.Is(err, chain.ErrGap), errors.Is(err, chain.ErrBehind):
		code = codes.Aborted
	}
	return status.Errorf(code, "partition %s/%d on replica %s: %v", p.stream, p.index, p.srv.id, err)
}

// restoredError is the refusal of a write or link while restored.
func (p *partition) restoredError() error {
	return status.Errorf(codes.Unavailable, "partition %s/%d on %s was reopened from its volume at epoch %d; until its chain's master installs a new epoch it takes no writes or links and serves nothing past the committed offset %d it recorded", p.stream, p.index, p.srv.id, p.core.Status().Epoch, p.committed)
}
