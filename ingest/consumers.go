package ingest

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
)

// Consumer holds: ingestion knows every partition's chain, so it fans a
// consumer's hold out to the chain's members (Replica.HoldRetention) and
// answers once every one of them stored it. A replica joining the chain
// later copies the holds from the member it catches up from.

const (
	// holdCallTimeout bounds one member's answer to a hold or release.
	holdCallTimeout = 10 * time.Second
	// holdChainChanges is how many times a commit follows a chain that
	// changed while it was being stored before it gives up.
	holdChainChanges = 3
)

// consumerPartition returns a partition's route for the consumer calls:
// NotFound for an unknown stream or partition, and the consumer name
// checked before anything is asked of a member.
func (s *Server) consumerPartition(ctx context.Context, stream string, index uint32, consumer string) (*partitionRoute, error) {
	if err := contract.ValidateConsumer(consumer); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v; nothing was stored", err)
	}
	sr, err := s.stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	if int(index) >= len(sr.partitions) {
		return nil, status.Errorf(codes.NotFound, "stream %q has %d partitions; partition %d does not exist", stream, len(sr.partitions), index)
	}
	pr := sr.partitions[index]
	if pr == nil || len(pr.members) == 0 {
		return nil, status.Errorf(codes.Unavailable, "partition %s/%d has no known chain", stream, index)
	}
	return pr, nil
}

// CommitConsumerOffset stores a consumer's hold on every member of the
// partition's chain.
func (s *Server) CommitConsumerOffset(ctx context.Context, req *catenapb.CommitConsumerOffsetRequest) (*catenapb.CommitConsumerOffsetResponse, error) {
	pr, err := s.consumerPartition(ctx, req.GetStream(), req.GetPartition(), req.GetConsumer())
	if err != nil {
		return nil, err
	}
	hold := &catenapb.HoldRetentionRequest{Stream: req.GetStream(), Partition: req.GetPartition(), Consumer: req.GetConsumer(), Offset: req.GetOffset()}
	for range holdChainChanges {
		err := s.onMembers(ctx, pr.members, func(ctx context.Context, c catenapb.ReplicaClient) error {
			_, err := c.HoldRetention(ctx, hold)
			return err
		})
		if err != nil {
			return nil, status.Errorf(status.Code(err), "commit offset %d of consumer %q on %s/%d: %s", req.GetOffset(), req.GetConsumer(), req.GetStream(), req.GetPartition(), status.Convert(err).Message())
		}
		// A chain changed meanwhile may have a member that copied the
		// holds before this one was stored: store it there too.
		cur := s.disc.current().streams[req.GetStream()]
		if cur == nil || int(req.GetPartition()) >= len(cur.partitions) || cur.partitions[req.GetPartition()] == nil ||
			cur.partitions[req.GetPartition()].epoch == pr.epoch {
			break
		}
		pr = cur.partitions[req.GetPartition()]
	}
	resp := &catenapb.CommitConsumerOffsetResponse{Epoch: pr.epoch}
	for _, m := range pr.members {
		resp.Members = append(resp.Members, m.GetId())
	}
	return resp, nil
}

// DeleteConsumer releases a consumer's holds on every member of every
// partition's chain.
func (s *Server) DeleteConsumer(ctx context.Context, req *catenapb.DeleteConsumerRequest) (*catenapb.DeleteConsumerResponse, error) {
	if err := contract.ValidateConsumer(req.GetConsumer()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v; nothing was released", err)
	}
	sr, err := s.stream(ctx, req.GetStream())
	if err != nil {
		return nil, err
	}
	resp := &catenapb.DeleteConsumerResponse{}
	for i, pr := range sr.partitions {
		if pr == nil || len(pr.members) == 0 {
			return nil, status.Errorf(codes.Unavailable, "delete consumer %q: partition %s/%d has no known chain", req.GetConsumer(), req.GetStream(), i)
		}
		partition := uint32(i)
		var mu sync.Mutex
		held := false
		err := s.onMembers(ctx, pr.members, func(ctx context.Context, c catenapb.ReplicaClient) error {
			r, err := c.ReleaseRetention(ctx, &catenapb.ReleaseRetentionRequest{Stream: req.GetStream(), Partition: &partition, Consumer: req.GetConsumer()})
			if err == nil && len(r.GetReleased()) > 0 {
				mu.Lock()
				held = true
				mu.Unlock()
			}
			return err
		})
		if err != nil {
			return nil, status.Errorf(status.Code(err), "delete consumer %q on %s/%d: %s", req.GetConsumer(), req.GetStream(), i, status.Convert(err).Message())
		}
		if held {
			resp.Partitions = append(resp.Partitions, partition)
		}
	}
	return resp, nil
}

// onMembers calls every member at once and waits for all. It fails when
// any member failed: with that member's code when every failure agrees on
// an input error, Unavailable otherwise (the caller retries; holds are
// set, not added, so a retry is harmless).
func (s *Server) onMembers(ctx context.Context, members []*catenapb.Member, call func(context.Context, catenapb.ReplicaClient) error) error {
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := s.pool.Get(m.GetAddr())
			if err != nil {
				errs[i] = err
				return
			}
			cctx, cancel := context.WithTimeout(ctx, holdCallTimeout)
			defer cancel()
			errs[i] = call(cctx, catenapb.NewReplicaClient(conn))
		}()
	}
	wg.Wait()
	var failed []string
	code := codes.OK
	for i, err := range errs {
		if err == nil {
			continue
		}
		failed = append(failed, fmt.Sprintf("%s: %s", members[i].GetId(), status.Convert(err).Message()))
		switch c := status.Code(err); {
		case code == codes.OK && (c == codes.InvalidArgument || c == codes.ResourceExhausted):
			code = c
		case c != code:
			code = codes.Unavailable
		}
	}
	if len(failed) == 0 {
		return nil
	}
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	s.disc.requestRefresh()
	return status.Errorf(code, "%d of %d members failed: %s", len(failed), len(members), strings.Join(failed, "; "))
}

// ListConsumers reports the holds and forced trims of every partition, as
// the members of its chain report them now.
func (s *Server) ListConsumers(ctx context.Context, req *catenapb.ListConsumersRequest) (*catenapb.ListConsumersResponse, error) {
	sr, err := s.stream(ctx, req.GetStream())
	if err != nil {
		return nil, err
	}
	addrs := map[string]string{} // id -> addr
	for _, pr := range sr.partitions {
		if pr == nil {
			continue
		}
		for _, m := range pr.members {
			addrs[m.GetId()] = m.GetAddr()
		}
	}
	var mu sync.Mutex
	reports := map[string]*catenapb.StatusResponse{}
	var wg sync.WaitGroup
	for id, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := s.pool.Get(addr)
			if err != nil {
				return
			}
			cctx, cancel := context.WithTimeout(ctx, holdCallTimeout)
			defer cancel()
			r, err := catenapb.NewReplicaClient(conn).Status(cctx, &catenapb.StatusRequest{Stream: req.GetStream()})
			if err != nil {
				return
			}
			mu.Lock()
			reports[id] = r
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	return mergeConsumers(sr, reports), nil
}

// mergeConsumers builds ListConsumers' answer from the members' reports
// (pure). A member that did not answer is left out; one that answered
// without the partition counts as holding nothing.
func mergeConsumers(sr *streamRoute, reports map[string]*catenapb.StatusResponse) *catenapb.ListConsumersResponse {
	out := &catenapb.ListConsumersResponse{Stream: sr.name}
	for i, pr := range sr.partitions {
		pc := &catenapb.PartitionConsumers{Partition: uint32(i)}
		out.Partitions = append(out.Partitions, pc)
		if pr == nil {
			continue
		}
		lowest := map[string]uint64{}
		trims := map[[2]string]*catenapb.ForcedTrim{}
		var sets []string // each answering member's holds, as one string
		var ids []string
		for _, m := range pr.members {
			rep := reports[m.GetId()]
			if rep == nil {
				continue
			}
			var ps *catenapb.PartitionStatus
			for _, p := range rep.GetPartitions() {
				if p.GetStream() == sr.name && p.GetPartition() == uint32(i) {
					ps = p
				}
			}
			var set []string
			for _, h := range ps.GetHolds() {
				if cur, ok := lowest[h.GetConsumer()]; !ok || h.GetOffset() < cur {
					lowest[h.GetConsumer()] = h.GetOffset()
				}
				set = append(set, fmt.Sprintf("%s@%d", h.GetConsumer(), h.GetOffset()))
			}
			for _, t := range ps.GetForcedTrims() {
				k := [2]string{t.GetConsumer(), fmt.Sprint(t.GetHoldOffset())}
				if cur := trims[k]; cur == nil || t.GetLogStart() > cur.GetLogStart() {
					trims[k] = t
				}
			}
			pc.LogStart = max(pc.LogStart, ps.GetLogStart())
			pc.Committed = max(pc.Committed, ps.GetCommitted())
			slices.Sort(set) // members send them sorted; compare sets whatever the order
			sets = append(sets, strings.Join(set, ","))
			ids = append(ids, m.GetId())
		}
		for c, off := range lowest {
			pc.Holds = append(pc.Holds, &catenapb.ConsumerHold{Consumer: c, Offset: off})
		}
		sort.Slice(pc.Holds, func(a, b int) bool { return pc.Holds[a].GetConsumer() < pc.Holds[b].GetConsumer() })
		for _, t := range trims {
			pc.ForcedTrims = append(pc.ForcedTrims, t)
		}
		sort.Slice(pc.ForcedTrims, func(a, b int) bool {
			x, y := pc.ForcedTrims[a], pc.ForcedTrims[b]
			if x.GetTimeMs() != y.GetTimeMs() {
				return x.GetTimeMs() < y.GetTimeMs()
			}
			return x.GetConsumer() < y.GetConsumer()
		})
		// The most common set is the agreement; the others disagree.
		counts := map[string]int{}
		for _, set := range sets {
			counts[set]++
		}
		common, best := "", -1
		for _, set := range sets {
			if counts[set] > best {
				common, best = set, counts[set]
			}
		}
		for k, set := range sets {
			if set != common {
				pc.Disagreeing = append(pc.Disagreeing, ids[k])
			}
		}
		slices.Sort(pc.Disagreeing)
	}
	return out
}
