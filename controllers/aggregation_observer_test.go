package controllers

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/catena-streams/catena/rpc/catenapb"
)

func TestWorkerProbeInterval(t *testing.T) {
	for _, tc := range []struct{ timeout, want time.Duration }{
		{500 * time.Millisecond, minWorkerProbeInterval},
		{time.Second, 125 * time.Millisecond},
		{2 * time.Second, 250 * time.Millisecond},
		{10 * time.Second, maxWorkerProbeInterval},
	} {
		if got := workerProbeInterval(tc.timeout); got != tc.want {
			t.Errorf("failure timeout %v: probe every %v, want %v", tc.timeout, got, tc.want)
		}
	}
}

func TestWorkersDigestChangesWithWhatTheReconcileDecidesFrom(t *testing.T) {
	base := workerView{Reports: map[string]*catenapb.AggregatorStatus{
		"a-0": {Generation: 3, Shards: []*catenapb.ShardStatus{{Shard: 0, Phase: catenapb.ShardPhase_SHARD_PHASE_RUNNING, Consumed: 10, SourceCommitted: 12}}},
		"a-1": {Generation: 3, Shards: []*catenapb.ShardStatus{{Shard: 1, Phase: catenapb.ShardPhase_SHARD_PHASE_RUNNING}}},
	}}
	with := func(change func(v workerView)) workerView {
		v := workerView{Reports: map[string]*catenapb.AggregatorStatus{}}
		for id, st := range base.Reports {
			v.Reports[id] = proto.Clone(st).(*catenapb.AggregatorStatus)
		}
		change(v)
		return v
	}
	for _, tc := range []struct {
		name    string
		view    workerView
		changes bool
	}{
		{"offsets move", with(func(v workerView) {
			v.Reports["a-0"].Shards[0].Consumed, v.Reports["a-0"].Shards[0].SourceCommitted = 12, 40
		}), false},
		{"a worker stops answering", with(func(v workerView) { delete(v.Reports, "a-1") }), true},
		{"a worker takes a new generation", with(func(v workerView) { v.Reports["a-1"].Generation = 4 }), true},
		{"a shard starts restoring", with(func(v workerView) {
			v.Reports["a-0"].Shards[0].Phase = catenapb.ShardPhase_SHARD_PHASE_RESTORING
		}), true},
		{"a restore finishes", with(func(v workerView) {
			v.Reports["a-0"].Shards[0].Restoration = &catenapb.Restoration{StartedMs: 1000}
		}), true},
		{"a shard fails", with(func(v workerView) { v.Reports["a-1"].Shards[0].Error = "corrupt checkpoint" }), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := workersDigest(tc.view) != workersDigest(base); got != tc.changes {
				t.Fatalf("digest changed %v, want %v", got, tc.changes)
			}
		})
	}
}
