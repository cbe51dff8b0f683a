package kafka

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/ingest/groups"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// metadata describes the brokers and the streams asked for (every stream
// for a null topic list). Every partition is led by one of the brokers;
// its replica list is that broker too, as a client cannot reach chain
// members and needs none: its writes and reads go through ingestion.
func (cn *conn) metadata(ctx context.Context, r *kmsg.MetadataRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.MetadataResponse)
	brokers := cn.srv.brokers()
	for _, br := range brokers {
		b := kmsg.NewMetadataResponseBroker()
		b.NodeID, b.Host, b.Port = br.id, br.host, br.port
		resp.Brokers = append(resp.Brokers, b)
	}
	resp.ClusterID = kmsg.StringPtr(ClusterID)
	resp.ControllerID = brokers[0].id
	// Brokers by id, so that every node names the same leader for a
	// partition.
	slices.SortFunc(brokers, func(a, b broker) int { return cmp.Compare(a.id, b.id) })
	var names []string
	if r.Topics == nil {
		if err := cn.authorize(ctx, catenapb.Ingest_ListStreams_FullMethodName, &catenapb.ListStreamsRequest{}); err != nil {
			return resp // no topic this caller may list
		}
		names = cn.srv.ing.StreamNames()
	} else {
		for _, t := range r.Topics {
			if t.Topic != nil {
				names = append(names, *t.Topic)
			}
		}
	}
	for _, name := range names {
		rt := kmsg.NewMetadataResponseTopic()
		rt.Topic = kmsg.StringPtr(name)
		// The groups' offsets stream is internal, as Kafka's
		// __consumer_offsets is: clients leave it out of pattern
		// subscriptions.
		rt.IsInternal = name == cn.srv.offsetsStream
		if err := cn.authorize(ctx, catenapb.Ingest_DescribeStream_FullMethodName, &catenapb.DescribeStreamRequest{Stream: name}); err != nil {
			rt.ErrorCode = kerr.TopicAuthorizationFailed.Code
			resp.Topics = append(resp.Topics, rt)
			continue
		}
		info, err := cn.srv.ing.Stream(ctx, name)
		if err != nil {
			code, _ := kafkaError(err, opRead)
			rt.ErrorCode = code.Code
			resp.Topics = append(resp.Topics, rt)
			continue
		}
		// Any broker serves any partition; leadership only spreads
		// clients' requests over the brokers, partition by partition,
		// starting at a broker the topic's name picks.
		first := int(groups.PeerID(name)) % len(brokers)
		for i := range info.Partitions {
			leader := brokers[(first+i)%len(brokers)].id
			p := kmsg.NewMetadataResponseTopicPartition()
			p.Partition, p.Leader, p.LeaderEpoch = int32(i), leader, -1
			p.Replicas, p.ISR = []int32{leader}, []int32{leader}
			if len(info.Chains[i]) == 0 {
				// No chain known yet: clients retry.
				p.ErrorCode, p.Leader = kerr.LeaderNotAvailable.Code, -1
			}
			rt.Partitions = append(rt.Partitions, p)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

// listOffsets resolves earliest (-2), latest (-1, the committed offset) or
// a timestamp to an offset.
func (cn *conn) listOffsets(ctx context.Context, r *kmsg.ListOffsetsRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.ListOffsetsResponse)
	for _, t := range r.Topics {
		rt := kmsg.NewListOffsetsResponseTopic()
		rt.Topic = t.Topic
		for _, p := range t.Partitions {
			out := kmsg.NewListOffsetsResponseTopicPartition()
			out.Partition, out.Timestamp, out.Offset, out.LeaderEpoch = p.Partition, -1, -1, -1
			req := &catenapb.ListOffsetsRequest{Stream: t.Topic, Partition: uint32(max(p.Partition, 0))}
			switch {
			case p.Timestamp == -1:
				req.Spec = catenapb.OffsetSpec_OFFSET_SPEC_LATEST
			case p.Timestamp == -2:
				req.Spec = catenapb.OffsetSpec_OFFSET_SPEC_EARLIEST
			case p.Timestamp >= 0:
				req.Spec, req.TimestampMs = catenapb.OffsetSpec_OFFSET_SPEC_TIMESTAMP, p.Timestamp
			default:
				out.ErrorCode = kerr.InvalidRequest.Code
				rt.Partitions = append(rt.Partitions, out)
				continue
			}
			if p.Partition < 0 {
				out.ErrorCode = kerr.UnknownTopicOrPartition.Code
				rt.Partitions = append(rt.Partitions, out)
				continue
			}
			if err := cn.authorize(ctx, catenapb.Ingest_ListOffsets_FullMethodName, req); err != nil {
				code, _ := kafkaError(err, opRead)
				out.ErrorCode = code.Code
				rt.Partitions = append(rt.Partitions, out)
				continue
			}
			res, err := cn.srv.ing.ListOffsets(ctx, req)
			if status.Code(err) == codes.InvalidArgument {
				err = status.Error(codes.NotFound, status.Convert(err).Message()) // a partition past the stream's
			}
			if err != nil {
				code, _ := kafkaError(err, opRead)
				out.ErrorCode = code.Code
			} else {
				out.Offset = int64(res.GetOffset())
				if req.Spec == catenapb.OffsetSpec_OFFSET_SPEC_TIMESTAMP {
					out.Offset, out.Timestamp = cn.recordAtOrAfter(ctx, req, res.GetOffset())
				}
			}
			rt.Partitions = append(rt.Partitions, out)
		}
		resp.Topics = append(resp.Topics, rt)
	}
	return resp
}

// recordAtOrAfter answers a lookup by timestamp as Kafka does: the offset
// and timestamp of the first record at or after the time; -1 and -1 when
// no committed record is, which clients take for "the end". Catena's
// ListOffsets found offset, the start of the first batch whose newest
// record is at or after the time: the records from there are read to
// find the first that is. A record that cannot be read now leaves the
// offset found with the time asked for.
func (cn *conn) recordAtOrAfter(ctx context.Context, req *catenapb.ListOffsetsRequest, offset uint64) (int64, int64) {
	end, err := cn.srv.ing.ListOffsets(ctx, &catenapb.ListOffsetsRequest{Stream: req.GetStream(), Partition: req.GetPartition(), Spec: catenapb.OffsetSpec_OFFSET_SPEC_LATEST})
	if err != nil {
		return int64(offset), req.GetTimestampMs()
	}
	if offset >= end.GetOffset() {
		return -1, -1
	}
	res, err := cn.srv.ing.Fetch(ctx, &catenapb.FetchRequest{Stream: req.GetStream(), Partition: req.GetPartition(), Offset: offset, MaxBytes: timeLookupBytes})
	if err != nil {
		return int64(offset), req.GetTimestampMs()
	}
	for _, r := range res.GetRecords() {
		if r.GetOffset() >= offset && r.GetTimestampMs() >= req.GetTimestampMs() {
			return int64(r.GetOffset()), r.GetTimestampMs()
		}
	}
	return int64(offset), req.GetTimestampMs()
}

// timeLookupBytes is how much a lookup by timestamp reads from the batch
// the index found: a batch, whole, is at most a few MiB.
const timeLookupBytes = 4 << 20

// initProducerID gives an idempotent producer its id. Catena keeps no
// producer state to allocate from: ids are random, 62 bits, and the epoch
// is always 0; a producer that asks again (to bump its epoch after an
// error, KIP-360) gets a new id. Transactional producers are refused.
func (cn *conn) initProducerID(ctx context.Context, r *kmsg.InitProducerIDRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.InitProducerIDResponse)
	resp.ProducerID, resp.ProducerEpoch = -1, -1
	if r.TransactionalID != nil {
		resp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
		cn.log.Info("Refused a transactional Kafka producer: Catena has no Kafka transactions", "transactionalID", *r.TransactionalID)
		return resp
	}
	id, err := randomProducerID()
	if err != nil {
		resp.ErrorCode = kerr.UnknownServerError.Code
		return resp
	}
	resp.ProducerID, resp.ProducerEpoch = id, 0
	return resp
}

// createTopics creates streams where the deployment lets clients (catena
// dev); elsewhere each topic is refused with the reason (a Stream object).
func (cn *conn) createTopics(ctx context.Context, r *kmsg.CreateTopicsRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.CreateTopicsResponse)
	for _, t := range r.Topics {
		out := kmsg.NewCreateTopicsResponseTopic()
		out.Topic, out.NumPartitions, out.ReplicationFactor = t.Topic, -1, -1
		fail := func(code *kerr.Error, msg string) {
			out.ErrorCode, out.ErrorMessage = code.Code, errString(msg)
		}
		partitions := t.NumPartitions
		switch {
		case len(t.ReplicaAssignment) > 0:
			fail(kerr.InvalidReplicaAssignment, "Catena places partitions on chains itself; a replica assignment cannot be given")
		case partitions == -1:
			partitions = 1
			fallthrough
		default:
			if msg := unsupportedConfigs(t.Configs); msg != "" {
				fail(kerr.InvalidConfig, msg)
				break
			}
			if partitions <= 0 {
				fail(kerr.InvalidPartitions, fmt.Sprintf("a topic needs at least one partition, not %d", partitions))
				break
			}
			req := &catenapb.CreateStreamRequest{Stream: t.Topic, Partitions: uint32(partitions)}
			if err := cn.authorize(ctx, catenapb.Ingest_CreateStream_FullMethodName, req); err != nil {
				fail(kafkaError(err, opAdmin))
				break
			}
			if r.ValidateOnly {
				if _, err := cn.srv.ing.Stream(ctx, t.Topic); err == nil {
					fail(kerr.TopicAlreadyExists, fmt.Sprintf("stream %q exists", t.Topic))
				}
				break
			}
			desc, err := cn.srv.ing.CreateStream(ctx, req)
			if err != nil {
				code, msg := kafkaError(err, opAdmin)
				if status.Code(err) == codes.InvalidArgument {
					code = kerr.InvalidTopicException
				}
				fail(code, msg)
				break
			}
			out.NumPartitions = int32(len(desc.GetPartitions()))
			if len(desc.GetPartitions()) > 0 {
				out.ReplicationFactor = int16(len(desc.GetPartitions()[0].GetMembers()))
			}
		}
		resp.Topics = append(resp.Topics, out)
	}
	return resp
}

// unsupportedConfigs names the first topic config a stream cannot take
// ("" when none): Catena keeps records until retention, compaction is not
// there, and a stream's other settings come from its Stream object or
// catena dev's flags.
func unsupportedConfigs(configs []kmsg.CreateTopicsRequestTopicConfig) string {
	for _, c := range configs {
		v := ""
		if c.Value != nil {
			v = *c.Value
		}
		if c.Name == "cleanup.policy" && v == "delete" {
			continue
		}
		return fmt.Sprintf("topic config %s=%s cannot be set through Kafka: Catena streams take their settings from the Stream object (or catena dev's flags), and do not compact", c.Name, v)
	}
	return ""
}

// deleteTopics deletes streams where the deployment lets clients.
func (cn *conn) deleteTopics(ctx context.Context, r *kmsg.DeleteTopicsRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.DeleteTopicsResponse)
	names := r.TopicNames
	for _, t := range r.Topics {
		if t.Topic != nil {
			names = append(names, *t.Topic)
		}
	}
	for _, name := range names {
		out := kmsg.NewDeleteTopicsResponseTopic()
		out.Topic = kmsg.StringPtr(name)
		req := &catenapb.DeleteStreamRequest{Stream: name}
		err := cn.authorize(ctx, catenapb.Ingest_DeleteStream_FullMethodName, req)
		if err == nil && name == cn.srv.offsetsStream {
			out.ErrorCode = kerr.InvalidTopicException.Code
			out.ErrorMessage = errString(fmt.Sprintf("stream %q holds every consumer group's committed offsets: not deleted", name))
			resp.Topics = append(resp.Topics, out)
			continue
		}
		if err == nil {
			_, err = cn.srv.ing.DeleteStream(ctx, req)
		}
		if err != nil {
			code, msg := kafkaError(err, opAdmin)
			out.ErrorCode, out.ErrorMessage = code.Code, errString(msg)
		}
		resp.Topics = append(resp.Topics, out)
	}
	return resp
}

// describeConfigs reports the Kafka equivalents of a stream's settings,
// read-only (they change through the Stream object), and no broker
// configs.
func (cn *conn) describeConfigs(ctx context.Context, r *kmsg.DescribeConfigsRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.DescribeConfigsResponse)
	for _, res := range r.Resources {
		out := kmsg.NewDescribeConfigsResponseResource()
		out.ResourceType, out.ResourceName = res.ResourceType, res.ResourceName
		switch res.ResourceType {
		case kmsg.ConfigResourceTypeBroker:
			// None to report.
		case kmsg.ConfigResourceTypeTopic:
			if err := cn.authorize(ctx, catenapb.Ingest_DescribeStream_FullMethodName, &catenapb.DescribeStreamRequest{Stream: res.ResourceName}); err != nil {
				code, msg := kafkaError(err, opRead)
				out.ErrorCode, out.ErrorMessage = code.Code, errString(msg)
				break
			}
			info, err := cn.srv.ing.Stream(ctx, res.ResourceName)
			if err != nil {
				code, msg := kafkaError(err, opRead)
				out.ErrorCode, out.ErrorMessage = code.Code, errString(msg)
				break
			}
			for _, c := range topicConfigs(info.Config) {
				if len(res.ConfigNames) > 0 && !slices.Contains(res.ConfigNames, c.name) {
					continue
				}
				e := kmsg.NewDescribeConfigsResponseResourceConfig()
				e.Name, e.Value, e.ReadOnly, e.IsDefault = c.name, kmsg.StringPtr(c.value), true, c.isDefault
				e.Source = kmsg.ConfigSourceDynamicTopicConfig
				if c.isDefault {
					e.Source = kmsg.ConfigSourceDefaultConfig
				}
				out.Configs = append(out.Configs, e)
			}
		default:
			out.ErrorCode = kerr.InvalidRequest.Code
			out.ErrorMessage = errString(fmt.Sprintf("resource type %d is not described by Catena", res.ResourceType))
		}
		resp.Resources = append(resp.Resources, out)
	}
	return resp
}

type topicConfig struct {
	name, value string
	isDefault   bool
}

// topicConfigs maps a stream's config to Kafka topic configs.
func topicConfigs(c *catenapb.StreamConfig) []topicConfig {
	orUnlimited := func(v int64) (string, bool) {
		if v <= 0 {
			return "-1", true
		}
		return strconv.FormatInt(v, 10), false
	}
	var out []topicConfig
	add := func(name, value string, isDefault bool) {
		out = append(out, topicConfig{name, value, isDefault})
	}
	add("cleanup.policy", "delete", true)
	v, d := orUnlimited(c.GetRetentionMs())
	add("retention.ms", v, d)
	v, d = orUnlimited(c.GetRetentionBytes())
	add("retention.bytes", v, d)
	if c.GetSegmentBytes() > 0 {
		add("segment.bytes", strconv.FormatInt(c.GetSegmentBytes(), 10), false)
	}
	if c.GetMaxRecordBytes() > 0 {
		add("max.message.bytes", strconv.FormatUint(uint64(c.GetMaxRecordBytes()), 10), false)
	}
	add("min.insync.replicas", strconv.FormatUint(uint64(max(c.GetMinChainLength(), 1)), 10), c.GetMinChainLength() <= 1)
	add("message.timestamp.type", "CreateTime", true)
	add("compression.type", "producer", true)
	return out
}
