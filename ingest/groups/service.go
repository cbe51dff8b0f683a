package groups

import (
	"context"
	"sort"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/ingest"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
)

// Service serves the Groups gRPC API (list, describe, reset, delete, and
// membership for Catena's own clients) from the Coordinator that the Kafka
// listener's groups join. With several ingestion nodes (Membership) a
// client reaches whichever one its connection landed on, so a request
// about a group another node coordinates is forwarded to that node, and a
// list asks every node.
type Service struct {
	catenapb.UnimplementedGroupsServer
	Coordinator *Coordinator
	// Ingest resolves offsets (earliest, latest, by time) and checks
	// streams and partitions.
	Ingest *ingest.Server
	// Membership is the Coordinator's (nil: it coordinates every group).
	Membership *Membership
	// Dial connects to another node's Groups service by its host (the
	// node's gRPC port, this node's TLS). A forwarded request is made with
	// this node's identity, after this node's policy admitted the caller;
	// the peer admits this node's identity (on Kubernetes, the operator
	// lists the ingestion identity among the allowed).
	Dial func(host string) (*grpc.ClientConn, error)
}

// Register registers the service on g.
func (s *Service) Register(g *grpc.Server) { catenapb.RegisterGroupsServer(g, s) }

// grpcError is a coordinator's refusal as a gRPC status, with Kafka's
// name for it as the ErrorInfo reason where a member acts on it.
func grpcError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok && CodeOf(err) == CoordinatorNotAvailable {
		return err
	}
	c, reason := codes.Unavailable, ""
	switch CodeOf(err) {
	case GroupIDNotFound, UnknownTopicOrPartition:
		c = codes.NotFound
	case NonEmptyGroup:
		c = codes.FailedPrecondition
	case UnknownMemberID:
		c, reason = codes.FailedPrecondition, contract.GroupUnknownMember
	case IllegalGeneration:
		c, reason = codes.FailedPrecondition, contract.GroupIllegalGeneration
	case RebalanceInProgress:
		c, reason = codes.FailedPrecondition, contract.GroupRebalanceInProgress
	case MemberIDRequired:
		c, reason = codes.FailedPrecondition, contract.GroupMemberIDRequired
	case CoordinatorLoadInProgress:
		c, reason = codes.Unavailable, contract.GroupCoordinatorLoading
	case NotCoordinator:
		c, reason = codes.Unavailable, contract.GroupNotCoordinator
	case InvalidGroupID, InvalidSessionTimeout, InconsistentGroupProtocol:
		c = codes.InvalidArgument
	case GroupMaxSizeReached, HoldsFull:
		c = codes.ResourceExhausted
	}
	st := status.New(c, err.Error())
	if reason != "" {
		if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: "catena.io"}); derr == nil {
			st = d
		}
	}
	return st.Err()
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
	return s.listEverywhere(ctx, resp)
}

func (s *Service) DescribeGroup(ctx context.Context, req *catenapb.DescribeGroupRequest) (*catenapb.GroupDescription, error) {
	if req.GetGroup() == "" {
		return nil, status.Error(codes.InvalidArgument, "a group name is required")
	}
	if resp, done, err := forward(ctx, s, req.GetGroup(), req, catenapb.GroupsClient.DescribeGroup); done {
		return resp, err
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
	if resp, done, err := forward(ctx, s, req.GetGroup(), req, catenapb.GroupsClient.ResetGroupOffsets); done {
		return resp, err
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
	if resp, done, err := forward(ctx, s, req.GetGroup(), req, catenapb.GroupsClient.DeleteGroup); done {
		return resp, err
	}
	if err := s.Coordinator.Delete(ctx, req.GetGroup()); err != nil {
		return nil, grpcError(err)
	}
	return &catenapb.DeleteGroupResponse{}, nil
}

// memberStream checks a membership request's group and stream.
func (s *Service) memberStream(ctx context.Context, group, stream string) error {
	if group == "" || stream == "" {
		return status.Error(codes.InvalidArgument, "a group and the stream the member consumes are required")
	}
	_, err := s.Ingest.Stream(ctx, stream)
	return err
}

func (s *Service) JoinGroup(ctx context.Context, req *catenapb.JoinGroupRequest) (*catenapb.JoinGroupResponse, error) {
	if err := s.memberStream(ctx, req.GetGroup(), req.GetStream()); err != nil {
		return nil, err
	}
	if resp, done, err := forward(ctx, s, req.GetGroup(), req, catenapb.GroupsClient.JoinGroup); done {
		return resp, err
	}
	jr := JoinRequest{Group: req.GetGroup(), MemberID: req.GetMemberId(), ClientID: req.GetClientId(), ProtocolType: req.GetProtocolType(),
		SessionTimeout:     time.Duration(req.GetSessionTimeoutMs()) * time.Millisecond,
		RebalanceTimeout:   time.Duration(req.GetRebalanceTimeoutMs()) * time.Millisecond,
		RequireKnownMember: true, ClientHost: clientHost(ctx)}
	for _, p := range req.GetProtocols() {
		jr.Protocols = append(jr.Protocols, Protocol{Name: p.GetName(), Metadata: p.GetMetadata()})
	}
	var r JoinResult
	select {
	case r = <-s.Coordinator.Join(ctx, jr):
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if r.Err != nil {
		err := grpcError(r.Err)
		if r.Err.Code == MemberIDRequired {
			st := status.New(codes.FailedPrecondition, r.Err.Error())
			if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: contract.GroupMemberIDRequired, Domain: "catena.io", Metadata: map[string]string{"member_id": r.MemberID}}); derr == nil {
				st = d
			}
			err = st.Err()
		}
		return nil, err
	}
	resp := &catenapb.JoinGroupResponse{Generation: r.Generation, Protocol: r.Protocol, Leader: r.Leader, MemberId: r.MemberID}
	for _, m := range r.Members {
		resp.Members = append(resp.Members, &catenapb.JoinGroupMember{MemberId: m.ID, Metadata: m.Metadata})
	}
	return resp, nil
}

func (s *Service) SyncGroup(ctx context.Context, req *catenapb.SyncGroupRequest) (*catenapb.SyncGroupResponse, error) {
	if err := s.memberStream(ctx, req.GetGroup(), req.GetStream()); err != nil {
		return nil, err
	}
	if resp, done, err := forward(ctx, s, req.GetGroup(), req, catenapb.GroupsClient.SyncGroup); done {
		return resp, err
	}
	sr := SyncRequest{Group: req.GetGroup(), Generation: req.GetGeneration(), MemberID: req.GetMemberId(), Assignments: map[string][]byte{}}
	for _, a := range req.GetAssignments() {
		sr.Assignments[a.GetMemberId()] = a.GetAssignment()
	}
	var r SyncResult
	select {
	case r = <-s.Coordinator.Sync(ctx, sr):
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if r.Err != nil {
		return nil, grpcError(r.Err)
	}
	return &catenapb.SyncGroupResponse{Assignment: r.Assignment}, nil
}

func (s *Service) Heartbeat(ctx context.Context, req *catenapb.HeartbeatRequest) (*catenapb.HeartbeatResponse, error) {
	if req.GetGroup() == "" || req.GetStream() == "" {
		return nil, status.Error(codes.InvalidArgument, "a group and the stream the member consumes are required")
	}
	if resp, done, err := forward(ctx, s, req.GetGroup(), req, catenapb.GroupsClient.Heartbeat); done {
		return resp, err
	}
	if err := s.Coordinator.Heartbeat(ctx, req.GetGroup(), req.GetMemberId(), req.GetGeneration()); err != nil {
		return nil, grpcError(err)
	}
	return &catenapb.HeartbeatResponse{}, nil
}

func (s *Service) LeaveGroup(ctx context.Context, req *catenapb.LeaveGroupRequest) (*catenapb.LeaveGroupResponse, error) {
	if req.GetGroup() == "" || req.GetStream() == "" {
		return nil, status.Error(codes.InvalidArgument, "a group and the stream the member consumes are required")
	}
	if resp, done, err := forward(ctx, s, req.GetGroup(), req, catenapb.GroupsClient.LeaveGroup); done {
		return resp, err
	}
	errs, err := s.Coordinator.Leave(ctx, req.GetGroup(), []string{req.GetMemberId()})
	if err == nil {
		err = errs[0]
	}
	if err != nil {
		return nil, grpcError(err)
	}
	return &catenapb.LeaveGroupResponse{}, nil
}

func (s *Service) CommitGroupOffsets(ctx context.Context, req *catenapb.CommitGroupOffsetsRequest) (*catenapb.CommitGroupOffsetsResponse, error) {
	if err := s.memberStream(ctx, req.GetGroup(), req.GetStream()); err != nil {
		return nil, err
	}
	if resp, done, err := forward(ctx, s, req.GetGroup(), req, catenapb.GroupsClient.CommitGroupOffsets); done {
		return resp, err
	}
	var commits []Commit
	for _, o := range req.GetOffsets() {
		if len(o.GetMetadata()) > MaxOffsetMetadata {
			return nil, status.Errorf(codes.InvalidArgument, "partition %d's metadata is %d bytes, above %d; nothing was committed", o.GetPartition(), len(o.GetMetadata()), MaxOffsetMetadata)
		}
		commits = append(commits, Commit{TopicPartition: TopicPartition{Topic: req.GetStream(), Partition: int32(o.GetPartition())},
			Committed: Committed{Offset: int64(o.GetOffset()), LeaderEpoch: -1, Metadata: o.GetMetadata()}})
	}
	errs, err := s.Coordinator.CommitOffsets(ctx, req.GetGroup(), req.GetMemberId(), req.GetGeneration(), commits)
	if err != nil {
		return nil, grpcError(err)
	}
	for i, e := range errs {
		if e != nil {
			return nil, status.Errorf(status.Code(grpcError(e)), "commit %s/%d: %v", req.GetStream(), commits[i].Partition, e)
		}
	}
	return &catenapb.CommitGroupOffsetsResponse{}, nil
}
