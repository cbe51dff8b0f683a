package controllers

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

func testPool(mutate func(*streamsv1alpha1.ReplicaPoolSpec)) *streamsv1alpha1.ReplicaPool {
	p := &streamsv1alpha1.ReplicaPool{ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: "ns", Generation: 2}}
	p.Spec.SetDefaults()
	if mutate != nil {
		mutate(&p.Spec)
	}
	return p
}

func TestDesiredStatefulSet(t *testing.T) {
	const image = "registry.example/catena:v1"
	tests := []struct {
		name  string
		pool  *streamsv1alpha1.ReplicaPool
		check func(t *testing.T, sts *appsv1.StatefulSet)
	}{
		{
			name: "defaults",
			pool: testPool(nil),
			check: func(t *testing.T, sts *appsv1.StatefulSet) {
				if got := *sts.Spec.Replicas; got != streamsv1alpha1.DefaultReplicas {
					t.Errorf("replicas = %d, want %d", got, streamsv1alpha1.DefaultReplicas)
				}
				if sts.Name != "shared" || sts.Namespace != "ns" || sts.Spec.ServiceName != "shared" {
					t.Errorf("name %s/%s serviceName %s, want ns/shared and shared", sts.Namespace, sts.Name, sts.Spec.ServiceName)
				}
				pvc := sts.Spec.VolumeClaimTemplates
				if len(pvc) != 1 || pvc[0].Name != dataVolumeName {
					t.Fatalf("volumeClaimTemplates = %v, want one named data", pvc)
				}
				if got := pvc[0].Spec.Resources.Requests[corev1.ResourceStorage]; got.Cmp(resource.MustParse("10Gi")) != 0 {
					t.Errorf("storage request = %s, want 10Gi", got.String())
				}
				if pvc[0].Spec.StorageClassName != nil {
					t.Errorf("storageClassName = %q, want the cluster default (nil)", *pvc[0].Spec.StorageClassName)
				}
				aa := sts.Spec.Template.Spec.Affinity.PodAntiAffinity
				if len(aa.RequiredDuringSchedulingIgnoredDuringExecution) != 1 || len(aa.PreferredDuringSchedulingIgnoredDuringExecution) != 0 {
					t.Errorf("anti-affinity = %+v, want one required term (nodeSpread Required)", aa)
				}
				if got := aa.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey; got != corev1.LabelHostname {
					t.Errorf("anti-affinity topologyKey = %s", got)
				}
				tsc := sts.Spec.Template.Spec.TopologySpreadConstraints
				if len(tsc) != 1 || tsc[0].TopologyKey != corev1.LabelTopologyZone || tsc[0].WhenUnsatisfiable != corev1.ScheduleAnyway || tsc[0].MaxSkew != 1 {
					t.Errorf("topologySpreadConstraints = %+v, want zone, ScheduleAnyway, maxSkew 1", tsc)
				}
			},
		},
		{
			name: "container runs the replica role as non-root",
			pool: testPool(nil),
			check: func(t *testing.T, sts *appsv1.StatefulSet) {
				c := sts.Spec.Template.Spec.Containers[0]
				if c.Image != image {
					t.Errorf("image = %s", c.Image)
				}
				wantArgs := []string{"replica", "--id", "$(POD_NAME)", "--listen", ":7071", "--data-dir", "/data", "--metrics-listen", ":9090"}
				if diff := cmp.Diff(wantArgs, c.Args); diff != "" {
					t.Errorf("args (-want +got):\n%s", diff)
				}
				if len(c.Env) != 1 || c.Env[0].Name != "POD_NAME" || c.Env[0].ValueFrom.FieldRef.FieldPath != "metadata.name" {
					t.Errorf("env = %+v, want POD_NAME from metadata.name", c.Env)
				}
				var ports []int32
				for _, p := range c.Ports {
					ports = append(ports, p.ContainerPort)
				}
				if diff := cmp.Diff([]int32{7071, 9090}, ports); diff != "" {
					t.Errorf("ports (-want +got):\n%s", diff)
				}
				sc := c.SecurityContext
				if !*sc.RunAsNonRoot || !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
					t.Errorf("securityContext = %+v", sc)
				}
				if !*sts.Spec.Template.Spec.SecurityContext.RunAsNonRoot {
					t.Errorf("pod securityContext does not require non-root")
				}
				if got := c.ReadinessProbe.TCPSocket.Port; got != intstr.FromString(replicaPortName) {
					t.Errorf("readiness probe port = %v", got)
				}
				if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/data" || c.VolumeMounts[0].Name != dataVolumeName {
					t.Errorf("volumeMounts = %+v", c.VolumeMounts)
				}
			},
		},
		{
			name: "a catch-up rate is passed on when set, 0 (no cap) too",
			pool: testPool(func(s *streamsv1alpha1.ReplicaPoolSpec) { s.CatchUpMiBPerSecond = ptr.To[int32](0) }),
			check: func(t *testing.T, sts *appsv1.StatefulSet) {
				args := sts.Spec.Template.Spec.Containers[0].Args
				if got := args[len(args)-2:]; !slices.Equal(got, []string{"--catch-up-rate", "0"}) {
					t.Errorf("args end with %q, want --catch-up-rate 0", got)
				}
			},
		},
		{
			name: "a journal is passed on when set, and not otherwise",
			pool: testPool(func(s *streamsv1alpha1.ReplicaPoolSpec) { s.Journal = true }),
			check: func(t *testing.T, sts *appsv1.StatefulSet) {
				args := sts.Spec.Template.Spec.Containers[0].Args
				if got := args[len(args)-1]; got != "--journal" {
					t.Errorf("args end with %q, want --journal", got)
				}
				plain, _, _ := desiredPoolObjects(testPool(nil), "registry.example/catena:v1")
				if slices.Contains(plain.Spec.Template.Spec.Containers[0].Args, "--journal") {
					t.Errorf("a pool without journal runs its replicas with --journal")
				}
			},
		},
		{
			name: "storage, class, resources, node selector and tolerations",
			pool: testPool(func(s *streamsv1alpha1.ReplicaPoolSpec) {
				s.Replicas = 5
				s.Storage = streamsv1alpha1.StorageSpec{Size: resource.MustParse("100Gi"), StorageClassName: "local-nvme"}
				s.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}
				s.Placement.NodeSelector = map[string]string{"disk": "nvme"}
				s.Placement.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
			}),
			check: func(t *testing.T, sts *appsv1.StatefulSet) {
				if *sts.Spec.Replicas != 5 {
					t.Errorf("replicas = %d", *sts.Spec.Replicas)
				}
				pvc := sts.Spec.VolumeClaimTemplates[0].Spec
				if got := pvc.Resources.Requests[corev1.ResourceStorage]; got.Cmp(resource.MustParse("100Gi")) != 0 {
					t.Errorf("storage = %s", got.String())
				}
				if pvc.StorageClassName == nil || *pvc.StorageClassName != "local-nvme" {
					t.Errorf("storageClassName = %v", pvc.StorageClassName)
				}
				pod := sts.Spec.Template.Spec
				if got := pod.Containers[0].Resources.Requests[corev1.ResourceCPU]; got.Cmp(resource.MustParse("1")) != 0 {
					t.Errorf("cpu request = %s", got.String())
				}
				if pod.NodeSelector["disk"] != "nvme" || len(pod.Tolerations) != 1 {
					t.Errorf("nodeSelector %v tolerations %v", pod.NodeSelector, pod.Tolerations)
				}
			},
		},
		{
			name: "preferred node spread, required zone spread",
			pool: testPool(func(s *streamsv1alpha1.ReplicaPoolSpec) {
				s.Placement.NodeSpread = streamsv1alpha1.SpreadPreferred
				s.Placement.ZoneSpread = streamsv1alpha1.SpreadRequired
			}),
			check: func(t *testing.T, sts *appsv1.StatefulSet) {
				aa := sts.Spec.Template.Spec.Affinity.PodAntiAffinity
				if len(aa.RequiredDuringSchedulingIgnoredDuringExecution) != 0 || len(aa.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
					t.Errorf("anti-affinity = %+v, want one preferred term", aa)
				}
				tsc := sts.Spec.Template.Spec.TopologySpreadConstraints
				if len(tsc) != 1 || tsc[0].WhenUnsatisfiable != corev1.DoNotSchedule {
					t.Errorf("topologySpreadConstraints = %+v, want DoNotSchedule", tsc)
				}
			},
		},
		{
			name: "no spread",
			pool: testPool(func(s *streamsv1alpha1.ReplicaPoolSpec) {
				s.Placement.NodeSpread = streamsv1alpha1.SpreadNone
				s.Placement.ZoneSpread = streamsv1alpha1.SpreadNone
			}),
			check: func(t *testing.T, sts *appsv1.StatefulSet) {
				if sts.Spec.Template.Spec.Affinity != nil || sts.Spec.Template.Spec.TopologySpreadConstraints != nil {
					t.Errorf("affinity %+v spread %+v, want none", sts.Spec.Template.Spec.Affinity, sts.Spec.Template.Spec.TopologySpreadConstraints)
				}
			},
		},
		{
			name: "selector matches the pod template and the anti-affinity term",
			pool: testPool(nil),
			check: func(t *testing.T, sts *appsv1.StatefulSet) {
				sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
				if err != nil {
					t.Fatal(err)
				}
				if !sel.Matches(labels.Set(sts.Spec.Template.Labels)) {
					t.Errorf("selector %s does not match template labels %v", sel, sts.Spec.Template.Labels)
				}
				term := sts.Spec.Template.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0]
				if diff := cmp.Diff(sts.Spec.Selector, term.LabelSelector); diff != "" {
					t.Errorf("anti-affinity selector differs from the StatefulSet's (-sts +term):\n%s", diff)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sts, _, _ := desiredPoolObjects(tt.pool, image)
			tt.check(t, sts)
		})
	}
}

func TestDesiredServiceAndPDB(t *testing.T) {
	pool := testPool(nil)
	sts, svc, pdb := desiredPoolObjects(pool, "catena:dev")

	if svc.Name != sts.Spec.ServiceName {
		t.Errorf("Service %s, StatefulSet serviceName %s", svc.Name, sts.Spec.ServiceName)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses {
		t.Errorf("Service clusterIP %q publishNotReadyAddresses %v, want headless and publishing", svc.Spec.ClusterIP, svc.Spec.PublishNotReadyAddresses)
	}
	// Pods held back by the chains-ready gate keep their DNS names: the
	// operator, ingestion and their chain neighbours reach them by it.
	if g := sts.Spec.Template.Spec.ReadinessGates; len(g) != 1 || g[0].ConditionType != ChainsReadyCondition {
		t.Errorf("readiness gates %v, want the chains-ready gate", g)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 7071 || svc.Spec.Ports[0].Protocol != corev1.ProtocolTCP {
		t.Errorf("Service ports = %+v, want 7071/TCP", svc.Spec.Ports)
	}
	if diff := cmp.Diff(sts.Spec.Selector.MatchLabels, svc.Spec.Selector); diff != "" {
		t.Errorf("Service selector differs from the StatefulSet's:\n%s", diff)
	}
	if got := pdb.Spec.MaxUnavailable; got == nil || *got != intstr.FromInt32(1) {
		t.Errorf("PDB maxUnavailable = %v, want 1", got)
	}
	if diff := cmp.Diff(sts.Spec.Selector, pdb.Spec.Selector); diff != "" {
		t.Errorf("PDB selector differs from the StatefulSet's:\n%s", diff)
	}
}

func expectCondition(t *testing.T, conds []metav1.Condition, typ string, status metav1.ConditionStatus, reason string, gen int64) {
	t.Helper()
	for _, c := range conds {
		if c.Type != typ {
			continue
		}
		if c.Status != status || c.Reason != reason || c.ObservedGeneration != gen {
			t.Errorf("%s = %s/%s (generation %d), want %s/%s (generation %d); message %q", typ, c.Status, c.Reason, c.ObservedGeneration, status, reason, gen, c.Message)
		}
		return
	}
	t.Errorf("no %s condition in %+v", typ, conds)
}
