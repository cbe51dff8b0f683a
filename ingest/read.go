package ingest

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// readAttemptSlack is what a read attempt may take beyond its long-poll.
const readAttemptSlack = 2 * time.Second

// partitionRoute returns the route of one partition or a clear error.
func (s *Server) partition(ctx context.Context, stream string, index uint32) (*partitionRoute, error) {
	sr, err := s.stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	if int(index) >= len(sr.partitions) {
		return nil, status.Errorf(codes.InvalidArgument, "stream %q has %d partitions; partition %d does not exist", stream, len(sr.partitions), index)
	}
	pr := sr.partitions[index]
	if pr == nil || len(pr.members) == 0 {
		return nil, status.Errorf(codes.Unavailable, "partition %s/%d has no known chain", stream, index)
	}
	return pr, nil
}

// readFrom tries the members of a partition's chain, tail first, until one
// answers. Every member serves committed records only.
//
// Each attempt is bounded by the read's own wait plus readAttemptSlack, so
// a member that hangs (paused, partitioned) costs one attempt, not the
// caller's whole deadline.
func (s *Server) readFrom(ctx context.Context, stream string, index uint32, wait time.Duration, call func(context.Context, catenapb.ReplicaClient) error) error {
	pr, err := s.partition(ctx, stream, index)
	if err != nil {
		return err
	}
	var last error
	for _, m := range pr.readOrder() {
		conn, err := s.pool.Get(m.GetAddr())
		if err != nil {
			last = err
			continue
		}
		actx, cancel := context.WithTimeout(ctx, wait+readAttemptSlack)
		err = call(actx, catenapb.NewReplicaClient(conn))
		cancel()
		if err == nil {
			return nil
		}
		last = err
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		switch status.Code(err) {
		case codes.InvalidArgument, codes.OutOfRange, codes.Canceled:
			return err
		}
	}
	s.disc.requestRefresh()
	return last
}

// errBehind: a member answered with a committed offset below what this
// ingestion already acknowledged; the next member is tried.
var errBehind = errors.New("member knows less committed than was acknowledged")

// Fetch reads committed records of one partition. A record this ingestion
// acknowledged is visible to its reads from then on: a member whose
// committed offset is behind the acknowledgements (the old tail, now a
// middle, while discovery has not seen a returning member join at the
// tail; middles learn commits a round trip after the tail) is passed over
// for one that knows more, and the best answer is used if none does.
func (s *Server) Fetch(ctx context.Context, req *catenapb.FetchRequest) (*catenapb.FetchResponse, error) {
	seen := s.committedSeen(req.GetStream(), req.GetPartition())
	if req.GetOffset() < seen && req.GetMaxWaitMs() > 0 {
		// Records at the offset are committed: no member needs to wait.
		req = proto.CloneOf(req)
		req.MaxWaitMs = 0
	}
	var best *catenapb.FetchResponse
	wait := time.Duration(req.GetMaxWaitMs()) * time.Millisecond
	err := s.readFrom(ctx, req.GetStream(), req.GetPartition(), wait, func(ctx context.Context, c catenapb.ReplicaClient) error {
		resp, err := c.Read(ctx, req)
		if err != nil {
			return err
		}
		if best == nil || resp.GetCommitted() > best.GetCommitted() {
			best = resp
		}
		if resp.GetCommitted() < seen {
			return errBehind
		}
		return nil
	})
	if best != nil && (err == nil || errors.Is(err, errBehind)) {
		return best, nil
	}
	return nil, err
}

// Subscribe streams committed records as they commit, until the client
// goes away. Replica failures are ridden out by trying other members.
func (s *Server) Subscribe(req *catenapb.SubscribeRequest, stream catenapb.Ingest_SubscribeServer) error {
	ctx := stream.Context()
	next := req.GetOffset()
	backoff := retryMin
	for ctx.Err() == nil {
		resp, err := s.Fetch(ctx, &catenapb.FetchRequest{Stream: req.GetStream(), Partition: req.GetPartition(), Offset: next, MaxBytes: req.GetMaxBytes(), MaxWaitMs: uint32(subscribeWait / time.Millisecond)})
		if err != nil {
			switch status.Code(err) {
			case codes.InvalidArgument, codes.OutOfRange, codes.NotFound, codes.Canceled, codes.DataLoss:
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, retryMax)
			continue
		}
		backoff = retryMin
		if len(resp.GetRecords()) == 0 {
			continue
		}
		next = resp.GetNextOffset()
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
	return nil
}

// ListOffsets resolves earliest, latest or a timestamp on a member. The
// latest offset, the committed end, is never below what this ingestion
// acknowledged, as a Fetch is not: a member behind (one that learns commits
// a round trip after the tail's completion answered the producer) is passed
// over for one that knows more, and what was acknowledged is committed
// when none does (TestLatestOffsetSeesWhatItAcknowledged).
func (s *Server) ListOffsets(ctx context.Context, req *catenapb.ListOffsetsRequest) (*catenapb.ListOffsetsResponse, error) {
	latest := req.GetSpec() == catenapb.OffsetSpec_OFFSET_SPEC_LATEST
	seen := s.committedSeen(req.GetStream(), req.GetPartition())
	var best *catenapb.ListOffsetsResponse
	err := s.readFrom(ctx, req.GetStream(), req.GetPartition(), 0, func(ctx context.Context, c catenapb.ReplicaClient) error {
		resp, err := c.ListOffsets(ctx, req)
		if err != nil {
			return err
		}
		if best == nil || (latest && resp.GetOffset() > best.GetOffset()) {
			best = resp
		}
		if latest && resp.GetOffset() < seen {
			return errBehind
		}
		return nil
	})
	if best == nil || (err != nil && !errors.Is(err, errBehind)) {
		return nil, err
	}
	if latest && best.GetOffset() < seen {
		best = &catenapb.ListOffsetsResponse{Offset: seen}
	}
	return best, nil
}

// DescribeStream reports each partition's chain with fresh member reports.
func (s *Server) DescribeStream(ctx context.Context, req *catenapb.DescribeStreamRequest) (*catenapb.StreamDescription, error) {
	if _, err := s.stream(ctx, req.GetStream()); err != nil {
		return nil, err
	}
	select {
	case <-s.disc.requestRefresh():
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	sr := s.disc.current().streams[req.GetStream()]
	if sr == nil {
		return nil, status.Errorf(codes.NotFound, "stream %q not found", req.GetStream())
	}
	out := &catenapb.StreamDescription{Stream: sr.name, Config: sr.config}
	for i, pr := range sr.partitions {
		pd := &catenapb.PartitionDescription{Partition: uint32(i)}
		if pr != nil {
			pd.Epoch, pd.Members = pr.epoch, pr.members
			for _, m := range pr.members {
				if rep := pr.reports[m.GetId()]; rep != nil {
					pd.Replicas = append(pd.Replicas, rep)
				}
			}
		}
		out.Partitions = append(out.Partitions, pd)
	}
	return out, nil
}

// ListStreams lists the streams the replicas host.
func (s *Server) ListStreams(ctx context.Context, _ *catenapb.ListStreamsRequest) (*catenapb.ListStreamsResponse, error) {
	return &catenapb.ListStreamsResponse{Streams: s.disc.current().streamNames()}, nil
}

// StreamInfo is a stream as this ingestion node's discovery last saw it.
type StreamInfo struct {
	Name   string
	Config *catenapb.StreamConfig
	// Partitions is the partition count; Chains[i] is partition i's chain
	// (nil while unknown), Epochs[i] its epoch.
	Partitions int
	Chains     [][]*catenapb.Member
	Epochs     []uint64
}

// Stream describes a stream from what discovery knows, refreshing once
// when it is unknown; NotFound when it does not exist. Unlike
// DescribeStream it does not wait for a fresh discovery round.
func (s *Server) Stream(ctx context.Context, name string) (StreamInfo, error) {
	sr, err := s.stream(ctx, name)
	if err != nil {
		return StreamInfo{}, err
	}
	info := StreamInfo{Name: sr.name, Config: sr.config, Partitions: len(sr.partitions), Chains: make([][]*catenapb.Member, len(sr.partitions)), Epochs: make([]uint64, len(sr.partitions))}
	for i, pr := range sr.partitions {
		if pr != nil {
			info.Chains[i], info.Epochs[i] = pr.members, pr.epoch
		}
	}
	return info, nil
}

// StreamNames lists the streams discovery knows, sorted.
func (s *Server) StreamNames() []string { return s.disc.current().streamNames() }
