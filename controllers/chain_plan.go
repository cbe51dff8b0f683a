package controllers

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/replica/chainmaster"
	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
)

// The chain controller's decisions, as pure functions of what it read:
// where a new chain goes, what the pool's pods say of each replica's
// health, the stream config every member runs, and the status of the
// ReplicationChain and its Partition. The reconciler reads, calls these and
// replica/chainmaster, and writes.

// poolLoad counts, per pod, the memberships of chains on the pool. Chains
// without members yet count nothing.
func poolLoad(chains []streamsv1alpha1.ReplicationChain) chainplan.Load {
	load := chainplan.Load{}
	for i := range chains {
		var members []string
		for _, m := range chains[i].Status.Members {
			members = append(members, m.Name)
		}
		load.Add(members)
	}
	return load
}

// memberHealth is what the failure detector (probed: the replica's
// answers, the master's own sight and its neighbours' link reports,
// chainmaster.Detector) and the replica's pod say of it: the detector's
// verdict when it has one; otherwise Failed when its pod is gone for good
// (terminated, deleted, failed) or its container has not been ready for
// the failure timeout, and Unknown (not answering yet, or not for long: the
// chain waits rather than reorders on a hiccup). pod is nil when no pod
// exists.
func memberHealth(pod *corev1.Pod, probed chainplan.Health, now time.Time, timeout time.Duration) chainplan.Health {
	if probed != chainplan.Unknown {
		return probed
	}
	if pod == nil {
		return chainplan.Unknown
	}
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		return chainplan.Failed
	}
	// The container's readiness, not the pod's: a pod's Ready includes the
	// chains-ready gate, which this very decision feeds, and a replica back
	// but not yet re-added must not look failed for being out of its chains.
	ready := corev1.PodReady
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.ContainersReady {
			ready = corev1.ContainersReady
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == ready && c.Status != corev1.ConditionTrue && !c.LastTransitionTime.IsZero() && now.Sub(c.LastTransitionTime.Time) >= timeout {
			return chainplan.Failed
		}
	}
	return chainplan.Unknown
}

// streamConfig is the config the Stream's members run
// (chainmaster.StreamConfig, as catena dev's).
func streamConfig(stream *streamsv1alpha1.Stream) *catenapb.StreamConfig {
	set := chainmaster.StreamSettings{
		Partitions:  int(stream.Spec.Partitions),
		Replication: int(stream.Spec.ReplicationFactor),
		// Negative (refused by the schema) is the default, as 0.
		MinChainLength: max(int(ptr.Deref(stream.Spec.MinChainLength, 0)), 0),
		Interval:       stream.Spec.Durability.Mode == streamsv1alpha1.DurabilityInterval,
	}
	if d := stream.Spec.Durability.FsyncInterval; d != nil {
		set.FsyncInterval = d.Duration
	}
	if b := stream.Spec.SegmentBytes; b != nil {
		set.SegmentBytes = b.Value()
	}
	if r := stream.Spec.Retention; r != nil {
		if r.Time != nil {
			set.RetentionTime = r.Time.Duration
		}
		if r.Bytes != nil {
			set.RetentionBytes = r.Bytes.Value()
		}
		if r.HardTime != nil {
			set.HardRetentionTime = r.HardTime.Duration
		}
		if r.HardBytes != nil {
			set.HardRetentionBytes = r.HardBytes.Value()
		}
	}
	return chainmaster.StreamConfig(set)
}

// minChainLength is the fewest full copies a partition of the Stream must
// have to take writes (chainplan.MinChainLength).
func minChainLength(stream *streamsv1alpha1.Stream) int {
	return chainplan.MinChainLength(int(stream.Spec.ReplicationFactor), int(ptr.Deref(stream.Spec.MinChainLength, 0)))
}

// chainRecord is the master's record of the chain, from its status once the
// ledger's entry is applied to it (applyLedgerEntry): nil when the operator
// has not placed it yet.
func chainRecord(chain *streamsv1alpha1.ReplicationChain) *chainplan.Chain {
	if chain.Status.TargetEpoch == 0 || len(chain.Status.Members) == 0 {
		return nil
	}
	rec := &chainplan.Chain{Epoch: uint64(chain.Status.TargetEpoch)}
	for _, m := range chain.Status.Members {
		rec.Members = append(rec.Members, m.Name)
	}
	return rec
}

// reconfigurationReason names why a plan changes the chain from prev to
// next.
func reconfigurationReason(prev, next []string, planReason string) streamsv1alpha1.ReconfigurationReason {
	if len(next) < len(prev) {
		// The first removed member names the case: it is what the
		// survivors' new roles follow from.
		for i, m := range prev {
			if slices.Contains(next, m) {
				continue
			}
			switch i {
			case 0:
				return streamsv1alpha1.ReconfigurationHeadFailed
			case len(prev) - 1:
				return streamsv1alpha1.ReconfigurationTailFailed
			default:
				return streamsv1alpha1.ReconfigurationMiddleFailed
			}
		}
	}
	switch planReason {
	case chainplan.ReasonAddReturning:
		return streamsv1alpha1.ReconfigurationMemberReturned
	case chainplan.ReasonAddNew:
		return streamsv1alpha1.ReconfigurationMemberReplaced
	}
	return streamsv1alpha1.ReconfigurationRebalanced
}

// reconfigurationEventType is the Event type of a reconfiguration: a
// Warning when a member was lost, Normal when the chain was placed or
// grew.
func reconfigurationEventType(reason streamsv1alpha1.ReconfigurationReason) string {
	switch reason {
	case streamsv1alpha1.ReconfigurationCreated, streamsv1alpha1.ReconfigurationMemberReturned, streamsv1alpha1.ReconfigurationMemberReplaced:
		return corev1.EventTypeNormal
	}
	return corev1.EventTypeWarning
}

// newlyConfirmed is the reconfiguration that a status change from before
// to after shows confirmed by every member for the first time (nil:
// none). Its Event is recorded then, not when it was decided: during a
// failover the decisions of hundreds of chains are what writes wait for,
// and their Events would share the API server with them. Derived from
// status alone, so an operator restarted between the decision and the
// confirmation records the Event all the same.
func newlyConfirmed(before, after streamsv1alpha1.ReplicationChainStatus) *streamsv1alpha1.Reconfiguration {
	rc := after.LastReconfiguration
	if rc == nil || rc.Epoch != after.TargetEpoch || !allConfirmed(after) {
		return nil
	}
	if before.TargetEpoch == after.TargetEpoch && allConfirmed(before) {
		return nil
	}
	return rc
}

// allConfirmed: the chain has members and every one confirmed its target
// epoch.
func allConfirmed(s streamsv1alpha1.ReplicationChainStatus) bool {
	for _, m := range s.Members {
		if m.ConfirmedEpoch != s.TargetEpoch {
			return false
		}
	}
	return len(s.Members) > 0
}

// chainObservation is what the chain controller learnt of a chain's
// members this round.
type chainObservation struct {
	// Reports are the members' reports of the partition (absent: none).
	Reports map[string]*catenapb.PartitionStatus
	// Health of every replica pod of the pool.
	Health map[string]chainplan.Health
	// Nodes are the nodes the pool's pods are scheduled on, by pod (a pod
	// not scheduled, or not read: absent).
	Nodes map[string]string
	// WritesAllowed is the planner's verdict on the chain as it stands.
	WritesAllowed bool
	// MinLength is the fewest full copies that take writes.
	MinLength int
}

// chainStatus is the ReplicationChain's status given its record (already
// in status) and what was observed: each member's state and confirmed
// epoch, and the conditions. Transition times of unchanged conditions are
// kept.
func chainStatus(chain *streamsv1alpha1.ReplicationChain, obs chainObservation) streamsv1alpha1.ReplicationChainStatus {
	status := *chain.Status.DeepCopy()
	status.ObservedGeneration = chain.Generation
	target := status.TargetEpoch
	var committed uint64
	for _, ps := range obs.Reports {
		committed = max(committed, ps.GetCommitted())
	}
	var unconfirmed, catching, failed, refusing []string
	for i := range status.Members {
		m := &status.Members[i]
		ps := obs.Reports[m.Name]
		if ps != nil {
			// A member's confirmation only grows, and never past the
			// target the operator wrote (a report of a newer epoch means
			// another master wrote it; the planner supersedes it).
			m.ConfirmedEpoch = max(m.ConfirmedEpoch, min(int64(ps.GetEpoch()), target))
		}
		switch {
		case obs.Health[m.Name] == chainplan.Failed:
			m.State = streamsv1alpha1.MemberFailed
			failed = append(failed, m.Name)
		case ps != nil && ps.GetError() != "":
			m.State = streamsv1alpha1.MemberFailed
			refusing = append(refusing, fmt.Sprintf("%s: %s", m.Name, ps.GetError()))
		// Catching up: the member lacks records the chain committed. Its
		// own report says so when its predecessor's commit notice is
		// beyond its durable end. The other members' committed offsets
		// are only trusted for a member not yet seen in chain (a joiner
		// before its link is up): they are read at other instants, and
		// under load a committed offset read after a member's durable end
		// is often beyond it, which made members in chain flap to
		// CatchingUp (and a rolling restart's check see one in chain).
		// A member in chain holds everything committed by definition.
		case ps != nil && ps.GetDurable() < ps.GetCommittedNotice():
			m.State = streamsv1alpha1.MemberCatchingUp
			catching = append(catching, fmt.Sprintf("%s catching up to offset %d", m.Name, ps.GetCommittedNotice()))
		case ps != nil && m.State != streamsv1alpha1.MemberInChain && ps.GetDurable() < committed:
			m.State = streamsv1alpha1.MemberCatchingUp
			catching = append(catching, fmt.Sprintf("%s catching up to offset %d", m.Name, committed))
		default:
			m.State = streamsv1alpha1.MemberInChain
		}
		if n := obs.Nodes[m.Name]; n != "" {
			m.Node = n
		}
		if m.ConfirmedEpoch < target {
			unconfirmed = append(unconfirmed, m.Name)
		}
	}
	gen := chain.Generation
	set := func(typ string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen})
	}
	rf := int(chain.Spec.ReplicationFactor)
	inChain := 0
	for _, m := range status.Members {
		if m.State == streamsv1alpha1.MemberInChain {
			inChain++
		}
	}

	switch {
	case len(status.Members) < rf:
		msg := fmt.Sprintf("%d of %d members in chain", len(status.Members), rf)
		if !obs.WritesAllowed {
			msg += fmt.Sprintf("; writes are refused below %d full copies", obs.MinLength)
		}
		set(streamsv1alpha1.ReplicationChainDegradedCondition, metav1.ConditionTrue, streamsv1alpha1.ReplicationChainUnderReplicatedReason, msg)
	default:
		set(streamsv1alpha1.ReplicationChainDegradedCondition, metav1.ConditionFalse, streamsv1alpha1.ReplicationChainFullyReplicatedReason,
			fmt.Sprintf("%d of %d members in chain", len(status.Members), rf))
	}
	switch {
	case len(unconfirmed) > 0:
		set(streamsv1alpha1.ReplicationChainProgressingCondition, metav1.ConditionTrue, streamsv1alpha1.ReplicationChainAwaitingConfirmationReason,
			fmt.Sprintf("Epoch %d not yet confirmed by %s", target, strings.Join(unconfirmed, ", ")))
	case len(catching) > 0:
		set(streamsv1alpha1.ReplicationChainProgressingCondition, metav1.ConditionTrue, streamsv1alpha1.ReplicationChainCatchingUpReason,
			strings.Join(catching, "; "))
	default:
		set(streamsv1alpha1.ReplicationChainProgressingCondition, metav1.ConditionFalse, streamsv1alpha1.ReplicationChainConvergedReason,
			fmt.Sprintf("Every member confirmed epoch %d", target))
	}
	switch {
	case len(status.Members) == 0:
		set(streamsv1alpha1.ReplicationChainReadyCondition, metav1.ConditionFalse, streamsv1alpha1.ReplicationChainAwaitingConfirmationReason, "Not placed yet")
	case len(failed)+len(refusing) > 0:
		set(streamsv1alpha1.ReplicationChainReadyCondition, metav1.ConditionFalse, streamsv1alpha1.ReplicationChainUnderReplicatedReason,
			fmt.Sprintf("Failed members: %s", strings.Join(append(failed, refusing...), "; ")))
	case len(unconfirmed) > 0:
		set(streamsv1alpha1.ReplicationChainReadyCondition, metav1.ConditionFalse, streamsv1alpha1.ReplicationChainAwaitingConfirmationReason,
			fmt.Sprintf("Epoch %d not yet confirmed by %s", target, strings.Join(unconfirmed, ", ")))
	case inChain < rf:
		set(streamsv1alpha1.ReplicationChainReadyCondition, metav1.ConditionFalse, streamsv1alpha1.ReplicationChainUnderReplicatedReason,
			fmt.Sprintf("%d of %d members in chain", inChain, rf))
	default:
		set(streamsv1alpha1.ReplicationChainReadyCondition, metav1.ConditionTrue, streamsv1alpha1.ReplicationChainConvergedReason,
			fmt.Sprintf("%d members in chain confirmed epoch %d", inChain, target))
	}
	return status
}

// Bounds of what a Partition's status lists of consumer holds (the API's
// MaxItems).
const (
	maxStatusConsumers   = 64
	maxStatusForcedTrims = 16
)

// consumerHolds is what the members report of consumer holds: per
// consumer the lowest offset any member holds (what every member keeps),
// sorted by consumer and cut at maxStatusConsumers (truncated says so),
// and the forced trims, one per consumer and hold offset (the latest trim
// of it), oldest first, the latest maxStatusForcedTrims.
func consumerHolds(reports map[string]*catenapb.PartitionStatus) (holds []streamsv1alpha1.ConsumerHold, truncated bool, trims []streamsv1alpha1.ForcedTrim) {
	lowest := map[string]uint64{}
	type trimKey struct {
		consumer string
		hold     uint64
	}
	latest := map[trimKey]*catenapb.ForcedTrim{}
	for _, ps := range reports {
		for _, h := range ps.GetHolds() {
			if cur, ok := lowest[h.GetConsumer()]; !ok || h.GetOffset() < cur {
				lowest[h.GetConsumer()] = h.GetOffset()
			}
		}
		for _, t := range ps.GetForcedTrims() {
			k := trimKey{t.GetConsumer(), t.GetHoldOffset()}
			if cur := latest[k]; cur == nil || t.GetLogStart() > cur.GetLogStart() ||
				(t.GetLogStart() == cur.GetLogStart() && t.GetTimeMs() > cur.GetTimeMs()) {
				latest[k] = t
			}
		}
	}
	for c, off := range lowest {
		holds = append(holds, streamsv1alpha1.ConsumerHold{Consumer: c, Offset: int64(off)})
	}
	sort.Slice(holds, func(i, j int) bool { return holds[i].Consumer < holds[j].Consumer })
	if len(holds) > maxStatusConsumers {
		holds, truncated = holds[:maxStatusConsumers], true
	}
	for _, t := range latest {
		trims = append(trims, streamsv1alpha1.ForcedTrim{Consumer: t.GetConsumer(), HoldOffset: int64(t.GetHoldOffset()),
			LogStartOffset: int64(t.GetLogStart()), Time: metav1.NewTime(time.UnixMilli(t.GetTimeMs()).UTC())})
	}
	sort.Slice(trims, func(i, j int) bool {
		a, b := trims[i], trims[j]
		if !a.Time.Equal(&b.Time) {
			return a.Time.Before(&b.Time)
		}
		if a.Consumer != b.Consumer {
			return a.Consumer < b.Consumer
		}
		return a.HoldOffset < b.HoldOffset
	})
	if n := len(trims); n > maxStatusForcedTrims {
		trims = trims[n-maxStatusForcedTrims:]
	}
	return holds, truncated, trims
}

// partitionStatus is the Partition's status from its chain's status and
// the members' reports. Offsets only grow: a round in which no member
// answered keeps what was known.
func partitionStatus(part *streamsv1alpha1.Partition, chain streamsv1alpha1.ReplicationChainStatus, reports map[string]*catenapb.PartitionStatus) streamsv1alpha1.PartitionStatus {
	status := *part.Status.DeepCopy()
	status.ObservedGeneration = part.Generation
	status.Head, status.Tail = "", ""
	if n := len(chain.Members); n > 0 {
		status.Head, status.Tail = chain.Members[0].Name, chain.Members[n-1].Name
	}
	status.ChainEpoch = max(status.ChainEpoch, chain.TargetEpoch)
	names := make([]string, 0, len(reports))
	for id := range reports {
		names = append(names, id)
	}
	sort.Strings(names)
	var refusing []string
	for _, id := range names {
		ps := reports[id]
		status.CommittedOffset = max(status.CommittedOffset, int64(ps.GetCommitted()))
		status.LogStartOffset = max(status.LogStartOffset, int64(ps.GetLogStart()))
		if ps.GetError() != "" {
			refusing = append(refusing, fmt.Sprintf("%s: %s", id, ps.GetError()))
		}
	}
	if len(reports) > 0 {
		status.Consumers, status.ConsumersTruncated, status.ForcedTrims = consumerHolds(reports)
	}
	cond := metav1.Condition{Type: streamsv1alpha1.PartitionReadyCondition, ObservedGeneration: part.Generation}
	ready := meta.FindStatusCondition(chain.Conditions, streamsv1alpha1.ReplicationChainReadyCondition)
	degraded := meta.IsStatusConditionTrue(chain.Conditions, streamsv1alpha1.ReplicationChainDegradedCondition)
	switch {
	case len(refusing) > 0:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, streamsv1alpha1.PartitionReplicaErrorReason, strings.Join(refusing, "; ")
	case ready != nil && ready.Status == metav1.ConditionTrue:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, streamsv1alpha1.PartitionChainReadyReason, ready.Message
	case degraded || ready == nil:
		msg := "Chain not placed yet"
		if ready != nil {
			msg = ready.Message
		}
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, streamsv1alpha1.PartitionUnderReplicatedReason, msg
	default:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, streamsv1alpha1.PartitionChainReconfiguringReason, ready.Message
	}
	meta.SetStatusCondition(&status.Conditions, cond)
	return status
}

// partitionProgressInterval is how often a Partition's progress alone (its
// committed offset, log start and consumer holds, which move with every
// write and read) is written to the API: under traffic a chain's status
// round runs every second, and writing each partition's offsets that often
// would load the API server and etcd with hundreds of writes a second.
const partitionProgressInterval = 10 * time.Second

// progressOnly reports whether next differs from prev only in a
// Partition's progress (see partitionProgressInterval), which may wait.
func progressOnly(prev, next streamsv1alpha1.PartitionStatus) bool {
	strip := func(s streamsv1alpha1.PartitionStatus) streamsv1alpha1.PartitionStatus {
		s.CommittedOffset, s.LogStartOffset, s.Consumers, s.ConsumersTruncated = 0, 0, nil, false
		return s
	}
	return equality.Semantic.DeepEqual(strip(prev), strip(next))
}
