package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/internal/durable"
	"github.com/catena-streams/catena/replica/chain"
	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
)

// Consumer holds. A consumer (an aggregation, a checkpoint reader) says
// "I still need partition P from offset O on" with HoldRetention; retention
// then deletes only segments wholly below the lowest hold, unless the
// stream's hard limits (StreamConfig.hard_retention_*) are exceeded, in
// which case the trim is recorded as a ForcedTrim. Holds live in a small
// file in the partition's directory (holdsFile, storage-format.md §10),
// rewritten atomically on every change, so they go with the partition when
// it is dropped.

const (
	// holdsFile holds a partition's consumer holds and forced trims.
	holdsFile = "holds.json"
	// holdsFileVersion is the version of holdsFile's format.
	holdsFileVersion = 1
	// maxHoldsPerPartition bounds the holds of one partition.
	maxHoldsPerPartition = contract.MaxHoldsPerPartition
	// maxForcedTrims bounds the forced trims kept per partition; the oldest
	// go first.
	maxForcedTrims = 64
	// maxHoldsFileBytes bounds what readHolds reads.
	maxHoldsFileBytes = 4 << 20
)

// holdState is a partition's holds and forced trims, as stored in
// holdsFile.
type holdState struct {
	Version     int          `json:"version"`
	Holds       []holdRecord `json:"holds"`
	ForcedTrims []trimRecord `json:"forcedTrims"`
}

type holdRecord struct {
	Consumer string `json:"consumer"`
	Offset   uint64 `json:"offset"`
}

type trimRecord struct {
	Consumer   string `json:"consumer"`
	HoldOffset uint64 `json:"holdOffset"`
	LogStart   uint64 `json:"logStart"`
	TimeMs     int64  `json:"timeMs"`
}

// clone returns a deep copy.
func (h holdState) clone() holdState {
	return holdState{Version: h.Version, Holds: slices.Clone(h.Holds), ForcedTrims: slices.Clone(h.ForcedTrims)}
}

// lowest is the lowest offset held (math.MaxUint64: none).
func (h *holdState) lowest() uint64 {
	low := uint64(math.MaxUint64)
	for _, r := range h.Holds {
		low = min(low, r.Offset)
	}
	return low
}

// set sets a consumer's hold, keeping Holds sorted by consumer. It reports
// whether anything changed.
func (h *holdState) set(consumer string, offset uint64) bool {
	i, found := slices.BinarySearchFunc(h.Holds, consumer, func(r holdRecord, c string) int { return strings.Compare(r.Consumer, c) })
	if found {
		if h.Holds[i].Offset == offset {
			return false
		}
		h.Holds[i].Offset = offset
		return true
	}
	h.Holds = slices.Insert(h.Holds, i, holdRecord{consumer, offset})
	return true
}

// release removes a consumer's hold and forced trims; it reports whether
// the consumer had a hold.
func (h *holdState) release(consumer string) (held, changed bool) {
	n := len(h.Holds)
	h.Holds = slices.DeleteFunc(h.Holds, func(r holdRecord) bool { return r.Consumer == consumer })
	m := len(h.ForcedTrims)
	h.ForcedTrims = slices.DeleteFunc(h.ForcedTrims, func(r trimRecord) bool { return r.Consumer == consumer })
	return len(h.Holds) < n, len(h.Holds) < n || len(h.ForcedTrims) < m
}

// recordForcedTrim records that the log now starts at logStart, past the
// holds below it: one record per consumer and hold offset, updated by a
// later trim of the same hold. It returns the holds trimmed past.
func (h *holdState) recordForcedTrim(logStart uint64, now time.Time) []holdRecord {
	var lost []holdRecord
	for _, r := range h.Holds {
		if r.Offset >= logStart {
			continue
		}
		lost = append(lost, r)
		i := slices.IndexFunc(h.ForcedTrims, func(t trimRecord) bool { return t.Consumer == r.Consumer && t.HoldOffset == r.Offset })
		if i >= 0 {
			h.ForcedTrims = slices.Delete(h.ForcedTrims, i, i+1)
		}
		h.ForcedTrims = append(h.ForcedTrims, trimRecord{Consumer: r.Consumer, HoldOffset: r.Offset, LogStart: logStart, TimeMs: now.UnixMilli()})
	}
	if n := len(h.ForcedTrims); n > maxForcedTrims {
		h.ForcedTrims = slices.Delete(h.ForcedTrims, 0, n-maxForcedTrims)
	}
	return lost
}

func (h *holdState) pbHolds() []*catenapb.ConsumerHold {
	out := make([]*catenapb.ConsumerHold, len(h.Holds))
	for i, r := range h.Holds {
		out[i] = &catenapb.ConsumerHold{Consumer: r.Consumer, Offset: r.Offset}
	}
	return out
}

func (h *holdState) pbForcedTrims() []*catenapb.ForcedTrim {
	out := make([]*catenapb.ForcedTrim, len(h.ForcedTrims))
	for i, r := range h.ForcedTrims {
		out[i] = &catenapb.ForcedTrim{Consumer: r.Consumer, HoldOffset: r.HoldOffset, LogStart: r.LogStart, TimeMs: r.TimeMs}
	}
	return out
}

// writeHolds replaces dir's holdsFile atomically: temp file, fsync,
// rename, fsync dir.
func writeHolds(dir string, h holdState) error {
	h.Version = holdsFileVersion
	b, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return fmt.Errorf("failed to encode consumer holds: %w", err)
	}
	return durable.WriteFile(dir, holdsFile, b, 0o644)
}

// readHolds loads dir's holdsFile; a missing file is no holds. A file that
// does not decode is an error: guessing would let retention delete what a
// consumer holds.
func readHolds(dir string) (holdState, error) {
	path := filepath.Join(dir, holdsFile)
	b, err := readSmallFile(path, maxHoldsFileBytes)
	if errors.Is(err, os.ErrNotExist) {
		return holdState{Version: holdsFileVersion}, nil
	}
	if err != nil {
		return holdState{}, err
	}
	var h holdState
	if err := json.Unmarshal(b, &h); err != nil {
		return holdState{}, fmt.Errorf("failed to decode %s: %w", path, err)
	}
	if h.Version != holdsFileVersion {
		return holdState{}, fmt.Errorf("%s has version %d; this replica reads version %d", path, h.Version, holdsFileVersion)
	}
	for _, r := range h.Holds {
		if err := contract.ValidateConsumer(r.Consumer); err != nil {
			return holdState{}, fmt.Errorf("%s: %w", path, err)
		}
	}
	sort.Slice(h.Holds, func(i, j int) bool { return h.Holds[i].Consumer < h.Holds[j].Consumer })
	return h, nil
}

// updateHolds applies f to a copy of the partition's holds and, when f
// reports a change, persists the copy before publishing it: a hold is in
// force (and acknowledged) only once durable. A partition that refuses to
// serve (corrupt, unreadable holds, dropped) takes no change: its file is
// evidence, or is gone. Callers must not hold p.mu.
func (p *partition) updateHolds(f func(h *holdState) (changed bool, err error)) error {
	p.holdsMu.Lock()
	defer p.holdsMu.Unlock()
	p.mu.Lock()
	failed := p.failed != nil
	err := p.usable()
	p.mu.Unlock()
	if failed {
		return err
	}
	next := p.holds.clone()
	changed, err := f(&next)
	if err != nil || !changed {
		return err
	}
	if err := writeHolds(p.dir, next); err != nil {
		return err
	}
	p.mu.Lock()
	p.holds = next
	p.mu.Unlock()
	return nil
}

// HoldRetention sets a consumer's hold on a hosted partition.
func (s *Server) HoldRetention(ctx context.Context, req *catenapb.HoldRetentionRequest) (*catenapb.PartitionStatus, error) {
	if err := contract.ValidateConsumer(req.GetConsumer()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "hold retention of %s/%d: %v; nothing was stored", req.GetStream(), req.GetPartition(), err)
	}
	p, err := s.lookup(req.GetStream(), req.GetPartition())
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	err = p.usable()
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	err = p.updateHolds(func(h *holdState) (bool, error) {
		if !slices.ContainsFunc(h.Holds, func(r holdRecord) bool { return r.Consumer == req.GetConsumer() }) && len(h.Holds) >= maxHoldsPerPartition {
			return false, status.Errorf(codes.ResourceExhausted, "hold retention of %s/%d: the partition has %d holds, the most it keeps; release one first", p.stream, p.index, len(h.Holds))
		}
		return h.set(req.GetConsumer(), req.GetOffset()), nil
	})
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Errorf(codes.Internal, "hold retention of %s/%d: %v", p.stream, p.index, err)
	}
	p.logger.V(1).Info("Set consumer hold", "consumer", req.GetConsumer(), "offset", req.GetOffset())
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statusLocked(), nil
}

// ReleaseRetention removes a consumer's hold from one or every hosted
// partition of a stream.
func (s *Server) ReleaseRetention(ctx context.Context, req *catenapb.ReleaseRetentionRequest) (*catenapb.ReleaseRetentionResponse, error) {
	if err := contract.ValidateConsumer(req.GetConsumer()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "release retention of stream %s: %v; nothing was released", req.GetStream(), err)
	}
	var parts []*partition
	if req.Partition != nil {
		p, err := s.lookup(req.GetStream(), req.GetPartition())
		if err != nil {
			return nil, err
		}
		parts = append(parts, p)
	} else {
		s.mu.Lock()
		for k, p := range s.partitions {
			if k.stream == req.GetStream() {
				parts = append(parts, p)
			}
		}
		s.mu.Unlock()
		sort.Slice(parts, func(i, j int) bool { return parts[i].index < parts[j].index })
	}
	resp := &catenapb.ReleaseRetentionResponse{}
	for _, p := range parts {
		var held bool
		err := p.updateHolds(func(h *holdState) (bool, error) {
			var changed bool
			held, changed = h.release(req.GetConsumer())
			return changed, nil
		})
		if _, ok := status.FromError(err); err != nil && ok {
			return nil, err
		}
		if err != nil {
			return nil, status.Errorf(codes.Internal, "release retention of %s/%d: %v", p.stream, p.index, err)
		}
		if held {
			resp.Released = append(resp.Released, p.index)
			p.logger.Info("Released consumer hold", "consumer", req.GetConsumer())
		}
	}
	return resp, nil
}

// adoptHolds makes the source's holds this replica's own, for a replica
// catching up outside the chain: it must keep what the chain keeps. Its
// own forced trims stay.
func (p *partition) adoptHolds(src []*catenapb.ConsumerHold) error {
	return p.updateHolds(func(h *holdState) (bool, error) {
		next := make([]holdRecord, 0, len(src))
		for _, sh := range src {
			if contract.ValidateConsumer(sh.GetConsumer()) != nil {
				continue // not from a replica of this version; ignore rather than stop the copy
			}
			next = append(next, holdRecord{sh.GetConsumer(), sh.GetOffset()})
		}
		sort.Slice(next, func(i, j int) bool { return next[i].Consumer < next[j].Consumer })
		if slices.Equal(next, h.Holds) {
			return false, nil
		}
		h.Holds = next
		return true, nil
	})
}

// enforceRetention deletes what the stream's retention allows: segments
// past the soft limits and wholly below the lowest hold, and any segment
// past the hard limits, recording the holds the latter trimmed past.
func (p *partition) enforceRetention() {
	p.mu.Lock()
	ok := p.failed == nil && p.log != nil
	var cfg *catenapb.StreamConfig
	if p.meta != nil {
		cfg = p.meta.config
	}
	p.mu.Unlock()
	if !ok {
		return
	}
	// holdsMu across the trim: a hold stored meanwhile would not be seen.
	p.holdsMu.Lock()
	defer p.holdsMu.Unlock()
	p.mu.Lock()
	keep := p.committed
	if st := p.core.Status(); st.Role == chain.RoleNone {
		// A copy outside the chain commits nothing itself; what it
		// copied was committed at its source.
		keep = max(keep, min(st.Noticed, st.DurableEnd))
	}
	p.mu.Unlock()
	res, err := p.log.EnforceRetentionHeld(partlog.RetentionHold{
		// What is not known to be on every member of the chain stays,
		// whatever the limits: a successor may still need it from here.
		KeepFrom:   keep,
		HoldOffset: p.holds.lowest(),
		HardBytes:  cfg.GetHardRetentionBytes(),
		HardTime:   time.Duration(cfg.GetHardRetentionMs()) * time.Millisecond,
	})
	if err != nil {
		p.logger.Error(err, "Retention failed")
		return
	}
	if res.Segments == 0 {
		return
	}
	p.logger.Info("Deleted segments past retention", "segments", res.Segments, "logStart", res.StartOffset)
	if !res.Forced {
		return
	}
	next := p.holds.clone()
	lost := next.recordForcedTrim(res.StartOffset, time.Now())
	for _, r := range lost {
		p.logger.Info("Hard retention limit trimmed records a consumer holds", "consumer", r.Consumer, "holdOffset", r.Offset, "logStart", res.StartOffset,
			"hardRetentionBytes", cfg.GetHardRetentionBytes(), "hardRetentionMs", cfg.GetHardRetentionMs())
	}
	if err := writeHolds(p.dir, next); err != nil {
		// Still reported until the replica restarts.
		p.logger.Error(err, "Failed to persist forced trims")
	}
	p.mu.Lock()
	p.holds = next
	p.mu.Unlock()
}
