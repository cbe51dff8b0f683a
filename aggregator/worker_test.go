package aggregator

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/catena-streams/catena/rpc/catenapb"
)

// TestAssignRefusesBadInput checks that every malformed or stale
// assignment is refused with its reason and changes nothing: the worker
// keeps the assignment it had.
func TestAssignRefusesBadInput(t *testing.T) {
	spec, _ := json.Marshal(testSpec(0, ""))
	good := &catenapb.AssignRequest{
		Aggregation: "ns/orders", Generation: 5, SpecJson: spec, Shards: []uint32{0, 1}, SourcePartitions: 4,
		Ingest: "127.0.0.1:1", CheckpointStream: "orders-checkpoints", Consumer: "aggregation.ns.orders",
	}
	w := NewWorker(Options{ID: "w0", Logger: logr.Discard()})
	defer w.Close()
	ctx := context.Background()
	if _, err := w.Assign(ctx, good); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Assign(ctx, good); err != nil {
		t.Fatalf("the same assignment again must be accepted: %v", err)
	}
	for _, tc := range []struct {
		name string
		mut  func(*catenapb.AssignRequest)
		code codes.Code
	}{
		{"no aggregation", func(r *catenapb.AssignRequest) { r.Aggregation = "" }, codes.InvalidArgument},
		{"zero generation", func(r *catenapb.AssignRequest) { r.Generation = 0 }, codes.InvalidArgument},
		{"spec not JSON", func(r *catenapb.AssignRequest) { r.SpecJson = []byte("{") }, codes.InvalidArgument},
		{"unknown spec field", func(r *catenapb.AssignRequest) { r.SpecJson = []byte(`{"source":"s","bogus":1}`) }, codes.InvalidArgument},
		{"invalid spec", func(r *catenapb.AssignRequest) { r.SpecJson = []byte(`{"source":"s","aggregates":[]}`) }, codes.InvalidArgument},
		{"shard past the partitions", func(r *catenapb.AssignRequest) { r.Shards = []uint32{4} }, codes.InvalidArgument},
		{"shard twice", func(r *catenapb.AssignRequest) { r.Shards = []uint32{1, 1} }, codes.InvalidArgument},
		{"no partitions", func(r *catenapb.AssignRequest) { r.SourcePartitions = 0 }, codes.InvalidArgument},
		{"no checkpoint stream", func(r *catenapb.AssignRequest) { r.CheckpointStream = "" }, codes.InvalidArgument},
		{"no ingestion", func(r *catenapb.AssignRequest) { r.Ingest = "" }, codes.InvalidArgument},
		{"older generation", func(r *catenapb.AssignRequest) { r.Generation = 4 }, codes.FailedPrecondition},
		{"same generation, other shards", func(r *catenapb.AssignRequest) { r.Shards = []uint32{2} }, codes.FailedPrecondition},
		{"another aggregation", func(r *catenapb.AssignRequest) { r.Aggregation = "ns/other"; r.Generation = 9 }, codes.FailedPrecondition},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := proto.Clone(good).(*catenapb.AssignRequest)
			tc.mut(req)
			_, err := w.Assign(ctx, req)
			if status.Code(err) != tc.code {
				t.Fatalf("Assign: %v, want %s", err, tc.code)
			}
			st, _ := w.Status(ctx, nil)
			if st.Generation != 5 || st.Aggregation != "ns/orders" || len(st.Shards) != 2 {
				t.Fatalf("a refused assignment changed the worker: %v", st)
			}
		})
	}
	// A newer generation moves shards.
	next := proto.Clone(good).(*catenapb.AssignRequest)
	next.Generation, next.Shards = 6, []uint32{1, 3}
	st, err := w.Assign(ctx, next)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Shards) != 2 || st.Shards[0].Shard != 1 || st.Shards[1].Shard != 3 {
		t.Fatalf("shards after generation 6: %v", st.Shards)
	}
}
