package kafka

import (
	"context"
	"errors"
	"net"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/catena-streams/catena/ingest/groups"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// The consumer-group APIs: FindCoordinator names the broker coordinating
// a group (this one, or with Options.Membership the group's owner among
// the nodes), and groups.Coordinator decides; a node asked about a group
// it does not coordinate answers NOT_COORDINATOR and the client asks
// again. Joining, syncing and heartbeats reveal no
// records and need only a connection the listener accepted; committing
// and fetching a group's offsets in a stream is consuming it, and is
// authorized per stream as Ingest.CommitConsumerOffset and
// Ingest.ListConsumers are.

// groupCode maps a coordinator's refusal to Kafka's error.
func groupCode(err error) *kerr.Error {
	switch groups.CodeOf(err) {
	case groups.OK:
		return nil
	case groups.UnknownMemberID:
		return kerr.UnknownMemberID
	case groups.IllegalGeneration:
		return kerr.IllegalGeneration
	case groups.RebalanceInProgress:
		return kerr.RebalanceInProgress
	case groups.MemberIDRequired:
		return kerr.MemberIDRequired
	case groups.InconsistentGroupProtocol:
		return kerr.InconsistentGroupProtocol
	case groups.InvalidSessionTimeout:
		return kerr.InvalidSessionTimeout
	case groups.InvalidGroupID:
		return kerr.InvalidGroupID
	case groups.GroupIDNotFound:
		return kerr.GroupIDNotFound
	case groups.NonEmptyGroup:
		return kerr.NonEmptyGroup
	case groups.CoordinatorLoadInProgress:
		return kerr.CoordinatorLoadInProgress
	case groups.UnknownTopicOrPartition:
		return kerr.UnknownTopicOrPartition
	case groups.GroupMaxSizeReached:
		return kerr.GroupMaxSizeReached
	case groups.NotCoordinator:
		return kerr.NotCoordinator
	case groups.HoldsFull:
		// Not retried by clients: room comes only when groups or
		// consumers holding the partition are deleted (or expire).
		return kerr.PolicyViolation
	}
	var auth *authError
	if errors.As(err, &auth) {
		return kerr.TopicAuthorizationFailed
	}
	// A store that failed: the client finds the coordinator again and
	// retries.
	return kerr.CoordinatorNotAvailable
}

// authError is a refusal of Options.Authorize.
type authError struct{ err error }

func (e *authError) Error() string { return e.err.Error() }

func errorMessage(err error) *string {
	if err == nil {
		return nil
	}
	s := err.Error()
	return &s
}

func (cn *conn) clientHost() string {
	host, _, err := net.SplitHostPort(cn.c.RemoteAddr().String())
	if err != nil {
		return cn.c.RemoteAddr().String()
	}
	return "/" + host
}

func (cn *conn) findCoordinator(r *kmsg.FindCoordinatorRequest) *kmsg.FindCoordinatorResponse {
	resp := kmsg.NewPtrFindCoordinatorResponse()
	keys := r.CoordinatorKeys
	if r.Version < 4 {
		keys = []string{r.CoordinatorKey}
	}
	for _, key := range keys {
		c := kmsg.NewFindCoordinatorResponseCoordinator()
		b := cn.srv.coordinator(key)
		c.Key, c.NodeID, c.Host, c.Port = key, b.id, b.host, b.port
		switch {
		case r.CoordinatorType == 1:
			// Transactions are not served.
			c.ErrorCode = kerr.CoordinatorNotAvailable.Code
			c.ErrorMessage = ptr("transactions are not supported by Catena")
			c.NodeID, c.Host, c.Port = -1, "", -1
		case key == "":
			c.ErrorCode = kerr.InvalidGroupID.Code
			c.ErrorMessage = ptr("a group id is required")
			c.NodeID, c.Host, c.Port = -1, "", -1
		}
		resp.Coordinators = append(resp.Coordinators, c)
	}
	if r.Version < 4 && len(resp.Coordinators) == 1 {
		c := resp.Coordinators[0]
		resp.ErrorCode, resp.ErrorMessage, resp.NodeID, resp.Host, resp.Port = c.ErrorCode, c.ErrorMessage, c.NodeID, c.Host, c.Port
		// Not sent before v4; kept, it would count twice in the
		// listener's error metrics, which read the whole response.
		resp.Coordinators = nil
	}
	return resp
}

func ptr[T any](v T) *T { return &v }

func (cn *conn) joinGroup(ctx context.Context, h header, r *kmsg.JoinGroupRequest) kmsg.Response {
	resp := kmsg.NewPtrJoinGroupResponse()
	req := groups.JoinRequest{
		Group: r.Group, MemberID: r.MemberID, ClientID: h.clientID, ClientHost: cn.clientHost(),
		ProtocolType:       r.ProtocolType,
		SessionTimeout:     time.Duration(r.SessionTimeoutMillis) * time.Millisecond,
		RebalanceTimeout:   time.Duration(r.RebalanceTimeoutMillis) * time.Millisecond,
		RequireKnownMember: r.Version >= 4,
	}
	for _, p := range r.Protocols {
		req.Protocols = append(req.Protocols, groups.Protocol{Name: p.Name, Metadata: p.Metadata})
	}
	var res groups.JoinResult
	select {
	case res = <-cn.srv.groups.Join(ctx, req):
	case <-ctx.Done():
		return nil
	}
	if res.Err != nil {
		resp.ErrorCode = groupCode(res.Err).Code
		resp.Generation = -1
		resp.MemberID = res.MemberID
		return resp
	}
	resp.Generation, resp.LeaderID, resp.MemberID = res.Generation, res.Leader, res.MemberID
	resp.Protocol = ptr(res.Protocol)
	resp.ProtocolType = ptr(res.ProtocolType)
	for _, m := range res.Members {
		jm := kmsg.NewJoinGroupResponseMember()
		jm.MemberID, jm.ProtocolMetadata = m.ID, m.Metadata
		resp.Members = append(resp.Members, jm)
	}
	return resp
}

func (cn *conn) syncGroup(ctx context.Context, r *kmsg.SyncGroupRequest) kmsg.Response {
	resp := kmsg.NewPtrSyncGroupResponse()
	req := groups.SyncRequest{Group: r.Group, Generation: r.Generation, MemberID: r.MemberID, Assignments: map[string][]byte{}}
	for _, a := range r.GroupAssignment {
		req.Assignments[a.MemberID] = a.MemberAssignment
	}
	var res groups.SyncResult
	select {
	case res = <-cn.srv.groups.Sync(ctx, req):
	case <-ctx.Done():
		return nil
	}
	if res.Err != nil {
		resp.ErrorCode = groupCode(res.Err).Code
		return resp
	}
	resp.ProtocolType, resp.Protocol = ptr(res.ProtocolType), ptr(res.Protocol)
	resp.MemberAssignment = res.Assignment
	return resp
}

func (cn *conn) heartbeat(ctx context.Context, r *kmsg.HeartbeatRequest) kmsg.Response {
	resp := kmsg.NewPtrHeartbeatResponse()
	if err := cn.srv.groups.Heartbeat(ctx, r.Group, r.MemberID, r.Generation); err != nil {
		resp.ErrorCode = groupCode(err).Code
	}
	return resp
}

func (cn *conn) leaveGroup(ctx context.Context, r *kmsg.LeaveGroupRequest) kmsg.Response {
	resp := kmsg.NewPtrLeaveGroupResponse()
	ids := []string{r.MemberID}
	if r.Version >= 3 {
		ids = ids[:0]
		for _, m := range r.Members {
			ids = append(ids, m.MemberID)
		}
	}
	errs, err := cn.srv.groups.Leave(ctx, r.Group, ids)
	if err != nil {
		resp.ErrorCode = groupCode(err).Code
		return resp
	}
	for i, id := range ids {
		if r.Version < 3 {
			if errs[i] != nil {
				resp.ErrorCode = groupCode(errs[i]).Code
			}
			break
		}
		m := kmsg.NewLeaveGroupResponseMember()
		m.MemberID = id
		if r.Version >= 3 && i < len(r.Members) {
			m.InstanceID = r.Members[i].InstanceID
		}
		if errs[i] != nil {
			m.ErrorCode = groupCode(errs[i]).Code
		}
		resp.Members = append(resp.Members, m)
	}
	return resp
}

func (cn *conn) offsetCommit(ctx context.Context, r *kmsg.OffsetCommitRequest) kmsg.Response {
	resp := kmsg.NewPtrOffsetCommitResponse()
	var commits []groups.Commit
	// where[i] is commits[i]'s place in the response.
	type place struct{ t, p int }
	var where []place
	for ti, t := range r.Topics {
		rt := kmsg.NewOffsetCommitResponseTopic()
		rt.Topic = t.Topic
		authErr := cn.authorize(ctx, catenapb.Ingest_CommitConsumerOffset_FullMethodName, &catenapb.CommitConsumerOffsetRequest{Stream: t.Topic})
		for pi, p := range t.Partitions {
			rp := kmsg.NewOffsetCommitResponseTopicPartition()
			rp.Partition = p.Partition
			if authErr != nil {
				rp.ErrorCode = kerr.TopicAuthorizationFailed.Code
			} else {
				c := groups.Commit{TopicPartition: groups.TopicPartition{Topic: t.Topic, Partition: p.Partition}}
				c.Offset, c.LeaderEpoch = p.Offset, -1
				if r.Version >= 6 {
					c.LeaderEpoch = p.LeaderEpoch
				}
				if p.Metadata != nil {
					c.Metadata = *p.Metadata
				}
				if len(c.Metadata) > groups.MaxOffsetMetadata {
					rp.ErrorCode = kerr.OffsetMetadataTooLarge.Code
				} else {
					commits = append(commits, c)
					where = append(where, place{ti, pi})
				}
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	if len(commits) == 0 {
		return resp
	}
	errs, err := cn.srv.groups.CommitOffsets(ctx, r.Group, r.MemberID, r.Generation, commits)
	for i, w := range where {
		e := err
		if e == nil {
			e = errs[i]
		}
		if e != nil {
			resp.Topics[w.t].Partitions[w.p].ErrorCode = groupCode(e).Code
			cn.log.V(1).Info("Kafka offset commit refused", "group", r.Group, "topic", commits[i].Topic, "partition", commits[i].Partition, "err", e.Error())
		}
	}
	return resp
}

func (cn *conn) offsetFetch(ctx context.Context, r *kmsg.OffsetFetchRequest) kmsg.Response {
	resp := kmsg.NewPtrOffsetFetchResponse()
	var tps []groups.TopicPartition
	if r.Topics != nil {
		tps = []groups.TopicPartition{}
		for _, t := range r.Topics {
			for _, p := range t.Partitions {
				tps = append(tps, groups.TopicPartition{Topic: t.Topic, Partition: p})
			}
		}
	}
	got, err := cn.srv.groups.FetchOffsets(ctx, r.Group, tps)
	if err != nil {
		code := groupCode(err).Code
		if r.Version >= 2 {
			resp.ErrorCode = code
			return resp
		}
		// v1 has no top-level error (so none is set: the listener's
		// error metrics read the whole response): each partition
		// carries it, or the client would take "no offsets" and reset
		// its position.
		for _, t := range r.Topics {
			rt := kmsg.NewOffsetFetchResponseTopic()
			rt.Topic = t.Topic
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetFetchResponseTopicPartition()
				rp.Partition, rp.Offset, rp.ErrorCode = p, -1, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp
	}
	if tps == nil {
		// Every partition the group committed on.
		for tp := range got {
			tps = append(tps, tp)
		}
		sort.Slice(tps, func(i, j int) bool {
			if tps[i].Topic != tps[j].Topic {
				return tps[i].Topic < tps[j].Topic
			}
			return tps[i].Partition < tps[j].Partition
		})
	}
	allowed := map[string]bool{}
	for _, tp := range tps {
		if len(resp.Topics) == 0 || resp.Topics[len(resp.Topics)-1].Topic != tp.Topic {
			rt := kmsg.NewOffsetFetchResponseTopic()
			rt.Topic = tp.Topic
			resp.Topics = append(resp.Topics, rt)
			allowed[tp.Topic] = cn.authorize(ctx, catenapb.Ingest_ListConsumers_FullMethodName, &catenapb.ListConsumersRequest{Stream: tp.Topic}) == nil
		}
		rt := &resp.Topics[len(resp.Topics)-1]
		rp := kmsg.NewOffsetFetchResponseTopicPartition()
		rp.Partition, rp.Offset, rp.LeaderEpoch = tp.Partition, -1, -1
		c, ok := got[tp]
		switch {
		case !allowed[tp.Topic]:
			rp.ErrorCode = kerr.TopicAuthorizationFailed.Code
		case ok:
			rp.Offset, rp.LeaderEpoch = c.Offset, c.LeaderEpoch
			rp.Metadata = ptr(c.Metadata)
		}
		rt.Partitions = append(rt.Partitions, rp)
	}
	return resp
}

func (cn *conn) listGroups(ctx context.Context, r *kmsg.ListGroupsRequest) kmsg.Response {
	resp := kmsg.NewPtrListGroupsResponse()
	all, err := cn.srv.groups.List(ctx)
	if err != nil {
		resp.ErrorCode = groupCode(err).Code
		return resp
	}
	for _, g := range all {
		if len(r.StatesFilter) > 0 && !slices.ContainsFunc(r.StatesFilter, func(f string) bool { return strings.EqualFold(f, string(g.State)) }) {
			continue
		}
		rg := kmsg.NewListGroupsResponseGroup()
		rg.Group, rg.ProtocolType, rg.GroupState = g.Name, g.ProtocolType, string(g.State)
		resp.Groups = append(resp.Groups, rg)
	}
	return resp
}

func (cn *conn) describeGroups(ctx context.Context, r *kmsg.DescribeGroupsRequest) kmsg.Response {
	resp := kmsg.NewPtrDescribeGroupsResponse()
	for _, name := range r.Groups {
		rg := kmsg.NewDescribeGroupsResponseGroup()
		rg.Group = name
		d, err := cn.srv.groups.Describe(ctx, name)
		if err != nil {
			rg.ErrorCode = groupCode(err).Code
			resp.Groups = append(resp.Groups, rg)
			continue
		}
		rg.State, rg.ProtocolType, rg.Protocol = string(d.State), d.ProtocolType, d.Protocol
		for _, m := range d.Members {
			rm := kmsg.NewDescribeGroupsResponseGroupMember()
			rm.MemberID, rm.ClientID, rm.ClientHost = m.ID, m.ClientID, m.ClientHost
			rm.ProtocolMetadata, rm.MemberAssignment = m.Metadata, m.Assignment
			rg.Members = append(rg.Members, rm)
		}
		resp.Groups = append(resp.Groups, rg)
	}
	return resp
}

func (cn *conn) deleteGroups(ctx context.Context, r *kmsg.DeleteGroupsRequest) kmsg.Response {
	resp := kmsg.NewPtrDeleteGroupsResponse()
	for _, name := range r.Groups {
		rg := kmsg.NewDeleteGroupsResponseGroup()
		rg.Group = name
		err := cn.authorizeGroup(ctx, name)
		if err == nil {
			err = cn.srv.groups.Delete(ctx, name)
		}
		if err != nil {
			rg.ErrorCode = groupCode(err).Code
			rg.ErrorMessage = errorMessage(err)
		}
		resp.Groups = append(resp.Groups, rg)
	}
	return resp
}

// authorizeGroup asks whether the connection may consume every stream the
// group has committed offsets on, as deleting the group releases its
// holds on them.
func (cn *conn) authorizeGroup(ctx context.Context, name string) error {
	offs, err := cn.srv.groups.FetchOffsets(ctx, name, nil)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	for tp := range offs {
		if seen[tp.Topic] {
			continue
		}
		seen[tp.Topic] = true
		if err := cn.authorize(ctx, catenapb.Ingest_DeleteConsumer_FullMethodName, &catenapb.DeleteConsumerRequest{Stream: tp.Topic}); err != nil {
			return &authError{err}
		}
	}
	return nil
}
