package server

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/replica/partlog"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/headers"
)

const (
	defaultReadBytes = 1 << 20
	maxReadBytes     = 16 << 20
	maxReadWait      = 30 * time.Second
)

// read serves committed records only: a member may hold more than it knows
// to be committed (a suffix the chain may still drop), and never shows it.
func (p *partition) read(ctx context.Context, req *catenapb.FetchRequest) (*catenapb.FetchResponse, error) {
	maxBytes := int(req.GetMaxBytes())
	if maxBytes <= 0 {
		maxBytes = defaultReadBytes
	}
	maxBytes = min(maxBytes, maxReadBytes)
	wait := min(time.Duration(req.GetMaxWaitMs())*time.Millisecond, maxReadWait)
	from := req.GetOffset()

	committed, err := p.waitPastCommitted(ctx, from, wait)
	if err != nil {
		return nil, err
	}
	resp := &catenapb.FetchResponse{Committed: committed, LogStart: p.log.StartOffset(), NextOffset: from}
	if from >= committed {
		return resp, nil
	}
	frames, err := p.committedFrames(from, committed, maxBytes)
	if err != nil {
		return nil, err
	}
	var bytes int
	for _, fr := range frames {
		_, recs, err := partlog.DecodeBatch(fr)
		if err != nil {
			p.markCorrupt(err)
			return nil, status.Errorf(codes.DataLoss, "partition %s/%d refuses to serve: %v", p.stream, p.index, err)
		}
		for i := range recs {
			r := &recs[i]
			if r.Offset < from || r.Offset >= committed {
				continue
			}
			resp.Records = append(resp.Records, &catenapb.Record{Key: r.Key, Value: r.Value, TimestampMs: r.TimestampMs, Partition: p.index, Offset: r.Offset, Headers: headers.ToWire(r.Headers)})
			resp.NextOffset = r.Offset + 1
			bytes += len(r.Key) + len(r.Value)
		}
	}
	p.m.recordsOut.Add(float64(len(resp.Records)))
	p.m.bytesOut.Add(float64(bytes))
	return resp, nil
}

// waitPastCommitted returns the committed offset once it is past from, or when
// wait is over (0: at once). It refuses offsets below the log start:
// retention removed them.
func (p *partition) waitPastCommitted(ctx context.Context, from uint64, wait time.Duration) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.usable(); err != nil {
		return 0, err
	}
	if start := p.log.StartOffset(); from < start {
		return 0, status.Errorf(codes.OutOfRange, "offset %d of partition %s/%d was removed by retention; the log starts at %d", from, p.stream, p.index, start)
	}
	if p.restored && from >= p.committed {
		// Nothing commits here before a new epoch, and another member may
		// know more: say so rather than wait or answer less.
		return 0, p.restoredError()
	}
	if wait > 0 && p.committed <= from {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		for expired := false; !expired && p.committed <= from && p.failed == nil; {
			ch := p.changed
			p.mu.Unlock()
			select {
			case <-ch:
			case <-timer.C:
				expired = true
			case <-ctx.Done():
				p.mu.Lock()
				return 0, status.FromContextError(ctx.Err()).Err()
			}
			p.mu.Lock()
		}
		if err := p.usable(); err != nil {
			return 0, err
		}
	}
	return p.committed, nil
}

// committedFrames reads whole frames from the one holding from, ending at
// or below committed, as a status error on failure.
func (p *partition) committedFrames(from, committed uint64, maxBytes int) ([][]byte, error) {
	frames, err := p.log.ReadFrames(from, committed, maxBytes)
	if err != nil {
		if errors.Is(err, partlog.ErrCorrupt) {
			p.markCorrupt(err)
			return nil, status.Errorf(codes.DataLoss, "partition %s/%d refuses to serve: %v", p.stream, p.index, err)
		}
		if errors.Is(err, partlog.ErrOutOfRange) {
			return nil, status.Errorf(codes.OutOfRange, "partition %s/%d: %v", p.stream, p.index, err)
		}
		return nil, status.Errorf(codes.Internal, "partition %s/%d: failed to read from %d: %v", p.stream, p.index, from, err)
	}
	return frames, nil
}

// listOffsets resolves earliest, latest (committed) or a timestamp.
func (p *partition) listOffsets(req *catenapb.ListOffsetsRequest) (*catenapb.ListOffsetsResponse, error) {
	p.mu.Lock()
	if err := p.usable(); err != nil {
		p.mu.Unlock()
		return nil, err
	}
	committed := p.committed
	if req.GetSpec() == catenapb.OffsetSpec_OFFSET_SPEC_LATEST && !p.committedExact {
		// Restarted from a crash: the recorded offset may lag what this
		// member answered before, and LATEST must not go back.
		err := p.restoredError()
		p.mu.Unlock()
		return nil, err
	}
	p.mu.Unlock()
	switch req.GetSpec() {
	case catenapb.OffsetSpec_OFFSET_SPEC_EARLIEST:
		return &catenapb.ListOffsetsResponse{Offset: p.log.StartOffset()}, nil
	case catenapb.OffsetSpec_OFFSET_SPEC_LATEST:
		return &catenapb.ListOffsetsResponse{Offset: committed}, nil
	case catenapb.OffsetSpec_OFFSET_SPEC_TIMESTAMP:
		off, err := p.log.OffsetForTime(req.GetTimestampMs())
		if err != nil {
			return nil, status.Errorf(codes.Internal, "partition %s/%d: failed to find offset for time %d: %v", p.stream, p.index, req.GetTimestampMs(), err)
		}
		return &catenapb.ListOffsetsResponse{Offset: min(off, committed)}, nil
	default:
		return nil, status.Errorf(codes.InvalidArgument, "unknown offset spec %v", req.GetSpec())
	}
}
