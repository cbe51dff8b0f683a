package clienttest

import (
	"context"
	"slices"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
)

// Consumer holds, kept per partition in memory, with the replicas' name
// rules (contract.ValidateConsumer).

// holdsOf returns a partition's holds, creating the map. Callers hold s.mu.
func (st *stream) holdsOf(partition uint32) map[string]uint64 {
	if st.holds == nil {
		st.holds = make([]map[string]uint64, len(st.parts))
		st.trims = make([][]*catenapb.ForcedTrim, len(st.parts))
	}
	if st.holds[partition] == nil {
		st.holds[partition] = map[string]uint64{}
	}
	return st.holds[partition]
}

// Holds returns a copy of a partition's holds (consumer -> offset).
func (s *Server) Holds(name string, partition int) map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[name]
	if st == nil || partition >= len(st.parts) {
		return nil
	}
	out := map[string]uint64{}
	for c, o := range st.holdsOf(uint32(partition)) {
		out[c] = o
	}
	return out
}

// ForceTrim records a forced trim of consumer's hold, as a replica does
// when a hard retention limit trims past it.
func (s *Server) ForceTrim(name string, partition int, consumer string, logStart uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[name]
	h := st.holdsOf(uint32(partition))
	st.trims[partition] = append(st.trims[partition], &catenapb.ForcedTrim{Consumer: consumer, HoldOffset: h[consumer], LogStart: logStart, TimeMs: time.Now().UnixMilli()})
}

// CommitConsumerOffset implements catenapb.IngestServer.
func (s *Server) CommitConsumerOffset(ctx context.Context, req *catenapb.CommitConsumerOffsetRequest) (*catenapb.CommitConsumerOffsetResponse, error) {
	if err := contract.ValidateConsumer(req.GetConsumer()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v; nothing was stored", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[req.GetStream()]
	if st == nil {
		return nil, notFound(req.GetStream())
	}
	if int(req.GetPartition()) >= len(st.parts) {
		return nil, status.Errorf(codes.NotFound, "stream %q has %d partitions; partition %d does not exist", req.GetStream(), len(st.parts), req.GetPartition())
	}
	st.holdsOf(req.GetPartition())[req.GetConsumer()] = req.GetOffset()
	return &catenapb.CommitConsumerOffsetResponse{Epoch: st.epoch, Members: []string{"r1", "r2", "r3"}}, nil
}

// ListConsumers implements catenapb.IngestServer.
func (s *Server) ListConsumers(ctx context.Context, req *catenapb.ListConsumersRequest) (*catenapb.ListConsumersResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[req.GetStream()]
	if st == nil {
		return nil, notFound(req.GetStream())
	}
	resp := &catenapb.ListConsumersResponse{Stream: req.GetStream()}
	for p := range st.parts {
		pc := &catenapb.PartitionConsumers{Partition: uint32(p), Committed: uint64(len(st.parts[p]))}
		for c, o := range st.holdsOf(uint32(p)) {
			pc.Holds = append(pc.Holds, &catenapb.ConsumerHold{Consumer: c, Offset: o})
		}
		sort.Slice(pc.Holds, func(i, j int) bool { return pc.Holds[i].Consumer < pc.Holds[j].Consumer })
		pc.ForcedTrims = slices.Clone(st.trims[p])
		for _, t := range pc.ForcedTrims {
			pc.LogStart = max(pc.LogStart, t.LogStart)
		}
		resp.Partitions = append(resp.Partitions, pc)
	}
	return resp, nil
}

// DeleteConsumer implements catenapb.IngestServer.
func (s *Server) DeleteConsumer(ctx context.Context, req *catenapb.DeleteConsumerRequest) (*catenapb.DeleteConsumerResponse, error) {
	if err := contract.ValidateConsumer(req.GetConsumer()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "%v; nothing was released", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.streams[req.GetStream()]
	if st == nil {
		return nil, notFound(req.GetStream())
	}
	resp := &catenapb.DeleteConsumerResponse{}
	for p := range st.parts {
		h := st.holdsOf(uint32(p))
		if _, ok := h[req.GetConsumer()]; ok {
			delete(h, req.GetConsumer())
			resp.Partitions = append(resp.Partitions, uint32(p))
		}
		st.trims[p] = slices.DeleteFunc(st.trims[p], func(t *catenapb.ForcedTrim) bool { return t.Consumer == req.GetConsumer() })
	}
	return resp, nil
}
