package devcluster

import (
	"context"
	"math"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/go-logr/logr"

	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

// Streams created and deleted by clients (catenactl stream create/delete,
// Ingest.CreateStream and DeleteStream): ingestion hands each request to
// the dev loop, which is the chain master, and waits for its answer. The
// loop creates a stream as it creates those of --stream, masters it from
// then on, and records it in dev.json (State.Created), so that the next
// start masters it again. A deleted stream is dropped from every replica
// (Replica.Drop, stream_deleted) and forgotten.

// CreatedStream is a stream a client created, in dev.json.
type CreatedStream struct {
	Name       string `json:"name"`
	Partitions int    `json:"partitions"`
}

// runState is what the dev loop's stream requests work on.
type runState struct {
	spec     Spec
	pool     *transport.Pool
	children []*child
	load     chainplan.Load
	log      logr.Logger
	state    *State
	master   *master
}

// handle answers one request.
func (r *runState) handle(ctx context.Context, op adminOp) {
	var err error
	if op.create {
		err = r.createStream(ctx, op.stream)
	} else {
		err = r.deleteStream(ctx, op.stream.Name)
	}
	op.reply <- err
}

// adminOp is one request to the dev loop.
type adminOp struct {
	create bool
	stream StreamSpec
	reply  chan error
}

// streamAdmin is the ingest.StreamAdmin of a dev cluster.
type streamAdmin struct{ ops chan adminOp }

func (a *streamAdmin) do(ctx context.Context, op adminOp) error {
	op.reply = make(chan error, 1)
	select {
	case a.ops <- op:
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	select {
	case err := <-op.reply:
		return err
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// CreateStream implements ingest.StreamAdmin.
func (a *streamAdmin) CreateStream(ctx context.Context, stream string, partitions int) error {
	if err := validateStreamName(stream); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if partitions < 1 || partitions > maxPartitions {
		return status.Errorf(codes.InvalidArgument, "partitions must be between 1 and %d, got %d", maxPartitions, partitions)
	}
	return a.do(ctx, adminOp{create: true, stream: StreamSpec{Name: stream, Partitions: partitions}})
}

// DeleteStream implements ingest.StreamAdmin.
func (a *streamAdmin) DeleteStream(ctx context.Context, stream string) error {
	return a.do(ctx, adminOp{stream: StreamSpec{Name: stream}})
}

// createStream is the loop's side of a create: the stream must not exist,
// and every replica must answer.
func (r *runState) createStream(ctx context.Context, s StreamSpec) error {
	if r.master.stream(s.Name) != nil {
		return status.Errorf(codes.AlreadyExists, "stream %q exists", s.Name)
	}
	if len(r.master.streams) >= maxStreams {
		return status.Errorf(codes.ResourceExhausted, "catena dev masters at most %d streams", maxStreams)
	}
	if down := r.down(); len(down) > 0 {
		return status.Errorf(codes.Unavailable, "replicas %v are down: a stream is created on every replica it is placed on; try again when they are back", down)
	}
	// A stream no master knows may still be on the replicas (created by
	// an earlier run that was killed before it recorded it): re-installed
	// as it is, which is what ensureStream does with a stream it finds.
	if err := ensureStream(ctx, r.pool, r.spec, s, r.children, r.load, r.log); err != nil {
		return status.Errorf(codes.Unavailable, "failed to create stream %q: %v", s.Name, err)
	}
	r.master.streams = append(r.master.streams, newMasterStream(s.Name, s.Partitions, r.spec.streamConfig(s.Name, s.Partitions)))
	r.state.Created = append(r.state.Created, CreatedStream{Name: s.Name, Partitions: s.Partitions})
	r.state.Streams = append(r.state.Streams, s.Name)
	r.log.Info("Created stream", "stream", s.Name, "partitions", s.Partitions)
	return r.saveState()
}

// deleteStream is the loop's side of a delete: every replica must answer,
// and drops its copies; the stream is forgotten once all have.
func (r *runState) deleteStream(ctx context.Context, name string) error {
	ms := r.master.stream(name)
	if ms == nil {
		return status.Errorf(codes.NotFound, "stream %q not found", name)
	}
	if down := r.down(); len(down) > 0 {
		return status.Errorf(codes.Unavailable, "replicas %v are down: their copies of %q could not be dropped; try again when they are back", down, name)
	}
	for _, c := range r.children {
		conn, err := r.pool.Get(c.Addr)
		if err != nil {
			return status.Errorf(codes.Unavailable, "failed to reach replica %s: %v", c.ID, err)
		}
		for p := range ms.partitions {
			cctx, cancel := context.WithTimeout(ctx, repairCallTimeout)
			_, err := catenapb.NewReplicaClient(conn).Drop(cctx, &catenapb.DropRequest{Stream: name, Partition: uint32(p), Epoch: math.MaxUint64, StreamDeleted: true})
			cancel()
			if err != nil {
				return status.Errorf(codes.Unavailable, "failed to drop %s/%d on replica %s (delete it again): %v", name, p, c.ID, err)
			}
		}
	}
	r.master.streams = slices.DeleteFunc(r.master.streams, func(s *masterStream) bool { return s.name == name })
	r.state.Created = slices.DeleteFunc(r.state.Created, func(s CreatedStream) bool { return s.Name == name })
	r.state.Streams = slices.DeleteFunc(r.state.Streams, func(s string) bool { return s == name })
	if r.state.Stream == name {
		r.state.Stream = ""
		if len(r.state.Streams) > 0 {
			r.state.Stream = r.state.Streams[0]
		}
	}
	r.log.Info("Deleted stream", "stream", name)
	return r.saveState()
}

// down lists the replicas that have exited and are not back.
func (r *runState) down() []string {
	var out []string
	for _, c := range r.children {
		if r.master.failed[c.ID] {
			out = append(out, c.ID)
		}
	}
	return out
}

func (r *runState) saveState() error {
	if err := writeState(r.spec.DataDir, *r.state); err != nil {
		return status.Errorf(codes.Internal, "failed to record the streams in %s: %v", StateFile, err)
	}
	return nil
}

// stream returns the master's stream name (nil when it has none).
func (m *master) stream(name string) *masterStream {
	for _, s := range m.streams {
		if s.name == name {
			return s
		}
	}
	return nil
}

// withCreated adds the streams an earlier run created to those of
// --stream (which win when both name one).
func withCreated(streams []StreamSpec, prev *State) []StreamSpec {
	if prev == nil {
		return streams
	}
	for _, c := range prev.Created {
		if !slices.ContainsFunc(streams, func(s StreamSpec) bool { return s.Name == c.Name }) {
			streams = append(streams, StreamSpec{Name: c.Name, Partitions: c.Partitions})
		}
	}
	return streams
}
