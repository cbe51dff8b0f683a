package controllers

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
	"github.com/catena-streams/catena/replica/chainplan"
	"github.com/catena-streams/catena/rpc/catenapb"
	"github.com/catena-streams/catena/rpc/transport"
)

func TestPlaceChainCountsChainsFromStatus(t *testing.T) {
	chains := []streamsv1alpha1.ReplicationChain{
		{Status: streamsv1alpha1.ReplicationChainStatus{Members: []streamsv1alpha1.ChainMember{{Name: "p-0"}, {Name: "p-1"}, {Name: "p-2"}}}},
		{Status: streamsv1alpha1.ReplicationChainStatus{Members: []streamsv1alpha1.ChainMember{{Name: "p-1"}, {Name: "p-2"}, {Name: "p-0"}}}},
		{}, // not placed yet: counts nothing
	}
	load := poolLoad(chains)
	if got := load["p-0"]; got != (chainplan.Roles{Members: 2, Heads: 1, Tails: 1}) {
		t.Errorf("p-0: %+v", got)
	}
	if got := load["p-2"]; got != (chainplan.Roles{Members: 2, Heads: 0, Tails: 1}) {
		t.Errorf("p-2: %+v", got)
	}
	if got := chainplan.Place([]string{"p-0", "p-1", "p-2"}, load, 3); fmt.Sprint(got) != "[p-2 p-0 p-1]" {
		t.Errorf("next chain %v, want it headed by the pod heading none", got)
	}
}

func TestMemberHealth(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	timeout := 3 * time.Second
	ready := func(status corev1.ConditionStatus, since time.Duration) *corev1.Pod {
		return &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{
			Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.NewTime(now.Add(-since)),
		}}}}
	}
	deleting := ready(corev1.ConditionTrue, time.Minute)
	deleting.DeletionTimestamp = ptr.To(metav1.NewTime(now))
	// Held back by the chains-ready gate: its container is ready, the pod
	// is not, since it is not yet back in its chains.
	gated := func(containers corev1.ConditionStatus) *corev1.Pod {
		p := ready(corev1.ConditionFalse, time.Minute)
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: corev1.ContainersReady, Status: containers, LastTransitionTime: metav1.NewTime(now.Add(-time.Minute))})
		return p
	}
	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		probed chainplan.Health // the failure detector's verdict
		want   chainplan.Health
	}{
		{"answers", ready(corev1.ConditionTrue, time.Minute), chainplan.Alive, chainplan.Alive},
		{"answers though its pod is not ready", ready(corev1.ConditionFalse, time.Minute), chainplan.Alive, chainplan.Alive},
		{"the detector failed it, its pod looks fine", ready(corev1.ConditionTrue, time.Minute), chainplan.Failed, chainplan.Failed},
		{"no pod, the detector in doubt", nil, chainplan.Unknown, chainplan.Unknown},
		{"silent a moment, pod ready", ready(corev1.ConditionTrue, time.Minute), chainplan.Unknown, chainplan.Unknown},
		{"pod deleted", deleting, chainplan.Unknown, chainplan.Failed},
		{"pod failed", &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed}}, chainplan.Unknown, chainplan.Failed},
		{"pod not ready for the timeout", ready(corev1.ConditionFalse, timeout), chainplan.Unknown, chainplan.Failed},
		{"pod not ready a moment", ready(corev1.ConditionFalse, time.Second), chainplan.Unknown, chainplan.Unknown},
		{"pod pending, no conditions", &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}, chainplan.Unknown, chainplan.Unknown},
		{"pod held back by the chains gate, its container ready", gated(corev1.ConditionTrue), chainplan.Unknown, chainplan.Unknown},
		{"pod held back by the chains gate, its container not ready for the timeout", gated(corev1.ConditionFalse), chainplan.Unknown, chainplan.Failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := memberHealth(tc.pod, tc.probed, now, timeout); got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStreamConfig(t *testing.T) {
	s := &streamsv1alpha1.Stream{Spec: streamsv1alpha1.StreamSpec{Partitions: 6, ReplicationFactor: 3}}
	got := streamConfig(s)
	want := &catenapb.StreamConfig{Partitions: 6, Durability: catenapb.Durability_DURABILITY_FSYNC, MinChainLength: 2}
	if got.String() != want.String() {
		t.Errorf("defaults: got %v, want %v", got, want)
	}
	s.Spec.ReplicationFactor = 5
	s.Spec.Durability = streamsv1alpha1.DurabilitySpec{Mode: streamsv1alpha1.DurabilityInterval, FsyncInterval: &metav1.Duration{Duration: 20 * time.Millisecond}}
	s.Spec.Retention = &streamsv1alpha1.RetentionSpec{Time: &metav1.Duration{Duration: time.Hour}, Bytes: ptr.To(resource.MustParse("2Gi"))}
	got = streamConfig(s)
	want = &catenapb.StreamConfig{Partitions: 6, Durability: catenapb.Durability_DURABILITY_INTERVAL, FsyncIntervalMs: 20,
		RetentionMs: 3600000, RetentionBytes: 2 << 30, MinChainLength: 3}
	if got.String() != want.String() {
		t.Errorf("interval, retention: got %v, want %v", got, want)
	}
	s.Spec.Retention.HardTime = &metav1.Duration{Duration: 24 * time.Hour}
	s.Spec.Retention.HardBytes = ptr.To(resource.MustParse("10Gi"))
	if got := streamConfig(s); got.GetHardRetentionMs() != 86400000 || got.GetHardRetentionBytes() != 10<<30 {
		t.Errorf("hard retention: got %v, want 86400000ms and %d bytes", got, int64(10<<30))
	}
	s.Spec.SegmentBytes = ptr.To(resource.MustParse("64Mi"))
	if got := streamConfig(s); got.GetSegmentBytes() != 64<<20 {
		t.Errorf("segment size: got %v, want %d bytes", got, int64(64<<20))
	}
	for rf, want := range map[int32]int{1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 7: 4} {
		s.Spec.ReplicationFactor = rf
		if got := minChainLength(s); got != want {
			t.Errorf("replicationFactor %d: min chain length %d, want %d", rf, got, want)
		}
	}
	s.Spec.ReplicationFactor, s.Spec.MinChainLength = 3, ptr.To[int32](1)
	if got := streamConfig(s).GetMinChainLength(); got != 1 {
		t.Errorf("minChainLength 1: config carries %d", got)
	}
	s.Spec.MinChainLength = ptr.To[int32](3)
	if got := minChainLength(s); got != 3 {
		t.Errorf("minChainLength 3 of 3: %d", got)
	}
}

func TestReconfigurationReason(t *testing.T) {
	abc := []string{"a", "b", "c"}
	for _, tc := range []struct {
		prev, next []string
		plan       string
		want       streamsv1alpha1.ReconfigurationReason
	}{
		{abc, []string{"b", "c"}, chainplan.ReasonRemoveFailed, streamsv1alpha1.ReconfigurationHeadFailed},
		{abc, []string{"a", "c"}, chainplan.ReasonRemoveFailed, streamsv1alpha1.ReconfigurationMiddleFailed},
		{abc, []string{"a", "b"}, chainplan.ReasonRemoveFailed, streamsv1alpha1.ReconfigurationTailFailed},
		{abc, []string{"c"}, chainplan.ReasonRemoveFailed, streamsv1alpha1.ReconfigurationHeadFailed},
		{abc, []string{"a"}, chainplan.ReasonRemoveFailed, streamsv1alpha1.ReconfigurationMiddleFailed},
		{[]string{"b", "c"}, []string{"b", "c", "a"}, chainplan.ReasonAddReturning, streamsv1alpha1.ReconfigurationMemberReturned},
		{[]string{"b", "c"}, []string{"b", "c", "d"}, chainplan.ReasonAddNew, streamsv1alpha1.ReconfigurationMemberReplaced},
		{abc, abc, chainplan.ReasonSupersede, streamsv1alpha1.ReconfigurationRebalanced},
	} {
		if got := reconfigurationReason(tc.prev, tc.next, tc.plan); got != tc.want {
			t.Errorf("%v -> %v (%s): got %s, want %s", tc.prev, tc.next, tc.plan, got, tc.want)
		}
	}
}

// chainWith is a placed chain of rf 3 at target epoch 2.
func chainWith(members ...streamsv1alpha1.ChainMember) *streamsv1alpha1.ReplicationChain {
	return &streamsv1alpha1.ReplicationChain{
		ObjectMeta: metav1.ObjectMeta{Name: "s-0", Generation: 1},
		Spec:       streamsv1alpha1.ReplicationChainSpec{Stream: "s", Partition: ptr.To[int32](0), Pool: "p", ReplicationFactor: 3},
		Status:     streamsv1alpha1.ReplicationChainStatus{TargetEpoch: 2, Members: members},
	}
}

func report(epoch, durable, committed uint64, errText string) *catenapb.PartitionStatus {
	return &catenapb.PartitionStatus{Epoch: epoch, LogEnd: durable, Durable: durable, Committed: committed, Error: errText, LogStart: 4}
}

// reportNoticed is a report whose predecessor's commit notice is noticed.
func reportNoticed(epoch, durable, committed, noticed uint64) *catenapb.PartitionStatus {
	r := report(epoch, durable, committed, "")
	r.CommittedNotice = noticed
	return r
}

func TestChainStatus(t *testing.T) {
	abc := func() []streamsv1alpha1.ChainMember {
		return []streamsv1alpha1.ChainMember{{Name: "a", ConfirmedEpoch: 1}, {Name: "b", ConfirmedEpoch: 1}, {Name: "c", ConfirmedEpoch: 1}}
	}
	alive := map[string]chainplan.Health{"a": chainplan.Alive, "b": chainplan.Alive, "c": chainplan.Alive}
	type cond struct {
		status metav1.ConditionStatus
		reason string
	}
	for _, tc := range []struct {
		name          string
		chain         *streamsv1alpha1.ReplicationChain
		obs           chainObservation
		wantConfirmed []int64
		wantStates    []streamsv1alpha1.MemberState
		ready, prog   cond
		degraded      cond
		wantMsg       string // in some condition's message
	}{
		{
			name:  "every member confirmed the target",
			chain: chainWith(abc()...),
			obs: chainObservation{Health: alive, WritesAllowed: true, Reports: map[string]*catenapb.PartitionStatus{
				"a": report(2, 10, 10, ""), "b": report(2, 10, 10, ""), "c": report(2, 10, 10, "")}},
			wantConfirmed: []int64{2, 2, 2},
			wantStates:    []streamsv1alpha1.MemberState{"InChain", "InChain", "InChain"},
			ready:         cond{metav1.ConditionTrue, streamsv1alpha1.ReplicationChainConvergedReason},
			prog:          cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainConvergedReason},
			degraded:      cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainFullyReplicatedReason},
		},
		{
			name:  "a member has not confirmed yet",
			chain: chainWith(abc()...),
			obs: chainObservation{Health: alive, WritesAllowed: true, Reports: map[string]*catenapb.PartitionStatus{
				"a": report(2, 10, 10, ""), "b": report(1, 10, 10, ""), "c": report(2, 10, 10, "")}},
			wantConfirmed: []int64{2, 1, 2},
			wantStates:    []streamsv1alpha1.MemberState{"InChain", "InChain", "InChain"},
			ready:         cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainAwaitingConfirmationReason},
			prog:          cond{metav1.ConditionTrue, streamsv1alpha1.ReplicationChainAwaitingConfirmationReason},
			degraded:      cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainFullyReplicatedReason},
			wantMsg:       "Epoch 2 not yet confirmed by b",
		},
		{
			name:  "a joiner at the tail is catching up",
			chain: chainWith(abc()...),
			obs: chainObservation{Health: alive, WritesAllowed: true, Reports: map[string]*catenapb.PartitionStatus{
				"a": report(2, 10, 10, ""), "b": report(2, 10, 10, ""), "c": report(2, 4, 4, "")}},
			wantConfirmed: []int64{2, 2, 2},
			wantStates:    []streamsv1alpha1.MemberState{"InChain", "InChain", "CatchingUp"},
			ready:         cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainUnderReplicatedReason},
			prog:          cond{metav1.ConditionTrue, streamsv1alpha1.ReplicationChainCatchingUpReason},
			degraded:      cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainFullyReplicatedReason},
			wantMsg:       "c catching up to offset 10",
		},
		{
			name: "a member in chain read before a later committed offset stays in chain",
			chain: chainWith(streamsv1alpha1.ChainMember{Name: "a", State: "InChain", ConfirmedEpoch: 2},
				streamsv1alpha1.ChainMember{Name: "b", State: "InChain", ConfirmedEpoch: 2}, streamsv1alpha1.ChainMember{Name: "c", State: "InChain", ConfirmedEpoch: 2}),
			obs: chainObservation{Health: alive, WritesAllowed: true, Reports: map[string]*catenapb.PartitionStatus{
				"a": report(2, 12, 12, ""), "b": report(2, 12, 12, ""), "c": reportNoticed(2, 9, 9, 8)}},
			wantConfirmed: []int64{2, 2, 2},
			wantStates:    []streamsv1alpha1.MemberState{"InChain", "InChain", "InChain"},
			ready:         cond{metav1.ConditionTrue, streamsv1alpha1.ReplicationChainConvergedReason},
			prog:          cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainConvergedReason},
			degraded:      cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainFullyReplicatedReason},
		},
		{
			name: "a member told of commits beyond its durable end is catching up, in chain or not",
			chain: chainWith(streamsv1alpha1.ChainMember{Name: "a", State: "InChain", ConfirmedEpoch: 2},
				streamsv1alpha1.ChainMember{Name: "b", State: "InChain", ConfirmedEpoch: 2}, streamsv1alpha1.ChainMember{Name: "c", State: "InChain", ConfirmedEpoch: 2}),
			obs: chainObservation{Health: alive, WritesAllowed: true, Reports: map[string]*catenapb.PartitionStatus{
				"a": report(2, 12, 10, ""), "b": report(2, 12, 10, ""), "c": reportNoticed(2, 7, 7, 10)}},
			wantConfirmed: []int64{2, 2, 2},
			wantStates:    []streamsv1alpha1.MemberState{"InChain", "InChain", "CatchingUp"},
			ready:         cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainUnderReplicatedReason},
			prog:          cond{metav1.ConditionTrue, streamsv1alpha1.ReplicationChainCatchingUpReason},
			degraded:      cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainFullyReplicatedReason},
			wantMsg:       "c catching up to offset 10",
		},
		{
			name:  "a member failed and is not removed yet; a silent one keeps its confirmation",
			chain: chainWith(abc()...),
			obs: chainObservation{Health: map[string]chainplan.Health{"a": chainplan.Alive, "b": chainplan.Failed, "c": chainplan.Unknown},
				WritesAllowed: true, Reports: map[string]*catenapb.PartitionStatus{"a": report(2, 10, 10, "")}},
			wantConfirmed: []int64{2, 1, 1},
			wantStates:    []streamsv1alpha1.MemberState{"InChain", "Failed", "InChain"},
			ready:         cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainUnderReplicatedReason},
			prog:          cond{metav1.ConditionTrue, streamsv1alpha1.ReplicationChainAwaitingConfirmationReason},
			degraded:      cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainFullyReplicatedReason},
			wantMsg:       "Failed members: b",
		},
		{
			name:  "a member refuses to serve a corrupt log",
			chain: chainWith(abc()...),
			obs: chainObservation{Health: alive, WritesAllowed: true, Reports: map[string]*catenapb.PartitionStatus{
				"a": report(2, 10, 10, ""), "b": report(2, 10, 10, "segment 0: checksum mismatch"), "c": report(2, 10, 10, "")}},
			wantConfirmed: []int64{2, 2, 2},
			wantStates:    []streamsv1alpha1.MemberState{"InChain", "Failed", "InChain"},
			ready:         cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainUnderReplicatedReason},
			prog:          cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainConvergedReason},
			degraded:      cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainFullyReplicatedReason},
			wantMsg:       "b: segment 0: checksum mismatch",
		},
		{
			name:  "a short chain that refuses writes says so",
			chain: chainWith(streamsv1alpha1.ChainMember{Name: "a", ConfirmedEpoch: 2}),
			obs: chainObservation{Health: alive, WritesAllowed: false, MinLength: 2, Reports: map[string]*catenapb.PartitionStatus{
				"a": report(2, 10, 10, "")}},
			wantConfirmed: []int64{2},
			wantStates:    []streamsv1alpha1.MemberState{"InChain"},
			ready:         cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainUnderReplicatedReason},
			prog:          cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainConvergedReason},
			degraded:      cond{metav1.ConditionTrue, streamsv1alpha1.ReplicationChainUnderReplicatedReason},
			wantMsg:       "writes are refused below 2 full copies",
		},
		{
			name:  "a report of a newer epoch never confirms past the target",
			chain: chainWith(abc()...),
			obs: chainObservation{Health: alive, WritesAllowed: true, Reports: map[string]*catenapb.PartitionStatus{
				"a": report(5, 10, 10, ""), "b": report(2, 10, 10, ""), "c": report(2, 10, 10, "")}},
			wantConfirmed: []int64{2, 2, 2},
			wantStates:    []streamsv1alpha1.MemberState{"InChain", "InChain", "InChain"},
			ready:         cond{metav1.ConditionTrue, streamsv1alpha1.ReplicationChainConvergedReason},
			prog:          cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainConvergedReason},
			degraded:      cond{metav1.ConditionFalse, streamsv1alpha1.ReplicationChainFullyReplicatedReason},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := chainStatus(tc.chain, tc.obs)
			for i, m := range st.Members {
				if m.ConfirmedEpoch != tc.wantConfirmed[i] || m.State != tc.wantStates[i] {
					t.Errorf("member %s: confirmed %d state %s, want %d %s", m.Name, m.ConfirmedEpoch, m.State, tc.wantConfirmed[i], tc.wantStates[i])
				}
			}
			var msgs string
			for typ, want := range map[string]cond{
				streamsv1alpha1.ReplicationChainReadyCondition:       tc.ready,
				streamsv1alpha1.ReplicationChainProgressingCondition: tc.prog,
				streamsv1alpha1.ReplicationChainDegradedCondition:    tc.degraded,
			} {
				c := meta.FindStatusCondition(st.Conditions, typ)
				if c == nil || c.Status != want.status || c.Reason != want.reason {
					t.Errorf("%s: got %+v, want %s %s", typ, c, want.status, want.reason)
					continue
				}
				if c.ObservedGeneration != 1 {
					t.Errorf("%s: observedGeneration %d", typ, c.ObservedGeneration)
				}
				msgs += c.Message + "\n"
			}
			if tc.wantMsg != "" && !strings.Contains(msgs, tc.wantMsg) {
				t.Errorf("no condition says %q:\n%s", tc.wantMsg, msgs)
			}
			if tc.chain.Status.Conditions != nil {
				t.Errorf("chainStatus changed its input")
			}
		})
	}
}

func TestPartitionStatus(t *testing.T) {
	part := &streamsv1alpha1.Partition{
		ObjectMeta: metav1.ObjectMeta{Name: "s-0", Generation: 1},
		Status:     streamsv1alpha1.PartitionStatus{ChainEpoch: 2, CommittedOffset: 50, LogStartOffset: 4},
	}
	chain := chainWith(
		streamsv1alpha1.ChainMember{Name: "a", ConfirmedEpoch: 2, State: streamsv1alpha1.MemberInChain},
		streamsv1alpha1.ChainMember{Name: "b", ConfirmedEpoch: 2, State: streamsv1alpha1.MemberInChain},
		streamsv1alpha1.ChainMember{Name: "c", ConfirmedEpoch: 2, State: streamsv1alpha1.MemberInChain},
	)
	chain.Status.TargetEpoch = 3
	meta.SetStatusCondition(&chain.Status.Conditions, metav1.Condition{Type: streamsv1alpha1.ReplicationChainReadyCondition, Status: metav1.ConditionFalse, Reason: "AwaitingConfirmation", Message: "Epoch 3 not yet confirmed by c"})

	// Members that answered report less than was known (a restarted one
	// before catching up): offsets do not go back.
	st := partitionStatus(part, chain.Status, map[string]*catenapb.PartitionStatus{"a": report(3, 60, 40, ""), "b": report(3, 60, 60, "")})
	if st.Head != "a" || st.Tail != "c" || st.ChainEpoch != 3 || st.CommittedOffset != 60 || st.LogStartOffset != 4 {
		t.Errorf("got %+v", st)
	}
	if c := meta.FindStatusCondition(st.Conditions, streamsv1alpha1.PartitionReadyCondition); c == nil || c.Status != metav1.ConditionFalse || c.Reason != streamsv1alpha1.PartitionChainReconfiguringReason {
		t.Errorf("reconfiguring: %+v", c)
	}
	st = partitionStatus(part, chain.Status, nil)
	if st.CommittedOffset != 50 {
		t.Errorf("no answers: committed %d, want the known 50", st.CommittedOffset)
	}

	meta.SetStatusCondition(&chain.Status.Conditions, metav1.Condition{Type: streamsv1alpha1.ReplicationChainReadyCondition, Status: metav1.ConditionTrue, Reason: "Converged", Message: "3 members in chain confirmed epoch 3"})
	st = partitionStatus(part, chain.Status, map[string]*catenapb.PartitionStatus{"a": report(3, 60, 60, "")})
	if c := meta.FindStatusCondition(st.Conditions, streamsv1alpha1.PartitionReadyCondition); c == nil || c.Status != metav1.ConditionTrue || c.Reason != streamsv1alpha1.PartitionChainReadyReason {
		t.Errorf("ready: %+v", c)
	}
	st = partitionStatus(part, chain.Status, map[string]*catenapb.PartitionStatus{"a": report(3, 60, 60, "frame at 12: bad checksum")})
	if c := meta.FindStatusCondition(st.Conditions, streamsv1alpha1.PartitionReadyCondition); c == nil || c.Reason != streamsv1alpha1.PartitionReplicaErrorReason || c.Message != "a: frame at 12: bad checksum" {
		t.Errorf("replica error: %+v", c)
	}
}

func TestPartitionStatusConsumerHolds(t *testing.T) {
	hold := func(c string, off uint64) *catenapb.ConsumerHold {
		return &catenapb.ConsumerHold{Consumer: c, Offset: off}
	}
	trim := func(c string, held, start uint64, ms int64) *catenapb.ForcedTrim {
		return &catenapb.ForcedTrim{Consumer: c, HoldOffset: held, LogStart: start, TimeMs: ms}
	}
	with := func(holds []*catenapb.ConsumerHold, trims ...*catenapb.ForcedTrim) *catenapb.PartitionStatus {
		ps := report(3, 60, 60, "")
		ps.Holds, ps.ForcedTrims = holds, trims
		return ps
	}
	known := streamsv1alpha1.PartitionStatus{Consumers: []streamsv1alpha1.ConsumerHold{{Consumer: "old", Offset: 1}}}
	many := make([]*catenapb.ConsumerHold, maxStatusConsumers+1)
	for i := range many {
		many[i] = hold(fmt.Sprintf("c%03d", i), uint64(i))
	}
	manyTrims := make([]*catenapb.ForcedTrim, maxStatusForcedTrims+2)
	for i := range manyTrims {
		manyTrims[i] = trim(fmt.Sprintf("t%02d", i), 0, 10, int64(1000+i))
	}
	for _, tc := range []struct {
		name          string
		known         streamsv1alpha1.PartitionStatus
		reports       map[string]*catenapb.PartitionStatus
		wantHolds     string
		wantTruncated bool
		wantTrims     string
	}{
		{name: "no holds", reports: map[string]*catenapb.PartitionStatus{"a": with(nil)}},
		{name: "members agree", reports: map[string]*catenapb.PartitionStatus{
			"a": with([]*catenapb.ConsumerHold{hold("y", 9), hold("x", 3)}), "b": with([]*catenapb.ConsumerHold{hold("x", 3), hold("y", 9)}),
		}, wantHolds: "x@3 y@9"},
		{name: "the lowest offset any member holds", reports: map[string]*catenapb.PartitionStatus{
			"a": with([]*catenapb.ConsumerHold{hold("x", 7)}), "b": with([]*catenapb.ConsumerHold{hold("x", 5)}), "c": with(nil),
		}, wantHolds: "x@5"},
		{name: "no member answered keeps what was known", known: known, wantHolds: "old@1"},
		{name: "answers replace what was known", known: known, reports: map[string]*catenapb.PartitionStatus{"a": with(nil)}},
		{name: "one trim per consumer and hold, the latest", reports: map[string]*catenapb.PartitionStatus{
			"a": with([]*catenapb.ConsumerHold{hold("x", 2)}, trim("x", 2, 10, 1000)),
			"b": with([]*catenapb.ConsumerHold{hold("x", 2)}, trim("x", 2, 14, 2000), trim("y", 0, 8, 500)),
		}, wantHolds: "x@2", wantTrims: "y:0->8@500 x:2->14@2000"},
		{name: "bounded consumers", reports: map[string]*catenapb.PartitionStatus{"a": with(many)},
			wantHolds: "", wantTruncated: true},
		{name: "bounded trims keep the latest", reports: map[string]*catenapb.PartitionStatus{"a": with(nil, manyTrims...)},
			wantTrims: "t02:0->10@1002 ..."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			part := &streamsv1alpha1.Partition{ObjectMeta: metav1.ObjectMeta{Name: "s-0", Generation: 1}, Status: tc.known}
			st := partitionStatus(part, chainWith().Status, tc.reports)
			var holds []string
			for _, h := range st.Consumers {
				holds = append(holds, fmt.Sprintf("%s@%d", h.Consumer, h.Offset))
			}
			if tc.name == "bounded consumers" {
				if len(st.Consumers) != maxStatusConsumers || st.Consumers[0].Consumer != "c000" {
					t.Errorf("%d consumers listed from c%v, want %d from c000", len(st.Consumers), st.Consumers[0].Consumer, maxStatusConsumers)
				}
			} else if got := strings.Join(holds, " "); got != tc.wantHolds {
				t.Errorf("consumers %q, want %q", got, tc.wantHolds)
			}
			if st.ConsumersTruncated != tc.wantTruncated {
				t.Errorf("truncated %v, want %v", st.ConsumersTruncated, tc.wantTruncated)
			}
			var trims []string
			for _, tr := range st.ForcedTrims {
				trims = append(trims, fmt.Sprintf("%s:%d->%d@%d", tr.Consumer, tr.HoldOffset, tr.LogStartOffset, tr.Time.UnixMilli()))
			}
			if tc.name == "bounded trims keep the latest" {
				if len(trims) != maxStatusForcedTrims || !strings.HasPrefix(trims[0], "t02:") {
					t.Errorf("trims %v, want the latest %d from t02", trims, maxStatusForcedTrims)
				}
			} else if got := strings.Join(trims, " "); got != tc.wantTrims {
				t.Errorf("forced trims %q, want %q", got, tc.wantTrims)
			}
		})
	}
}

func TestProgressOnly(t *testing.T) {
	base := streamsv1alpha1.PartitionStatus{
		Head: "p-0", Tail: "p-2", ChainEpoch: 3, CommittedOffset: 100, LogStartOffset: 10,
		Consumers:  []streamsv1alpha1.ConsumerHold{{Consumer: "c", Offset: 50}},
		Conditions: []metav1.Condition{{Type: streamsv1alpha1.PartitionReadyCondition, Status: metav1.ConditionTrue, Reason: "ChainReady"}},
	}
	for _, tc := range []struct {
		name   string
		change func(*streamsv1alpha1.PartitionStatus)
		want   bool
	}{
		{"records committed", func(s *streamsv1alpha1.PartitionStatus) { s.CommittedOffset = 900 }, true},
		{"retention trimmed", func(s *streamsv1alpha1.PartitionStatus) { s.LogStartOffset = 60 }, true},
		{"a consumer read on", func(s *streamsv1alpha1.PartitionStatus) { s.Consumers[0].Offset = 80 }, true},
		{"a new epoch", func(s *streamsv1alpha1.PartitionStatus) { s.ChainEpoch = 4 }, false},
		{"a new head", func(s *streamsv1alpha1.PartitionStatus) { s.Head = "p-1" }, false},
		{"no longer Ready", func(s *streamsv1alpha1.PartitionStatus) { s.Conditions[0].Status = metav1.ConditionFalse }, false},
		{"a hard limit trimmed past a hold", func(s *streamsv1alpha1.PartitionStatus) {
			s.ForcedTrims = []streamsv1alpha1.ForcedTrim{{Consumer: "c"}}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := *base.DeepCopy()
			tc.change(&next)
			if got := progressOnly(base, next); got != tc.want {
				t.Fatalf("progressOnly = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNewlyConfirmed(t *testing.T) {
	member := func(name string, confirmed int64) streamsv1alpha1.ChainMember {
		return streamsv1alpha1.ChainMember{Name: name, State: streamsv1alpha1.MemberInChain, ConfirmedEpoch: confirmed}
	}
	reorder := &streamsv1alpha1.Reconfiguration{Epoch: 5, Reason: streamsv1alpha1.ReconfigurationHeadFailed, Message: "HeadFailed: [a b c] at epoch 4 -> [b c] at epoch 5"}
	status := func(target int64, rc *streamsv1alpha1.Reconfiguration, members ...streamsv1alpha1.ChainMember) streamsv1alpha1.ReplicationChainStatus {
		return streamsv1alpha1.ReplicationChainStatus{TargetEpoch: target, LastReconfiguration: rc, Members: members}
	}
	for _, tc := range []struct {
		name          string
		before, after streamsv1alpha1.ReplicationChainStatus
		want          *streamsv1alpha1.Reconfiguration
	}{
		{"decided, nobody confirmed yet",
			status(4, nil, member("a", 4), member("b", 4), member("c", 4)),
			status(5, reorder, member("b", 4), member("c", 4)), nil},
		{"one of two confirmed",
			status(5, reorder, member("b", 4), member("c", 4)),
			status(5, reorder, member("b", 4), member("c", 5)), nil},
		{"the last one confirms",
			status(5, reorder, member("b", 4), member("c", 5)),
			status(5, reorder, member("b", 5), member("c", 5)), reorder},
		{"both confirm in one round",
			status(5, reorder, member("b", 4), member("c", 4)),
			status(5, reorder, member("b", 5), member("c", 5)), reorder},
		{"already confirmed: a later status change records nothing",
			status(5, reorder, member("b", 5), member("c", 5)),
			status(5, reorder, member("b", 5), member("c", 5)), nil},
		// An operator restarted after the decision finds the confirmation
		// to make in status, and records the Event then.
		{"decided by an earlier operator, confirmed now",
			status(5, reorder, member("b", 5), member("c", 4)),
			status(5, reorder, member("b", 5), member("c", 5)), reorder},
		{"the record is of an older epoch than the target",
			status(6, reorder, member("b", 5), member("c", 5)),
			status(6, reorder, member("b", 6), member("c", 6)), nil},
		{"no members", status(5, reorder), status(5, reorder), nil},
	} {
		if got := newlyConfirmed(tc.before, tc.after); got != tc.want {
			t.Errorf("%s: newlyConfirmed = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestReconfigurationEventType(t *testing.T) {
	for reason, want := range map[streamsv1alpha1.ReconfigurationReason]string{
		streamsv1alpha1.ReconfigurationCreated:        corev1.EventTypeNormal,
		streamsv1alpha1.ReconfigurationMemberReturned: corev1.EventTypeNormal,
		streamsv1alpha1.ReconfigurationMemberReplaced: corev1.EventTypeNormal,
		streamsv1alpha1.ReconfigurationHeadFailed:     corev1.EventTypeWarning,
		streamsv1alpha1.ReconfigurationMiddleFailed:   corev1.EventTypeWarning,
		streamsv1alpha1.ReconfigurationTailFailed:     corev1.EventTypeWarning,
		streamsv1alpha1.ReconfigurationRebalanced:     corev1.EventTypeWarning,
	} {
		if got := reconfigurationEventType(reason); got != want {
			t.Errorf("%s: %s, want %s", reason, got, want)
		}
	}
}

// A link that stays silent for the failure timeout gets a member removed.
// A predecessor dialling a returned member's stale address (its pod came
// back on another node) must have time for a second attempt, at the
// name's new address, before that: one attempt is bounded by
// transport.MinConnectTimeout.
func TestTwoConnectAttemptsFitInTheFailureTimeout(t *testing.T) {
	if 2*transport.MinConnectTimeout > DefaultFailureTimeout {
		t.Fatalf("a connection attempt may take %v, the failure timeout is %v: a link to a returned member's new address may be declared cut before its second attempt",
			transport.MinConnectTimeout, DefaultFailureTimeout)
	}
}

// Each member's node is what its pod was last seen on: a pod not scheduled
// (or not read) this round keeps the node it had.
func TestChainStatusRecordsEachMembersNode(t *testing.T) {
	chain := &streamsv1alpha1.ReplicationChain{ObjectMeta: metav1.ObjectMeta{Generation: 1}}
	chain.Status.TargetEpoch = 1
	chain.Status.Members = []streamsv1alpha1.ChainMember{{Name: "a"}, {Name: "b", Node: "old"}, {Name: "c", Node: "n3"}}
	st := chainStatus(chain, chainObservation{Nodes: map[string]string{"a": "n1", "b": "n2"}})
	for i, want := range []string{"n1", "n2", "n3"} {
		if got := st.Members[i].Node; got != want {
			t.Errorf("member %s: node %q, want %q", st.Members[i].Name, got, want)
		}
	}
	if chain.Status.Members[0].Node != "" {
		t.Error("chainStatus changed its input")
	}
}
