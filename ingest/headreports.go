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
	senders sync.WaitGroup               // Server.Close waits for them
}

// successorReports are the reports waiting for one successor, by head and
// then by chain, the latest of each. It is in pending exactly while its
// sender runs.
type successorReports struct {
	byHead map[string]map[chainRef]queuedReport
}

// queuedReport is a chain's report and when it was queued: the time it
// waits to be sent counts in its down_ms.
type queuedReport struct {
	chain  *catenapb.HeadReportChain
	queued time.Time
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
	if r.srv.ctx.Err() != nil {
		return // closing: Close waits for the senders it knows
	}
	sr := r.pending[addr]
	if sr == nil {
		sr = &successorReports{byHead: map[string]map[chainRef]queuedReport{}}
		r.pending[addr] = sr
		r.senders.Add(1)
		go r.send(addr, sr)
	}
	chains := sr.byHead[head]
	if chains == nil {
		chains = map[chainRef]queuedReport{}
		sr.byHead[head] = chains
	}
	chains[chainRef{c.GetStream(), c.GetPartition()}] = queuedReport{c, time.Now()}
}

// wait waits for the senders to end, once the server's context is done.
func (r *headReporter) wait() {
	r.mu.Lock() // no sender starts after this: add sees the context done
	r.mu.Unlock()
	r.senders.Wait()
}

// send sends sr's reports to the successor at addr, one call per head
// (in parallel: a successor slow to answer for one head holds up no
// other's), until none are left; at most one round every headReportEvery.
func (r *headReporter) send(addr string, sr *successorReports) {
	defer r.senders.Done()
	for {
		r.mu.Lock()
		if len(sr.byHead) == 0 || r.srv.ctx.Err() != nil {
			delete(r.pending, addr)
			r.mu.Unlock()
			return
		}
		byHead := sr.byHead
		sr.byHead = map[string]map[chainRef]queuedReport{}
		r.mu.Unlock()

		start := time.Now()
		var calls sync.WaitGroup
		for head, chains := range byHead {
			req := reportRequest(head, r.srv.name, chains, start)
			calls.Go(func() { r.call(addr, req) })
		}
		calls.Wait()
		select {
		case <-time.After(headReportEvery - time.Since(start)):
		case <-r.srv.ctx.Done():
		}
	}
}

// reportRequest is one call's report of head for every chain of chains, in
// a stable order (the first in the request's own fields), each chain's
// down_ms counted up to now.
func reportRequest(head, reporter string, chains map[chainRef]queuedReport, now time.Time) *catenapb.ReportHeadUnreachableRequest {
	all := make([]*catenapb.HeadReportChain, 0, len(chains))
	for _, q := range chains {
		c := q.chain
		c.DownMs += uint64(max(now.Sub(q.queued), 0).Milliseconds())
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
	if r.srv.ctx.Err() != nil {
		return // closing: the pool may be closed
	}
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
