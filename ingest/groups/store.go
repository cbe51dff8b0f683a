package groups

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/ingest"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
)

// DefaultOffsetsStream is the internal stream committed offsets are
// stored in.
const DefaultOffsetsStream = "catena-groups"

// offsetsRecord is one record of the offsets stream, keyed by its group
// (so a group's records are in one partition, in commit order). A record
// with Deleted set forgets every offset of the group before it; otherwise
// each offset replaces the group's offset of its partition. The newest
// record wins, as in Kafka's __consumer_offsets. docs/kafka.md describes
// the format.
type offsetsRecord struct {
	// V is the format's version (1).
	V       int            `json:"v"`
	Group   string         `json:"group"`
	Deleted bool           `json:"deleted,omitempty"`
	Offsets []offsetsEntry `json:"offsets,omitempty"`
}

type offsetsEntry struct {
	Topic       string `json:"topic"`
	Partition   int32  `json:"partition"`
	Offset      int64  `json:"offset"`
	LeaderEpoch int32  `json:"leaderEpoch"`
	Metadata    string `json:"metadata,omitempty"`
	At          int64  `json:"at"`
}

// StreamOffsets stores committed offsets in an internal Catena stream and
// holds each group's committed offsets from retention on the partitions
// they are in, so that retention never trims what a group has not
// consumed.
type StreamOffsets struct {
	Ingest *ingest.Server
	// Stream is the offsets stream (DefaultOffsetsStream when empty). It
	// is created on the first commit where the deployment lets ingestion
	// create streams (catena dev); elsewhere it must exist.
	Stream string
	// Partitions is the offsets stream's partition count when created
	// here (1 when 0).
	Partitions int

	mu sync.Mutex
	// held is the offset each group holds each partition at, so an
	// unchanged offset (a consumer committing while idle) asks no chain.
	held map[string]map[TopicPartition]int64
}

func (s *StreamOffsets) stream() string {
	if s.Stream == "" {
		return DefaultOffsetsStream
	}
	return s.Stream
}

// HoldName is the consumer name a Kafka consumer group's retention holds
// are stored under: "kafka.group/<group>", with a group id that is not a
// valid consumer name made into one and told apart by a hash of the id.
// (A Kubernetes namespace has no '.', so no aggregation's hold,
// "<namespace>/<name>", is ever named so.)
func HoldName(group string) string {
	const prefix = "kafka.group/"
	if contract.ValidateConsumer(prefix+group) == nil {
		return prefix + group
	}
	var b strings.Builder
	for _, r := range strings.ToLower(group) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	sum := sha256.Sum256([]byte(group))
	name := b.String()
	if max := contract.MaxConsumerNameLen - len(prefix) - 1 - 16; len(name) > max {
		name = name[:max]
	}
	return prefix + name + "-" + hex.EncodeToString(sum[:8])
}

// Load reads the offsets stream from its start to its committed end.
func (s *StreamOffsets) Load(ctx context.Context) (map[string]map[TopicPartition]Committed, error) {
	out := map[string]map[TopicPartition]Committed{}
	info, err := s.Ingest.Stream(ctx, s.stream())
	if status.Code(err) == codes.NotFound {
		s.setHeld(out)
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	for p := 0; p < info.Partitions; p++ {
		if err := s.loadPartition(ctx, uint32(p), out); err != nil {
			return nil, fmt.Errorf("offsets stream %s/%d: %w", s.stream(), p, err)
		}
	}
	s.setHeld(out)
	return out, nil
}

func (s *StreamOffsets) setHeld(all map[string]map[TopicPartition]Committed) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = map[string]map[TopicPartition]int64{}
	for g, offs := range all {
		s.held[g] = map[TopicPartition]int64{}
		for tp, o := range offs {
			s.held[g][tp] = o.Offset
		}
	}
}

func (s *StreamOffsets) loadPartition(ctx context.Context, p uint32, out map[string]map[TopicPartition]Committed) error {
	end, err := s.Ingest.ListOffsets(ctx, &catenapb.ListOffsetsRequest{Stream: s.stream(), Partition: p, Spec: catenapb.OffsetSpec_OFFSET_SPEC_LATEST})
	if err != nil {
		return err
	}
	start, err := s.Ingest.ListOffsets(ctx, &catenapb.ListOffsetsRequest{Stream: s.stream(), Partition: p, Spec: catenapb.OffsetSpec_OFFSET_SPEC_EARLIEST})
	if err != nil {
		return err
	}
	for next := start.GetOffset(); next < end.GetOffset(); {
		resp, err := s.Ingest.Fetch(ctx, &catenapb.FetchRequest{Stream: s.stream(), Partition: p, Offset: next, MaxBytes: 4 << 20})
		if err != nil {
			return err
		}
		for _, r := range resp.GetRecords() {
			if err := applyOffsetsRecord(r.GetValue(), out); err != nil {
				return fmt.Errorf("record at offset %d: %w", r.GetOffset(), err)
			}
		}
		if resp.GetNextOffset() <= next {
			return fmt.Errorf("read from offset %d made no progress (committed end %d)", next, end.GetOffset())
		}
		next = resp.GetNextOffset()
	}
	return nil
}

func applyOffsetsRecord(value []byte, out map[string]map[TopicPartition]Committed) error {
	var rec offsetsRecord
	if err := json.Unmarshal(value, &rec); err != nil {
		return err
	}
	if rec.V != 1 {
		return fmt.Errorf("offsets record version %d is not known (1 is)", rec.V)
	}
	if rec.Deleted {
		delete(out, rec.Group)
		return nil
	}
	g := out[rec.Group]
	if g == nil {
		g = map[TopicPartition]Committed{}
		out[rec.Group] = g
	}
	for _, e := range rec.Offsets {
		g[TopicPartition{e.Topic, e.Partition}] = Committed{Offset: e.Offset, LeaderEpoch: e.LeaderEpoch, Metadata: e.Metadata, At: e.At}
	}
	return nil
}

// append writes one record to the offsets stream and waits until it is
// committed, creating the stream first where it does not exist and the
// deployment lets ingestion create it.
func (s *StreamOffsets) append(ctx context.Context, rec offsetsRecord) error {
	value, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	req := &catenapb.ProduceRequest{Stream: s.stream(), Records: []*catenapb.ProduceRecord{{Key: []byte(rec.Group), Value: value}}}
	_, err = s.Ingest.Produce(ctx, req)
	if status.Code(err) != codes.NotFound {
		return err
	}
	partitions := max(s.Partitions, 1)
	_, cerr := s.Ingest.CreateStream(ctx, &catenapb.CreateStreamRequest{Stream: s.stream(), Partitions: uint32(partitions)})
	if cerr != nil && status.Code(cerr) != codes.AlreadyExists {
		return fmt.Errorf("the offsets stream %q does not exist and cannot be created here (%s): create it (on Kubernetes, a Stream named %q)", s.stream(), status.Convert(cerr).Message(), s.stream())
	}
	_, err = s.Ingest.Produce(ctx, req)
	return err
}

// Commit stores a group's offsets: the partitions are checked to exist,
// the offsets written to the offsets stream as one record, then each
// partition's hold moved to its offset. In that order a failure can only
// leave a hold behind the committed offset (retention keeps more), never
// ahead of it.
func (s *StreamOffsets) Commit(ctx context.Context, group string, commits []Commit) ([]error, error) {
	errs := make([]error, len(commits))
	rec := offsetsRecord{V: 1, Group: group}
	for i, c := range commits {
		info, err := s.Ingest.Stream(ctx, c.Topic)
		switch {
		case status.Code(err) == codes.NotFound:
			errs[i] = refuse(UnknownTopicOrPartition, "no stream %q", c.Topic)
		case err != nil:
			errs[i] = err
		case c.Partition < 0 || int(c.Partition) >= info.Partitions:
			errs[i] = refuse(UnknownTopicOrPartition, "stream %q has %d partitions; partition %d does not exist", c.Topic, info.Partitions, c.Partition)
		}
		if errs[i] == nil {
			rec.Offsets = append(rec.Offsets, offsetsEntry{Topic: c.Topic, Partition: c.Partition, Offset: c.Offset, LeaderEpoch: c.LeaderEpoch, Metadata: c.Metadata, At: c.At})
		}
	}
	if len(rec.Offsets) == 0 {
		return errs, nil
	}
	if err := s.append(ctx, rec); err != nil {
		return nil, fmt.Errorf("store the offsets of group %q: %w", group, err)
	}
	consumer := HoldName(group)
	var wg sync.WaitGroup
	for i, c := range commits {
		if errs[i] != nil || c.Offset < 0 || s.heldAt(group, c.TopicPartition) == c.Offset {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Ingest.CommitConsumerOffset(ctx, &catenapb.CommitConsumerOffsetRequest{Stream: c.Topic, Partition: uint32(c.Partition), Consumer: consumer, Offset: uint64(c.Offset)})
			if err != nil {
				errs[i] = fmt.Errorf("hold %s/%d at offset %d for group %q: %w", c.Topic, c.Partition, c.Offset, group, err)
				return
			}
			s.setHeldAt(group, c.TopicPartition, c.Offset)
		}()
	}
	wg.Wait()
	return errs, nil
}

func (s *StreamOffsets) heldAt(group string, tp TopicPartition) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.held[group][tp]; ok {
		return o
	}
	return -1
}

func (s *StreamOffsets) setHeldAt(group string, tp TopicPartition, offset int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held == nil {
		s.held = map[string]map[TopicPartition]int64{}
	}
	if s.held[group] == nil {
		s.held[group] = map[TopicPartition]int64{}
	}
	s.held[group][tp] = offset
}

// Delete writes the group's deletion to the offsets stream, then releases
// its holds on the streams it committed on.
func (s *StreamOffsets) Delete(ctx context.Context, group string, topics []string) error {
	if err := s.append(ctx, offsetsRecord{V: 1, Group: group, Deleted: true}); err != nil {
		return fmt.Errorf("delete group %q: %w", group, err)
	}
	s.mu.Lock()
	delete(s.held, group)
	s.mu.Unlock()
	for _, t := range topics {
		_, err := s.Ingest.DeleteConsumer(ctx, &catenapb.DeleteConsumerRequest{Stream: t, Consumer: HoldName(group)})
		if err != nil && status.Code(err) != codes.NotFound {
			return fmt.Errorf("release the holds of group %q on stream %q: %w", group, t, err)
		}
	}
	return nil
}
