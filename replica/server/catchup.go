package server

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/replica/chain"
	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// Catching up outside the chain. A replica joining a chain (a returning
// one cut back to where it agrees, or an empty one) first copies the
// committed log from a chain member while it is not a member: the chain
// keeps committing at its own pace meanwhile. Only once it is close to the
// committed offset does the master add it at the tail, where the
// replication link sends it the rest; commits wait for it only for that
// short remainder.

const (
	// copyChunkBytes is how much one ReadFrames asks for: one read piece
	// at the source (partlog reads history in 256 KiB preads), and a
	// burst of CPU on both sides short enough that the chain's own work
	// is not queued behind it for long (producer p99 during a copy 3.3-3.9
	// ms with 256 KiB, 4.0-5.4 ms with 1 MiB, at the same copy rate;
	// docs/benchmarks.md).
	copyChunkBytes = 256 << 10
	// maxFramesBytes caps what one ReadFrames answer carries.
	maxFramesBytes = 16 << 20
	// copyWait is how long a ReadFrames long-polls once the copy has
	// reached the source's committed offset.
	copyWait = time.Second
	// copyRetry is the pause after a failed ReadFrames, and copyBusyRetry
	// (plus up to as much again) after one the source refused as busy.
	copyRetry     = 100 * time.Millisecond
	copyBusyRetry = time.Second
	// copySyncBytes is how much a copy appends between fsyncs while it is
	// far behind. A copy is not a member: nothing waits for its
	// durability until it joins, and fewer, larger fsyncs leave the disk
	// to the chain's own. It fsyncs at once when it catches up.
	copySyncBytes = 8 << 20
)

// DefaultCatchUpMiBPerSecond is `catena replica --catch-up-rate`'s default:
// what a replica copies in all while it catches up on partitions outside
// their chains, and what it serves in all to the replicas copying from it. Copying is CPU and disk the chains' writes then wait for:
// on 2 cores with the copy's both ends and the chain in one process, the
// producer's p99 during an uncapped copy (237-298 MiB/s) was 2.2-2.5 times
// what it was before, and at 160 MiB/s 1.65-2.1 times (docs/benchmarks.md,
// "Catch-up of a replacement"). CockroachDB and TiKV cap their snapshot
// and recovery traffic by default for the same reason.
const DefaultCatchUpMiBPerSecond = 160

// newCopyLimit returns the limiter of copies at bytesPerSecond (nil: none).
// A copy waits after each chunk it appended. The burst is a few chunks, so
// that a wait's wake-up late by a fraction of a millisecond (a busy
// machine's timers are) is made up by the next chunks: with a burst of one
// chunk a cap of 150 MiB/s copied at 106-112 MiB/s.
func newCopyLimit(bytesPerSecond int64) *rate.Limiter {
	if bytesPerSecond <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(bytesPerSecond), copyBurstBytes)
}

// copyBurstBytes is the copy limiter's burst.
const copyBurstBytes = 4 * copyChunkBytes

// ReadFrames serves committed frames as stored.
func (s *Server) ReadFrames(ctx context.Context, req *catenapb.ReadFramesRequest) (*catenapb.ReadFramesResponse, error) {
	p, err := s.lookup(req.GetStream(), req.GetPartition())
	if err != nil {
		return nil, err
	}
	maxBytes := int(req.GetMaxBytes())
	if maxBytes <= 0 {
		maxBytes = copyChunkBytes
	}
	maxBytes = min(maxBytes, maxFramesBytes)
	wait := min(time.Duration(req.GetWaitMs())*time.Millisecond, maxReadWait)
	if end := p.log.NextOffset(); req.GetFrom() > end {
		// The reader holds more than this member: their logs diverged
		// (or it asks the wrong member); waiting would not help.
		return nil, status.Errorf(codes.OutOfRange, "partition %s/%d on %s: offset %d is beyond the log end %d", p.stream, p.index, s.id, req.GetFrom(), end)
	}
	committed, err := p.waitPastCommitted(ctx, req.GetFrom(), wait)
	if err != nil {
		return nil, err
	}
	resp := &catenapb.ReadFramesResponse{Committed: committed, LogStart: p.log.StartOffset()}
	p.mu.Lock()
	resp.Holds = p.holds.pbHolds()
	p.mu.Unlock()
	if req.GetFrom() >= committed {
		return resp, nil
	}
	granted := maxBytes
	if req.GetHistory() {
		// Several replicas returning at once (after a power cut, say)
		// all copy from the survivors, each at its own cap: paced here
		// too, the copies a replica serves share one cap. Before the
		// read, so that a busy source reads nothing it cannot send.
		if granted, err = s.reserveServe(ctx, maxBytes); err != nil {
			return nil, err
		}
		maxBytes = granted
	}
	frames, err := p.committedFrames(req.GetFrom(), committed, maxBytes)
	if err != nil {
		return nil, err
	}
	resp.Frames = frames
	var n int
	for _, fr := range frames {
		n += len(fr)
	}
	if req.GetHistory() && n > granted && s.serveLimit != nil {
		// One frame larger than the grant (a frame is served whole):
		// charged to the next reads, not waited for here.
		s.serveLimit.ReserveN(time.Now(), min(n-granted, s.serveLimit.Burst()))
	}
	p.m.bytesOut.Add(float64(n))
	return resp, nil
}

const (
	// maxServeWait bounds how long a history read waits for the serve
	// limiter, and serveMargin is left of the reader's deadline for the
	// read and the answer.
	maxServeWait = 5 * time.Second
	serveMargin  = time.Second
)

// reserveServe waits until the serve limiter lets a history read of up to
// want bytes through, and returns how much it may read (want, or the
// limiter's burst if less). A read that would wait past the reader's
// deadline (or maxServeWait) is refused at once, RESOURCE_EXHAUSTED with
// nothing read or reserved: more copies read from this replica than its
// cap serves in that time, and the copier backs off.
func (s *Server) reserveServe(ctx context.Context, want int) (int, error) {
	lim := s.serveLimit
	if lim == nil {
		return want, nil
	}
	n := min(want, lim.Burst())
	r := lim.ReserveN(time.Now(), n)
	if !r.OK() {
		return n, nil // not for n <= burst
	}
	limit := maxServeWait
	if d, ok := ctx.Deadline(); ok {
		limit = min(limit, time.Until(d)-serveMargin)
	}
	delay := r.Delay()
	if delay > limit {
		r.Cancel()
		s.metrics.serveRefused.Inc()
		return 0, status.Errorf(codes.ResourceExhausted, "replica %s serves history to the replicas copying from it at %.0f MiB/s in all (its catch-up rate), and the reads queued ahead of this one would hold it %v; retry later",
			s.id, float64(lim.Limit())/(1<<20), delay.Round(time.Millisecond))
	}
	if delay > 0 {
		s.metrics.serveWaitSeconds.Add(delay.Seconds())
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			r.Cancel()
			return 0, status.FromContextError(ctx.Err()).Err()
		}
	}
	return n, nil
}

// copier is a running copy from a source.
type copier struct {
	source, addr string
	// start is the log end when the copy began: past it, the log holds
	// what the copy took from source (PartitionStatus.copy).
	start  uint64
	cancel context.CancelFunc
	done   chan struct{}
}

func (c *copier) running() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// CatchUp starts (or keeps) this replica copying a partition from a chain
// member while it is outside the chain.
func (s *Server) CatchUp(ctx context.Context, req *catenapb.CatchUpRequest) (*catenapb.PartitionStatus, error) {
	cfg := req.GetChain()
	if cfg == nil || req.GetSourceId() == "" || req.GetSourceAddr() == "" {
		return nil, status.Error(codes.InvalidArgument, "catch up: the chain, the source id and the source address are required")
	}
	var members []string
	for _, m := range cfg.GetMembers() {
		members = append(members, m.GetId())
	}
	switch {
	case slices.Contains(members, s.id):
		return nil, status.Errorf(codes.FailedPrecondition, "catch up %s/%d: %s is a member of the chain at epoch %d; members receive records through their link", cfg.GetStream(), cfg.GetPartition(), s.id, cfg.GetEpoch())
	case !slices.Contains(members, req.GetSourceId()):
		return nil, status.Errorf(codes.InvalidArgument, "catch up %s/%d: source %q is not a member of the chain at epoch %d", cfg.GetStream(), cfg.GetPartition(), req.GetSourceId(), cfg.GetEpoch())
	}
	// Knowing the chain it is outside of, the replica has no role: it
	// refuses appends and links, and Copied accepts what it copies.
	if _, err := s.Configure(ctx, cfg); err != nil {
		return nil, err
	}
	p, err := s.lookup(cfg.GetStream(), cfg.GetPartition())
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usable(); err != nil {
		return nil, err
	}
	if st := p.core.Status(); st.Role != chain.RoleNone {
		return nil, status.Errorf(codes.FailedPrecondition, "catch up %s/%d: %s is %s of the chain at epoch %d", p.stream, p.index, s.id, st.Role, st.Epoch)
	}
	if c := p.copy; c != nil && c.running() {
		if c.source == req.GetSourceId() && c.addr == req.GetSourceAddr() {
			return p.statusLocked(), nil
		}
		c.cancel()
	}
	cctx, cancel := context.WithCancel(context.Background())
	c := &copier{source: req.GetSourceId(), addr: req.GetSourceAddr(), start: p.log.NextOffset(), cancel: cancel, done: make(chan struct{})}
	p.copy = c
	p.wg.Add(1)
	go p.copyFrom(cctx, c)
	p.logger.Info("Catching up outside the chain", "source", c.source, "from", p.log.NextOffset(), "epoch", p.core.Status().Epoch)
	return p.statusLocked(), nil
}

// copyFrom copies committed frames from the source until this replica
// becomes a member, the copy is cancelled (another source, Drop, Close) or
// the source cannot serve what comes next.
func (p *partition) copyFrom(ctx context.Context, c *copier) {
	defer p.wg.Done()
	defer close(c.done)
	defer c.cancel()
	logger := p.logger.WithValues("source", c.source)
	conn, err := p.srv.pool.Get(c.addr)
	if err != nil {
		logger.Error(err, "Cannot reach the catch-up source")
		return
	}
	rc := catenapb.NewReplicaClient(conn)
	started := time.Now()
	p.mu.Lock()
	first := p.log.NextOffset() // where the copy starts, for the log line
	p.mu.Unlock()
	var bytes, unsynced int64
	// backlog is the source's committed offset when the copy began: the
	// copy is paced below it only (pace). What the chain commits
	// meanwhile is copied as fast as it comes, so that a copy always
	// closes in on its chain, however many copies share the cap and
	// however fast the chain is written; the cap bounds the history copied
	// on top of the chain's own traffic.
	var backlog uint64
	for {
		p.mu.Lock()
		if p.failed != nil || p.core.Status().Role != chain.RoleNone {
			end, role := p.log.NextOffset(), p.core.Status().Role
			p.mu.Unlock()
			if elapsed := time.Since(started); bytes > 0 {
				logger.Info("Caught up outside the chain", "copiedRecords", end-first, "copiedBytes", bytes, "seconds", elapsed.Seconds(),
					"MiBPerSecond", float64(bytes)/(1<<20)/elapsed.Seconds(), "role", role.String())
			}
			return
		}
		from := p.log.NextOffset()
		p.mu.Unlock()

		wait := p.srv.copyWait
		rctx, cancel := context.WithTimeout(ctx, wait+10*time.Second)
		// The first read is not history: it learns where history ends,
		// and a replica that missed a few records is not queued behind
		// the full copies a busy source serves.
		history := backlog != 0 && from < backlog
		resp, err := rc.ReadFrames(rctx, &catenapb.ReadFramesRequest{Stream: p.stream, Partition: p.index, From: from, MaxBytes: copyChunkBytes, WaitMs: uint32(wait / time.Millisecond), History: history})
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case status.Code(err) == codes.OutOfRange:
			// Either the source no longer holds what comes next here
			// (retention trimmed it: start again where its log starts) or
			// this copy holds more than the source (their logs diverged:
			// the master cuts it back or drops it).
			reset, rerr := p.resetBelowSource(ctx, rc, from)
			if rerr != nil || !reset {
				logger.Info("The catch-up source cannot serve the next offset; stopping", "from", from, "reason", err.Error(), "resetError", rerr)
				return
			}
			backlog = 0 // history ends where the source's committed offset is now
			continue
		case status.Code(err) == codes.ResourceExhausted:
			// The source serves more copies than its cap lets through
			// before this read's deadline: ask again later, at a time of
			// its own so that the copies waiting do not come back together.
			select {
			case <-time.After(copyBusyRetry + rand.N(copyBusyRetry)):
			case <-ctx.Done():
				return
			}
			continue
		case err != nil:
			select {
			case <-time.After(copyRetry):
			case <-ctx.Done():
				return
			}
			continue
		}
		// Holds first: the copy must keep whatever the chain keeps before
		// its retention can see what it copied.
		if err := p.adoptHolds(resp.GetHolds()); err != nil {
			logger.Error(err, "Stopping catch-up: cannot store the source's consumer holds")
			return
		}
		n, err := p.appendCopied(resp)
		if err != nil {
			logger.Error(err, "Stopping catch-up")
			return
		}
		bytes += n
		unsynced += n
		p.mu.Lock()
		caughtUp := p.log.NextOffset() >= resp.GetCommitted()
		if unsynced > 0 && (caughtUp || unsynced >= copySyncBytes) {
			p.appended()
			unsynced = 0
		}
		p.mu.Unlock()
		if backlog == 0 {
			backlog = resp.GetCommitted()
		}
		if from >= backlog {
			continue
		}
		if err := pace(ctx, p.srv.copyLimit, n); err != nil {
			return
		}
	}
}

// pace waits until lim lets n more bytes through (at once when lim is
// nil): copyLimit, this replica's copies together. It fails only when ctx
// ends.
func pace(ctx context.Context, lim *rate.Limiter, n int64) error {
	if lim == nil {
		return nil
	}
	for n > 0 {
		k := min(n, int64(lim.Burst()))
		if err := lim.WaitN(ctx, int(k)); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// resetBelowSource starts this copy's log again at the source's log start
// when it ends below it (retention at the source trimmed past it while it
// was away, or it starts empty on a trimmed partition). It reports whether
// it reset.
func (p *partition) resetBelowSource(ctx context.Context, rc catenapb.ReplicaClient, from uint64) (bool, error) {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	idx := p.index
	resp, err := rc.Status(sctx, &catenapb.StatusRequest{Stream: p.stream, Partition: &idx})
	if err != nil {
		return false, err
	}
	var src *catenapb.PartitionStatus
	for _, ps := range resp.GetPartitions() {
		if ps.GetStream() == p.stream && ps.GetPartition() == p.index && ps.GetError() == "" {
			src = ps
		}
	}
	if src == nil || src.GetLogStart() <= from {
		return false, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usable(); err != nil {
		return false, err
	}
	if st := p.core.Status(); st.Role != chain.RoleNone || p.log.NextOffset() != from {
		return false, nil // joined, or moved, meanwhile
	}
	start, sum := src.GetLogStart(), src.GetLogStartChecksum()
	if err := p.log.Reset(start, sum); err != nil {
		if errors.Is(err, partlog.ErrFailed) {
			go p.crashStop(fmt.Errorf("failed to reset partition %s/%d: %w", p.stream, p.index, err))
		}
		return false, err
	}
	// As after a truncation: the core, de-duplication and forwarding
	// state describe the old log.
	p.truncations.Add(1)
	p.dedup, p.dedupSaved = newDedupTable(), 0
	p.recent, p.recentBytes = nil, 0
	p.core = chain.New(p.srv.id, start)
	if p.meta != nil {
		eff, err := p.core.Configure(chain.Config{Epoch: p.meta.Epoch, Members: p.meta.memberIDs(), Committed: p.committed})
		if err != nil {
			return false, coreStatus(err, p)
		}
		p.apply(eff)
	}
	p.m.logEnd.Set(float64(start))
	p.logger.Info("Copy ends below the source's log start; starting the log again there", "from", from, "logStart", start, "logStartChecksum", sum)
	return true, nil
}

// appendCopied appends the frames of one ReadFrames answer.
func (p *partition) appendCopied(resp *catenapb.ReadFramesResponse) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usable(); err != nil {
		return 0, err
	}
	var n int64
	wrote := false
	for _, fr := range resp.GetFrames() {
		h, recs, err := partlog.DecodeBatchInto(fr, p.recBuf[:0])
		p.recBuf = recs[:0]
		if err != nil {
			return n, fmt.Errorf("malformed frame from the catch-up source: %w", err)
		}
		eff, err := p.core.Copied(h.BaseOffset, uint64(h.Count), resp.GetCommitted())
		if err != nil {
			if errors.Is(err, chain.ErrMember) {
				return n, nil // joined the chain meanwhile: the link takes over
			}
			return n, err
		}
		if eff.Append == nil {
			continue
		}
		if eff.Append.Base != h.BaseOffset || eff.Append.End != h.End() {
			return n, fmt.Errorf("copied frame [%d,%d) overlaps the local log end %d: the logs diverged", h.BaseOffset, h.End(), eff.Append.Base)
		}
		if err := p.log.Append(fr); err != nil {
			go p.crashStop(fmt.Errorf("failed to append a copied frame to partition %s/%d: %w", p.stream, p.index, err))
			return n, err
		}
		p.dedup.addBatch(recs)
		clear(recs)
		p.m.recordsIn.Add(float64(h.Count))
		p.m.bytesIn.Add(float64(len(fr)))
		n += int64(len(fr))
		wrote = true
	}
	if wrote {
		p.m.logEnd.Set(float64(p.log.NextOffset()))
		if p.meta.config.GetDurability() == catenapb.Durability_DURABILITY_INTERVAL {
			p.appended() // durable as written, like a member's
		}
	}
	return n, nil
}
