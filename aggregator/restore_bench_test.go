package aggregator

import (
	"context"
	"fmt"
	"testing"
	"time"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// BenchmarkRestoreInMemory is the restore's own cost, without the
// checkpoint stream's reads: 1M keys in a snapshot plus two increments of
// 100k keys, from an in-memory log. make bench-restore measures the whole
// path through a running catena dev.
func BenchmarkRestoreInMemory(b *testing.B) {
	spec := streamsv1alpha1.AggregationSpec{
		Source: "views",
		Aggregates: []streamsv1alpha1.AggregateSpec{
			{Name: "n", Function: streamsv1alpha1.AggregateCount},
			{Name: "total", Function: streamsv1alpha1.AggregateSum, Field: "ms"},
			{Name: "high", Function: streamsv1alpha1.AggregateMax, Field: "ms"},
		},
	}
	p := mustCompile(b, spec)
	st := NewState(p, 1_000_000)
	for i := range 1_000_000 {
		st.Fold(fmt.Appendf(nil, "user-%07d", i), fmt.Appendf(nil, `{"ms": %d}`, i%1000), 0)
	}
	log := newMemLog()
	cp := &Checkpointer{Plan: p, Log: log, Writer: 1}
	ctx := context.Background()
	for round := range 3 {
		if round > 0 {
			for i := range 100_000 {
				st.Fold(fmt.Appendf(nil, "user-%07d", (i*7919+round)%1_000_000), []byte(`{"ms": 5}`), 0)
			}
		}
		if _, err := cp.Write(ctx, cp.Capture(st, uint64(round+1), 0, time.Now())); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		r, err := Restore(ctx, log, p, 0, 0, 0)
		if err != nil || r.State.Len() != 1_000_000 || r.Loaded != 3 {
			b.Fatalf("%v %d %d", err, r.State.Len(), r.Loaded)
		}
	}
}
