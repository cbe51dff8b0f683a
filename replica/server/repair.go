package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/internal/durable"
	"github.com/catena-streams/catena/replica/chain"
	"github.com/catena-streams/catena/replica/journal"
	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// Chain repair: the admin calls the chain's master makes to bring a
// returning member back. The master first installs the current chain on the
// returning member (which is not in it, so its role is none), asks a chain
// member where the returning member's last log epoch ended (EpochEnd), cuts
// the returning member's log back there (Truncate) and then adds it at the
// tail under a new epoch, where the link fills it in.

// EpochEnd says where an epoch ended in this replica's log.
func (s *Server) EpochEnd(ctx context.Context, req *catenapb.EpochEndRequest) (*catenapb.EpochEndResponse, error) {
	p, err := s.lookup(req.GetStream(), req.GetPartition())
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed != nil || p.log == nil {
		return nil, p.usable()
	}
	end, err := p.log.EpochEndOffset(req.GetEpoch())
	if err != nil {
		if errors.Is(err, partlog.ErrOutOfRange) {
			return nil, status.Errorf(codes.OutOfRange, "partition %s/%d on %s: %v", p.stream, p.index, s.id, err)
		}
		return nil, status.Errorf(codes.Unavailable, "partition %s/%d on %s: %v", p.stream, p.index, s.id, err)
	}
	resp := &catenapb.EpochEndResponse{EndOffset: end, LogEnd: p.log.NextOffset(), ChainEpoch: p.core.Status().Epoch}
	for _, e := range p.log.Epochs() {
		if e.Epoch > req.GetEpoch() {
			break
		}
		resp.Epoch = e.Epoch
	}
	return resp, nil
}

// Truncate cuts a non-member's log back to req.To, rounded down to a batch
// boundary. It refuses while this replica is a member of the epoch it has
// installed (the master must install a chain without it first) and below
// the committed offset it knows: committed records are on every member and
// never orphans.
func (s *Server) Truncate(ctx context.Context, req *catenapb.TruncateRequest) (*catenapb.PartitionStatus, error) {
	p, err := s.lookup(req.GetStream(), req.GetPartition())
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed != nil || p.log == nil {
		return nil, p.usable()
	}
	st := p.core.Status()
	if st.Role != chain.RoleNone {
		return nil, status.Errorf(codes.FailedPrecondition, "partition %s/%d on %s: replica is %s of the chain at epoch %d; only a replica outside the chain may be truncated", p.stream, p.index, s.id, st.Role, st.Epoch)
	}
	end := p.log.NextOffset()
	to := req.GetTo()
	if to >= end {
		return p.statusLocked(), nil
	}
	if start := p.log.StartOffset(); to < start {
		return nil, status.Errorf(codes.OutOfRange, "partition %s/%d on %s: truncate to %d is below the log start %d", p.stream, p.index, s.id, to, start)
	}
	// Round down to the start of the batch holding to.
	frames, err := p.log.ReadFrames(to, end, 1)
	if err != nil || len(frames) == 0 {
		if errors.Is(err, partlog.ErrCorrupt) {
			p.failed = err
			p.broadcast()
		}
		return nil, status.Errorf(codes.Internal, "partition %s/%d on %s: failed to find the batch holding offset %d: %v", p.stream, p.index, s.id, to, err)
	}
	h, err := partlog.DecodeHeader(frames[0])
	if err != nil {
		return nil, status.Errorf(codes.Internal, "partition %s/%d on %s: %v", p.stream, p.index, s.id, err)
	}
	cut := h.BaseOffset
	if committed := max(st.Committed, p.committed); cut < committed {
		return nil, status.Errorf(codes.FailedPrecondition, "partition %s/%d on %s: truncating to %d (batch boundary at or below %d) would cut committed offsets below %d", p.stream, p.index, s.id, cut, to, committed)
	}
	if err := p.log.Truncate(cut); err != nil {
		switch {
		case errors.Is(err, partlog.ErrFailed):
			// The log is in an unknown state on disk: stop, as a failed fsync does.
			go p.crashStop(fmt.Errorf("failed to truncate partition %s/%d: %w", p.stream, p.index, err))
		case errors.Is(err, partlog.ErrCorrupt):
			// Damage the cut read (a segment opened from its summary is
			// read whole first): not served, and replaced.
			p.failed = err
			p.broadcast()
		}
		return nil, status.Errorf(codes.Internal, "partition %s/%d on %s: truncate to %d: %v", p.stream, p.index, s.id, cut, err)
	}
	// A sync that read the log end before the cut must not report it
	// durable now (the log may grow again past the cut before it reports).
	p.truncations.Add(1)
	p.dedup.truncate(cut)
	p.dedupSaved = 0
	p.recent, p.recentBytes = nil, 0
	// The core has no truncation: rebuild it over the shorter log and
	// reinstall the installed configuration (where this replica has no role).
	p.core = chain.New(s.id, cut)
	if p.meta != nil {
		eff, err := p.core.Configure(chain.Config{Epoch: p.meta.Epoch, Members: p.meta.memberIDs(), Committed: p.committed})
		if err != nil {
			return nil, coreStatus(err, p)
		}
		p.apply(eff)
	}
	p.fwdEnd, p.ackUp = 0, 0
	p.m.logEnd.Set(float64(cut))
	p.broadcast()
	p.logger.Info("Truncated partition log for chain repair", "from", end, "to", cut, "requested", to, "epoch", st.Epoch)
	return p.statusLocked(), nil
}

// lastLogEpoch is the epoch of the log's last batch (0: empty).
func lastLogEpoch(l *partlog.Log) uint64 {
	eps := l.Epochs()
	if len(eps) == 0 || l.NextOffset() == l.StartOffset() {
		return 0
	}
	return eps[len(eps)-1].Epoch
}

// errDropped stops a partition that Drop is deleting: calls that found it
// before it left the table are refused rather than served from a log being
// removed.
var errDropped = errors.New("partition was dropped from this replica")

// droppedPrefix marks a partition directory being removed: Drop renames it
// first (one atomic step), so that a crash half-way through the removal
// leaves a directory that openExisting skips and removes, never a
// partially deleted log that would be opened as a corrupt one.
const droppedPrefix = ".dropped-"

// Drop deletes this replica's copy of a partition. It refuses when the
// replica has installed a newer epoch than the request's, or is a member of
// the chain at the request's epoch (unless the stream is deleted): a
// member at an older epoch was replaced while away and never told.
func (s *Server) Drop(ctx context.Context, req *catenapb.DropRequest) (*catenapb.DropResponse, error) {
	if !nameRE.MatchString(req.GetStream()) || len(req.GetStream()) > maxNameLen {
		return nil, status.Errorf(codes.InvalidArgument, "drop: stream name %q must be 1-%d lowercase letters, digits or '-'", req.GetStream(), maxNameLen)
	}
	key := partKey{req.GetStream(), req.GetPartition()}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, status.Error(codes.Unavailable, "replica is shutting down")
	}
	p := s.partitions[key]
	if p == nil {
		s.mu.Unlock()
		return &catenapb.DropResponse{}, nil
	}
	// holdsMu first (its order before mu): a hold being written finishes
	// before the directory is renamed away, and none is written after
	// (updateHolds refuses a failed partition). Released before close,
	// which waits for a catch-up copy that may be adopting holds.
	p.holdsMu.Lock()
	p.mu.Lock()
	var epoch uint64
	member := false
	if p.meta != nil {
		epoch = p.meta.Epoch
		member = slices.Contains(p.meta.memberIDs(), s.id)
	}
	switch {
	case epoch > req.GetEpoch():
		p.mu.Unlock()
		p.holdsMu.Unlock()
		s.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "drop %s/%d on %s: the replica has installed epoch %d, newer than the drop's %d", p.stream, p.index, s.id, epoch, req.GetEpoch())
	case member && epoch == req.GetEpoch() && !req.GetStreamDeleted():
		// A membership of an older epoch is one the master has replaced.
		p.mu.Unlock()
		p.holdsMu.Unlock()
		s.mu.Unlock()
		return nil, status.Errorf(codes.FailedPrecondition, "drop %s/%d on %s: the replica is a member of the chain at epoch %d; only a replica outside the chain may drop its copy", p.stream, p.index, s.id, epoch)
	}
	p.failed = errDropped
	p.broadcast()
	p.mu.Unlock()
	p.holdsMu.Unlock()
	delete(s.partitions, key)
	s.dropping[key] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.dropping, key)
		s.mu.Unlock()
	}()

	p.close()
	if s.store != nil {
		// Durable before the directory goes: recovery then never takes
		// the directory, or what is left of it, for a partition to open.
		if err := s.store.Drop(journal.PartitionID{Stream: p.stream, Partition: p.index}); err != nil {
			// The journal failed: every partition's appends fail from
			// now on, and the process must stop, as on a failed fsync.
			go s.fatal(fmt.Errorf("drop %s/%d: %w", p.stream, p.index, err))
			return nil, status.Errorf(codes.Internal, "drop %s/%d on %s: %v", p.stream, p.index, s.id, err)
		}
	}
	if s.beforeDropRename != nil {
		s.beforeDropRename()
	}
	gone := filepath.Join(filepath.Dir(p.dir), fmt.Sprintf("%s%s-%d", droppedPrefix, filepath.Base(p.dir), time.Now().UnixNano()))
	if err := os.Rename(p.dir, gone); err != nil {
		return nil, status.Errorf(codes.Internal, "drop %s/%d on %s: %v", p.stream, p.index, s.id, err)
	}
	if err := durable.SyncDir(filepath.Dir(p.dir)); err != nil {
		return nil, status.Errorf(codes.Internal, "drop %s/%d on %s: %v", p.stream, p.index, s.id, err)
	}
	if err := os.RemoveAll(gone); err != nil {
		// Renamed away: it no longer exists as a partition, and the next
		// start removes it.
		p.logger.Error(err, "Failed to remove a dropped partition's files", "dir", gone)
	}
	s.metrics.forget(p.stream, p.index)
	p.logger.Info("Dropped partition", "epoch", epoch, "requestEpoch", req.GetEpoch(), "streamDeleted", req.GetStreamDeleted(), "wasMember", member)
	return &catenapb.DropResponse{Dropped: true}, nil
}
