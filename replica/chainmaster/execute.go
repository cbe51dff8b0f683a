package chainmaster

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// DefaultCallTimeout bounds each RPC of a repair.
const DefaultCallTimeout = 5 * time.Second

// ReachTimeout bounds how long CheckJoins waits for a member to reach a
// joiner: a connection within the cluster is up in milliseconds, and a
// master waiting on one that is not holds up its other chains.
const ReachTimeout = time.Second

// Executor makes a repair's RPCs, in order, stopping at the first failure
// (the next round plans again from fresh reports).
type Executor struct {
	Conns *transport.Pool
	Log   logr.Logger
	// CallTimeout bounds each RPC (0: DefaultCallTimeout).
	CallTimeout time.Duration
}

// Execute carries out r's calls for stream. Agreements found on the way
// (EpochEnd exchanges) are returned by replica, also when a later call
// fails.
func (e Executor) Execute(ctx context.Context, stream string, r *Repair) (map[string]Agreement, error) {
	found := map[string]Agreement{}
	timeout := e.CallTimeout
	if timeout <= 0 {
		timeout = DefaultCallTimeout
	}
	for _, c := range r.Calls {
		conn, err := e.Conns.Get(c.Addr)
		if err != nil {
			return found, err
		}
		rc := catenapb.NewReplicaClient(conn)
		cctx, cancel := context.WithTimeout(ctx, timeout)
		switch c.Kind {
		case CallConfigure:
			_, err = rc.Configure(cctx, c.Configure)
			if err != nil {
				err = fmt.Errorf("configure %s at epoch %d: %w", c.Replica, c.Configure.GetEpoch(), err)
			}
		case CallTruncate:
			var ps *catenapb.PartitionStatus
			ps, err = rc.Truncate(cctx, c.Truncate)
			if err != nil {
				err = fmt.Errorf("truncate %s to %d: %w", c.Replica, c.Truncate.GetTo(), err)
			} else {
				e.Log.Info("Truncated returning replica", "stream", stream, "partition", r.Partition, "replica", c.Replica, "logEnd", ps.GetLogEnd())
			}
		case CallEpochEnd:
			var a Agreement
			a, err = e.findAgreement(cctx, stream, r, c, rc)
			switch {
			case err == nil:
				found[c.Member] = a
			case status.Code(err) == codes.OutOfRange:
				// The chain no longer holds the epoch the returning
				// replica's log ends in (retention trimmed it): there is
				// no point to cut back to. Its copy goes, and it rejoins
				// empty, copying the whole log.
				e.Log.Info("A returning replica's log cannot be reconciled with the chain; dropping its copy for a full one", "stream", stream, "partition", r.Partition, "replica", c.Member, "reason", err.Error())
				err = e.drop(cctx, c.MemberAddr, c.Member, &catenapb.DropRequest{Stream: stream, Partition: r.Partition, Epoch: r.Chain.Epoch})
			}
		case CallDrop:
			err = e.drop(cctx, c.Addr, c.Replica, c.Drop)
		case CallCatchUp:
			_, err = rc.CatchUp(cctx, c.CatchUp)
			if err != nil {
				err = fmt.Errorf("have %s catch up from %s: %w", c.Replica, c.CatchUp.GetSourceId(), err)
			}
		}
		cancel()
		if err != nil {
			return found, err
		}
	}
	return found, nil
}

// CheckJoins asks the member each joiner of r joins behind to reach the
// joiner (Replica.Reach), in ReachTimeout. A master records a plan that
// adds a replica only when it returns nil: the member's link to the
// joiner must come up before the failure timeout, or the planner cuts
// the link and removes a member of the chain with it. A pod that returned
// keeps its DNS name, which can resolve to nothing, or to the address the
// pod had, for as long as DNS caches answers (30 s in a default CoreDNS),
// while the master reaches the pod already (seen in the end-to-end
// suite: the new tail's link came up 3.3 s after the join, and the 3 s
// failure timeout removed the member behind which it joined). A member
// that does not know the call (a replica older than the master answers
// UNIMPLEMENTED, with TLS too: gRPC answers a method its server does not
// register before any authorization policy sees it) is taken to reach
// the joiner, as before the call existed. Any other error, a refusal of
// the master included, holds the join.
func (e Executor) CheckJoins(ctx context.Context, r *Repair) error {
	for _, j := range r.Joins {
		conn, err := e.Conns.Get(j.PredAddr)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, ReachTimeout)
		_, err = catenapb.NewReplicaClient(conn).Reach(cctx, &catenapb.ReachRequest{Id: j.Member, Addr: j.MemberAddr})
		cancel()
		if err != nil && status.Code(err) != codes.Unimplemented {
			return fmt.Errorf("%s, which %s would join behind, cannot reach it yet: %w", j.Pred, j.Member, err)
		}
	}
	return nil
}

func (e Executor) drop(ctx context.Context, addr, replica string, req *catenapb.DropRequest) error {
	conn, err := e.Conns.Get(addr)
	if err != nil {
		return err
	}
	resp, err := catenapb.NewReplicaClient(conn).Drop(ctx, req)
	if err != nil {
		return fmt.Errorf("drop %s's copy of %s/%d: %w", replica, req.GetStream(), req.GetPartition(), err)
	}
	if resp.GetDropped() {
		e.Log.Info("Dropped a copy outside the chain", "stream", req.GetStream(), "partition", req.GetPartition(), "replica", replica, "epoch", req.GetEpoch())
	}
	return nil
}

// findAgreement asks a chain member where the returning replica's last log
// epoch ended and returns the offset below which the returning replica's
// log agrees with the chain (Kafka's leader-epoch rule: if the chain holds
// no batch of that epoch, the answer names the largest epoch it holds below
// it, and the returning replica's own end of that epoch bounds the
// agreement too).
func (e Executor) findAgreement(ctx context.Context, stream string, r *Repair, c Call, rc catenapb.ReplicaClient) (Agreement, error) {
	resp, err := rc.EpochEnd(ctx, c.EpochEnd)
	if err != nil {
		return Agreement{}, fmt.Errorf("ask %s where epoch %d ended: %w", c.Replica, c.EpochEnd.GetEpoch(), err)
	}
	off := min(resp.GetEndOffset(), c.MemberLogEnd)
	if resp.GetEpoch() < c.EpochEnd.GetEpoch() {
		conn, err := e.Conns.Get(c.MemberAddr)
		if err != nil {
			return Agreement{}, err
		}
		own, err := catenapb.NewReplicaClient(conn).EpochEnd(ctx, &catenapb.EpochEndRequest{Stream: stream, Partition: r.Partition, Epoch: resp.GetEpoch()})
		if err != nil {
			return Agreement{}, fmt.Errorf("ask %s where its epoch %d ended: %w", c.Member, resp.GetEpoch(), err)
		}
		off = min(off, own.GetEndOffset())
	}
	e.Log.Info("Found where a returning replica agrees with the chain", "stream", stream, "partition", r.Partition,
		"replica", c.Member, "lastLogEpoch", c.EpochEnd.GetEpoch(), "asked", c.Replica, "agreesBelow", off, "logEnd", c.MemberLogEnd)
	return Agreement{ChainEpoch: r.Chain.Epoch, LogEnd: c.MemberLogEnd, LastLogEpoch: c.EpochEnd.GetEpoch(), Offset: off}, nil
}

// PartitionReports picks partition p of stream out of Status answers.
func PartitionReports(resps map[string]*catenapb.StatusResponse, stream string, p uint32) map[string]*catenapb.PartitionStatus {
	out := map[string]*catenapb.PartitionStatus{}
	for id, resp := range resps {
		for _, ps := range resp.GetPartitions() {
			if ps.GetStream() == stream && ps.GetPartition() == p {
				out[id] = ps
			}
		}
	}
	return out
}
