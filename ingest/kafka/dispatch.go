package kafka

import (
	"context"
	"sort"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// versions is the range of one API's versions the listener serves.
type versions struct{ min, max int16 }

// supported lists every API the listener serves, and ApiVersions reports
// exactly these: a client sees an API it may not use as absent and does
// without it. The ranges stop before versions that need what Catena does
// not have: topic ids (Metadata v10+ and Fetch v13+ name topics by a UUID),
// Produce v10+ (KIP-890's transaction verification), ListOffsets v7+
// (max-timestamp lookups), OffsetCommit v9+ and OffsetFetch v8+ (the new
// consumer protocol's member epochs, and several groups in one request).
// docs/kafka.md has the same table.
var supported = map[int16]versions{
	kmsg.Produce.Int16():         {3, 9},
	kmsg.Fetch.Int16():           {4, 12},
	kmsg.ListOffsets.Int16():     {1, 6},
	kmsg.Metadata.Int16():        {1, 9},
	kmsg.ApiVersions.Int16():     {0, 3},
	kmsg.CreateTopics.Int16():    {2, 6},
	kmsg.DeleteTopics.Int16():    {1, 5},
	kmsg.InitProducerID.Int16():  {0, 4},
	kmsg.DescribeConfigs.Int16(): {1, 4},

	kmsg.FindCoordinator.Int16(): {0, 4},
	kmsg.JoinGroup.Int16():       {0, 9},
	kmsg.SyncGroup.Int16():       {0, 5},
	kmsg.Heartbeat.Int16():       {0, 4},
	kmsg.LeaveGroup.Int16():      {0, 5},
	kmsg.OffsetCommit.Int16():    {2, 8},
	kmsg.OffsetFetch.Int16():     {1, 7},
	kmsg.ListGroups.Int16():      {0, 4},
	kmsg.DescribeGroups.Int16():  {0, 5},
	kmsg.DeleteGroups.Int16():    {0, 2},
}

// apiKeys is supported as ApiVersions reports it, by key.
func apiKeys() []kmsg.ApiVersionsResponseApiKey {
	out := make([]kmsg.ApiVersionsResponseApiKey, 0, len(supported))
	for k, v := range supported {
		key := kmsg.NewApiVersionsResponseApiKey()
		key.ApiKey, key.MinVersion, key.MaxVersion = k, v.min, v.max
		out = append(out, key)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ApiKey < out[j].ApiKey })
	return out
}

func (cn *conn) apiVersions() *kmsg.ApiVersionsResponse {
	resp := kmsg.NewPtrApiVersionsResponse()
	resp.ApiKeys = apiKeys()
	return resp
}

// apiVersionsUnsupported answers an ApiVersions of a version the listener
// does not serve: at v0, UNSUPPORTED_VERSION, with the versions it does, so
// that the client retries with one of them.
func (cn *conn) apiVersionsUnsupported() *kmsg.ApiVersionsResponse {
	resp := cn.apiVersions()
	resp.ErrorCode = kerr.UnsupportedVersion.Code
	resp.Version = 0
	return resp
}

// dispatch answers one parsed request. Produce is queued here, in the
// connection's order; the rest is answered in goroutines of their own,
// and every answer is written in request order.
func (cn *conn) dispatch(h header, req kmsg.Request) error {
	switch r := req.(type) {
	case *kmsg.ApiVersionsRequest:
		cn.reply(h, cn.apiVersions())
	case *kmsg.ProduceRequest:
		cn.produce(h, r)
	case *kmsg.FetchRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.fetch(ctx, r) })
	case *kmsg.ListOffsetsRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.listOffsets(ctx, r) })
	case *kmsg.MetadataRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.metadata(ctx, r) })
	case *kmsg.CreateTopicsRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.createTopics(ctx, r) })
	case *kmsg.DeleteTopicsRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.deleteTopics(ctx, r) })
	case *kmsg.InitProducerIDRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.initProducerID(ctx, r) })
	case *kmsg.DescribeConfigsRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.describeConfigs(ctx, r) })
	case *kmsg.FindCoordinatorRequest:
		cn.reply(h, cn.findCoordinator(r))
	case *kmsg.JoinGroupRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.joinGroup(ctx, h, r) })
	case *kmsg.SyncGroupRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.syncGroup(ctx, r) })
	case *kmsg.HeartbeatRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.heartbeat(ctx, r) })
	case *kmsg.LeaveGroupRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.leaveGroup(ctx, r) })
	case *kmsg.OffsetCommitRequest:
		// A connection's commits are applied in the order they came (a
		// client pipelining async commits expects the last to stay): each
		// waits for the one before it.
		prev, mine := cn.lastCommit, make(chan struct{})
		cn.lastCommit = mine
		cn.later(h, func(ctx context.Context) kmsg.Response {
			defer close(mine)
			if prev != nil {
				select {
				case <-prev:
				case <-ctx.Done():
					return nil
				}
			}
			return cn.offsetCommit(ctx, r)
		})
	case *kmsg.OffsetFetchRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.offsetFetch(ctx, r) })
	case *kmsg.ListGroupsRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.listGroups(ctx, r) })
	case *kmsg.DescribeGroupsRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.describeGroups(ctx, r) })
	case *kmsg.DeleteGroupsRequest:
		cn.later(h, func(ctx context.Context) kmsg.Response { return cn.deleteGroups(ctx, r) })
	}
	return nil
}
