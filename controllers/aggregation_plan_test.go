package controllers

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// owners renders assignments as "w0:0,1 w1:2,3" for compact tables.
func renderAssignments(as []streamsv1alpha1.WorkerAssignment) string {
	var parts []string
	for _, a := range as {
		var ps []string
		for _, p := range a.Partitions {
			ps = append(ps, fmt.Sprint(p))
		}
		parts = append(parts, a.Worker+":"+strings.Join(ps, ","))
	}
	return strings.Join(parts, " ")
}

// parseAssignments reads that rendering back.
func parseAssignments(s string) []streamsv1alpha1.WorkerAssignment {
	var out []streamsv1alpha1.WorkerAssignment
	for _, f := range strings.Fields(s) {
		w, ps, _ := strings.Cut(f, ":")
		a := streamsv1alpha1.WorkerAssignment{Worker: w}
		for _, p := range strings.Split(ps, ",") {
			var n int32
			fmt.Sscan(p, &n)
			a.Partitions = append(a.Partitions, n)
		}
		out = append(out, a)
	}
	return out
}

func renderMoves(ms []shardMove) string {
	var parts []string
	for _, m := range ms {
		parts = append(parts, fmt.Sprintf("%d:%s->%s(%s)", m.Partition, m.From, m.To, m.Reason))
	}
	return strings.Join(parts, " ")
}

func TestPlanAssignment(t *testing.T) {
	const (
		live    = workerLive
		silent  = workerSilent
		stalled = workerStalled
		failed  = workerFailed
	)
	for _, tc := range []struct {
		name       string
		partitions int32
		workers    int
		states     map[string]workerState
		benched    []string
		current    string
		settled    bool
		specChange bool
		want       string
		wantMoves  string
		wantGen    int64 // from generation 5
		unowned    []int32
	}{
		{
			name: "first assignment spreads shards in order", partitions: 4, workers: 2,
			states: map[string]workerState{"a-0": live, "a-1": live},
			want:   "a-0:0,2 a-1:1,3", wantMoves: "0:->a-0() 1:->a-1() 2:->a-0() 3:->a-1()", wantGen: 6,
		},
		{
			name: "nothing changes while every owner is live", partitions: 4, workers: 2, settled: true,
			states:  map[string]workerState{"a-0": live, "a-1": live},
			current: "a-0:0,2 a-1:1,3", want: "a-0:0,2 a-1:1,3", wantGen: 5,
		},
		{
			name: "a changed spec is a new generation", partitions: 4, workers: 2, settled: true, specChange: true,
			states:  map[string]workerState{"a-0": live, "a-1": live},
			current: "a-0:0,2 a-1:1,3", want: "a-0:0,2 a-1:1,3", wantGen: 6,
		},
		{
			name: "a briefly silent owner keeps its shards", partitions: 4, workers: 2, settled: true,
			states:  map[string]workerState{"a-0": live, "a-1": silent},
			current: "a-0:0,2 a-1:1,3", want: "a-0:0,2 a-1:1,3", wantGen: 5,
		},
		{
			name: "a failed owner's shards go to the survivor", partitions: 4, workers: 2,
			states:  map[string]workerState{"a-0": live, "a-1": failed},
			current: "a-0:0,2 a-1:1,3", want: "a-0:0,1,2,3",
			wantMoves: "1:a-1->a-0(WorkerFailed) 3:a-1->a-0(WorkerFailed)", wantGen: 6,
		},
		{
			name: "a failed owner's shards spread over the least loaded", partitions: 6, workers: 3,
			states:  map[string]workerState{"a-0": live, "a-1": failed, "a-2": live},
			current: "a-0:0,3 a-1:1,4 a-2:2,5", want: "a-0:0,1,3 a-2:2,4,5",
			wantMoves: "1:a-1->a-0(WorkerFailed) 4:a-1->a-2(WorkerFailed)", wantGen: 6,
		},
		{
			name: "balanced within one after a failure of the most loaded", partitions: 5, workers: 3,
			states:  map[string]workerState{"a-0": failed, "a-1": live, "a-2": live},
			current: "a-0:0,3 a-1:1,4 a-2:2", want: "a-1:1,3,4 a-2:0,2",
			wantMoves: "0:a-0->a-2(WorkerFailed) 3:a-0->a-1(WorkerFailed)", wantGen: 6,
		},
		{
			name: "a stalled owner's shards move and it gets none back", partitions: 4, workers: 2,
			states:  map[string]workerState{"a-0": stalled, "a-1": live},
			current: "a-0:0,2 a-1:1,3", want: "a-1:0,1,2,3",
			wantMoves: "0:a-0->a-1(WorkerStalled) 2:a-0->a-1(WorkerStalled)", wantGen: 6,
		},
		{
			name: "a stalled worker with no one to take over keeps its shards", partitions: 2, workers: 1,
			states:  map[string]workerState{"a-0": stalled},
			current: "a-0:0,1", want: "a-0:0,1", wantGen: 5, unowned: []int32{0, 1},
		},
		{
			name: "no live worker: shards wait with their failed owner", partitions: 2, workers: 2,
			states:  map[string]workerState{"a-0": failed, "a-1": failed},
			current: "a-0:0 a-1:1", want: "a-0:0 a-1:1", wantGen: 5, unowned: []int32{0, 1},
		},
		{
			name: "no live worker yet: nothing is assigned", partitions: 2, workers: 2,
			states: map[string]workerState{"a-0": silent, "a-1": silent},
			want:   "", wantGen: 5,
		},
		{
			name: "a returning worker takes half once every shard runs", partitions: 4, workers: 2, settled: true,
			states:  map[string]workerState{"a-0": live, "a-1": live},
			current: "a-0:0,1,2,3", want: "a-0:0,1 a-1:2,3",
			wantMoves: "3:a-0->a-1(Rebalanced) 2:a-0->a-1(Rebalanced)", wantGen: 6,
		},
		{
			name: "a returning worker waits while shards restore", partitions: 4, workers: 2, settled: false,
			states:  map[string]workerState{"a-0": live, "a-1": live},
			current: "a-0:0,1,2,3", want: "a-0:0,1,2,3", wantGen: 5,
		},
		{
			name: "a benched worker is not rebalanced onto", partitions: 4, workers: 2, settled: true,
			states: map[string]workerState{"a-0": live, "a-1": live}, benched: []string{"a-1"},
			current: "a-0:0,1,2,3", want: "a-0:0,1,2,3", wantGen: 5,
		},
		{
			name: "a new worker is idle when the counts are within one", partitions: 4, workers: 5, settled: true,
			states:  map[string]workerState{"a-0": live, "a-1": live, "a-2": live, "a-3": live, "a-4": live},
			current: "a-0:0 a-1:1 a-2:2 a-3:3", want: "a-0:0 a-1:1 a-2:2 a-3:3", wantGen: 5,
		},
		{
			name: "a third worker takes one shard of four, not two", partitions: 4, workers: 3, settled: true,
			states:  map[string]workerState{"a-0": live, "a-1": live, "a-2": live},
			current: "a-0:0,2 a-1:1,3", want: "a-0:0,2 a-1:1 a-2:3",
			wantMoves: "3:a-1->a-2(Rebalanced)", wantGen: 6,
		},
		{
			name: "a third worker takes shards of six", partitions: 6, workers: 3, settled: true,
			states:  map[string]workerState{"a-0": live, "a-1": live, "a-2": live},
			current: "a-0:0,2,4 a-1:1,3,5", want: "a-0:0,2 a-1:1,3 a-2:4,5",
			wantMoves: "5:a-1->a-2(Rebalanced) 4:a-0->a-2(Rebalanced)", wantGen: 6,
		},
		{
			name: "shards of a worker beyond spec.workers move", partitions: 4, workers: 1,
			states:  map[string]workerState{"a-0": live, "a-1": live},
			current: "a-0:0,2 a-1:1,3", want: "a-0:0,1,2,3",
			wantMoves: "1:a-1->a-0(Rebalanced) 3:a-1->a-0(Rebalanced)", wantGen: 6,
		},
		{
			name: "new partitions of the source are assigned", partitions: 6, workers: 2, settled: false,
			states:  map[string]workerState{"a-0": live, "a-1": live},
			current: "a-0:0,2 a-1:1,3", want: "a-0:0,2,4 a-1:1,3,5",
			wantMoves: "4:->a-0() 5:->a-1()", wantGen: 6,
		},
		{
			name: "ordinals order workers numerically", partitions: 12, workers: 11,
			states:  map[string]workerState{"a-0": live, "a-1": live, "a-2": live, "a-3": live, "a-4": live, "a-5": live, "a-6": live, "a-7": live, "a-8": live, "a-9": live, "a-10": live},
			current: "a-0:0,11 a-1:1 a-2:2 a-3:3 a-4:4 a-5:5 a-6:6 a-7:7 a-8:8 a-9:9 a-10:10", want: "a-0:0,11 a-1:1 a-2:2 a-3:3 a-4:4 a-5:5 a-6:6 a-7:7 a-8:8 a-9:9 a-10:10", wantGen: 5,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var workers []string
			for i := range tc.workers {
				workers = append(workers, fmt.Sprintf("a-%d", i))
			}
			benched := map[string]bool{}
			for _, w := range tc.benched {
				benched[w] = true
			}
			plan := planAssignment(assignmentInput{
				Partitions: tc.partitions, Workers: workers, States: tc.states, Benched: benched,
				Current: parseAssignments(tc.current), Generation: 5, Settled: tc.settled, SpecChanged: tc.specChange,
			})
			if got := renderAssignments(plan.Assignments); got != tc.want {
				t.Errorf("assignments %q, want %q", got, tc.want)
			}
			if got := renderMoves(plan.Moves); got != tc.wantMoves {
				t.Errorf("moves %q, want %q", got, tc.wantMoves)
			}
			if plan.Generation != tc.wantGen || plan.Changed != (tc.wantGen != 5) {
				t.Errorf("generation %d (changed %v), want %d", plan.Generation, plan.Changed, tc.wantGen)
			}
			if !slices.Equal(plan.Unowned, tc.unowned) {
				t.Errorf("unowned %v, want %v", plan.Unowned, tc.unowned)
			}
			// Whatever happened, every shard has at most one owner.
			seen := map[int32]bool{}
			for _, a := range plan.Assignments {
				for _, p := range a.Partitions {
					if seen[p] {
						t.Fatalf("shard %d owned twice: %s", p, renderAssignments(plan.Assignments))
					}
					seen[p] = true
				}
			}
		})
	}
}

// A plan applied again changes nothing: the planner reaches a fixed point.
func TestPlanAssignmentIsStable(t *testing.T) {
	states := map[string]workerState{"a-0": workerLive, "a-1": workerFailed, "a-2": workerLive}
	in := assignmentInput{Partitions: 7, Workers: []string{"a-0", "a-1", "a-2"}, States: states,
		Current: parseAssignments("a-0:0,3,6 a-1:1,4 a-2:2,5"), Generation: 1, Settled: true}
	first := planAssignment(in)
	in.Current, in.Generation = first.Assignments, first.Generation
	second := planAssignment(in)
	if second.Changed || len(second.Moves) > 0 {
		t.Fatalf("second plan moved %s after %s", renderMoves(second.Moves), renderAssignments(first.Assignments))
	}
	counts := []int{}
	for _, a := range first.Assignments {
		counts = append(counts, len(a.Partitions))
	}
	if slices.Max(counts)-slices.Min(counts) > 1 {
		t.Fatalf("unbalanced after the failure: %s", renderAssignments(first.Assignments))
	}
}

func TestWorkerHealth(t *testing.T) {
	now := time.Unix(1000, 0)
	const timeout = 10 * time.Second
	pod := func(phase corev1.PodPhase, ready corev1.ConditionStatus, since time.Duration) *corev1.Pod {
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: phase}}
		if ready != "" {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, LastTransitionTime: metav1.NewTime(now.Add(-since))}}
		}
		return p
	}
	deleting := pod(corev1.PodRunning, corev1.ConditionTrue, time.Minute)
	deleting.DeletionTimestamp = &metav1.Time{Time: now}
	for _, tc := range []struct {
		name       string
		pod        *corev1.Pod
		answered   bool
		lastAnswer time.Duration // ago; 0: never
		firstAsked time.Duration // ago
		want       workerState
	}{
		{"ready and answering", pod(corev1.PodRunning, corev1.ConditionTrue, time.Minute), true, 0, time.Minute, workerLive},
		{"no pod", nil, true, 0, time.Minute, workerFailed},
		{"pod failed", pod(corev1.PodFailed, corev1.ConditionFalse, 0), true, 0, time.Minute, workerFailed},
		{"pod being deleted", deleting, true, 0, time.Minute, workerFailed},
		{"answering, pod not ready yet", pod(corev1.PodRunning, corev1.ConditionFalse, time.Second), true, 0, time.Minute, workerSilent},
		{"pod not ready for the timeout", pod(corev1.PodRunning, corev1.ConditionFalse, timeout), true, 0, time.Minute, workerFailed},
		{"silent briefly", pod(corev1.PodRunning, corev1.ConditionTrue, time.Minute), false, 2 * time.Second, time.Minute, workerSilent},
		{"silent for the timeout", pod(corev1.PodRunning, corev1.ConditionTrue, time.Minute), false, timeout, time.Minute, workerFailed},
		{"never answered, asked just now", pod(corev1.PodRunning, corev1.ConditionTrue, time.Minute), false, 0, time.Second, workerSilent},
		{"never answered for the timeout", pod(corev1.PodRunning, corev1.ConditionTrue, time.Minute), false, 0, timeout, workerFailed},
		{"pending pod without conditions", pod(corev1.PodPending, "", 0), false, 0, time.Second, workerSilent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var last time.Time
			if tc.lastAnswer > 0 {
				last = now.Add(-tc.lastAnswer)
			}
			if got := workerHealth(tc.pod, tc.answered, last, now.Add(-tc.firstAsked), now, timeout); got != tc.want {
				t.Errorf("state %v, want %v", got, tc.want)
			}
		})
	}
}

func TestTrackProgress(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const timeout = 5 * time.Second
	running := catenapb.ShardPhase_SHARD_PHASE_RUNNING
	shard := func(phase catenapb.ShardPhase, consumed, committed uint64) *catenapb.ShardStatus {
		return &catenapb.ShardStatus{Phase: phase, Consumed: consumed, SourceCommitted: committed}
	}
	for _, tc := range []struct {
		name    string
		prev    shardProgress
		worker  string
		ss      *catenapb.ShardStatus
		at      time.Duration // after t0
		stalled bool
		since   time.Duration
	}{
		{"first look starts the clock", shardProgress{}, "w", shard(running, 5, 10), 0, false, 0},
		{"no progress, under the timeout", shardProgress{"w", 5, t0}, "w", shard(running, 5, 10), 4 * time.Second, false, 0},
		{"no progress for the timeout", shardProgress{"w", 5, t0}, "w", shard(running, 5, 10), timeout, true, 0},
		{"progress restarts the clock", shardProgress{"w", 5, t0}, "w", shard(running, 6, 10), timeout, false, timeout},
		{"caught up is not stalled", shardProgress{"w", 10, t0}, "w", shard(running, 10, 10), time.Minute, false, time.Minute},
		{"restoring is not checked", shardProgress{"w", 0, t0}, "w", shard(catenapb.ShardPhase_SHARD_PHASE_RESTORING, 0, 10), time.Minute, false, time.Minute},
		{"failed is not checked", shardProgress{"w", 0, t0}, "w", shard(catenapb.ShardPhase_SHARD_PHASE_FAILED, 0, 10), time.Minute, false, time.Minute},
		{"replaying is checked", shardProgress{"w", 3, t0}, "w", shard(catenapb.ShardPhase_SHARD_PHASE_REPLAYING, 3, 10), timeout, true, 0},
		{"a new owner restarts the clock", shardProgress{"v", 5, t0}, "w", shard(running, 5, 10), time.Minute, false, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, stalled := trackProgress(tc.prev, tc.worker, tc.ss, t0.Add(tc.at), timeout)
			if stalled != tc.stalled {
				t.Errorf("stalled %v, want %v", stalled, tc.stalled)
			}
			if !got.Since.Equal(t0.Add(tc.since)) || got.Worker != tc.worker || got.Consumed != tc.ss.GetConsumed() {
				t.Errorf("progress %+v, want since %v", got, t0.Add(tc.since))
			}
		})
	}
}

func TestStableCheckpoint(t *testing.T) {
	cp := func(epoch, offset int64) *streamsv1alpha1.CheckpointReference {
		return &streamsv1alpha1.CheckpointReference{Epoch: epoch, SourceOffset: offset}
	}
	shards := func(cps ...*streamsv1alpha1.CheckpointReference) []streamsv1alpha1.AggregationShardStatus {
		var out []streamsv1alpha1.AggregationShardStatus
		for i, c := range cps {
			out = append(out, streamsv1alpha1.AggregationShardStatus{Partition: int32(i), Checkpoint: c})
		}
		return out
	}
	prev := &streamsv1alpha1.StableCheckpoint{Epoch: 7, SourceOffsets: []int64{1, 1}}
	for _, tc := range []struct {
		name   string
		shards []streamsv1alpha1.AggregationShardStatus
		prev   *streamsv1alpha1.StableCheckpoint
		want   int64 // -1: nil
		offs   []int64
	}{
		{"minimum over shards", shards(cp(9, 100), cp(8, 50)), nil, 8, []int64{100, 50}},
		{"a shard without a checkpoint: none yet", shards(cp(9, 100), nil), nil, -1, nil},
		{"a shard without a checkpoint keeps the last", shards(cp(9, 100), nil), prev, 7, []int64{1, 1}},
		{"never goes back", shards(cp(9, 100), cp(6, 50)), prev, 7, []int64{1, 1}},
		{"grows", shards(cp(9, 100), cp(10, 50)), prev, 9, []int64{100, 50}},
		{"offsets grow under the same minimum", shards(cp(7, 3), cp(9, 2)), prev, 7, []int64{3, 2}},
		{"an offset going back keeps the last", shards(cp(8, 0), cp(9, 2)), prev, 7, []int64{1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := stableCheckpoint(tc.shards, 10*time.Second, tc.prev)
			if tc.want < 0 {
				if got != nil {
					t.Fatalf("got %+v, want none", got)
				}
				return
			}
			if got == nil || got.Epoch != tc.want || !slices.Equal(got.SourceOffsets, tc.offs) {
				t.Fatalf("got %+v, want epoch %d offsets %v", got, tc.want, tc.offs)
			}
			if got != tc.prev && (got.Time == nil || !got.Time.Equal(&metav1.Time{Time: time.Unix(tc.want*10, 0)})) {
				t.Errorf("time %v, want the epoch's start", got.Time)
			}
		})
	}
}

func TestCompletedRestoration(t *testing.T) {
	moved := time.UnixMilli(1_000_000)
	pending := streamsv1alpha1.ShardMove{Partition: 2, FromWorker: "a-1", ToWorker: "a-0", Reason: streamsv1alpha1.RestorationWorkerFailed,
		Time: metav1.NewMicroTime(moved), Generation: 4}
	restoration := func(started time.Time) *catenapb.Restoration {
		return &catenapb.Restoration{
			Shard: 2, From: &catenapb.CheckpointRef{ManifestOffset: 40, SourceOffset: 900, Epoch: 77, Snapshot: true, TimeMs: 999_000},
			CheckpointsLoaded: 3, Skipped: []string{"manifest 12: torn"}, RecordsReplayed: 25, LoadMs: 120, ReplayMs: 300,
			StartedMs: started.UnixMilli(),
		}
	}
	for _, tc := range []struct {
		name string
		ss   *catenapb.ShardStatus
		ok   bool
	}{
		{"running after a restore that began after the move", &catenapb.ShardStatus{Phase: catenapb.ShardPhase_SHARD_PHASE_RUNNING, Restoration: restoration(moved.Add(time.Second))}, true},
		{"still replaying", &catenapb.ShardStatus{Phase: catenapb.ShardPhase_SHARD_PHASE_REPLAYING, Restoration: restoration(moved.Add(time.Second))}, false},
		{"a restore from before the move", &catenapb.ShardStatus{Phase: catenapb.ShardPhase_SHARD_PHASE_RUNNING, Restoration: restoration(moved.Add(-time.Minute))}, false},
		{"within the clock skew allowance", &catenapb.ShardStatus{Phase: catenapb.ShardPhase_SHARD_PHASE_RUNNING, Restoration: restoration(moved.Add(-restorationClockSkew / 2))}, true},
		{"no report", nil, false},
		{"no restoration reported", &catenapb.ShardStatus{Phase: catenapb.ShardPhase_SHARD_PHASE_RUNNING}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := completedRestoration(pending, tc.ss)
			if ok != tc.ok {
				t.Fatalf("completed %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if got.Partition != 2 || got.FromWorker != "a-1" || got.ToWorker != "a-0" || got.Reason != streamsv1alpha1.RestorationWorkerFailed ||
				!got.Time.Time.Equal(moved) || got.Checkpoint == nil || got.Checkpoint.Epoch != 77 || got.Checkpoint.SourceOffset != 900 ||
				got.Checkpoint.ManifestOffset != 40 || !got.Checkpoint.Snapshot || got.CheckpointsLoaded != 3 || got.RecordsReplayed != 25 ||
				got.LoadDuration.Duration != 120*time.Millisecond || got.ReplayDuration.Duration != 300*time.Millisecond ||
				!slices.Equal(got.SkippedCheckpoints, []string{"manifest 12: torn"}) {
				t.Errorf("restoration %+v", got)
			}
		})
	}
}

func TestAppendRestorationsKeepsTheNewest(t *testing.T) {
	var list []streamsv1alpha1.AggregationRestoration
	for i := range 40 {
		list = appendRestorations(list, streamsv1alpha1.AggregationRestoration{Partition: int32(i)})
	}
	if len(list) != maxRestorations || list[0].Partition != 40-maxRestorations || list[len(list)-1].Partition != 39 {
		t.Fatalf("kept %d, from %d to %d", len(list), list[0].Partition, list[len(list)-1].Partition)
	}
}

func TestAggShards(t *testing.T) {
	assignments := parseAssignments("a-0:0 a-1:1,2")
	prev := []streamsv1alpha1.AggregationShardStatus{
		{Partition: 1, Worker: "a-1", Phase: "Running", ConsumedOffset: 40, Checkpoint: &streamsv1alpha1.CheckpointReference{Epoch: 3}},
		{Partition: 2, Worker: "a-0", Phase: "Running", Checkpoint: &streamsv1alpha1.CheckpointReference{Epoch: 4}},
	}
	reports := map[int32]*catenapb.ShardStatus{
		0: {Shard: 0, Phase: catenapb.ShardPhase_SHARD_PHASE_RUNNING, Consumed: 10, SourceCommitted: 15, Keys: 3, LostRecords: 2,
			Checkpoint: &catenapb.CheckpointRef{Epoch: 5, SourceOffset: 8}},
		2: {Shard: 2, Phase: catenapb.ShardPhase_SHARD_PHASE_RESTORING, Error: ""},
	}
	got := aggShards(3, assignments, reports, prev)
	if len(got) != 3 {
		t.Fatalf("got %d shards", len(got))
	}
	if s := got[0]; s.Worker != "a-0" || s.Phase != "Running" || s.ConsumedOffset != 10 || s.Lag != 5 || s.Keys != 3 || s.LostRecords != 2 ||
		s.Checkpoint == nil || s.Checkpoint.Epoch != 5 || s.Checkpoint.SourceOffset != 8 {
		t.Errorf("shard 0: %+v", s)
	}
	if s := got[1]; s.Worker != "a-1" || s.Phase != "" || s.ConsumedOffset != 40 || s.Checkpoint == nil || s.Checkpoint.Epoch != 3 {
		t.Errorf("shard 1, unreported: %+v", s)
	}
	if s := got[2]; s.Worker != "a-1" || s.Phase != "Restoring" || s.Checkpoint == nil || s.Checkpoint.Epoch != 4 {
		t.Errorf("shard 2, restoring on a new owner: %+v", s)
	}
}

func TestAggregationConditions(t *testing.T) {
	agg := &streamsv1alpha1.Aggregation{
		ObjectMeta: metav1.ObjectMeta{Name: "totals", Namespace: "ns", Generation: 3},
		Spec:       streamsv1alpha1.AggregationSpec{Source: "orders", Workers: 2},
	}
	running := func(ps ...int32) []streamsv1alpha1.AggregationShardStatus {
		var out []streamsv1alpha1.AggregationShardStatus
		for _, p := range ps {
			out = append(out, streamsv1alpha1.AggregationShardStatus{Partition: p, Worker: "w", Phase: "Running"})
		}
		return out
	}
	ok := aggObservation{SourceFound: true, CheckpointsReady: true, WorkersFound: true, Live: 2}
	for _, tc := range []struct {
		name                                 string
		shards                               []streamsv1alpha1.AggregationShardStatus
		obs                                  aggObservation
		ready, progressing, degraded         metav1.ConditionStatus
		readyReason, progReason, degradedWhy string
	}{
		{"every shard runs", running(0, 1), ok, "True", "False", "False", "Running", "UpToDate", "UpToDate"},
		{"no source", nil, aggObservation{}, "False", "False", "True", "SourceNotFound", "SourceNotFound", "SourceNotFound"},
		{"objects being created", nil, aggObservation{SourceFound: true, Live: 1}, "False", "True", "False", "Provisioning", "Provisioning", "UpToDate"},
		{"no worker answers", running(0, 1), aggObservation{SourceFound: true, CheckpointsReady: true, WorkersFound: true}, "False", "False", "True", "NoWorkers", "UpToDate", "NoWorkers"},
		{"no worker has answered yet", nil, aggObservation{SourceFound: true, CheckpointsReady: true, WorkersFound: true}, "False", "True", "False", "Provisioning", "Provisioning", "UpToDate"},
		{"a shard restoring", append(running(0), streamsv1alpha1.AggregationShardStatus{Partition: 1, Phase: "Restoring"}), ok, "False", "True", "False", "Restoring", "Restoring", "UpToDate"},
		{"a shard failed", append(running(0), streamsv1alpha1.AggregationShardStatus{Partition: 1, Phase: "Failed", Message: "bad spec"}), ok, "False", "False", "True", "ShardFailed", "UpToDate", "ShardFailed"},
		{"records lost: degraded but ready", append(running(0), streamsv1alpha1.AggregationShardStatus{Partition: 1, Phase: "Running", LostRecords: 4}), ok, "True", "False", "True", "Running", "UpToDate", "RecordsLost"},
		{"checkpoint Stream name taken", nil, aggObservation{SourceFound: true, Conflict: "Stream totals-checkpoints"}, "False", "False", "True", "CheckpointStreamConflict", "CheckpointStreamConflict", "CheckpointStreamConflict"},
		{"shards without a live owner", running(0, 1), aggObservation{SourceFound: true, CheckpointsReady: true, WorkersFound: true, Live: 1, Unowned: []int32{1}}, "False", "False", "True", "NoWorkers", "UpToDate", "NoWorkers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := agg.DeepCopy()
			a.Status.Shards = tc.shards
			for _, sh := range tc.shards {
				// Each shard on a worker of its own: owners are what
				// matters here, not who.
				a.Status.Assignments = append(a.Status.Assignments, streamsv1alpha1.WorkerAssignment{Worker: fmt.Sprintf("w-%d", sh.Partition), Partitions: []int32{sh.Partition}})
			}
			st := aggregationStatus(a, tc.obs)
			check := func(typ string, status metav1.ConditionStatus, reason string) {
				c := meta.FindStatusCondition(st.Conditions, typ)
				if c == nil || c.Status != status || c.Reason != reason || c.ObservedGeneration != 3 {
					t.Errorf("%s: %+v, want %s %s", typ, c, status, reason)
				}
			}
			check(streamsv1alpha1.AggregationReadyCondition, tc.ready, tc.readyReason)
			check(streamsv1alpha1.AggregationProgressingCondition, tc.progressing, tc.progReason)
			check(streamsv1alpha1.AggregationDegradedCondition, tc.degraded, tc.degradedWhy)
			if st.ObservedGeneration != 3 || st.CheckpointStream != "totals-checkpoints" {
				t.Errorf("status %+v", st)
			}
			// The scale subresource's current count and selector.
			if st.Workers != int32(tc.obs.Live) || st.Selector != labels.SelectorFromSet(aggSelectorLabels(a)).String() {
				t.Errorf("workers %d selector %q, want %d and the worker pods' labels", st.Workers, st.Selector, tc.obs.Live)
			}
		})
	}
}

func TestCompareWorkers(t *testing.T) {
	names := []string{"a-10", "a-2", "b-0", "a-1", "a-x"}
	slices.SortFunc(names, compareWorkers)
	if want := []string{"a-1", "a-2", "a-10", "a-x", "b-0"}; !slices.Equal(names, want) {
		t.Fatalf("sorted %v, want %v", names, want)
	}
}

func TestAwaitRestores(t *testing.T) {
	t0 := time.UnixMilli(1_000_000)
	at := metav1.NewMicroTime(t0)
	awaited := func(p int32, from, to, reason string, gen int64) streamsv1alpha1.ShardMove {
		return streamsv1alpha1.ShardMove{Partition: p, FromWorker: from, ToWorker: to, Reason: reason, Time: at, Generation: gen}
	}
	earlier := streamsv1alpha1.ShardMove{Partition: 1, FromWorker: "a-2", ToWorker: "a-1", Reason: streamsv1alpha1.RestorationWorkerFailed,
		Time: metav1.NewMicroTime(t0.Add(-time.Minute)), Generation: 3}
	for _, tc := range []struct {
		name      string
		restoring []streamsv1alpha1.ShardMove
		moves     []shardMove
		want      []streamsv1alpha1.ShardMove
	}{
		{name: "nothing moves"},
		{
			name:  "a move from an owner is awaited, a first assignment is not",
			moves: []shardMove{{Partition: 3, From: "a-1", To: "a-0", Reason: streamsv1alpha1.RestorationWorkerFailed}, {Partition: 0, To: "a-0"}},
			want:  []streamsv1alpha1.ShardMove{awaited(3, "a-1", "a-0", streamsv1alpha1.RestorationWorkerFailed, 4)},
		},
		{
			name:      "moves already awaited stay, in shard order",
			restoring: []streamsv1alpha1.ShardMove{earlier},
			moves:     []shardMove{{Partition: 0, From: "a-1", To: "a-0", Reason: streamsv1alpha1.RestorationRebalanced}},
			want:      []streamsv1alpha1.ShardMove{awaited(0, "a-1", "a-0", streamsv1alpha1.RestorationRebalanced, 4), earlier},
		},
		{
			name:      "a shard moved again is awaited on its newest owner",
			restoring: []streamsv1alpha1.ShardMove{earlier},
			moves:     []shardMove{{Partition: 1, From: "a-1", To: "a-0", Reason: streamsv1alpha1.RestorationWorkerStalled}},
			want:      []streamsv1alpha1.ShardMove{awaited(1, "a-1", "a-0", streamsv1alpha1.RestorationWorkerStalled, 4)},
		},
		{
			name:      "a shard that lost its owner and is assigned afresh is not awaited",
			restoring: []streamsv1alpha1.ShardMove{earlier},
			moves:     []shardMove{{Partition: 1, To: "a-0"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := awaitRestores(slices.Clone(tc.restoring), tc.moves, 4, t0)
			if !equality.Semantic.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestBenches(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	list := benchWorker(nil, "a-10", t0.Add(30*time.Second), streamsv1alpha1.RestorationWorkerStalled)
	list = benchWorker(list, "a-2", t0.Add(10*time.Second), streamsv1alpha1.RestorationWorkerStalled)
	// Benched again for less: the longer bench stands.
	list = benchWorker(list, "a-10", t0.Add(20*time.Second), streamsv1alpha1.RestorationWorkerStalled)
	if len(list) != 2 || list[0].Worker != "a-2" || list[1].Worker != "a-10" || !list[1].Until.Time.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("benched %+v, want a-2 until +10s and a-10 until +30s, in ordinal order", list)
	}
	// Benched again for longer: extended.
	list = benchWorker(list, "a-2", t0.Add(40*time.Second), streamsv1alpha1.RestorationWorkerStalled)
	if !list[0].Until.Time.Equal(t0.Add(40 * time.Second)) {
		t.Fatalf("a-2 benched until %v, want +40s", list[0].Until)
	}
	for _, tc := range []struct {
		at   time.Duration
		want []string
	}{
		{0, []string{"a-10", "a-2"}},
		{30 * time.Second, []string{"a-2"}},
		{40 * time.Second, nil},
	} {
		active, kept := stillBenched(list, t0.Add(tc.at))
		got := slices.Sorted(maps.Keys(active))
		if !slices.Equal(got, tc.want) || len(kept) != len(tc.want) {
			t.Errorf("at +%v: benched %v (kept %d), want %v", tc.at, got, len(kept), tc.want)
		}
	}
}
