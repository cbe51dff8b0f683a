package controllers

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

func testStream(mutate func(*streamsv1alpha1.StreamSpec)) *streamsv1alpha1.Stream {
	s := &streamsv1alpha1.Stream{
		ObjectMeta: metav1.ObjectMeta{Name: "events", Namespace: "ns", Generation: 4},
		Spec:       streamsv1alpha1.StreamSpec{Partitions: 3, ReplicationFactor: 3},
	}
	if mutate != nil {
		mutate(&s.Spec)
	}
	return s
}

func TestDesiredStreamChildren(t *testing.T) {
	tests := []struct {
		name         string
		stream       *streamsv1alpha1.Stream
		wantPool     string // "" for none
		wantReplicas int32
		wantSize     string
		wantChainOn  string
	}{
		{"own pool with defaults", testStream(nil), "events-pool", 3, "10Gi", "events-pool"},
		{"own pool from the Stream's fields", testStream(func(s *streamsv1alpha1.StreamSpec) {
			s.Replicas = ptr.To[int32](5)
			s.Storage = &streamsv1alpha1.StorageSpec{Size: resource.MustParse("50Gi")}
		}), "events-pool", 5, "50Gi", "events-pool"},
		{"shared pool", testStream(func(s *streamsv1alpha1.StreamSpec) { s.Pool = "shared" }), "", 0, "", "shared"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := desiredStreamChildren(tt.stream)
			if tt.wantPool == "" {
				if got.Pool != nil {
					t.Errorf("pool = %s, want none", got.Pool.Name)
				}
			} else {
				if got.Pool == nil || got.Pool.Name != tt.wantPool || got.Pool.Namespace != "ns" {
					t.Fatalf("pool = %+v, want ns/%s", got.Pool, tt.wantPool)
				}
				if got.Pool.Spec.Replicas != tt.wantReplicas || got.Pool.Spec.Storage.Size.Cmp(resource.MustParse(tt.wantSize)) != 0 {
					t.Errorf("pool replicas %d size %s, want %d and %s", got.Pool.Spec.Replicas, got.Pool.Spec.Storage.Size.String(), tt.wantReplicas, tt.wantSize)
				}
				if got.Pool.Spec.Placement.NodeSpread != streamsv1alpha1.DefaultNodeSpread {
					t.Errorf("pool nodeSpread = %q, want the default", got.Pool.Spec.Placement.NodeSpread)
				}
			}
			if len(got.Partitions) != 3 || len(got.Chains) != 3 {
				t.Fatalf("%d Partitions and %d chains, want 3 of each", len(got.Partitions), len(got.Chains))
			}
			for i := range int32(3) {
				p, c := got.Partitions[i], got.Chains[i]
				want := streamsv1alpha1.PartitionName("events", i)
				if p.Name != want || c.Name != want {
					t.Errorf("partition %d named %s, chain %s, want %s", i, p.Name, c.Name, want)
				}
				if p.Spec.Stream != "events" || *p.Spec.Index != i {
					t.Errorf("partition %d spec = %+v", i, p.Spec)
				}
				if c.Spec.Stream != "events" || *c.Spec.Partition != i || c.Spec.Pool != tt.wantChainOn || c.Spec.ReplicationFactor != 3 {
					t.Errorf("chain %d spec = %+v, want pool %s", i, c.Spec, tt.wantChainOn)
				}
				if p.Labels[labelStream] != "events" || c.Labels[labelStream] != "events" {
					t.Errorf("partition %d labels %v, chain labels %v", i, p.Labels, c.Labels)
				}
			}
		})
	}
}

func TestStreamStatus(t *testing.T) {
	type want struct {
		ready, progressing      metav1.ConditionStatus
		readyReason, progReason string
		degradedReason          string // "" when not degraded
	}
	complete := streamObservation{PoolFound: true, PoolOwned: true, PoolReplicas: 3, Partitions: 3, Chains: 3,
		IngestionFound: true, IngestServiceFound: true, IngestionAvailable: 2}
	servedButNoIngestion := func(f func(*streamObservation)) streamObservation {
		o := complete
		o.PoolReady, o.PartitionsReady = true, 3
		f(&o)
		return o
	}
	with := func(f func(*streamObservation)) streamObservation { o := complete; f(&o); return o }
	shared := testStream(func(s *streamsv1alpha1.StreamSpec) { s.Pool = "shared" })
	tests := []struct {
		name   string
		stream *streamsv1alpha1.Stream
		obs    streamObservation
		want   want
	}{
		{"nothing created yet", testStream(nil), streamObservation{},
			want{metav1.ConditionFalse, metav1.ConditionTrue, streamsv1alpha1.StreamPoolNotReadyReason, streamsv1alpha1.StreamProvisioningReason, ""}},
		{"some chains missing", testStream(nil), with(func(o *streamObservation) { o.Chains = 1 }),
			want{metav1.ConditionFalse, metav1.ConditionTrue, streamsv1alpha1.StreamPoolNotReadyReason, streamsv1alpha1.StreamProvisioningReason, ""}},
		{"all children exist, pool not ready", testStream(nil), complete,
			want{metav1.ConditionFalse, metav1.ConditionFalse, streamsv1alpha1.StreamPoolNotReadyReason, streamsv1alpha1.StreamUpToDateReason, ""}},
		{"pool ready, partitions not", testStream(nil), with(func(o *streamObservation) { o.PoolReady = true; o.PartitionsReady = 1 }),
			want{metav1.ConditionFalse, metav1.ConditionFalse, streamsv1alpha1.StreamPartitionsNotReadyReason, streamsv1alpha1.StreamUpToDateReason, ""}},
		{"ready", testStream(nil), with(func(o *streamObservation) { o.PoolReady = true; o.PartitionsReady = 3 }),
			want{metav1.ConditionTrue, metav1.ConditionFalse, streamsv1alpha1.StreamPartitionsReadyReason, streamsv1alpha1.StreamUpToDateReason, ""}},
		{"own pool name taken", testStream(nil), with(func(o *streamObservation) { o.PoolOwned = false }),
			want{metav1.ConditionFalse, metav1.ConditionFalse, streamsv1alpha1.StreamPoolConflictReason, streamsv1alpha1.StreamUpToDateReason, streamsv1alpha1.StreamPoolConflictReason}},
		{"shared pool missing", shared, with(func(o *streamObservation) { o.PoolFound = false; o.PoolOwned = false }),
			want{metav1.ConditionFalse, metav1.ConditionFalse, streamsv1alpha1.StreamPoolNotFoundReason, streamsv1alpha1.StreamUpToDateReason, streamsv1alpha1.StreamPoolNotFoundReason}},
		{"ingestion not created yet", testStream(nil), servedButNoIngestion(func(o *streamObservation) {
			o.IngestionFound, o.IngestServiceFound, o.IngestionAvailable = false, false, 0
		}),
			want{metav1.ConditionFalse, metav1.ConditionTrue, streamsv1alpha1.StreamIngestionNotReadyReason, streamsv1alpha1.StreamProvisioningReason, ""}},
		{"ingestion Deployment without an available pod", testStream(nil), servedButNoIngestion(func(o *streamObservation) { o.IngestionAvailable = 0 }),
			want{metav1.ConditionFalse, metav1.ConditionFalse, streamsv1alpha1.StreamIngestionNotReadyReason, streamsv1alpha1.StreamUpToDateReason, ""}},
		{"ingestion available, pool not ready", testStream(nil), with(func(o *streamObservation) { o.PartitionsReady = 3 }),
			want{metav1.ConditionFalse, metav1.ConditionFalse, streamsv1alpha1.StreamPoolNotReadyReason, streamsv1alpha1.StreamUpToDateReason, ""}},
		{"one available ingestion pod is enough", testStream(nil), servedButNoIngestion(func(o *streamObservation) { o.IngestionAvailable = 1 }),
			want{metav1.ConditionTrue, metav1.ConditionFalse, streamsv1alpha1.StreamPartitionsReadyReason, streamsv1alpha1.StreamUpToDateReason, ""}},
		{"ingestion Service name taken", testStream(nil), servedButNoIngestion(func(o *streamObservation) {
			o.IngestServiceFound, o.IngestionConflict = false, "Service events"
		}),
			want{metav1.ConditionFalse, metav1.ConditionTrue, streamsv1alpha1.StreamIngestionConflictReason, streamsv1alpha1.StreamProvisioningReason, streamsv1alpha1.StreamIngestionConflictReason}},
		{"a chain shorter than the replication factor", testStream(nil), servedButNoIngestion(func(o *streamObservation) {
			o.PartitionsReady = 2
			o.ShortChains = []string{"events-1: 2 of 3 members in chain"}
			o.Reconfiguring = []string{"events-1"}
		}),
			want{metav1.ConditionFalse, metav1.ConditionTrue, streamsv1alpha1.StreamUnderReplicatedReason, streamsv1alpha1.StreamReconfiguringReason, streamsv1alpha1.StreamUnderReplicatedReason}},
		{"a chain still confirming its epoch", testStream(nil), servedButNoIngestion(func(o *streamObservation) {
			o.PartitionsReady = 2
			o.Reconfiguring = []string{"events-2"}
		}),
			want{metav1.ConditionFalse, metav1.ConditionTrue, streamsv1alpha1.StreamPartitionsNotReadyReason, streamsv1alpha1.StreamReconfiguringReason, ""}},
		{"shared pool too small", shared, with(func(o *streamObservation) { o.PoolOwned = false; o.PoolReplicas = 2; o.PoolReady = true }),
			want{metav1.ConditionFalse, metav1.ConditionFalse, streamsv1alpha1.StreamReplicationFactorExceedsPoolReason, streamsv1alpha1.StreamUpToDateReason, streamsv1alpha1.StreamReplicationFactorExceedsPoolReason}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := streamStatus(tt.stream, tt.obs)
			if got.ObservedGeneration != tt.stream.Generation {
				t.Errorf("observedGeneration = %d, want %d", got.ObservedGeneration, tt.stream.Generation)
			}
			if got.Pool != tt.stream.PoolName() {
				t.Errorf("status.pool = %q, want %q", got.Pool, tt.stream.PoolName())
			}
			if got.PartitionsReady != tt.obs.PartitionsReady {
				t.Errorf("partitionsReady = %d, want %d", got.PartitionsReady, tt.obs.PartitionsReady)
			}
			gen := tt.stream.Generation
			expectCondition(t, got.Conditions, streamsv1alpha1.StreamReadyCondition, tt.want.ready, tt.want.readyReason, gen)
			expectCondition(t, got.Conditions, streamsv1alpha1.StreamProgressingCondition, tt.want.progressing, tt.want.progReason, gen)
			if tt.want.degradedReason == "" {
				for _, c := range got.Conditions {
					if c.Type == streamsv1alpha1.StreamDegradedCondition {
						t.Errorf("Degraded = %+v, want no Degraded condition", c)
					}
				}
			} else {
				expectCondition(t, got.Conditions, streamsv1alpha1.StreamDegradedCondition, metav1.ConditionTrue, tt.want.degradedReason, gen)
			}
		})
	}
}

func TestStreamStatusNamesShortChains(t *testing.T) {
	stream := testStream(nil)
	got := streamStatus(stream, streamObservation{PoolFound: true, PoolOwned: true, PoolReplicas: 3, PoolReady: true, Partitions: 3, Chains: 3,
		ShortChains: []string{"events-0: 1 of 3 members in chain; writes are refused below 2 full copies", "events-2: 2 of 3 members in chain"}})
	d := meta.FindStatusCondition(got.Conditions, streamsv1alpha1.StreamDegradedCondition)
	want := "2 chains have fewer than 3 members: events-0: 1 of 3 members in chain; writes are refused below 2 full copies; events-2: 2 of 3 members in chain"
	if d == nil || d.Message != want {
		t.Errorf("Degraded = %+v\nwant message %q", d, want)
	}
}

func TestStreamStatusEndpointsAndMessages(t *testing.T) {
	stream := testStream(nil)

	got := streamStatus(stream, streamObservation{})
	if got.Endpoints != (streamsv1alpha1.StreamEndpoints{}) {
		t.Errorf("endpoints without a Service = %+v, want none", got.Endpoints)
	}
	prog := meta.FindStatusCondition(got.Conditions, streamsv1alpha1.StreamProgressingCondition)
	for _, want := range []string{"ingestion Deployment events-ingest", "ingestion Service events"} {
		if prog == nil || !strings.Contains(prog.Message, want) {
			t.Errorf("Progressing = %+v, want its message to list %q", prog, want)
		}
	}

	stream.Status = got
	got = streamStatus(stream, streamObservation{IngestServiceFound: true})
	want := streamsv1alpha1.StreamEndpoints{Producers: "events.ns.svc:7070", Consumers: "events.ns.svc:7070"}
	if got.Endpoints != want {
		t.Errorf("endpoints = %+v, want %+v", got.Endpoints, want)
	}

	// A Service lost to a conflict no longer serves the Stream: its
	// address must not stay in the status.
	stream.Status = got
	got = streamStatus(stream, streamObservation{IngestionConflict: "Service events"})
	if got.Endpoints != (streamsv1alpha1.StreamEndpoints{}) {
		t.Errorf("endpoints after losing the Service = %+v, want none", got.Endpoints)
	}
	ready := meta.FindStatusCondition(got.Conditions, streamsv1alpha1.StreamReadyCondition)
	if ready == nil || !strings.Contains(ready.Message, "Service events exists and is not owned by this Stream") {
		t.Errorf("Ready = %+v, want the conflict in its message", ready)
	}
}

func TestStreamStatusKeepsTransitionTimes(t *testing.T) {
	stream := testStream(nil)
	first := streamStatus(stream, streamObservation{})
	stream.Status = first
	again := streamStatus(stream, streamObservation{})
	for i := range first.Conditions {
		if !first.Conditions[i].LastTransitionTime.Equal(&again.Conditions[i].LastTransitionTime) {
			t.Errorf("%s moved its lastTransitionTime without a change", first.Conditions[i].Type)
		}
	}
}

func TestJoinList(t *testing.T) {
	for _, tt := range []struct {
		in   []string
		want string
	}{
		{nil, ""},
		{[]string{"a"}, "a"},
		{[]string{"a", "b"}, "a and b"},
		{[]string{"a", "b", "c"}, "a, b and c"},
	} {
		if got := joinList(tt.in); got != tt.want {
			t.Errorf("joinList(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestStreamLooksOnlyAtChildChangesThatMatter(t *testing.T) {
	cond := func(typ string, s metav1.ConditionStatus, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s, Reason: "R", Message: msg}
	}
	chain := func(epoch int64, conds ...metav1.Condition) *streamsv1alpha1.ReplicationChain {
		c := &streamsv1alpha1.ReplicationChain{}
		c.Generation = 1
		c.Status.TargetEpoch = epoch
		c.Status.Conditions = conds
		return c
	}
	degraded := func(msg string) metav1.Condition {
		return cond(streamsv1alpha1.ReplicationChainDegradedCondition, metav1.ConditionTrue, msg)
	}
	progressing := cond(streamsv1alpha1.ReplicationChainProgressingCondition, metav1.ConditionTrue, "epoch 3")
	for _, tc := range []struct {
		name     string
		old, cur *streamsv1alpha1.ReplicationChain
		want     bool
	}{
		{"a member confirms, nothing else changes", chain(3, progressing), chain(3, progressing), false},
		{"a new epoch while still reconfiguring", chain(3, progressing), chain(4, cond(streamsv1alpha1.ReplicationChainProgressingCondition, metav1.ConditionTrue, "epoch 4")), false},
		{"reconfiguring starts", chain(3), chain(4, progressing), true},
		{"the chain becomes short", chain(3), chain(4, degraded("2 of 3 members in chain")), true},
		{"how short it is changes", chain(3, degraded("2 of 3 members in chain")), chain(4, degraded("1 of 3 members in chain")), true},
		{"its spec changes", chain(3), func() *streamsv1alpha1.ReplicationChain { c := chain(3); c.Generation = 2; return c }(), true},
		{"it is being deleted", chain(3), func() *streamsv1alpha1.ReplicationChain {
			c := chain(3)
			now := metav1.Now()
			c.DeletionTimestamp = &now
			return c
		}(), true},
	} {
		t.Run("chain: "+tc.name, func(t *testing.T) {
			if got := chainChangeMatters(tc.old, tc.cur); got != tc.want {
				t.Fatalf("chainChangeMatters = %v, want %v", got, tc.want)
			}
		})
	}

	part := func(committed int64, ready metav1.ConditionStatus) *streamsv1alpha1.Partition {
		p := &streamsv1alpha1.Partition{}
		p.Status.CommittedOffset = committed
		p.Status.Conditions = []metav1.Condition{cond(streamsv1alpha1.PartitionReadyCondition, ready, "")}
		return p
	}
	for _, tc := range []struct {
		name     string
		old, cur *streamsv1alpha1.Partition
		want     bool
	}{
		{"offsets move", part(10, metav1.ConditionTrue), part(900, metav1.ConditionTrue), false},
		{"it stops being Ready", part(10, metav1.ConditionTrue), part(10, metav1.ConditionFalse), true},
		{"it becomes Ready", part(10, metav1.ConditionFalse), part(10, metav1.ConditionTrue), true},
	} {
		t.Run("partition: "+tc.name, func(t *testing.T) {
			if got := partitionChangeMatters(tc.old, tc.cur); got != tc.want {
				t.Fatalf("partitionChangeMatters = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStreamReapplyDue(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	r := &StreamReconciler{Now: func() time.Time { return now }}
	key := types.NamespacedName{Namespace: "ns", Name: "orders"}
	if !r.reapplyDue(key) {
		t.Fatal("a Stream never applied by this operator is not due an apply (an operator start must apply everything once)")
	}
	r.applied.set(key, now)
	now = now.Add(reapplyInterval - time.Second)
	if r.reapplyDue(key) {
		t.Fatal("due again before reapplyInterval")
	}
	now = now.Add(time.Second)
	if !r.reapplyDue(key) {
		t.Fatal("not due after reapplyInterval: a hand edit would stay")
	}
	r.applied.forget(key)
	if !r.reapplyDue(key) {
		t.Fatal("a forgotten Stream is not due")
	}
}
