package groups

import (
	"context"
	"sort"

	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/ingest"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// Service serves the Groups gRPC API (list, describe, reset, delete) from
// the Coordinator that the Kafka listener's groups join.
type Service struct {
	catenapb.UnimplementedGroupsServer
	Coordinator *Coordinator
	// Ingest resolves offsets (earliest, latest, by time) and checks
	// streams and partitions.
	Ingest *ingest.Server
}

// Register registers the service on g.
func (s *Service) Register(g *grpc.Server) { catenapb.RegisterGroupsServer(g, s) }

// grpcError is a coordinator's refusal as a gRPC status.
func grpcError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && CodeOf(err) == CoordinatorNotAvailable {
		return err
	}
	c := codes.Unavailable
	switch CodeOf(err) {
	case GroupIDNotFound, UnknownTopicOrPartition:
		c = codes.NotFound
	case NonEmptyGroup, UnknownMemberID, IllegalGeneration, RebalanceInProgress:
		c = codes.FailedPrecondition
	case InvalidGroupID:
		c = codes.InvalidArgument
	}
	return status.Error(c, err.Error())
}

func (s *Service) ListGroups(ctx context.Context, _ *catenapb.ListGroupsRequest) (*catenapb.ListGroupsResponse, error) {
	all, err := s.Coordinator.List(ctx)
	if err != nil {
		return nil, grpcError(err)
	}
	resp := &catenapb.ListGroupsResponse{}
	for _, g := range all {
		resp.Groups = append(resp.Groups, &catenapb.GroupSummary{Group: g.Name, State: string(g.State), ProtocolType: g.ProtocolType, Members: uint32(g.Members)})
	}
	return resp, nil
}

func (s *Service) DescribeGroup(ctx context.Context, req *catenapb.DescribeGroupRequest) (*catenapb.GroupDescription, error) {
	if req.GetGroup() == "" {
		return nil, status.Error(codes.InvalidArgument, "a group name is required")
	}
	d, err := s.Coordinator.Describe(ctx, req.GetGroup())
	if err != nil {
		return nil, grpcError(err)
	}
	if d.State == Dead {
		return nil, status.Errorf(codes.NotFound, "no group %q", req.GetGroup())
	}
	resp := &catenapb.GroupDescription{Group: d.Name, State: string(d.State), Generation: d.Generation, ProtocolType: d.ProtocolType, Protocol: d.Protocol, Leader: d.Leader}
	for _, m := range d.Members {
		gm := &catenapb.GroupMember{Id: m.ID, ClientId: m.ClientID, ClientHost: m.ClientHost}
		if d.ProtocolType == "consumer" && len(m.Assignment) > 0 {
			var a kmsg.ConsumerMemberAssignment
			if err := a.ReadFrom(m.Assignment); err == nil {
				for _, t := range a.Topics {
					if req.GetStream() != "" && t.Topic != req.GetStream() {
						continue
					}
					ga := &catenapb.GroupAssignment{Stream: t.Topic}
					for _, p := range t.Partitions {
						ga.Partitions = append(ga.Partitions, uint32(p))
					}
					gm.Assignment = append(gm.Assignment, ga)
				}
			}
		}
		resp.Members = append(resp.Members, gm)
	}
	for tp, o := range d.Offsets {
		if req.GetStream() != "" && tp.Topic != req.GetStream() {
			continue
		}
		off := &catenapb.GroupOffset{Stream: tp.Topic, Partition: uint32(tp.Partition), Offset: uint64(max(o.Offset, 0)), Metadata: o.Metadata, CommittedAtMs: o.At}
		if end, err := s.Ingest.ListOffsets(ctx, &catenapb.ListOffsetsRequest{Stream: tp.Topic, Partition: uint32(tp.Partition), Spec: catenapb.OffsetSpec_OFFSET_SPEC_LATEST}); err == nil {
			off.End = end.GetOffset()
		}
		resp.Offsets = append(resp.Offsets, off)
	}
	sort.Slice(resp.Offsets, func(i, j int) bool {
		a, b := resp.Offsets[i], resp.Offsets[j]
		if a.Stream != b.Stream {
			return a.Stream < b.Stream
		}
		return a.Partition < b.Partition
	})
	return resp, nil
}

func (s *Service) ResetGroupOffsets(ctx context.Context, req *catenapb.ResetGroupOffsetsRequest) (*catenapb.ResetGroupOffsetsResponse, error) {
	if req.GetGroup() == "" || req.GetStream() == "" {
		return nil, status.Error(codes.InvalidArgument, "a group and a stream are required; nothing was changed")
	}
	switch req.GetSpec() {
	case catenapb.OffsetSpec_OFFSET_SPEC_UNSPECIFIED, catenapb.OffsetSpec_OFFSET_SPEC_EARLIEST, catenapb.OffsetSpec_OFFSET_SPEC_LATEST, catenapb.OffsetSpec_OFFSET_SPEC_TIMESTAMP:
	default:
		return nil, status.Errorf(codes.InvalidArgument, "offset spec %v is not one of earliest, latest, timestamp or an offset; nothing was changed", req.GetSpec())
	}
	info, err := s.Ingest.Stream(ctx, req.GetStream())
	if err != nil {
		return nil, err
	}
	parts := req.GetPartitions()
	if len(parts) == 0 {
		for p := range info.Partitions {
			parts = append(parts, uint32(p))
		}
	}
	seen := map[uint32]bool{}
	for _, p := range parts {
		if int(p) >= info.Partitions {
			return nil, status.Errorf(codes.NotFound, "stream %q has %d partitions; partition %d does not exist; nothing was changed", req.GetStream(), info.Partitions, p)
		}
		if seen[p] {
			return nil, status.Errorf(codes.InvalidArgument, "partition %d is named twice; nothing was changed", p)
		}
		seen[p] = true
	}
	d, err := s.Coordinator.Describe(ctx, req.GetGroup())
	if err != nil {
		return nil, grpcError(err)
	}
	if len(d.Members) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "group %q has %d members: stop its consumers before resetting its offsets; nothing was changed", req.GetGroup(), len(d.Members))
	}
	resp := &catenapb.ResetGroupOffsetsResponse{}
	var commits []Commit
	for _, p := range parts {
		target, clamped, err := s.resolve(ctx, req, p)
		if err != nil {
			return nil, err
		}
		tp := TopicPartition{Topic: req.GetStream(), Partition: int32(p)}
		prev := int64(-1)
		if o, ok := d.Offsets[tp]; ok {
			prev = o.Offset
		}
		resp.Changes = append(resp.Changes, &catenapb.GroupOffsetChange{Partition: p, Previous: prev, Offset: target, Clamped: clamped})
		commits = append(commits, Commit{TopicPartition: tp, Committed: Committed{Offset: int64(target), LeaderEpoch: -1}})
	}
	if req.GetDryRun() {
		return resp, nil
	}
	errs, err := s.Coordinator.CommitOffsets(ctx, req.GetGroup(), "", -1, commits)
	if err != nil {
		return nil, grpcError(err)
	}
	for i, e := range errs {
		if e != nil {
			return nil, status.Errorf(status.Code(grpcError(e)), "reset %s/%d: %v", req.GetStream(), commits[i].Partition, e)
		}
	}
	return resp, nil
}

// resolve is the offset a reset moves partition p to, clamped into the
// partition's records.
func (s *Service) resolve(ctx context.Context, req *catenapb.ResetGroupOffsetsRequest, p uint32) (uint64, bool, error) {
	list := func(spec catenapb.OffsetSpec) (uint64, error) {
		r, err := s.Ingest.ListOffsets(ctx, &catenapb.ListOffsetsRequest{Stream: req.GetStream(), Partition: p, Spec: spec, TimestampMs: req.GetTimestampMs()})
		return r.GetOffset(), err
	}
	if req.GetSpec() != catenapb.OffsetSpec_OFFSET_SPEC_UNSPECIFIED {
		o, err := list(req.GetSpec())
		return o, false, err
	}
	start, err := list(catenapb.OffsetSpec_OFFSET_SPEC_EARLIEST)
	if err != nil {
		return 0, false, err
	}
	end, err := list(catenapb.OffsetSpec_OFFSET_SPEC_LATEST)
	if err != nil {
		return 0, false, err
	}
	switch o := req.GetOffset(); {
	case o < start:
		return start, true, nil
	case o > end:
		return end, true, nil
	default:
		return o, false, nil
	}
}

func (s *Service) DeleteGroup(ctx context.Context, req *catenapb.DeleteGroupRequest) (*catenapb.DeleteGroupResponse, error) {
	if req.GetGroup() == "" {
		return nil, status.Error(codes.InvalidArgument, "a group name is required")
	}
	if err := s.Coordinator.Delete(ctx, req.GetGroup()); err != nil {
		return nil, grpcError(err)
	}
	return &catenapb.DeleteGroupResponse{}, nil
}
