package groups

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/catena-streams/catena/ingest"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/contract"
)

// DefaultOffsetsStream is the internal stream committed offsets are
// stored in.
const DefaultOffsetsStream = "catena-groups"

// offsetsPartition is the partition of the offsets stream every record is
// written to and read from: one partition keeps every group's records in
// the order they were committed whatever the stream's partition count
// (hashing groups over partitions would reorder a group's records if the
// count changed).
const offsetsPartition = 0

// offsetsRecord is one record of the offsets stream, keyed by its group
// (so a group's records are in one partition, in commit order). A record
// with Deleted set forgets every offset of the group before it; otherwise
// each offset replaces the group's offset of its partition. The newest
// record wins, as in Kafka's __consumer_offsets. docs/kafka.md describes
// the format.
type offsetsRecord struct {
	// V is the format's version: 1 for a commit or a deletion, 2 for a
	// part of a snapshot (which a coordinator that knows only 1 skips).
	V       int            `json:"v"`
	Group   string         `json:"group,omitempty"`
	Deleted bool           `json:"deleted,omitempty"`
	Offsets []offsetsEntry `json:"offsets,omitempty"`
	// Snapshot and Groups make a part of a snapshot (snapshot.go).
	Snapshot *snapshotHeader `json:"snapshot,omitempty"`
	Groups   []snapshotGroup `json:"groups,omitempty"`
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
	// is created on the first load where the deployment lets ingestion
	// create streams (catena dev); elsewhere it must exist. Every record is
	// in its partition 0.
	Stream string
	Logger logr.Logger

	// SnapshotEvery is how many records of the offsets stream Compact
	// lets accumulate after the newest snapshot before it writes another
	// (0: DefaultSnapshotEvery).
	SnapshotEvery uint64

	// loadMu orders loads and compactions; view is every group's offsets
	// as read up to next, the offset after the last record read, so a
	// load reads only what was stored since the one before.
	loadMu sync.Mutex
	view   map[string]map[TopicPartition]Committed
	next   uint64
	// snapshotAsOf is the highest asOf of a whole snapshot seen in the
	// stream or written (0: none), and snapshotParts that snapshot's
	// parts count when this process wrote it.
	snapshotAsOf  uint64
	snapshotParts int
	// compactMu orders compactions; holdOwed is where a snapshot this
	// process wrote needs the hold, when moving it failed (0: nowhere).
	compactMu sync.Mutex
	holdOwed  uint64
	// lastLoad describes the last load that read the stream from its
	// start or from a snapshot.
	lastLoad LoadStats

	mu sync.Mutex
	// held is the offset each group's hold was stored at by this process,
	// so an unchanged offset asks no chain again.
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

// Load reads the offsets stream to its committed end: from its start the
// first time, then from where the last load ended (another node may have
// written since). A stream that ingestion does not know is never taken for
// one without offsets (discovery may not have seen it yet): where the
// deployment lets ingestion create streams it is created, and read on the
// next try; elsewhere it must be created (on Kubernetes, a Stream).
func (s *StreamOffsets) Load(ctx context.Context) (map[string]map[TopicPartition]Committed, error) {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	// A load is a start or a change of the nodes: holds this process
	// moved may have been moved since by another node, so none is taken
	// for known any more (a commit moves its holds again).
	s.mu.Lock()
	s.held = nil
	s.mu.Unlock()
	created, err := s.loadLocked(ctx)
	if err != nil {
		return nil, err
	}
	if created {
		return map[string]map[TopicPartition]Committed{}, nil
	}
	out := make(map[string]map[TopicPartition]Committed, len(s.view))
	for g, offs := range s.view {
		out[g] = make(map[TopicPartition]Committed, len(offs))
		for tp, o := range offs {
			out[g][tp] = o
		}
	}
	return out, nil
}

// loadLocked brings the view up to the stream's committed end (created:
// the stream did not exist and was created now, empty). Callers hold
// loadMu.
func (s *StreamOffsets) loadLocked(ctx context.Context) (created bool, err error) {
	if _, err := s.Ingest.Stream(ctx, s.stream()); status.Code(err) == codes.NotFound {
		_, cerr := s.Ingest.CreateStream(ctx, &catenapb.CreateStreamRequest{Stream: s.stream(), Partitions: 1})
		switch status.Code(cerr) {
		case codes.OK:
			// Created now: nothing was ever committed.
			return true, nil
		case codes.AlreadyExists:
			return false, fmt.Errorf("the offsets stream %q exists but is not discovered yet", s.stream())
		}
		return false, fmt.Errorf("the offsets stream %q is not found and cannot be created here (%s): create it (on Kubernetes, a Stream named %q)", s.stream(), status.Convert(cerr).Message(), s.stream())
	} else if err != nil {
		return false, err
	}
	// Retention may trim what a load is about to read between its look
	// at the stream's first offset and its read (a view left behind a
	// newer snapshot's hold): it then reads anew from what remains.
	for attempt := 1; ; attempt++ {
		err := s.loadPartition(ctx, offsetsPartition, attempt > 1)
		if status.Code(err) == codes.OutOfRange && attempt < 3 {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("offsets stream %s/%d: %w", s.stream(), offsetsPartition, err)
		}
		return false, nil
	}
}

func (s *StreamOffsets) loadPartition(ctx context.Context, p uint32, anew bool) error {
	// The committed end a member reports can be behind the records its
	// chain holds: after every process restarted, until the chain is
	// reconfigured and commits them again. Loading to that end would miss
	// committed offsets for good, so the load waits until the committed
	// end has reached every current member's log end.
	desc, err := s.Ingest.DescribeStream(ctx, &catenapb.DescribeStreamRequest{Stream: s.stream()})
	if err != nil {
		return err
	}
	var logEnd uint64
	for _, pd := range desc.GetPartitions() {
		if pd.GetPartition() != p {
			continue
		}
		members := map[string]bool{}
		for _, m := range pd.GetMembers() {
			members[m.GetId()] = true
		}
		for _, r := range pd.GetReplicas() {
			if members[r.GetReplicaId()] {
				logEnd = max(logEnd, r.GetLogEnd())
			}
		}
	}
	// A commit in flight (this node's or another's) holds the committed
	// end behind a member's log for moments only: wait while it moves,
	// and give up once it has stood still for a second (a chain that
	// must be reconfigured before it commits again).
	var end *catenapb.ListOffsetsResponse
	var last uint64
	moved := time.Now()
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		if end, err = s.Ingest.ListOffsets(ctx, &catenapb.ListOffsetsRequest{Stream: s.stream(), Partition: p, Spec: catenapb.OffsetSpec_OFFSET_SPEC_LATEST}); err != nil {
			return err
		}
		if end.GetOffset() >= logEnd {
			break
		}
		if end.GetOffset() > last {
			last, moved = end.GetOffset(), time.Now()
		} else if time.Since(moved) > time.Second {
			return fmt.Errorf("its committed end %d is behind its members' logs (%d): waiting for the chain to commit them", end.GetOffset(), logEnd)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	start, err := s.Ingest.ListOffsets(ctx, &catenapb.ListOffsetsRequest{Stream: s.stream(), Partition: p, Spec: catenapb.OffsetSpec_OFFSET_SPEC_EARLIEST})
	if err != nil {
		return err
	}
	if s.view == nil || start.GetOffset() > s.next || anew {
		// The first load, or records not read yet were trimmed (the
		// stream was given retention): read it again from its newest
		// snapshot, or all that remains.
		return s.loadWhole(ctx, p, start.GetOffset(), end.GetOffset())
	}
	// Read on from the last load. Snapshots are passed over: the view
	// already holds every record before them.
	return s.fetch(ctx, p, s.next, end.GetOffset(), func(r *catenapb.Record, rec *offsetsRecord) error {
		switch {
		case rec == nil:
		case rec.Snapshot != nil:
			if h := rec.Snapshot; h.Part == h.Parts-1 {
				// Its writer's last part: the snapshot is whole.
				s.snapshotAsOf = max(s.snapshotAsOf, h.AsOf)
			}
		default:
			applyCommit(rec, s.view)
		}
		s.next = r.GetOffset() + 1
		return nil
	})
}

// fetch reads the records of partition p in [from, end) and hands each to
// fn in order, decoded; one that does not decode is logged and handed
// over as nil, to be skipped (not written by a coordinator: the stream is
// refused to Kafka producers, not to every writer), so that one bad
// record does not stop every group.
func (s *StreamOffsets) fetch(ctx context.Context, p uint32, from, end uint64, fn func(*catenapb.Record, *offsetsRecord) error) error {
	for next := from; next < end; {
		resp, err := s.Ingest.Fetch(ctx, &catenapb.FetchRequest{Stream: s.stream(), Partition: p, Offset: next, MaxBytes: 4 << 20})
		if err != nil {
			return err
		}
		for _, r := range resp.GetRecords() {
			if r.GetOffset() >= end {
				return nil
			}
			rec, err := decodeOffsetsRecord(r.GetValue())
			if err != nil {
				s.Logger.Error(err, "Skipping a record of the offsets stream that is not an offsets record", "stream", s.stream(), "offset", r.GetOffset())
				rec = nil
			}
			if err := fn(r, rec); err != nil {
				return err
			}
		}
		if resp.GetNextOffset() <= next {
			return fmt.Errorf("read from offset %d made no progress (committed end %d)", next, end)
		}
		next = resp.GetNextOffset()
	}
	return nil
}

func decodeOffsetsRecord(value []byte) (*offsetsRecord, error) {
	var rec offsetsRecord
	if err := json.Unmarshal(value, &rec); err != nil {
		return nil, err
	}
	switch {
	case rec.V == 1 && rec.Snapshot == nil && len(rec.Groups) == 0:
	case rec.V == 2 && rec.Snapshot != nil:
		if err := rec.Snapshot.validate(); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("offsets record version %d is not known (1 and 2 are)", rec.V)
	}
	return &rec, nil
}

// applyCommit applies a commit or deletion record to out.
func applyCommit(rec *offsetsRecord, out map[string]map[TopicPartition]Committed) {
	if rec.Deleted {
		delete(out, rec.Group)
		return
	}
	g := out[rec.Group]
	if g == nil {
		g = map[TopicPartition]Committed{}
		out[rec.Group] = g
	}
	for _, e := range rec.Offsets {
		g[TopicPartition{e.Topic, e.Partition}] = Committed{Offset: e.Offset, LeaderEpoch: e.LeaderEpoch, Metadata: e.Metadata, At: e.At}
	}
}

// append writes one record to the offsets stream and waits until it is
// committed.
func (s *StreamOffsets) append(ctx context.Context, rec offsetsRecord) error {
	value, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return s.appendValue(ctx, []byte(rec.Group), value)
}

// appendValue writes one record to the offsets stream's partition and
// waits until it is committed.
func (s *StreamOffsets) appendValue(ctx context.Context, key, value []byte) error {
	partition := uint32(offsetsPartition)
	resp, err := s.Ingest.Produce(ctx, &catenapb.ProduceRequest{Stream: s.stream(), Records: []*catenapb.ProduceRecord{{Key: key, Value: value, Partition: &partition}}})
	if err != nil {
		return err
	}
	// Ingestion answers a record that failed in its result, not as the
	// call's error.
	for _, r := range resp.GetResults() {
		if r.GetErrorCode() != 0 {
			return status.Error(codes.Code(r.GetErrorCode()), r.GetErrorMessage())
		}
	}
	return nil
}

// Commit stores a group's offsets: the partitions are checked to exist
// and to have room for the group's hold, the offsets written to the
// offsets stream as one record, then each partition's hold moved to its
// offset. In that order a failure can only leave a hold behind the
// committed offset (retention keeps more), never ahead of it.
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
	}
	s.refuseUnholdable(ctx, group, commits, errs)
	for i, c := range commits {
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
	// The record is stored: its holds are moved even if the client that
	// committed goes away meanwhile (its request's context ends), so that
	// they do not stay behind until the group's next commit.
	var moves []Commit
	var at []int
	for i, c := range commits {
		if errs[i] != nil || c.Offset < 0 || s.heldAt(group, c.TopicPartition) == c.Offset {
			continue
		}
		moves, at = append(moves, c), append(at, i)
	}
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), holdTimeout)
	defer cancel()
	for i, err := range s.MoveHolds(hctx, group, moves) {
		switch {
		case errors.Is(err, ErrPartitionGone):
		case status.Code(err) == codes.ResourceExhausted:
			// Another consumer took the partition's last hold after
			// refuseUnholdable looked: the offset is stored, without a
			// hold; answered so that the client does not retry.
			errs[at[i]] = storedError{refuse(HoldsFull, "the offset is stored but the partition has no room for the group's retention hold (%v): retention may trim records the group has not read; delete idle groups or consumers", err)}
		case err != nil:
			// Answered as not stored: the client's retry stores the
			// offset again and moves the hold again at once.
			errs[at[i]] = err
		}
	}
	return errs, nil
}

// storedError is a commit's error that came after its offset was stored,
// answered with a code clients do not retry (no room for its hold): the
// offset is committed all the same, and a coordinator holds it as
// committed, as its next load would.
type storedError struct{ error }

func (e storedError) Unwrap() error { return e.error }

// IsStored reports whether a commit's err came after its offset was
// stored.
func IsStored(err error) bool {
	var s storedError
	return errors.As(err, &s)
}

// refuseUnholdable refuses (in errs) each commit on a partition whose
// replicas have no room for the group's retention hold, before its offset
// is stored: a hold is refused past contract.MaxHoldsPerPartition, and an
// offset stored without one would let retention trim what the group has
// not read. Only partitions whose hold this process has not stored are
// looked at, one ListConsumers per stream; a stream that cannot be listed
// is passed over (the hold's own refusal still answers).
func (s *StreamOffsets) refuseUnholdable(ctx context.Context, group string, commits []Commit, errs []error) {
	byTopic := map[string][]int{}
	for i, c := range commits {
		if errs[i] == nil && c.Offset >= 0 && s.heldAt(group, c.TopicPartition) < 0 {
			byTopic[c.Topic] = append(byTopic[c.Topic], i)
		}
	}
	consumer := HoldName(group)
	for topic, idx := range byTopic {
		resp, err := s.Ingest.ListConsumers(ctx, &catenapb.ListConsumersRequest{Stream: topic})
		if err != nil {
			continue
		}
		full := map[int32]int{}
		for _, p := range resp.GetPartitions() {
			holds := p.GetHolds()
			if len(holds) >= contract.MaxHoldsPerPartition && !slices.ContainsFunc(holds, func(h *catenapb.ConsumerHold) bool { return h.GetConsumer() == consumer }) {
				full[int32(p.GetPartition())] = len(holds)
			}
		}
		for _, i := range idx {
			if n, ok := full[commits[i].Partition]; ok {
				errs[i] = refuse(HoldsFull, "partition %s/%d has %d retention holds, the most it keeps, and none for this group: delete idle groups (catenactl group delete) or consumers (catenactl consumers delete) holding it", topic, commits[i].Partition, n)
			}
		}
	}
}

// ErrPartitionGone is MoveHolds' error for a partition that no longer
// exists: it has no hold to keep.
var ErrPartitionGone = errors.New("the partition no longer exists")

// MoveHolds moves the group's hold on each commit's partition to its
// offset on every member of the partition's chain, all partitions at
// once. A partition that no longer exists is ErrPartitionGone.
func (s *StreamOffsets) MoveHolds(ctx context.Context, group string, commits []Commit) []error {
	errs := make([]error, len(commits))
	consumer := HoldName(group)
	var wg sync.WaitGroup
	for i, c := range commits {
		// Forgotten until stored: a hold call that fails may have moved
		// the hold on some members, so the next commit asks again.
		s.forgetHeld(group, c.TopicPartition)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.Ingest.CommitConsumerOffset(ctx, &catenapb.CommitConsumerOffsetRequest{Stream: c.Topic, Partition: uint32(c.Partition), Consumer: consumer, Offset: uint64(c.Offset)})
			switch {
			case status.Code(err) == codes.NotFound:
				errs[i] = fmt.Errorf("hold %s/%d for group %q: %w", c.Topic, c.Partition, group, ErrPartitionGone)
			case err != nil:
				errs[i] = fmt.Errorf("hold %s/%d at offset %d for group %q: %w", c.Topic, c.Partition, c.Offset, group, err)
			default:
				s.setHeldAt(group, c.TopicPartition, c.Offset)
			}
		}()
	}
	wg.Wait()
	return errs
}

// Holds lists the groups' holds on topics, one ListConsumers per topic:
// per group, the offset its hold is at on every member of a partition's
// chain. A partition whose members do not all hold the same is left out
// (its holds are moved again), as is a stream that no longer exists; a
// stream that cannot be listed too, with an error naming it.
func (s *StreamOffsets) Holds(ctx context.Context, groups, topics []string) (map[string]map[TopicPartition]int64, error) {
	byHold := make(map[string]string, len(groups))
	for _, g := range groups {
		byHold[HoldName(g)] = g
	}
	out := map[string]map[TopicPartition]int64{}
	var errs []error
	for _, t := range topics {
		resp, err := s.Ingest.ListConsumers(ctx, &catenapb.ListConsumersRequest{Stream: t})
		if status.Code(err) == codes.NotFound {
			continue
		}
		if err != nil {
			// The other streams are still listed: one stream that cannot
			// be leaves its partitions out (their holds are moved again).
			errs = append(errs, fmt.Errorf("list the holds on stream %q: %w", t, err))
			continue
		}
		for _, p := range resp.GetPartitions() {
			if len(p.GetDisagreeing()) > 0 {
				continue
			}
			for _, h := range p.GetHolds() {
				g, ok := byHold[h.GetConsumer()]
				if !ok {
					continue
				}
				if out[g] == nil {
					out[g] = map[TopicPartition]int64{}
				}
				out[g][TopicPartition{Topic: t, Partition: int32(p.GetPartition())}] = int64(h.GetOffset())
			}
		}
	}
	return out, errors.Join(errs...)
}

// holdTimeout bounds moving a commit's holds once its record is stored.
const holdTimeout = 30 * time.Second

func (s *StreamOffsets) heldAt(group string, tp TopicPartition) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.held[group][tp]; ok {
		return o
	}
	return -1
}

func (s *StreamOffsets) forgetHeld(group string, tp TopicPartition) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.held[group], tp)
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
			return fmt.Errorf("%w: stream %q, consumer %q (catenactl consumers delete releases them): %v", ErrHoldsRemain, t, HoldName(group), err)
		}
	}
	return nil
}
