package controllers

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// workerState is what the operator makes of one aggregator worker in one
// round.
type workerState int

const (
	// workerSilent: the worker did not answer this round (or has not yet),
	// or its pod is not Ready, for less than failureTimeout. It keeps the
	// shards it owns and is given none.
	workerSilent workerState = iota
	// workerLive: its pod is Ready and it answered this round.
	workerLive
	// workerStalled: it answers, but a shard it owns has committed source
	// records to read and has not folded one for failureTimeout. Its shards
	// move (WorkerStalled) and, for a while, it is given none.
	workerStalled
	// workerFailed: its pod is gone, terminal or being deleted, or it has
	// been silent or not Ready for failureTimeout. Its shards move
	// (WorkerFailed).
	workerFailed
)

func (s workerState) String() string {
	switch s {
	case workerLive:
		return "Live"
	case workerStalled:
		return "Stalled"
	case workerFailed:
		return "Failed"
	default:
		return "Silent"
	}
}

// workerHealth decides a worker's state from its pod, whether it answered
// this round, when it last answered, and when the operator first asked it
// (an operator that just started gives an owner failureTimeout to answer,
// as if it had answered then).
func workerHealth(pod *corev1.Pod, answered bool, lastAnswer, firstAsked, now time.Time, timeout time.Duration) workerState {
	if pod == nil || pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		return workerFailed
	}
	ready := false
	for _, c := range pod.Status.Conditions {
		if c.Type != corev1.PodReady {
			continue
		}
		ready = c.Status == corev1.ConditionTrue
		if !ready && !c.LastTransitionTime.IsZero() && now.Sub(c.LastTransitionTime.Time) >= timeout {
			return workerFailed
		}
	}
	if answered && ready {
		return workerLive
	}
	since := lastAnswer
	if answered {
		since = now
	}
	if since.IsZero() {
		since = firstAsked
	}
	if !since.IsZero() && now.Sub(since) >= timeout {
		return workerFailed
	}
	return workerSilent
}

// shardProgress is what the operator remembers of one shard on one owner:
// the offset it had folded to, and since when.
type shardProgress struct {
	Worker   string
	Consumed uint64
	Since    time.Time
}

// trackProgress updates a shard's progress record with its owner's report
// and says whether the shard is stalled: running or replaying, with
// committed source records it has not folded, and no record folded for
// timeout. A shard that is restoring (loading a checkpoint, which moves no
// offset), failed (moving it would fail it elsewhere too: it is reported
// as ShardFailed instead) or caught up is not stalled.
func trackProgress(prev shardProgress, worker string, ss *catenapb.ShardStatus, now time.Time, timeout time.Duration) (shardProgress, bool) {
	phase := ss.GetPhase()
	waiting := ss.GetSourceCommitted() > ss.GetConsumed()
	checked := phase == catenapb.ShardPhase_SHARD_PHASE_RUNNING || phase == catenapb.ShardPhase_SHARD_PHASE_REPLAYING
	if !checked || !waiting || prev.Worker != worker || prev.Since.IsZero() || ss.GetConsumed() != prev.Consumed {
		return shardProgress{Worker: worker, Consumed: ss.GetConsumed(), Since: now}, false
	}
	return prev, now.Sub(prev.Since) >= timeout
}

// assignmentInput is what planAssignment decides from.
type assignmentInput struct {
	// Partitions is the source's partition count: shards 0..Partitions-1.
	Partitions int32
	// Workers are the desired workers' names (the StatefulSet's pods
	// 0..workers-1), in ordinal order. Owners not among them (the
	// StatefulSet shrank) give their shards up (Rebalanced).
	Workers []string
	// States of the workers, desired ones and owners; a worker missing is
	// Silent.
	States map[string]workerState
	// Benched are workers recently stalled: they are given no shards.
	Benched map[string]bool
	// Current is status.assignments; Generation status.assignmentGeneration.
	Current    []streamsv1alpha1.WorkerAssignment
	Generation int64
	// Settled is true when every shard runs on its owner: only then may
	// shards move for balance alone.
	Settled bool
	// SpecChanged is true when the spec changed since the workers were
	// given it: a worker takes a generation only once, so the new spec
	// needs a new generation even when no shard moves.
	SpecChanged bool
}

// shardMove is one shard given to a new owner.
type shardMove struct {
	Partition int32
	// From is "" for a shard that had no owner (first assignment).
	From, To string
	// Reason is an AggregationRestoration reason.
	Reason string
}

// assignmentPlan is planAssignment's decision.
type assignmentPlan struct {
	// Assignments are the new status.assignments (workers owning shards,
	// in worker order, partitions ascending).
	Assignments []streamsv1alpha1.WorkerAssignment
	// Generation is the new assignmentGeneration: one more than before
	// when Changed.
	Generation int64
	Moves      []shardMove
	Changed    bool
	// Unowned are shards whose owner failed with no live worker to take
	// them: they keep their owner in status and wait.
	Unowned []int32
}

// planAssignment decides who owns which shard.
//
//   - Sticky: a shard stays with its owner while the owner is live or only
//     briefly silent (under failureTimeout).
//   - A shard without an owner, or whose owner failed, stalled or is no
//     longer a desired worker, goes to the live worker that owns the
//     fewest shards (the first in ordinal order on a tie). Shards whose
//     owners were balanced therefore stay within one of each other.
//   - With nothing to repair and every shard running, shards move for
//     balance alone only while the most loaded live worker owns at least
//     two more than the least loaded one: the highest shard of the most
//     loaded (the last in order on a tie) goes to the least loaded. A new
//     or returning worker thus takes shards exactly when it would
//     otherwise leave the counts more than one apart; it never causes a
//     move that does not narrow that gap, and moves wait until restores
//     have finished, so that they do not cascade.
//   - Shards with no live worker to go to stay where they are (Unowned);
//     nothing changes until one answers.
//
// Any change, and a change of the spec, increments the generation.
func planAssignment(in assignmentInput) assignmentPlan {
	state := func(w string) workerState {
		if s, ok := in.States[w]; ok {
			return s
		}
		return workerSilent
	}
	desired := map[string]int{}
	for i, w := range in.Workers {
		desired[w] = i
	}
	eligible := map[string]bool{}
	for _, w := range in.Workers {
		if state(w) == workerLive && !in.Benched[w] {
			eligible[w] = true
		}
	}

	owner := make([]string, in.Partitions)
	for _, a := range in.Current {
		for _, p := range a.Partitions {
			if p >= 0 && p < in.Partitions {
				owner[p] = a.Worker
			}
		}
	}
	count := map[string]int{}
	for _, o := range owner {
		if eligible[o] {
			count[o]++
		}
	}
	// leastLoaded is the eligible worker with the fewest shards, first in
	// order on a tie; "" when none is eligible.
	leastLoaded := func() string {
		best := ""
		for _, w := range in.Workers {
			if eligible[w] && (best == "" || count[w] < count[best]) {
				best = w
			}
		}
		return best
	}

	var out assignmentPlan
	for p := range in.Partitions {
		o := owner[p]
		var reason string
		switch _, isDesired := desired[o]; {
		case o == "":
			reason = "" // first assignment
		case state(o) == workerFailed:
			reason = streamsv1alpha1.RestorationWorkerFailed
		case state(o) == workerStalled:
			reason = streamsv1alpha1.RestorationWorkerStalled
		case !isDesired:
			reason = streamsv1alpha1.RestorationRebalanced
		default:
			continue // live or briefly silent: sticky
		}
		to := leastLoaded()
		if to == "" {
			if o != "" && reason != streamsv1alpha1.RestorationRebalanced {
				out.Unowned = append(out.Unowned, p)
			}
			continue
		}
		out.Moves = append(out.Moves, shardMove{Partition: p, From: o, To: to, Reason: reason})
		owner[p] = to
		count[to]++
	}

	settled := in.Settled && len(out.Moves) == 0
	for _, o := range owner {
		if !eligible[o] {
			settled = false
		}
	}
	for settled {
		lo, hi := "", ""
		for _, w := range in.Workers {
			if !eligible[w] {
				continue
			}
			if lo == "" || count[w] < count[lo] {
				lo = w
			}
			if hi == "" || count[w] >= count[hi] {
				hi = w
			}
		}
		if lo == "" || count[hi]-count[lo] <= 1 {
			break
		}
		for p := in.Partitions - 1; p >= 0; p-- {
			if owner[p] == hi {
				out.Moves = append(out.Moves, shardMove{Partition: p, From: hi, To: lo, Reason: streamsv1alpha1.RestorationRebalanced})
				owner[p] = lo
				count[hi]--
				count[lo]++
				break
			}
		}
	}

	out.Assignments = assignmentsOf(owner, in.Workers)
	out.Generation = in.Generation
	if !equalAssignments(out.Assignments, in.Current) || (in.SpecChanged && len(out.Assignments) > 0) {
		out.Changed = true
		out.Generation++
	}
	return out
}

// assignmentsOf groups owners by worker: desired workers in order, then any
// other owner by name.
func assignmentsOf(owner []string, workers []string) []streamsv1alpha1.WorkerAssignment {
	by := map[string][]int32{}
	for p, o := range owner {
		if o != "" {
			by[o] = append(by[o], int32(p))
		}
	}
	var out []streamsv1alpha1.WorkerAssignment
	for _, w := range workers {
		if ps := by[w]; len(ps) > 0 {
			out = append(out, streamsv1alpha1.WorkerAssignment{Worker: w, Partitions: ps})
			delete(by, w)
		}
	}
	rest := make([]string, 0, len(by))
	for w := range by {
		rest = append(rest, w)
	}
	slices.SortFunc(rest, compareWorkers)
	for _, w := range rest {
		out = append(out, streamsv1alpha1.WorkerAssignment{Worker: w, Partitions: by[w]})
	}
	return out
}

// equalAssignments compares assignments as sets of (worker, partitions).
func equalAssignments(a, b []streamsv1alpha1.WorkerAssignment) bool {
	norm := func(as []streamsv1alpha1.WorkerAssignment) map[string]string {
		out := map[string]string{}
		for _, x := range as {
			if len(x.Partitions) == 0 {
				continue
			}
			ps := slices.Clone(x.Partitions)
			slices.Sort(ps)
			out[x.Worker] = fmt.Sprint(ps)
		}
		return out
	}
	na, nb := norm(a), norm(b)
	if len(na) != len(nb) {
		return false
	}
	for w, ps := range na {
		if nb[w] != ps {
			return false
		}
	}
	return true
}

// ownersOf maps each shard to its worker.
func ownersOf(assignments []streamsv1alpha1.WorkerAssignment) map[int32]string {
	out := map[int32]string{}
	for _, a := range assignments {
		for _, p := range a.Partitions {
			out[p] = a.Worker
		}
	}
	return out
}

// compareWorkers orders worker pod names by StatefulSet ordinal (x-10
// after x-9), then by name.
func compareWorkers(a, b string) int {
	pa, oa := splitOrdinal(a)
	pb, ob := splitOrdinal(b)
	if c := cmp.Compare(pa, pb); c != 0 {
		return c
	}
	return cmp.Compare(oa, ob)
}

func splitOrdinal(name string) (string, int) {
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return name, -1
	}
	n, err := strconv.Atoi(name[i+1:])
	if err != nil {
		return name, -1
	}
	return name[:i], n
}

// awaitRestores is status.restoring after the moves of a new assignment
// generation gen, made at at: each move from an owner is awaited until its
// restore is seen, and replaces what was awaited for its shard (a shard
// moved again is restored by its newest owner only). A shard that had no
// owner is assigned, not restored.
func awaitRestores(restoring []streamsv1alpha1.ShardMove, moves []shardMove, gen int64, at time.Time) []streamsv1alpha1.ShardMove {
	byShard := map[int32]streamsv1alpha1.ShardMove{}
	for _, m := range restoring {
		byShard[m.Partition] = m
	}
	for _, m := range moves {
		if m.From == "" {
			delete(byShard, m.Partition)
			continue
		}
		byShard[m.Partition] = streamsv1alpha1.ShardMove{
			Partition: m.Partition, FromWorker: m.From, ToWorker: m.To, Reason: m.Reason,
			Time: metav1.NewMicroTime(at), Generation: gen,
		}
	}
	out := make([]streamsv1alpha1.ShardMove, 0, len(byShard))
	for _, p := range slices.Sorted(maps.Keys(byShard)) {
		out = append(out, byShard[p])
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// benchWorker is status.benched with worker given no shards until until,
// for reason. A bench already longer is kept.
func benchWorker(benched []streamsv1alpha1.BenchedWorker, worker string, until time.Time, reason string) []streamsv1alpha1.BenchedWorker {
	for i, b := range benched {
		if b.Worker == worker {
			if b.Until.Time.Before(until) {
				benched[i].Until, benched[i].Reason = metav1.NewTime(until), reason
			}
			return benched
		}
	}
	benched = append(benched, streamsv1alpha1.BenchedWorker{Worker: worker, Until: metav1.NewTime(until), Reason: reason})
	slices.SortFunc(benched, func(a, b streamsv1alpha1.BenchedWorker) int { return compareWorkers(a.Worker, b.Worker) })
	return benched
}

// stillBenched splits status.benched at now: the workers still benched,
// and the list without the benches that ended.
func stillBenched(benched []streamsv1alpha1.BenchedWorker, now time.Time) (map[string]bool, []streamsv1alpha1.BenchedWorker) {
	active := map[string]bool{}
	var kept []streamsv1alpha1.BenchedWorker
	for _, b := range benched {
		if now.Before(b.Until.Time) {
			active[b.Worker] = true
			kept = append(kept, b)
		}
	}
	return active, kept
}

// restorationClockSkew is how much earlier than the operator's clock a
// worker's restoration may say it started and still be the restore of a
// move the operator made: the two clocks are different machines'.
const restorationClockSkew = time.Second

// completedRestoration returns the restoration an awaited move led to,
// once its new owner reports the shard Running with a restoration that
// started at or after the move.
func completedRestoration(move streamsv1alpha1.ShardMove, ss *catenapb.ShardStatus) (streamsv1alpha1.AggregationRestoration, bool) {
	r := ss.GetRestoration()
	if ss.GetPhase() != catenapb.ShardPhase_SHARD_PHASE_RUNNING || r == nil ||
		time.UnixMilli(r.GetStartedMs()).Before(move.Time.Add(-restorationClockSkew)) {
		return streamsv1alpha1.AggregationRestoration{}, false
	}
	out := streamsv1alpha1.AggregationRestoration{
		Time:               metav1.NewTime(move.Time.Time),
		Partition:          move.Partition,
		FromWorker:         move.FromWorker,
		ToWorker:           move.ToWorker,
		Reason:             move.Reason,
		Checkpoint:         checkpointRef(r.GetFrom()),
		CheckpointsLoaded:  int32(r.GetCheckpointsLoaded()),
		SkippedCheckpoints: slices.Clone(r.GetSkipped()),
		RecordsReplayed:    int64(r.GetRecordsReplayed()),
		LoadDuration:       metav1.Duration{Duration: time.Duration(r.GetLoadMs()) * time.Millisecond},
		ReplayDuration:     metav1.Duration{Duration: time.Duration(r.GetReplayMs()) * time.Millisecond},
	}
	return out, true
}

// maxRestorations bounds status.restorations (its MaxItems).
const maxRestorations = 32

// appendRestorations appends done to the list, keeping the newest
// maxRestorations.
func appendRestorations(list []streamsv1alpha1.AggregationRestoration, done ...streamsv1alpha1.AggregationRestoration) []streamsv1alpha1.AggregationRestoration {
	list = append(list, done...)
	if n := len(list); n > maxRestorations {
		list = slices.Clone(list[n-maxRestorations:])
	}
	return list
}

// checkpointRef converts a worker's checkpoint reference; nil stays nil.
func checkpointRef(c *catenapb.CheckpointRef) *streamsv1alpha1.CheckpointReference {
	if c == nil {
		return nil
	}
	out := &streamsv1alpha1.CheckpointReference{
		ManifestOffset: int64(c.GetManifestOffset()),
		SourceOffset:   int64(c.GetSourceOffset()),
		Epoch:          c.GetEpoch(),
		Snapshot:       c.GetSnapshot(),
	}
	if c.GetTimeMs() > 0 {
		t := metav1.NewTime(time.UnixMilli(c.GetTimeMs()))
		out.Time = &t
	}
	return out
}

// shardPhaseNames are the phases written in status.shards.
var shardPhaseNames = map[catenapb.ShardPhase]string{
	catenapb.ShardPhase_SHARD_PHASE_RESTORING: "Restoring",
	catenapb.ShardPhase_SHARD_PHASE_REPLAYING: "Replaying",
	catenapb.ShardPhase_SHARD_PHASE_RUNNING:   "Running",
	catenapb.ShardPhase_SHARD_PHASE_FAILED:    "Failed",
}

// shardReports picks, for every shard, its owner's report of it this
// round; a shard whose owner did not answer or does not run it yet has
// none.
func shardReports(assignments []streamsv1alpha1.WorkerAssignment, reports map[string]*catenapb.AggregatorStatus) map[int32]*catenapb.ShardStatus {
	owners := ownersOf(assignments)
	out := map[int32]*catenapb.ShardStatus{}
	for w, st := range reports {
		for _, ss := range st.GetShards() {
			p := int32(ss.GetShard())
			if owners[p] == w {
				out[p] = ss
			}
		}
	}
	return out
}

// aggShards is status.shards: every shard's owner and its report. A shard
// without a report this round keeps its last progress and checkpoint, with
// no phase: the operator does not know what it is doing.
func aggShards(partitions int32, assignments []streamsv1alpha1.WorkerAssignment, reports map[int32]*catenapb.ShardStatus, prev []streamsv1alpha1.AggregationShardStatus) []streamsv1alpha1.AggregationShardStatus {
	owners := ownersOf(assignments)
	old := map[int32]streamsv1alpha1.AggregationShardStatus{}
	for _, s := range prev {
		old[s.Partition] = s
	}
	out := make([]streamsv1alpha1.AggregationShardStatus, 0, partitions)
	for p := range partitions {
		ss, ok := reports[p]
		if !ok {
			prevShard := old[p]
			s := *prevShard.DeepCopy()
			s.Partition, s.Worker, s.Phase, s.Message = p, owners[p], "", ""
			out = append(out, s)
			continue
		}
		s := streamsv1alpha1.AggregationShardStatus{
			Partition:      p,
			Worker:         owners[p],
			Phase:          shardPhaseNames[ss.GetPhase()],
			ConsumedOffset: int64(ss.GetConsumed()),
			Keys:           int64(ss.GetKeys()),
			Checkpoint:     checkpointRef(ss.GetCheckpoint()),
			LostRecords:    int64(ss.GetLostRecords()),
			Message:        ss.GetError(),
		}
		if ss.GetSourceCommitted() > ss.GetConsumed() {
			s.Lag = int64(ss.GetSourceCommitted() - ss.GetConsumed())
		}
		if s.Checkpoint == nil {
			// A new owner that has not checkpointed yet stands on the
			// checkpoint it restored from.
			s.Checkpoint = checkpointRef(ss.GetRestoration().GetFrom())
		}
		if prevShard, ok := old[p]; ok && s.Checkpoint == nil && prevShard.Checkpoint != nil {
			s.Checkpoint = prevShard.Checkpoint.DeepCopy()
		}
		out = append(out, s)
	}
	return out
}

// stableCheckpoint is the minimum over shards of their latest checkpoint
// epoch, once every shard has one, with each shard's checkpointed source
// offset. It only grows: a lower minimum or offset (a shard restored from
// an older checkpoint than it had reported) or a shard without a
// checkpoint keeps prev.
func stableCheckpoint(shards []streamsv1alpha1.AggregationShardStatus, interval time.Duration, prev *streamsv1alpha1.StableCheckpoint) *streamsv1alpha1.StableCheckpoint {
	if len(shards) == 0 {
		return prev
	}
	epoch := int64(-1)
	offsets := make([]int64, 0, len(shards))
	for _, s := range shards {
		if s.Checkpoint == nil {
			return prev
		}
		if epoch < 0 || s.Checkpoint.Epoch < epoch {
			epoch = s.Checkpoint.Epoch
		}
		offsets = append(offsets, s.Checkpoint.SourceOffset)
	}
	if prev != nil {
		// A shard restored from an older checkpoint than it had reported
		// lowers the minimum, or an offset, for a while: keep the old one.
		if epoch < prev.Epoch || len(prev.SourceOffsets) > len(offsets) {
			return prev
		}
		same := epoch == prev.Epoch
		for i, o := range prev.SourceOffsets {
			if offsets[i] < o {
				return prev
			}
			same = same && offsets[i] == o
		}
		if same && len(offsets) == len(prev.SourceOffsets) {
			return prev
		}
	}
	out := &streamsv1alpha1.StableCheckpoint{Epoch: epoch, SourceOffsets: offsets}
	if interval > 0 {
		t := metav1.NewTime(time.UnixMilli(epoch * interval.Milliseconds()).UTC())
		out.Time = &t
	}
	return out
}

// aggObservation is what the Aggregation reconciler read and did.
type aggObservation struct {
	// SourceFound is whether the source Stream exists.
	SourceFound bool
	// CheckpointsReady is whether the checkpoint Stream's Ready condition
	// is True; WorkersFound whether the StatefulSet exists.
	CheckpointsReady, WorkersFound bool
	// Live counts the live workers.
	Live int
	// Unowned are shards whose owner failed with no live worker to take
	// them.
	Unowned []int32
	// AssignErrors name workers that refused or failed Assign this round.
	AssignErrors []string
	// Conflict names the checkpoint Stream when a Stream the Aggregation
	// does not control holds its name: nothing is assigned.
	Conflict string
}

// aggregationStatus is the Aggregation's status given what was observed;
// status.shards, assignments and restorations are already filled in.
func aggregationStatus(agg *streamsv1alpha1.Aggregation, obs aggObservation) streamsv1alpha1.AggregationStatus {
	status := *agg.Status.DeepCopy()
	status.ObservedGeneration = agg.Generation
	status.CheckpointStream = agg.CheckpointStreamName()
	status.Workers = int32(obs.Live)
	status.Selector = labels.SelectorFromSet(aggSelectorLabels(agg)).String()
	if obs.WorkersFound {
		status.Endpoint = aggEndpoint(agg)
	}
	gen := agg.Generation
	set := func(typ string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen})
	}
	if !obs.SourceFound {
		msg := fmt.Sprintf("Stream %s does not exist", agg.Spec.Source)
		set(streamsv1alpha1.AggregationReadyCondition, metav1.ConditionFalse, streamsv1alpha1.AggregationSourceNotFoundReason, msg)
		set(streamsv1alpha1.AggregationDegradedCondition, metav1.ConditionTrue, streamsv1alpha1.AggregationSourceNotFoundReason, msg)
		set(streamsv1alpha1.AggregationProgressingCondition, metav1.ConditionFalse, streamsv1alpha1.AggregationSourceNotFoundReason, msg)
		return status
	}

	if obs.Conflict != "" {
		msg := fmt.Sprintf("%s exists and is not owned by this Aggregation: delete it or rename the Aggregation", obs.Conflict)
		set(streamsv1alpha1.AggregationReadyCondition, metav1.ConditionFalse, streamsv1alpha1.AggregationCheckpointConflictReason, msg)
		set(streamsv1alpha1.AggregationDegradedCondition, metav1.ConditionTrue, streamsv1alpha1.AggregationCheckpointConflictReason, msg)
		set(streamsv1alpha1.AggregationProgressingCondition, metav1.ConditionFalse, streamsv1alpha1.AggregationCheckpointConflictReason, msg)
		return status
	}

	var failed, notRunning, lost []string
	for _, s := range status.Shards {
		switch {
		case s.Phase == "Failed":
			failed = append(failed, fmt.Sprintf("shard %d on %s: %s", s.Partition, s.Worker, s.Message))
		case s.Phase != "Running":
			phase := s.Phase
			if phase == "" {
				phase = "not reported"
			}
			notRunning = append(notRunning, fmt.Sprintf("%d (%s)", s.Partition, phase))
		}
		if s.LostRecords > 0 {
			lost = append(lost, fmt.Sprintf("shard %d lost %d records", s.Partition, s.LostRecords))
		}
	}

	// Degraded: something needs a person, or a worker to come back.
	var degraded *metav1.Condition
	switch {
	case obs.Live == 0 && len(status.Assignments) > 0:
		degraded = &metav1.Condition{Reason: streamsv1alpha1.AggregationNoWorkersReason, Message: "No worker answers; shards wait for one"}
	case len(failed) > 0:
		degraded = &metav1.Condition{Reason: streamsv1alpha1.AggregationShardFailedReason, Message: strings.Join(failed, "; ")}
	case len(obs.Unowned) > 0:
		degraded = &metav1.Condition{Reason: streamsv1alpha1.AggregationNoWorkersReason,
			Message: fmt.Sprintf("Shards %v have no live worker to move to", obs.Unowned)}
	case len(lost) > 0:
		degraded = &metav1.Condition{Reason: streamsv1alpha1.AggregationRecordsLostReason,
			Message: "A hard retention limit removed source records before they were checkpointed: " + strings.Join(lost, "; ")}
	}
	if degraded != nil {
		set(streamsv1alpha1.AggregationDegradedCondition, metav1.ConditionTrue, degraded.Reason, degraded.Message)
	} else {
		set(streamsv1alpha1.AggregationDegradedCondition, metav1.ConditionFalse, streamsv1alpha1.AggregationUpToDateReason, "Every shard has a live owner")
	}

	// Progressing: objects being created, shards being restored.
	var missing []string
	if !obs.WorkersFound {
		missing = append(missing, "StatefulSet "+agg.WorkersName())
	}
	if !obs.CheckpointsReady {
		missing = append(missing, "a Ready checkpoint Stream "+agg.CheckpointStreamName())
	}
	if obs.Live == 0 && len(status.Assignments) == 0 {
		// A new Aggregation's pods are starting: not yet a failure.
		missing = append(missing, "a worker that answers")
	}
	switch {
	case len(missing) > 0:
		set(streamsv1alpha1.AggregationProgressingCondition, metav1.ConditionTrue, streamsv1alpha1.AggregationProvisioningReason, "Waiting for "+joinList(missing))
	case len(notRunning) > 0:
		set(streamsv1alpha1.AggregationProgressingCondition, metav1.ConditionTrue, streamsv1alpha1.AggregationRestoringReason,
			"Shards not running yet: "+strings.Join(notRunning, ", "))
	default:
		set(streamsv1alpha1.AggregationProgressingCondition, metav1.ConditionFalse, streamsv1alpha1.AggregationUpToDateReason,
			fmt.Sprintf("No shard is being restored at assignment generation %d", status.AssignmentGeneration))
	}

	// Ready: every shard runs on its owner.
	switch {
	case degraded != nil && degraded.Reason != streamsv1alpha1.AggregationRecordsLostReason:
		set(streamsv1alpha1.AggregationReadyCondition, metav1.ConditionFalse, degraded.Reason, degraded.Message)
	case len(status.Assignments) == 0 || len(status.Shards) == 0:
		set(streamsv1alpha1.AggregationReadyCondition, metav1.ConditionFalse, streamsv1alpha1.AggregationProvisioningReason, "No shard is assigned yet")
	case len(notRunning) > 0:
		set(streamsv1alpha1.AggregationReadyCondition, metav1.ConditionFalse, streamsv1alpha1.AggregationRestoringReason,
			"Shards not running yet: "+strings.Join(notRunning, ", "))
	default:
		set(streamsv1alpha1.AggregationReadyCondition, metav1.ConditionTrue, streamsv1alpha1.AggregationRunningReason,
			fmt.Sprintf("%d shards run on %d workers", len(status.Shards), len(status.Assignments)))
	}
	return status
}
