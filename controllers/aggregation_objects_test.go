package controllers

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

func testAggregation() *streamsv1alpha1.Aggregation {
	return &streamsv1alpha1.Aggregation{
		ObjectMeta: metav1.ObjectMeta{Name: "totals", Namespace: "ns"},
		Spec: streamsv1alpha1.AggregationSpec{
			Source:     "orders",
			Aggregates: []streamsv1alpha1.AggregateSpec{{Name: "n", Function: streamsv1alpha1.AggregateCount}},
			Workers:    3,
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
			},
		},
	}
}

func TestDesiredCheckpointStream(t *testing.T) {
	for _, tt := range []struct {
		name     string
		source   *streamsv1alpha1.Stream
		wantPool string
	}{
		{"on a shared pool", testStream(func(s *streamsv1alpha1.StreamSpec) { s.Pool = "shared" }), "shared"},
		{"on the source's own pool, before its status says so", testStream(nil), "events-pool"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.source.Spec.Partitions, tt.source.Spec.ReplicationFactor = 4, 2
			cp := desiredCheckpointStream(testAggregation(), tt.source)
			if cp.Name != "totals-checkpoints" || cp.Namespace != "ns" {
				t.Errorf("named %s/%s", cp.Namespace, cp.Name)
			}
			want := streamsv1alpha1.StreamSpec{
				Pool: tt.wantPool, Partitions: 4, ReplicationFactor: 2,
				Retention:           &streamsv1alpha1.RetentionSpec{Time: &metav1.Duration{Duration: time.Hour}},
				Durability:          streamsv1alpha1.DurabilitySpec{Mode: streamsv1alpha1.DurabilityFsync},
				Ingestion:           streamsv1alpha1.IngestionSpec{Replicas: 1},
				Access:              &streamsv1alpha1.StreamAccess{},
				VolumeReclaimPolicy: streamsv1alpha1.VolumeReclaimDelete,
			}
			if diff := cmp.Diff(want, cp.Spec); diff != "" {
				t.Errorf("checkpoint Stream spec mismatch (-want +got):\n%s", diff)
			}
			if cp.Labels[labelAggregation] != "totals" {
				t.Errorf("labels %v", cp.Labels)
			}
		})
	}
}

func TestDesiredWorkers(t *testing.T) {
	agg := testAggregation()
	objs := desiredAggregationObjects(agg, testStream(nil), "registry.example/catena:v1")
	sts := objs.Workers
	if sts.Name != "totals-aggregator" || *sts.Spec.Replicas != 3 || sts.Spec.ServiceName != "totals-aggregator" {
		t.Errorf("StatefulSet %s: replicas %d, service %s", sts.Name, *sts.Spec.Replicas, sts.Spec.ServiceName)
	}
	sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(sts.Spec.Template.Labels)) {
		t.Errorf("selector %v does not select the template's labels %v", sts.Spec.Selector, sts.Spec.Template.Labels)
	}
	if !OperatorPodSelector().Matches(labels.Set(sts.Spec.Template.Labels)) {
		t.Errorf("the operator's pod cache would not see the workers")
	}
	c := sts.Spec.Template.Spec.Containers[0]
	if diff := cmp.Diff([]string{"aggregator", "--listen=:7080", "--id=$(POD_NAME)", "--metrics-listen=:9090"}, c.Args); diff != "" {
		t.Errorf("args mismatch (-want +got):\n%s", diff)
	}
	if c.Image != "registry.example/catena:v1" || c.Env[0].ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("container %+v", c)
	}
	if c.Resources.Requests.Memory().String() != "256Mi" {
		t.Errorf("resources %+v", c.Resources)
	}
	if sc := c.SecurityContext; !*sc.RunAsNonRoot || !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation {
		t.Errorf("container security context %+v", sc)
	}
	if psc := sts.Spec.Template.Spec.SecurityContext; psc == nil || !*psc.RunAsNonRoot {
		t.Errorf("pod security context %+v", psc)
	}

	if h := objs.Headless; h.Name != "totals-aggregator" || h.Spec.ClusterIP != corev1.ClusterIPNone || !h.Spec.PublishNotReadyAddresses || h.Spec.Ports[0].Port != 7080 {
		t.Errorf("headless Service %+v", h.Spec)
	}
	if s := objs.Service; s.Name != "totals-aggregator-api" || s.Spec.Type != corev1.ServiceTypeClusterIP || s.Spec.Ports[0].Port != 7080 {
		t.Errorf("client Service %+v", s.Spec)
	}
	if got := aggEndpoint(agg); got != "totals-aggregator-api.ns.svc:7080" {
		t.Errorf("endpoint %s", got)
	}
	if p := objs.PDB; p.Name != "totals-aggregator" || p.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget %+v", p.Spec)
	}

	agg.Spec.Workers = 0 // not through the API server's defaults
	if got := desiredWorkers(agg, "x").Spec.Replicas; !cmp.Equal(got, ptr.To[int32](1)) {
		t.Errorf("replicas %v, want 1", *got)
	}
}

func TestWorkerDNSAddr(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "totals-aggregator-1", Namespace: "ns"}, Spec: corev1.PodSpec{Subdomain: "totals-aggregator"}}
	if got := WorkerDNSAddr(pod); got != "totals-aggregator-1.totals-aggregator.ns.svc:7080" {
		t.Errorf("address %s", got)
	}
	if got := desiredWorkerNames(testAggregation()); !cmp.Equal(got, []string{"totals-aggregator-0", "totals-aggregator-1", "totals-aggregator-2"}) {
		t.Errorf("worker names %v", got)
	}
}
