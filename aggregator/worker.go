package aggregator

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/client"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// Options configure a Worker.
type Options struct {
	// ID names the worker (its pod name in a cluster).
	ID string
	// Ingest is the ingestion endpoint used when Assign names none.
	Ingest string
	TLS    *tls.Config
	Logger logr.Logger
	// ChunkBytes bounds checkpoint chunk records (0: DefaultChunkBytes).
	ChunkBytes int
	// Registerer takes the worker's metrics (nil: not exported).
	Registerer prometheus.Registerer
}

// Worker is the aggregator role: the Aggregator gRPC service over the
// shards it is assigned.
type Worker struct {
	catenapb.UnimplementedAggregatorServer

	opts    Options
	writer  uint64
	peers   *transport.Pool
	metrics *metrics

	mu         sync.Mutex
	assign     *catenapb.AssignRequest // the current assignment (nil: none yet)
	plan       *Plan
	ingestAddr string
	cl         *client.Client
	ckpt       *StreamLog
	shards     map[uint32]*shard
}

// NewWorker makes a worker with no shards; Assign gives it some.
func NewWorker(opts Options) *Worker {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Worker{opts: opts, writer: binary.BigEndian.Uint64(b[:]), peers: transport.NewPool(opts.TLS), shards: map[uint32]*shard{},
		metrics: newMetrics(opts.Registerer)}
}

// Close stops every shard and closes connections.
func (w *Worker) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopAllLocked()
	w.peers.Close()
}

func (w *Worker) stopAllLocked() {
	for id, s := range w.shards {
		s.stop()
		delete(w.shards, id)
	}
	if w.ckpt != nil {
		w.ckpt.Close()
		w.ckpt = nil
	}
	if w.cl != nil {
		w.cl.Close()
		w.cl = nil
	}
}

// Assign implements catenapb.AggregatorServer.
func (w *Worker) Assign(ctx context.Context, req *catenapb.AssignRequest) (*catenapb.AggregatorStatus, error) {
	plan, ingestAddr, err := w.checkAssign(req)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if cur := w.assign; cur != nil {
		if cur.Aggregation != req.Aggregation {
			return nil, status.Errorf(codes.FailedPrecondition, "this worker serves aggregation %s, not %s", cur.Aggregation, req.Aggregation)
		}
		if req.Generation < cur.Generation {
			return nil, status.Errorf(codes.FailedPrecondition, "assignment generation %d is older than this worker's %d", req.Generation, cur.Generation)
		}
		if req.Generation == cur.Generation && !proto.Equal(req, cur) {
			return nil, status.Errorf(codes.FailedPrecondition, "assignment generation %d was already given with other content", req.Generation)
		}
	}
	restart := w.assign == nil || w.plan.Fingerprint != plan.Fingerprint || w.ingestAddr != ingestAddr ||
		w.assign.CheckpointStream != req.CheckpointStream || w.assign.Consumer != req.Consumer ||
		w.plan.Interval != plan.Interval || w.plan.SnapshotEvery != plan.SnapshotEvery
	if restart {
		w.stopAllLocked()
		c, err := client.Dial(ctx, ingestAddr, w.clientOptions()...)
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "failed to reach ingestion at %s: %v", ingestAddr, err)
		}
		w.cl, w.ckpt, w.ingestAddr = c, NewStreamLog(c, req.CheckpointStream), ingestAddr
	}
	w.assign, w.plan = proto.Clone(req).(*catenapb.AssignRequest), plan
	want := map[uint32]bool{}
	for _, s := range req.Shards {
		want[s] = true
	}
	for id, s := range w.shards {
		if !want[id] {
			s.stop()
			delete(w.shards, id)
			w.opts.Logger.Info("Shard given up", "shard", id, "generation", req.Generation)
		}
	}
	ckptParts := req.SourcePartitions
	if cp, ok := w.checkpointPartitions(ctx, req.CheckpointStream); ok {
		ckptParts = cp
	}
	for _, id := range req.Shards {
		if w.shards[id] != nil {
			continue
		}
		w.shards[id] = startShard(id, shardEnv{
			plan: plan, client: w.cl, source: plan.Source, ckpt: w.ckpt, ckptStream: req.CheckpointStream, ckptParts: ckptParts,
			consumer: req.Consumer, writer: w.writer, chunkBytes: w.opts.ChunkBytes,
			log: w.opts.Logger.WithValues("source", plan.Source), metrics: w.metrics.forShard(id),
		})
		w.opts.Logger.Info("Shard assigned", "shard", id, "generation", req.Generation)
	}
	return w.statusLocked(), nil
}

func (w *Worker) clientOptions() []client.Option {
	if w.opts.TLS != nil {
		return []client.Option{client.WithTLS(w.opts.TLS)}
	}
	return nil
}

// checkpointPartitions asks for the checkpoint stream's partition count.
func (w *Worker) checkpointPartitions(ctx context.Context, stream string) (uint32, bool) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	d, err := w.cl.Describe(cctx, stream)
	if err != nil || len(d.GetPartitions()) == 0 {
		return 0, false
	}
	return uint32(len(d.GetPartitions())), true
}

// checkAssign validates an assignment before anything changes.
func (w *Worker) checkAssign(req *catenapb.AssignRequest) (*Plan, string, error) {
	if req.Aggregation == "" {
		return nil, "", status.Error(codes.InvalidArgument, "aggregation must name the Aggregation (namespace/name)")
	}
	if req.Generation <= 0 {
		return nil, "", status.Errorf(codes.InvalidArgument, "generation %d must be positive", req.Generation)
	}
	var spec streamsv1alpha1.AggregationSpec
	dec := json.NewDecoder(strings.NewReader(string(req.SpecJson)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		return nil, "", status.Errorf(codes.InvalidArgument, "spec_json is not an Aggregation spec: %v", err)
	}
	plan, err := Compile(spec)
	if err != nil {
		return nil, "", status.Errorf(codes.InvalidArgument, "invalid spec: %v", err)
	}
	if req.SourcePartitions == 0 {
		return nil, "", status.Error(codes.InvalidArgument, "source_partitions must be positive")
	}
	seen := map[uint32]bool{}
	for _, s := range req.Shards {
		if s >= req.SourcePartitions {
			return nil, "", status.Errorf(codes.InvalidArgument, "shard %d is not a partition of %s, which has %d", s, spec.Source, req.SourcePartitions)
		}
		if seen[s] {
			return nil, "", status.Errorf(codes.InvalidArgument, "shard %d is assigned twice", s)
		}
		seen[s] = true
	}
	if req.CheckpointStream == "" || req.Consumer == "" {
		return nil, "", status.Error(codes.InvalidArgument, "checkpoint_stream and consumer must be set")
	}
	addr := req.Ingest
	if addr == "" {
		addr = w.opts.Ingest
	}
	if addr == "" {
		return nil, "", status.Error(codes.InvalidArgument, "no ingestion endpoint: set ingest, or start the worker with --ingest")
	}
	return plan, addr, nil
}

// Status implements catenapb.AggregatorServer.
func (w *Worker) Status(context.Context, *catenapb.AggregatorStatusRequest) (*catenapb.AggregatorStatus, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.statusLocked(), nil
}

func (w *Worker) statusLocked() *catenapb.AggregatorStatus {
	out := &catenapb.AggregatorStatus{Worker: w.opts.ID}
	if w.assign == nil {
		return out
	}
	out.Aggregation, out.Generation, out.SpecFingerprint = w.assign.Aggregation, w.assign.Generation, w.plan.Fingerprint
	ids := make([]uint32, 0, len(w.shards))
	for id := range w.shards {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		out.Shards = append(out.Shards, w.shards[id].report())
	}
	return out
}

// snapshotForQuery returns the plan, owned shards and routing for a query.
func (w *Worker) snapshotForQuery() (*Plan, map[uint32]*shard, *catenapb.AssignRequest, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.assign == nil {
		return nil, nil, nil, status.Error(codes.Unavailable, "this worker has no assignment yet")
	}
	shards := make(map[uint32]*shard, len(w.shards))
	for id, s := range w.shards {
		shards[id] = s
	}
	return w.plan, shards, w.assign, nil
}

// Get implements catenapb.AggregatorServer.
func (w *Worker) Get(ctx context.Context, req *catenapb.AggGetRequest) (*catenapb.AggGetResponse, error) {
	if req.Key == "" {
		return nil, status.Error(codes.InvalidArgument, "key must not be empty")
	}
	plan, shards, asg, err := w.snapshotForQuery()
	if err != nil {
		return nil, err
	}
	local := &catenapb.AggGetResponse{}
	for _, id := range sortedIDs(shards) {
		part, err := shards[id].partial(req.Key, req.WindowFromMs, req.WindowToMs)
		if err != nil {
			return nil, err
		}
		local.Shards = append(local.Shards, id)
		local.Partials = append(local.Partials, part)
	}
	if req.Local {
		return local, nil
	}
	remote, err := fanOut(ctx, w.peers, asg, shards, func(ctx context.Context, c catenapb.AggregatorClient) (*catenapb.AggGetResponse, error) {
		return c.Get(ctx, &catenapb.AggGetRequest{Key: req.Key, Local: true, WindowFromMs: req.WindowFromMs, WindowToMs: req.WindowToMs})
	})
	if err != nil {
		return nil, err
	}
	return mergeGet(plan, asg.SourcePartitions, append(remote, local))
}

// fanOut calls, in parallel, every other worker that owns shards this one
// does not, and returns their answers.
func fanOut[R any](ctx context.Context, peers *transport.Pool, asg *catenapb.AssignRequest, mine map[uint32]*shard, call func(context.Context, catenapb.AggregatorClient) (R, error)) ([]R, error) {
	others := map[string]bool{}
	for s := uint32(0); s < asg.SourcePartitions; s++ {
		if mine[s] != nil {
			continue
		}
		owner, ok := asg.Owners[s]
		if !ok || owner == "" {
			return nil, status.Errorf(codes.Unavailable, "shard %d has no owner", s)
		}
		others[owner] = true
	}
	var (
		mu   sync.Mutex
		out  []R
		errs []string
		wg   sync.WaitGroup
	)
	for owner := range others {
		addr := asg.Peers[owner]
		if addr == "" {
			return nil, status.Errorf(codes.Unavailable, "worker %s owns shards but has no address", owner)
		}
		wg.Go(func() {
			var r R
			conn, err := peers.Get(addr)
			if err == nil {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				r, err = call(cctx, catenapb.NewAggregatorClient(conn))
				cancel()
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Sprintf("worker %s: %v", owner, err))
				return
			}
			out = append(out, r)
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		sort.Strings(errs)
		return nil, status.Errorf(codes.Unavailable, "some shards did not answer: %s", strings.Join(errs, "; "))
	}
	return out, nil
}

// mergeGet merges per-shard partials in shard order (so float sums are
// the same on every query) and checks every shard answered once.
func mergeGet(plan *Plan, partitions uint32, parts []*catenapb.AggGetResponse) (*catenapb.AggGetResponse, error) {
	byShard := map[uint32][]byte{}
	for _, p := range parts {
		if len(p.Partials) != len(p.Shards) {
			return nil, status.Error(codes.Internal, "a worker answered shards and partials that do not match")
		}
		for i, s := range p.Shards {
			byShard[s] = p.Partials[i]
		}
	}
	out := &catenapb.AggGetResponse{}
	groups := map[entryKey]*entry{}
	for s := uint32(0); s < partitions; s++ {
		b, ok := byShard[s]
		if !ok {
			return nil, status.Errorf(codes.Unavailable, "shard %d did not answer (its owner may be restoring it)", s)
		}
		out.Shards = append(out.Shards, s)
		err := decodePartial(plan, b, func(k entryKey, e *entry) {
			if g := groups[k]; g != nil {
				plan.merge(g, e)
			} else {
				groups[k] = e
			}
		})
		if err != nil {
			return nil, status.Errorf(codes.Internal, "shard %d answered a partial that does not decode: %v", s, err)
		}
	}
	keys := make([]entryKey, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].window < keys[j].window })
	for _, k := range keys {
		out.Rows = append(out.Rows, &catenapb.AggRow{Key: k.key, WindowStartMs: k.window, Values: plan.values(groups[k])})
	}
	return out, nil
}

// partial encodes the shard's groups of key: uvarint count, then entries.
func (s *shard) partial(key string, fromMs, toMs int64) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.st == nil || s.phase == catenapb.ShardPhase_SHARD_PHASE_RESTORING {
		return nil, status.Errorf(codes.Unavailable, "shard %d is %s", s.id, errNotReady)
	}
	ks := s.st.groups(key, fromMs, toMs)
	b := binary.AppendUvarint(nil, uint64(len(ks)))
	for _, k := range ks {
		b = s.env.plan.appendEntry(b, k, s.st.get(k))
	}
	return b, nil
}

func decodePartial(plan *Plan, b []byte, put func(entryKey, *entry)) error {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return errCorrupt
	}
	return plan.decodeEntries(b[k:], uint32(n), put)
}

// List implements catenapb.AggregatorServer.
func (w *Worker) List(ctx context.Context, req *catenapb.AggListRequest) (*catenapb.AggListResponse, error) {
	limit := int(req.Limit)
	if limit <= 0 {
		limit = 100
	}
	if limit > 10000 {
		return nil, status.Errorf(codes.InvalidArgument, "limit %d is above 10000", limit)
	}
	_, shards, asg, err := w.snapshotForQuery()
	if err != nil {
		return nil, err
	}
	keys := map[string]struct{}{}
	covered := map[uint32]bool{}
	for _, id := range sortedIDs(shards) {
		s := shards[id]
		s.mu.Lock()
		if s.st == nil || s.phase == catenapb.ShardPhase_SHARD_PHASE_RESTORING {
			s.mu.Unlock()
			return nil, status.Errorf(codes.Unavailable, "shard %d is %s", id, errNotReady)
		}
		for _, k := range s.st.keys(req.Prefix, req.After, limit) {
			keys[k] = struct{}{}
		}
		s.mu.Unlock()
		covered[id] = true
	}
	if !req.Local {
		remote, err := fanOut(ctx, w.peers, asg, shards, func(ctx context.Context, c catenapb.AggregatorClient) (*catenapb.AggListResponse, error) {
			return c.List(ctx, &catenapb.AggListRequest{Prefix: req.Prefix, After: req.After, Limit: uint32(limit), Local: true})
		})
		if err != nil {
			return nil, err
		}
		for _, r := range remote {
			for _, k := range r.Keys {
				keys[k] = struct{}{}
			}
			for _, s := range r.Shards {
				covered[s] = true
			}
		}
		for s := uint32(0); s < asg.SourcePartitions; s++ {
			if !covered[s] {
				return nil, status.Errorf(codes.Unavailable, "shard %d did not answer", s)
			}
		}
	}
	out := &catenapb.AggListResponse{}
	for k := range keys {
		out.Keys = append(out.Keys, k)
	}
	sort.Strings(out.Keys)
	if len(out.Keys) > limit {
		out.Keys, out.More = out.Keys[:limit], true
	}
	for id := range covered {
		out.Shards = append(out.Shards, id)
	}
	slices.Sort(out.Shards)
	return out, nil
}

func sortedIDs(m map[uint32]*shard) []uint32 {
	ids := make([]uint32, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
