package server

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/replica/chain"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// headReportFresh is how long an ingestion node's report of an unreachable
// head stands: reporters repeat it every few hundred milliseconds while
// their appends stall, so an older one means they no longer do.
const headReportFresh = time.Second

// headReport is an ingestion node's latest report that this member's
// predecessor (the head) cannot be reached.
type headReport struct {
	epoch uint64
	head  string
	down  time.Duration
	at    time.Time // when it arrived
}

// ReportHeadUnreachable records an ingestion node's report that the head
// of a chain this replica is the second member of does not answer its
// appends, for the chain the request names and each of its more chains.
// Status shows it (head_unreachable_ms) for the chain's master. A chain
// this replica is not the head's successor of at that epoch is passed
// over; the call fails only when none of its chains was recorded.
func (s *Server) ReportHeadUnreachable(ctx context.Context, req *catenapb.ReportHeadUnreachableRequest) (*catenapb.ReportHeadUnreachableResponse, error) {
	if req.GetHeadId() == "" {
		return nil, status.Error(codes.InvalidArgument, "report names no head")
	}
	firstErr := s.recordHeadReport(req.GetStream(), req.GetPartition(), req.GetEpoch(), req.GetDownMs(), req)
	recorded := firstErr == nil
	for _, c := range req.GetMore() {
		if err := s.recordHeadReport(c.GetStream(), c.GetPartition(), c.GetEpoch(), c.GetDownMs(), req); err == nil {
			recorded = true
		} else if firstErr == nil {
			firstErr = err
		}
	}
	if !recorded {
		return nil, firstErr
	}
	return &catenapb.ReportHeadUnreachableResponse{}, nil
}

// recordHeadReport records req's report of its head for one chain.
func (s *Server) recordHeadReport(stream string, partition uint32, epoch, downMs uint64, req *catenapb.ReportHeadUnreachableRequest) error {
	p, err := s.lookup(stream, partition)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.core == nil {
		return status.Errorf(codes.FailedPrecondition, "partition %s/%d on %s has no chain configuration; the report is ignored", p.stream, p.index, s.id)
	}
	st := p.core.Status()
	if st.Epoch != epoch || st.Predecessor != req.GetHeadId() || len(st.Members) == 0 || st.Members[0] != req.GetHeadId() || st.Role == chain.RoleHead {
		return status.Errorf(codes.FailedPrecondition, "partition %s/%d on %s is at epoch %d with members %v: it is not the successor of head %q at epoch %d; the report is ignored",
			p.stream, p.index, s.id, st.Epoch, st.Members, req.GetHeadId(), epoch)
	}
	first := p.headUnreachableMs(st.Epoch) == 0
	if p.headReports == nil {
		p.headReports = map[string]headReport{}
	}
	now := time.Now()
	for who, r := range p.headReports {
		if r.epoch != st.Epoch || now.Sub(r.at) >= headReportFresh {
			delete(p.headReports, who) // stale: bounded by the reporters of the last second
		}
	}
	p.headReports[req.GetReporter()] = headReport{epoch: st.Epoch, head: req.GetHeadId(), down: time.Duration(downMs) * time.Millisecond, at: now}
	if first {
		p.logger.Info("Ingestion reports the head unreachable", "head", req.GetHeadId(), "epoch", st.Epoch, "downMs", downMs, "reporter", req.GetReporter())
	}
	return nil
}

// headUnreachableMs is what Status reports of the head reports at epoch:
// the longest that is fresh (each ingestion node's latest counts), else 0.
// Callers hold p.mu.
func (p *partition) headUnreachableMs(epoch uint64) uint64 {
	var longest time.Duration
	for _, r := range p.headReports {
		if r.epoch == epoch && time.Since(r.at) < headReportFresh {
			longest = max(longest, r.down)
		}
	}
	return uint64(longest.Milliseconds())
}
