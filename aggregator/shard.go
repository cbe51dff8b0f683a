package aggregator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// shardEnv is what a shard needs from its worker.
type shardEnv struct {
	plan       *Plan
	client     *client.Client
	source     string
	ckpt       Log
	ckptStream string
	ckptParts  uint32
	consumer   string
	writer     uint64
	chunkBytes int
	log        logr.Logger
	metrics    *shardMetrics
}

// shard runs one source partition: restore, replay, follow, checkpoint.
type shard struct {
	id  uint32
	env shardEnv

	cancel context.CancelFunc
	done   chan struct{}

	mu          sync.Mutex
	st          *State
	phase       catenapb.ShardPhase
	consumed    uint64
	committed   uint64
	lost        uint64
	err         string
	checkpoint  *catenapb.CheckpointRef
	restoration *catenapb.Restoration
}

func startShard(id uint32, env shardEnv) *shard {
	ctx, cancel := context.WithCancel(context.Background())
	s := &shard{id: id, env: env, cancel: cancel, done: make(chan struct{}), phase: catenapb.ShardPhase_SHARD_PHASE_RESTORING}
	go s.run(ctx)
	return s
}

// stop ends the shard and waits for it.
func (s *shard) stop() {
	s.cancel()
	<-s.done
}

// ckptConsumer is the consumer name holding the shard's checkpoints: one
// per shard, since shards may share a checkpoint partition.
func ckptConsumer(consumer string, shard uint32) string {
	return fmt.Sprintf("%s.shard-%d", consumer, shard)
}

// run restores and follows until stopped. An error restarts the shard
// from its latest checkpoint (always exact), after a back-off during
// which the shard reports Failed with the error.
func (s *shard) run(ctx context.Context) {
	defer close(s.done)
	backoff := time.Second
	for ctx.Err() == nil {
		err := s.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		s.env.log.Error(err, "Shard stopped; restoring it again from its latest checkpoint", "shard", s.id, "retryIn", backoff)
		s.mu.Lock()
		s.phase, s.err = catenapb.ShardPhase_SHARD_PHASE_FAILED, err.Error()
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 15*time.Second)
	}
}

func (s *shard) runOnce(ctx context.Context) error {
	env := s.env
	started := time.Now()
	faults0 := pageFaults()
	part := s.id % env.ckptParts
	s.mu.Lock()
	s.phase, s.err = catenapb.ShardPhase_SHARD_PHASE_RESTORING, ""
	s.mu.Unlock()

	from, err := s.scanStart(ctx, part)
	if err != nil {
		return err
	}
	res, err := Restore(ctx, env.ckpt, env.plan, s.id, part, from)
	if err != nil {
		return err
	}
	faults := pageFaults().since(faults0)
	cp := &Checkpointer{Plan: env.plan, Log: env.ckpt, Shard: s.id, Partition: part, Writer: env.writer, ChunkBytes: env.chunkBytes}
	cp.Resume(res)

	srcStart, err := env.client.ListOffsets(ctx, env.source, s.id, catenapb.OffsetSpec_OFFSET_SPEC_EARLIEST, 0)
	if err != nil {
		return fmt.Errorf("failed to find the start of %s/%d: %w", env.source, s.id, err)
	}
	target, err := env.client.ListOffsets(ctx, env.source, s.id, catenapb.OffsetSpec_OFFSET_SPEC_LATEST, 0)
	if err != nil {
		return fmt.Errorf("failed to find the end of %s/%d: %w", env.source, s.id, err)
	}
	off, lost := res.SourceOffset, res.Lost
	if last, _ := res.Checkpoint(); last == nil {
		off = srcStart // a new shard starts at the source's beginning
	} else if off < srcStart {
		// A hard retention limit removed records this shard had not
		// checkpointed past: the state misses them, and says so.
		lost += srcStart - off
		env.log.Info("Source records were trimmed before this shard checkpointed past them; results miss them", "shard", s.id, "checkpointOffset", off, "logStart", srcStart, "lost", srcStart-off)
		off = srcStart
	}
	// Hold the source where this restore starts until the first
	// checkpoint moves the hold.
	if err := env.client.CommitConsumerOffset(ctx, env.source, s.id, env.consumer, heldSource(res, off)); err != nil {
		return fmt.Errorf("failed to hold retention of %s/%d: %w", env.source, s.id, err)
	}
	rest := &catenapb.Restoration{
		Shard: s.id, CheckpointsLoaded: uint32(res.Loaded), Skipped: res.Skipped,
		Keys: uint64(res.State.Len()), LoadMs: time.Since(started).Milliseconds(), StartedMs: started.UnixMilli(),
	}
	if m, mo := res.Checkpoint(); m != nil {
		rest.From = refOf(m, mo, 0)
		env.metrics.restoredFromCheckpoint.Inc()
	} else {
		env.metrics.restoredEmpty.Inc()
	}
	env.metrics.loadSeconds.Observe(time.Since(started).Seconds())
	replayFrom := off
	s.mu.Lock()
	s.st, s.consumed, s.committed, s.lost = res.State, off, target, lost
	s.restoration, s.checkpoint = rest, nil
	if rest.From != nil {
		s.checkpoint = proto.Clone(rest.From).(*catenapb.CheckpointRef)
	}
	s.phase = catenapb.ShardPhase_SHARD_PHASE_REPLAYING
	if off >= target {
		s.phase = catenapb.ShardPhase_SHARD_PHASE_RUNNING
		rest.ReplayMs = time.Since(started).Milliseconds()
	}
	s.mu.Unlock()
	env.log.Info("Shard restored", "shard", s.id, "sourceOffset", off, "keys", res.State.Len(), "checkpoints", res.Loaded, "skipped", res.Skipped, "loadMs", rest.LoadMs, "readMs", res.ReadTime.Milliseconds(), "decodeMs", res.DecodeTime.Milliseconds(),
		"minorFaults", faults.minor, "majorFaults", faults.major)

	sub, err := env.client.Subscribe(ctx, env.source, s.id, client.AtOffset(off))
	if err != nil {
		return fmt.Errorf("failed to subscribe to %s/%d at %d: %w", env.source, s.id, off, err)
	}
	defer sub.Close()

	// The checkpoint loop and the committed-offset watcher end with this
	// attempt.
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	ckErr := make(chan error, 1)
	wg.Go(func() { ckErr <- s.checkpointLoop(actx, cp) })
	wg.Go(func() { s.watchCommitted(actx) })
	for {
		m, err := sub.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if status.Code(err) == codes.OutOfRange {
				return fmt.Errorf("the source moved past this shard (retention): %w", err)
			}
			return fmt.Errorf("reading %s/%d: %w", env.source, s.id, err)
		}
		s.mu.Lock()
		if m.Offset != s.consumed {
			if m.Offset < s.consumed {
				s.mu.Unlock()
				return fmt.Errorf("the source delivered offset %d again (at %d)", m.Offset, s.consumed)
			}
			s.lost += m.Offset - s.consumed
		}
		if !s.st.Fold(m.Key, m.Value, m.TimestampMs) {
			env.metrics.skipped.Inc()
		}
		env.metrics.folded.Inc()
		s.consumed = m.Offset + 1
		s.committed = max(s.committed, sub.Committed(), s.consumed)
		if s.phase == catenapb.ShardPhase_SHARD_PHASE_REPLAYING && s.consumed >= target {
			s.phase = catenapb.ShardPhase_SHARD_PHASE_RUNNING
			rest.ReplayMs = time.Since(started).Milliseconds()
			rest.RecordsReplayed = s.consumed - replayFrom
			env.metrics.replayed.Add(float64(rest.RecordsReplayed))
			env.log.Info("Shard replayed", "shard", s.id, "records", rest.RecordsReplayed, "replayMs", rest.ReplayMs)
		}
		s.mu.Unlock()
		select {
		case err := <-ckErr:
			return err
		default:
		}
	}
}

// heldSource is where the source must be held after a restore: the
// oldest checkpoint a later restore could fall back to, or where this one
// starts.
func heldSource(res *Restored, off uint64) uint64 {
	if res.snap != nil {
		return min(res.snap.sourceOffset, off)
	}
	return off
}

// scanStart is where a restore reads the checkpoint partition from: the
// shard's retention hold there (at the oldest snapshot it may fall back
// to), or the partition's start.
func (s *shard) scanStart(ctx context.Context, part uint32) (uint64, error) {
	resp, err := s.env.client.ListConsumers(ctx, s.env.ckptStream)
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return s.env.ckpt.Start(ctx, part)
		}
		return 0, fmt.Errorf("failed to read the checkpoint stream's holds: %w", err)
	}
	name := ckptConsumer(s.env.consumer, s.id)
	for _, pc := range resp.GetPartitions() {
		if pc.GetPartition() != part {
			continue
		}
		for _, h := range pc.GetHolds() {
			if h.GetConsumer() == name {
				return h.GetOffset(), nil
			}
		}
	}
	return s.env.ckpt.Start(ctx, part)
}

// checkpointLoop writes a checkpoint at every aligned tick (multiples of
// the interval since the epoch, so every shard's epochs line up).
func (s *shard) checkpointLoop(ctx context.Context, cp *Checkpointer) error {
	iv := s.env.plan.Interval
	for {
		now := time.Now()
		next := now.Truncate(iv).Add(iv)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(next.Sub(now)):
		}
		if err := s.checkpointOnce(ctx, cp, next); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.env.metrics.ckptFailures.Inc()
			// The checkpoint did not happen; the next one is a snapshot.
			s.env.log.Error(err, "Checkpoint failed; the next one is a full snapshot", "shard", s.id)
		}
	}
}

func (s *shard) checkpointOnce(ctx context.Context, cp *Checkpointer, at time.Time) error {
	s.mu.Lock()
	if s.phase == catenapb.ShardPhase_SHARD_PHASE_FAILED {
		s.mu.Unlock()
		return nil
	}
	if !cp.Due(s.consumed) {
		// Nothing new: the last checkpoint still describes the state, so
		// the shard's checkpoint stands as of this epoch too.
		if s.checkpoint != nil {
			s.checkpoint.Epoch = at.UnixMilli() / s.env.plan.Interval.Milliseconds()
		}
		s.mu.Unlock()
		return nil
	}
	began := time.Now()
	c := cp.Capture(s.st, s.consumed, s.lost, at)
	s.mu.Unlock()

	w, err := cp.Write(ctx, c)
	if err != nil {
		return err
	}
	m := s.env.metrics
	m.ckptSeconds.Observe(time.Since(began).Seconds())
	m.ckptBytes.Add(float64(w.Bytes))
	if w.Manifest.Snapshot {
		m.snapshots.Inc()
	} else {
		m.increments.Inc()
	}
	ref := refOf(w.Manifest, w.ManifestOffset, w.Bytes)
	s.mu.Lock()
	s.checkpoint = ref
	s.mu.Unlock()
	// Recorded: move the holds. A failure here leaves them lower, which
	// only keeps more.
	env := s.env
	if err := env.client.CommitConsumerOffset(ctx, env.source, s.id, env.consumer, w.HoldSource); err != nil {
		return fmt.Errorf("checkpoint written, but holding the source failed: %w", err)
	}
	if err := env.client.CommitConsumerOffset(ctx, env.ckptStream, cp.Partition, ckptConsumer(env.consumer, s.id), w.HoldCheckpoints); err != nil {
		return fmt.Errorf("checkpoint written, but holding the checkpoint stream failed: %w", err)
	}
	return nil
}

func refOf(m *manifest, off uint64, bytes int) *catenapb.CheckpointRef {
	var entries uint64
	for _, c := range m.Chunks {
		entries += uint64(c.Entries)
	}
	return &catenapb.CheckpointRef{
		ManifestOffset: off, SourceOffset: m.SourceOffset, Epoch: m.Epoch, Snapshot: m.Snapshot,
		TimeMs: m.TimeMs, Entries: entries, Bytes: uint64(bytes),
	}
}

// report is the shard's status.
func (s *shard) report() *catenapb.ShardStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &catenapb.ShardStatus{
		Shard: s.id, Phase: s.phase, Consumed: s.consumed, SourceCommitted: s.committed,
		Error: s.err, LostRecords: s.lost,
	}
	if s.checkpoint != nil {
		out.Checkpoint = proto.Clone(s.checkpoint).(*catenapb.CheckpointRef)
	}
	if s.restoration != nil {
		out.Restoration = proto.Clone(s.restoration).(*catenapb.Restoration)
	}
	if s.st != nil {
		out.Keys = uint64(s.st.Len())
		out.SkippedRecords = s.st.Skipped
	}
	return out
}

// watchCommitted refreshes the source's committed offset while no
// records arrive, so that a shard that stopped reading shows its lag (the
// operator's stall detector compares consumed with it).
func (s *shard) watchCommitted(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c, err := s.env.client.ListOffsets(ctx, s.env.source, s.id, catenapb.OffsetSpec_OFFSET_SPEC_LATEST, 0)
		if err != nil {
			continue
		}
		s.mu.Lock()
		s.committed = max(s.committed, c)
		s.env.metrics.lag.Set(float64(s.committed - min(s.consumed, s.committed)))
		if s.st != nil {
			s.env.metrics.keys.Set(float64(s.st.Len()))
		}
		s.mu.Unlock()
	}
}

// errNotReady: the shard has no state yet.
var errNotReady = errors.New("restoring")
