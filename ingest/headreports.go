package ingest

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// headReportEvery bounds how often one successor is sent reports: a dead
// head leads hundreds of chains, each of whose appenders reports it every
// stallAfter; they go in one call per successor (ReportHeadUnreachable's
// more chains), the first at once, the next with whatever came meanwhile.
const headReportEvery = 50 * time.Millisecond

// headReporter gathers appenders' reports of unreachable heads by the
// successor they go to and sends each successor's in one call.
type headReporter struct {
	srv *Server

	mu      sync.Mutex
	pending map[string]*successorReports // by successor address
}

// successorReports are the reports waiting for one successor, by head and
// then by chain, the latest of each; sending is set while its sender runs.
type successorReports struct {
	byHead  map[string]map[chainRef]*catenapb.HeadReportChain
	sending bool
}

type chainRef struct {
	stream    string
	partition uint32
}

func newHeadReporter(srv *Server) *headReporter {
	return &headReporter{srv: srv, pending: map[string]*successorReports{}}
}

// add queues a report that head, of the chain c names, does not answer,
// for the successor at addr.
func (r *headReporter) add(addr, head string, c *catenapb.HeadReportChain) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sr := r.pending[addr]
	if sr == nil {
		sr = &successorReports{byHead: map[string]map[chainRef]*catenapb.HeadReportChain{}}
		r.pending[addr] = sr
	}
	chains := sr.byHead[head]
	if chains == nil {
		chains = map[chainRef]*catenapb.HeadReportChain{}
		sr.byHead[head] = chains
	}
	chains[chainRef{c.GetStream(), c.GetPartition()}] = c
	if !sr.sending {
		sr.sending = true
		go r.send(addr, sr)
	}
}

// send sends sr's reports to the successor at addr, one call per head,
// until none are left; at most one round every headReportEvery.
func (r *headReporter) send(addr string, sr *successorReports) {
	for {
		r.mu.Lock()
		if len(sr.byHead) == 0 || r.srv.ctx.Err() != nil {
			sr.sending = false
			delete(r.pending, addr)
			r.mu.Unlock()
			return
		}
		byHead := sr.byHead
		sr.byHead = map[string]map[chainRef]*catenapb.HeadReportChain{}
		r.mu.Unlock()

		start := time.Now()
		for head, chains := range byHead {
			r.call(addr, reportRequest(head, r.srv.name, chains))
		}
		select {
		case <-time.After(headReportEvery - time.Since(start)):
		case <-r.srv.ctx.Done():
		}
	}
}

// reportRequest is one call's report of head for every chain of chains, in
// a stable order (the first in the request's own fields).
func reportRequest(head, reporter string, chains map[chainRef]*catenapb.HeadReportChain) *catenapb.ReportHeadUnreachableRequest {
	all := make([]*catenapb.HeadReportChain, 0, len(chains))
	for _, c := range chains {
		all = append(all, c)
	}
	slices.SortFunc(all, func(a, b *catenapb.HeadReportChain) int {
		return cmp.Or(cmp.Compare(a.GetStream(), b.GetStream()), cmp.Compare(a.GetPartition(), b.GetPartition()))
	})
	first := all[0]
	return &catenapb.ReportHeadUnreachableRequest{Stream: first.GetStream(), Partition: first.GetPartition(), Epoch: first.GetEpoch(),
		HeadId: head, DownMs: first.GetDownMs(), Reporter: reporter, More: all[1:]}
}

// call sends one report, best effort: a successor that does not take it
// (not the successor any more, or down too) changes nothing here.
func (r *headReporter) call(addr string, req *catenapb.ReportHeadUnreachableRequest) {
	conn, err := r.srv.pool.Get(addr)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.srv.ctx, headReportTimeout)
	defer cancel()
	if _, err := catenapb.NewReplicaClient(conn).ReportHeadUnreachable(ctx, req); err != nil {
		r.srv.logger.V(1).Info("Head's successor did not take the report", "head", req.GetHeadId(), "successor", addr,
			"chains", 1+len(req.GetMore()), "error", err.Error())
	}
}
