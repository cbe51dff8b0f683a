package controllers

import (
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// Ports and paths of a replica pod. The replica serves gRPC on
// replicaPort and Prometheus metrics on metricsPort; its logs live on the
// volume mounted at dataDir.
const (
	replicaPort      int32 = 7071
	metricsPort      int32 = 9090
	replicaPortName        = "replica"
	metricsPortName        = "metrics"
	dataVolumeName         = "data"
	dataDir                = "/data"
	replicaContainer       = "replica"
	// replicaUID is the distroless "nonroot" user the image runs as (see
	// the Dockerfile); fsGroup gives it the replica volume.
	replicaUID int64 = 65532
)

// Topology keys the pool spreads its pods over.
const (
	nodeTopologyKey = corev1.LabelHostname
	zoneTopologyKey = corev1.LabelTopologyZone
)

// Labels on everything the operator creates for a pool. The selector
// labels are a StatefulSet's immutable selector: never change them.
const (
	labelName        = "app.kubernetes.io/name"
	labelComponent   = "app.kubernetes.io/component"
	labelInstance    = "app.kubernetes.io/instance"
	labelManagedBy   = "app.kubernetes.io/managed-by"
	appName          = "catena"
	componentReplica = "replica"
)

// selectorLabels select the pods of one component (replica, ingest) of one
// instance (a pool, a stream).
func selectorLabels(component, instance string) map[string]string {
	return map[string]string{
		labelName:      appName,
		labelComponent: component,
		labelInstance:  instance,
	}
}

// poolSelectorLabels select the replica pods of a pool.
func poolSelectorLabels(pool *streamsv1alpha1.ReplicaPool) map[string]string {
	return selectorLabels(componentReplica, pool.Name)
}

// tcpProbe probes that a container accepts connections on a named port.
func tcpProbe(port string) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
		TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString(port)},
	}}
}

// spreadWhenPossible prefers, and never requires, the pods of selector on
// different nodes: for stateless or restorable pods (ingestion, aggregation
// workers), where spreading helps but a pending pod would hurt.
func spreadWhenPossible(selector map[string]string) *corev1.Affinity {
	return &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
			Weight: 100,
			PodAffinityTerm: corev1.PodAffinityTerm{
				LabelSelector: &metav1.LabelSelector{MatchLabels: selector},
				TopologyKey:   nodeTopologyKey,
			},
		}},
	}}
}

// restrictedContainer is the security context of every container the
// operator runs: non-root, read-only root file system, no privilege
// escalation, no capabilities (the Kubernetes "restricted" profile).
func restrictedContainer() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsNonRoot:             ptr.To(true),
		ReadOnlyRootFilesystem:   ptr.To(true),
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
}

// restrictedPod is the pod security context that goes with it.
func restrictedPod() *corev1.PodSecurityContext {
	return &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		RunAsUser:      ptr.To(replicaUID),
		RunAsGroup:     ptr.To(replicaUID),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// poolLabels are the selector labels and who manages the object.
func poolLabels(pool *streamsv1alpha1.ReplicaPool) map[string]string {
	l := poolSelectorLabels(pool)
	l[labelManagedBy] = fieldOwner
	return l
}

// desiredPoolObjects is what a ReplicaPool is made of: a StatefulSet of
// replica pods, the headless Service that gives each pod a stable DNS name,
// and a PodDisruptionBudget. It reads nothing but its arguments; owner
// references are set by the caller.
func desiredPoolObjects(pool *streamsv1alpha1.ReplicaPool, image string) (*appsv1.StatefulSet, *corev1.Service, *policyv1.PodDisruptionBudget) {
	return desiredStatefulSet(pool, image), desiredService(pool), desiredPDB(pool)
}

func desiredStatefulSet(pool *streamsv1alpha1.ReplicaPool, image string) *appsv1.StatefulSet {
	spec := pool.Spec
	labels := poolLabels(pool)

	var pvcRequests corev1.ResourceList
	if !spec.Storage.Size.IsZero() {
		pvcRequests = corev1.ResourceList{corev1.ResourceStorage: spec.Storage.Size}
	}
	pvc := corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: dataVolumeName, Labels: poolSelectorLabels(pool)},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: pvcRequests},
		},
	}
	if spec.Storage.StorageClassName != "" {
		pvc.Spec.StorageClassName = ptr.To(spec.Storage.StorageClassName)
	}

	container := corev1.Container{
		Name:  replicaContainer,
		Image: image,
		Args: []string{
			"replica",
			"--id", "$(POD_NAME)",
			"--listen", ":" + strconv.Itoa(int(replicaPort)),
			"--data-dir", dataDir,
			"--metrics-listen", ":" + strconv.Itoa(int(metricsPort)),
		},
		Env: []corev1.EnvVar{{
			Name: "POD_NAME",
			ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"},
			},
		}},
		Ports: []corev1.ContainerPort{
			{Name: replicaPortName, ContainerPort: replicaPort, Protocol: corev1.ProtocolTCP},
			{Name: metricsPortName, ContainerPort: metricsPort, Protocol: corev1.ProtocolTCP},
		},
		Resources:       *spec.Resources.DeepCopy(),
		VolumeMounts:    []corev1.VolumeMount{{Name: dataVolumeName, MountPath: dataDir}},
		ReadinessProbe:  tcpProbe(replicaPortName),
		SecurityContext: restrictedContainer(),
	}
	if r := spec.CatchUpMiBPerSecond; r != nil {
		// Only when set: the replica's own default otherwise, so that
		// pools that do not set it keep their pod template.
		container.Args = append(container.Args, "--catch-up-rate", strconv.Itoa(int(*r)))
	}
	if spec.Journal {
		container.Args = append(container.Args, "--journal")
	}
	podSecurity := restrictedPod()
	// The volume is group-writable for the replica's group.
	podSecurity.FSGroup = ptr.To(replicaUID)

	podSpec := corev1.PodSpec{
		Containers: []corev1.Container{container},
		// Ready means back in its chains, not only listening: see
		// ChainsReadyCondition.
		ReadinessGates:            []corev1.PodReadinessGate{{ConditionType: ChainsReadyCondition}},
		NodeSelector:              spec.Placement.NodeSelector,
		Tolerations:               spec.Placement.Tolerations,
		Affinity:                  podAntiAffinity(pool, spec.Placement.NodeSpread),
		TopologySpreadConstraints: zoneSpread(pool, spec.Placement.ZoneSpread),
		SecurityContext:           podSecurity,
	}

	sts := &appsv1.StatefulSet{
		TypeMeta: metav1.TypeMeta{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "StatefulSet"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      pool.StatefulSetName(),
			Namespace: pool.Namespace,
			Labels:    labels,
		},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr.To(spec.Replicas),
			ServiceName: pool.ServiceName(),
			Selector:    &metav1.LabelSelector{MatchLabels: poolSelectorLabels(pool)},
			// Replicas are independent processes; a chain tolerates any
			// start order, so starting them together is safe and faster.
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       podSpec,
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{pvc},
		},
	}
	applyPodOptions(&sts.Spec.Template, spec.Pod)
	return sts
}

// podAntiAffinity keeps replica pods of one pool on different nodes, so a
// node failure takes out at most one member of each chain: strictly
// (Required, pods stay pending without a free node) or when possible
// (Preferred).
func podAntiAffinity(pool *streamsv1alpha1.ReplicaPool, policy streamsv1alpha1.SpreadPolicy) *corev1.Affinity {
	term := corev1.PodAffinityTerm{
		LabelSelector: &metav1.LabelSelector{MatchLabels: poolSelectorLabels(pool)},
		TopologyKey:   nodeTopologyKey,
	}
	switch policy {
	case streamsv1alpha1.SpreadRequired:
		return &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term},
		}}
	case streamsv1alpha1.SpreadPreferred:
		return &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: 100, PodAffinityTerm: term}},
		}}
	default:
		return nil
	}
}

// zoneSpread balances replica pods across zones, within one pod of each
// other: strictly (Required) or when possible (Preferred).
func zoneSpread(pool *streamsv1alpha1.ReplicaPool, policy streamsv1alpha1.SpreadPolicy) []corev1.TopologySpreadConstraint {
	var when corev1.UnsatisfiableConstraintAction
	switch policy {
	case streamsv1alpha1.SpreadRequired:
		when = corev1.DoNotSchedule
	case streamsv1alpha1.SpreadPreferred:
		when = corev1.ScheduleAnyway
	default:
		return nil
	}
	return []corev1.TopologySpreadConstraint{{
		MaxSkew:           1,
		TopologyKey:       zoneTopologyKey,
		WhenUnsatisfiable: when,
		LabelSelector:     &metav1.LabelSelector{MatchLabels: poolSelectorLabels(pool)},
	}}
}

// desiredService is the pool's headless Service. It publishes pods before
// they are ready: a replica rejoining its chain must be reachable by its
// peers to catch up, which is what makes it ready.
func desiredService(pool *streamsv1alpha1.ReplicaPool) *corev1.Service {
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      pool.ServiceName(),
			Namespace: pool.Namespace,
			Labels:    poolLabels(pool),
		},
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			PublishNotReadyAddresses: true,
			Selector:                 poolSelectorLabels(pool),
			Ports:                    []corev1.ServicePort{namedPort(replicaPortName, replicaPort)},
		},
	}
}

// desiredPDB lets voluntary disruptions (drains, upgrades) take at most one
// replica pod at a time: every chain loses at most one member on purpose.
func desiredPDB(pool *streamsv1alpha1.ReplicaPool) *policyv1.PodDisruptionBudget {
	return oneAtATime(pool.Namespace, pool.Name, poolLabels(pool), poolSelectorLabels(pool))
}

// oneAtATime is a PodDisruptionBudget that lets voluntary disruptions take
// at most one of the selected pods at a time.
func oneAtATime(namespace, name string, labels, selector map[string]string) *policyv1.PodDisruptionBudget {
	return &policyv1.PodDisruptionBudget{
		TypeMeta:   metav1.TypeMeta{APIVersion: policyv1.SchemeGroupVersion.String(), Kind: "PodDisruptionBudget"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: ptr.To(intstr.FromInt32(1)),
			Selector:       &metav1.LabelSelector{MatchLabels: selector},
		},
	}
}

// namedPort is a TCP Service port forwarding to the pods' port of the same
// name.
func namedPort(name string, port int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, TargetPort: intstr.FromString(name), Protocol: corev1.ProtocolTCP}
}
