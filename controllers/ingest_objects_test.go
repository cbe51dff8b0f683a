package controllers

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

func TestReplicaAddrs(t *testing.T) {
	for _, tt := range []struct {
		name     string
		replicas int32
		want     []string
	}{
		{"one", 1, []string{"shared-0.shared.ns.svc:7071"}},
		{"three", 3, []string{"shared-0.shared.ns.svc:7071", "shared-1.shared.ns.svc:7071", "shared-2.shared.ns.svc:7071"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pool := testPool(func(s *streamsv1alpha1.ReplicaPoolSpec) { s.Replicas = tt.replicas })
			if diff := cmp.Diff(tt.want, replicaAddrs(pool)); diff != "" {
				t.Errorf("replicaAddrs() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDesiredIngestion(t *testing.T) {
	const image = "registry.example/catena:v1"
	ownPool := testPool(nil)
	ownPool.Name = "events-pool"
	fivePods := testPool(func(s *streamsv1alpha1.ReplicaPoolSpec) { s.Replicas = 5 })
	tests := []struct {
		name         string
		stream       *streamsv1alpha1.Stream
		pool         *streamsv1alpha1.ReplicaPool
		wantReplicas int32 // 0 when no Deployment is wanted
		wantAddrs    string
		wantCPU      string // "" for no requests
	}{
		{"no pool yet: no Deployment", testStream(nil), nil, 0, "", ""},
		{"own pool, replicas not defaulted by the API server", testStream(nil), ownPool,
			streamsv1alpha1.DefaultIngestionReplicas,
			"events-pool-0.events-pool.ns.svc:7071,events-pool-1.events-pool.ns.svc:7071,events-pool-2.events-pool.ns.svc:7071", ""},
		{"shared pool of five, three ingestion pods with resources", testStream(func(s *streamsv1alpha1.StreamSpec) {
			s.Pool = "shared"
			s.Ingestion = streamsv1alpha1.IngestionSpec{Replicas: 3, Resources: &corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")},
			}}
		}), fivePods, 3,
			"shared-0.shared.ns.svc:7071,shared-1.shared.ns.svc:7071,shared-2.shared.ns.svc:7071,shared-3.shared.ns.svc:7071,shared-4.shared.ns.svc:7071", "250m"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := desiredIngestion(tt.stream, tt.pool, image)
			checkIngestService(t, got.Service)
			if got.PDB == nil || got.PDB.Name != "events-ingest" || got.PDB.Spec.MaxUnavailable.IntValue() != 1 ||
				!cmp.Equal(got.PDB.Spec.Selector.MatchLabels, ingestSelectorLabels(tt.stream)) {
				t.Errorf("PDB = %+v, want events-ingest with maxUnavailable 1 over the ingestion pods", got.PDB)
			}
			if tt.wantReplicas == 0 {
				if got.Deployment != nil {
					t.Errorf("Deployment = %s, want none without a pool", got.Deployment.Name)
				}
				return
			}
			d := got.Deployment
			if d == nil {
				t.Fatal("no Deployment")
			}
			if d.Name != "events-ingest" || d.Namespace != "ns" || d.Kind != "Deployment" {
				t.Errorf("Deployment %s/%s (kind %q), want ns/events-ingest", d.Namespace, d.Name, d.Kind)
			}
			if *d.Spec.Replicas != tt.wantReplicas {
				t.Errorf("replicas = %d, want %d", *d.Spec.Replicas, tt.wantReplicas)
			}
			if !labels.SelectorFromSet(d.Spec.Selector.MatchLabels).Matches(labels.Set(d.Spec.Template.Labels)) {
				t.Errorf("selector %v does not select the template's labels %v", d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
			}
			if !labels.SelectorFromSet(got.Service.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) {
				t.Errorf("Service selector %v does not select the pods %v", got.Service.Spec.Selector, d.Spec.Template.Labels)
			}
			if d.Spec.Template.Labels[labelStream] != "events" {
				t.Errorf("pod labels %v lack the Stream", d.Spec.Template.Labels)
			}

			pod := d.Spec.Template.Spec
			if len(pod.Containers) != 1 {
				t.Fatalf("%d containers, want 1", len(pod.Containers))
			}
			c := pod.Containers[0]
			if c.Image != image {
				t.Errorf("image = %q, want %q", c.Image, image)
			}
			wantArgs := []string{"ingest", "--listen=:7070", "--replicas=" + tt.wantAddrs, "--metrics-listen=:9090"}
			if diff := cmp.Diff(wantArgs, c.Args); diff != "" {
				t.Errorf("args mismatch (-want +got):\n%s", diff)
			}
			wantPorts := []corev1.ContainerPort{{Name: "grpc", ContainerPort: 7070, Protocol: corev1.ProtocolTCP}, {Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP}}
			if diff := cmp.Diff(wantPorts, c.Ports); diff != "" {
				t.Errorf("ports mismatch (-want +got):\n%s", diff)
			}
			for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
				if p == nil || p.TCPSocket == nil || p.TCPSocket.Port != intstr.FromString("grpc") {
					t.Errorf("%s probe = %+v, want TCP on grpc", name, p)
				}
			}
			if cpu := c.Resources.Requests.Cpu(); tt.wantCPU == "" && !cpu.IsZero() || tt.wantCPU != "" && cpu.Cmp(resource.MustParse(tt.wantCPU)) != 0 {
				t.Errorf("cpu request = %s, want %q", cpu.String(), tt.wantCPU)
			}
			sc := c.SecurityContext
			if sc == nil || !*sc.RunAsNonRoot || !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation ||
				sc.Capabilities == nil || !cmp.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Errorf("container securityContext = %+v, want non-root, read-only root, no escalation, drop ALL", sc)
			}
			psc := pod.SecurityContext
			if psc == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("pod securityContext = %+v, want non-root with the RuntimeDefault seccomp profile", psc)
			}
			aa := pod.Affinity
			if aa == nil || aa.PodAntiAffinity == nil || len(aa.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 0 ||
				len(aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
				t.Fatalf("affinity = %+v, want one preferred anti-affinity term", aa)
			}
			term := aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm
			if term.TopologyKey != corev1.LabelHostname || !cmp.Equal(term.LabelSelector.MatchLabels, ingestSelectorLabels(tt.stream)) {
				t.Errorf("anti-affinity term = %+v, want across nodes, among this Stream's ingestion pods", term)
			}
		})
	}
}

func checkIngestService(t *testing.T, svc *corev1.Service) {
	t.Helper()
	if svc == nil {
		t.Fatal("no Service")
	}
	if svc.Name != "events" || svc.Namespace != "ns" || svc.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Errorf("Service %s/%s of type %q, want ClusterIP ns/events", svc.Namespace, svc.Name, svc.Spec.Type)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "grpc" || svc.Spec.Ports[0].Port != 7070 ||
		svc.Spec.Ports[0].TargetPort != intstr.FromString("grpc") {
		t.Errorf("Service ports = %+v, want grpc 7070", svc.Spec.Ports)
	}
}

// The ingestion pods must not be selected by the pool's selectors (or the
// pool's by theirs) even when a Stream and a shared pool have one name.
func TestIngestLabelsDoNotOverlapPoolLabels(t *testing.T) {
	stream := testStream(func(s *streamsv1alpha1.StreamSpec) { s.Pool = "shared" })
	stream.Name = "shared"
	pool := testPool(nil)
	if labels.SelectorFromSet(poolSelectorLabels(pool)).Matches(labels.Set(ingestLabels(stream))) {
		t.Errorf("the pool's selector %v selects ingestion pods %v", poolSelectorLabels(pool), ingestLabels(stream))
	}
	if labels.SelectorFromSet(ingestSelectorLabels(stream)).Matches(labels.Set(poolLabels(pool))) {
		t.Errorf("the ingestion selector %v selects replica pods %v", ingestSelectorLabels(stream), poolLabels(pool))
	}
	if got := ingestEndpoint(stream); !strings.HasPrefix(got, "shared.ns.svc:") {
		t.Errorf("endpoint = %q", got)
	}
}

func TestExternalListener(t *testing.T) {
	stream := testStream(nil)
	if desiredExternalService(stream) != nil {
		t.Fatal("an external Service without spec.ingestion.external")
	}
	stream.Spec.Ingestion.External = &streamsv1alpha1.ExternalListener{Type: corev1.ServiceTypeNodePort, NodePort: 31070,
		Annotations: map[string]string{"a": "b"}}
	svc := desiredExternalService(stream)
	if svc.Name != stream.Name+"-external" || svc.Spec.Type != corev1.ServiceTypeNodePort || svc.Spec.Ports[0].NodePort != 31070 ||
		svc.Spec.Ports[0].Port != ingestPort || svc.Annotations["a"] != "b" || svc.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyCluster {
		t.Errorf("NodePort Service: %+v", svc)
	}
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(desiredIngestDeployment(stream, testPool(nil), "img").Spec.Template.Labels)) {
		t.Errorf("the Service does not select the ingestion pods")
	}
	if !OperatorPodSelector().Matches(labels.Set(desiredIngestDeployment(stream, testPool(nil), "img").Spec.Template.Labels)) {
		t.Errorf("the operator's pod cache would not see the ingestion pods it reports the nodes of")
	}

	nodePort := func(port int32) *corev1.Service {
		return &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{{Port: 7070, NodePort: port}}}}
	}
	lb := func(ingress ...corev1.LoadBalancerIngress) *corev1.Service {
		s := &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 7070, NodePort: 30001}}}}
		s.Status.LoadBalancer.Ingress = ingress
		return s
	}
	np := &streamsv1alpha1.ExternalListener{Type: corev1.ServiceTypeNodePort}
	lbl := &streamsv1alpha1.ExternalListener{Type: corev1.ServiceTypeLoadBalancer}
	for _, tc := range []struct {
		name  string
		ext   *streamsv1alpha1.ExternalListener
		svc   *corev1.Service
		hosts []string
		prev  string
		want  string
	}{
		{"node port on the first ready ingestion pod's node", np, nodePort(31070), []string{"10.0.0.5", "10.0.0.9"}, "", "10.0.0.5:31070"},
		{"node port stays on its node while a ready pod runs there", np, nodePort(31070), []string{"10.0.0.5", "10.0.0.9"}, "10.0.0.9:31070", "10.0.0.9:31070"},
		{"node port moves when its node has no ready pod", np, nodePort(31070), []string{"10.0.0.5", "10.0.0.7"}, "10.0.0.9:31070", "10.0.0.5:31070"},
		{"node port follows a new port on the same node", np, nodePort(31071), []string{"10.0.0.5", "10.0.0.9"}, "10.0.0.9:31070", "10.0.0.9:31071"},
		{"node port, previous address unparsable", np, nodePort(31070), []string{"10.0.0.5"}, "garbage", "10.0.0.5:31070"},
		{"node port, previous advertised host replaced by a node", np, nodePort(31070), []string{"10.0.0.5"}, "ingest.example.com:31070", "10.0.0.5:31070"},
		{"node port, IPv6 node", np, nodePort(31070), []string{"fd00::5"}, "", "[fd00::5]:31070"},
		{"node port, advertised host", &streamsv1alpha1.ExternalListener{Type: corev1.ServiceTypeNodePort, AdvertisedHost: "ingest.example.com"}, nodePort(31070), []string{"10.0.0.5"}, "", "ingest.example.com:31070"},
		{"node port not given yet", np, nodePort(0), []string{"10.0.0.5"}, "", ""},
		{"no ready ingestion pod yet", np, nodePort(31070), nil, "", ""},
		{"load balancer by IP", lbl, lb(corev1.LoadBalancerIngress{IP: "203.0.113.7"}), nil, "", "203.0.113.7:7070"},
		{"load balancer by host name", lbl, lb(corev1.LoadBalancerIngress{Hostname: "lb.example.net"}), nil, "", "lb.example.net:7070"},
		{"load balancer not provisioned yet", lbl, lb(), []string{"10.0.0.5"}, "", ""},
		{"load balancer, advertised host", &streamsv1alpha1.ExternalListener{Type: corev1.ServiceTypeLoadBalancer, AdvertisedHost: "ingest.example.com"}, lb(), nil, "", "ingest.example.com:7070"},
		{"no external listener", nil, nodePort(31070), []string{"10.0.0.5"}, "", ""},
	} {
		if got := externalEndpoint(tc.ext, tc.svc, tc.hosts, tc.prev); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestIngestPodsStream(t *testing.T) {
	stream := testStream(nil)
	tmpl := desiredIngestDeployment(stream, testPool(nil), "img").Spec.Template
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: stream.Namespace, Name: "x", Labels: tmpl.Labels}}
	if got := ingestPodsStream(context.Background(), pod); len(got) != 1 || got[0].Name != stream.Name || got[0].Namespace != stream.Namespace {
		t.Errorf("an ingestion pod maps to %v, want its Stream %s", got, stream.Name)
	}
	replica := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r", Labels: desiredStatefulSet(testPool(nil), "img").Spec.Template.Labels}}
	if got := ingestPodsStream(context.Background(), replica); got != nil {
		t.Errorf("a replica pod maps to %v", got)
	}
}

func TestIngestHosts(t *testing.T) {
	pod := func(host string, ready, deleting bool) corev1.Pod {
		p := corev1.Pod{Status: corev1.PodStatus{HostIP: host}}
		if ready {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
		if deleting {
			now := metav1.Now()
			p.DeletionTimestamp = &now
		}
		return p
	}
	for _, tc := range []struct {
		name string
		pods []corev1.Pod
		want []string
	}{
		{"none", nil, nil},
		{"ready pods, sorted, each node once", []corev1.Pod{pod("10.0.0.9", true, false), pod("10.0.0.5", true, false), pod("10.0.0.9", true, false)}, []string{"10.0.0.5", "10.0.0.9"}},
		{"not ready", []corev1.Pod{pod("10.0.0.5", false, false), pod("10.0.0.9", true, false)}, []string{"10.0.0.9"}},
		{"being deleted, still ready", []corev1.Pod{pod("10.0.0.5", true, true), pod("10.0.0.9", true, false)}, []string{"10.0.0.9"}},
		{"not scheduled yet", []corev1.Pod{pod("", true, false)}, nil},
	} {
		if got := ingestHosts(tc.pods); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
