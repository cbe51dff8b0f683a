package controllers

import (
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/utils/ptr"

	streamsv1alpha1 "github.com/catena-streams/catena/api/v1alpha1"
)

// Ports and names of an aggregator pod. `catena aggregator` serves the
// Aggregator gRPC API (Assign, Status, Get, List) on workerPort, and
// Prometheus metrics on metricsPort, as replicas do.
const (
	workerPort          int32 = 7080
	workerPortName            = "aggregator"
	workerContainer           = "aggregator"
	componentAggregator       = "aggregator"
	// aggServiceSuffix names the ClusterIP Service clients (`catenactl agg
	// get --server`) use: it sends them to ready workers only, any of which
	// answers for every shard.
	aggServiceSuffix = "-api"
	// labelAggregation names the Aggregation an object belongs to.
	labelAggregation = "streams.catena.io/aggregation"
)

// Settings of an Aggregation's checkpoint Stream.
const (
	// checkpointRetention bounds the checkpoint stream by time only. Workers
	// hold retention at their latest snapshot, so what a restore needs is
	// kept however old it is; what retention removes is superseded.
	checkpointRetention = time.Hour
	// checkpointIngestReplicas: workers write checkpoints through the
	// source's ingestion Service (both Streams are on one pool); the
	// checkpoint Stream's own ingestion tier only serves inspection.
	checkpointIngestReplicas int32 = 1
)

// aggSelectorLabels select the worker pods of an Aggregation. They are the
// StatefulSet's immutable selector: never change them.
func aggSelectorLabels(agg *streamsv1alpha1.Aggregation) map[string]string {
	return selectorLabels(componentAggregator, agg.WorkersName())
}

// aggLabels are the selector labels, the Aggregation's and who manages the
// object.
func aggLabels(agg *streamsv1alpha1.Aggregation) map[string]string {
	l := aggSelectorLabels(agg)
	l[labelManagedBy] = fieldOwner
	l[labelAggregation] = agg.Name
	return l
}

// aggServiceName is the ClusterIP Service of an Aggregation's workers.
func aggServiceName(agg *streamsv1alpha1.Aggregation) string {
	return agg.WorkersName() + aggServiceSuffix
}

// aggEndpoint is the in-cluster address of that Service.
func aggEndpoint(agg *streamsv1alpha1.Aggregation) string {
	return fmt.Sprintf("%s.%s.svc:%d", aggServiceName(agg), agg.Namespace, workerPort)
}

// WorkerDNSAddr is the address of a worker pod through its StatefulSet's
// headless Service: <pod>.<service>.<namespace>.svc:7080.
func WorkerDNSAddr(pod *corev1.Pod) string {
	svc := pod.Spec.Subdomain
	if svc == "" {
		svc = pod.Labels[labelInstance]
	}
	return fmt.Sprintf("%s.%s.%s.svc:%d", pod.Name, svc, pod.Namespace, workerPort)
}

// OperatorPodSelector selects the pods the operator watches: replica pods
// of every pool, worker pods of every Aggregation, and ingestion pods (the
// nodes an external listener's NodePort is reported on). The operator's
// cache of pods is restricted to them.
func OperatorPodSelector() labels.Selector {
	name, err := labels.NewRequirement(labelName, selection.Equals, []string{appName})
	if err != nil {
		panic(err) // constant input
	}
	component, err := labels.NewRequirement(labelComponent, selection.In, []string{componentReplica, componentAggregator, componentIngest})
	if err != nil {
		panic(err)
	}
	return labels.NewSelector().Add(*name, *component)
}

// aggregationObjects is what an Aggregation is made of: its checkpoint
// Stream, the workers' StatefulSet, their headless Service (stable pod DNS
// names for the operator's Assign and the workers' fan-out), the ClusterIP
// Service clients use, and a PodDisruptionBudget.
type aggregationObjects struct {
	Checkpoints *streamsv1alpha1.Stream
	Workers     *appsv1.StatefulSet
	Headless    *corev1.Service
	Service     *corev1.Service
	PDB         *policyv1.PodDisruptionBudget
}

// desiredAggregationObjects builds an Aggregation's objects from its spec
// and its source Stream. It reads nothing but its arguments; owner
// references are set by the caller.
func desiredAggregationObjects(agg *streamsv1alpha1.Aggregation, source *streamsv1alpha1.Stream, image string) aggregationObjects {
	return aggregationObjects{
		Checkpoints: desiredCheckpointStream(agg, source),
		Workers:     desiredWorkers(agg, image),
		Headless:    desiredWorkersHeadless(agg),
		Service:     desiredWorkersService(agg),
		PDB:         oneAtATime(agg.Namespace, agg.WorkersName(), aggLabels(agg), aggSelectorLabels(agg)),
	}
}

// desiredCheckpointStream is the Stream holding the Aggregation's
// checkpoints: on the pool hosting the source, with as many partitions
// (shard n checkpoints to partition n) and as many copies, fsynced before
// acknowledgement. The source's own pool, when it has one, is named as a
// shared pool: the Stream controller lets any Stream live on a pool it
// does not own. Deleting the Aggregation deletes it, and its partitions are
// dropped from the pool's replicas (volumeReclaimPolicy Delete): a
// checkpoint outlives its Aggregation for no one.
func desiredCheckpointStream(agg *streamsv1alpha1.Aggregation, source *streamsv1alpha1.Stream) *streamsv1alpha1.Stream {
	pool := source.Status.Pool
	if pool == "" {
		pool = source.PoolName()
	}
	return &streamsv1alpha1.Stream{
		TypeMeta: metav1.TypeMeta{APIVersion: streamsv1alpha1.GroupVersion.String(), Kind: "Stream"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      agg.CheckpointStreamName(),
			Namespace: agg.Namespace,
			Labels: map[string]string{
				labelName: appName, labelManagedBy: fieldOwner, labelAggregation: agg.Name,
			},
		},
		Spec: streamsv1alpha1.StreamSpec{
			Pool:              pool,
			Partitions:        source.Spec.Partitions,
			ReplicationFactor: source.Spec.ReplicationFactor,
			MinChainLength:    source.Spec.MinChainLength,
			Retention:         &streamsv1alpha1.RetentionSpec{Time: &metav1.Duration{Duration: checkpointRetention}},
			Durability:        streamsv1alpha1.DurabilitySpec{Mode: streamsv1alpha1.DurabilityFsync},
			Ingestion:         streamsv1alpha1.IngestionSpec{Replicas: checkpointIngestReplicas},
			// No users: only the workers (and the operator) may write
			// or read the checkpoints.
			Access:              &streamsv1alpha1.StreamAccess{},
			VolumeReclaimPolicy: streamsv1alpha1.VolumeReclaimDelete,
		},
	}
}

func desiredWorkers(agg *streamsv1alpha1.Aggregation, image string) *appsv1.StatefulSet {
	replicas := agg.Spec.Workers
	if replicas == 0 {
		replicas = 1 // the schema's default, for an Aggregation built in Go
	}
	container := corev1.Container{
		Name:  workerContainer,
		Image: image,
		Args: []string{
			"aggregator",
			fmt.Sprintf("--listen=:%d", workerPort),
			"--id=$(POD_NAME)",
			fmt.Sprintf("--metrics-listen=:%d", metricsPort),
		},
		Env: []corev1.EnvVar{{
			Name: "POD_NAME",
			ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"},
			},
		}},
		Ports: []corev1.ContainerPort{
			{Name: workerPortName, ContainerPort: workerPort, Protocol: corev1.ProtocolTCP},
			{Name: metricsPortName, ContainerPort: metricsPort, Protocol: corev1.ProtocolTCP},
		},
		Resources:       *agg.Spec.Resources.DeepCopy(),
		ReadinessProbe:  tcpProbe(workerPortName),
		LivenessProbe:   tcpProbe(workerPortName),
		SecurityContext: restrictedContainer(),
	}
	podSpec := corev1.PodSpec{
		Containers: []corev1.Container{container},
		// Workers keep their state in memory and in the checkpoint stream:
		// spread them when the cluster allows, never leave one pending.
		Affinity:        spreadWhenPossible(aggSelectorLabels(agg)),
		SecurityContext: restrictedPod(),
	}
	sts := &appsv1.StatefulSet{
		TypeMeta: metav1.TypeMeta{APIVersion: appsv1.SchemeGroupVersion.String(), Kind: "StatefulSet"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      agg.WorkersName(),
			Namespace: agg.Namespace,
			Labels:    aggLabels(agg),
		},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr.To(replicas),
			ServiceName: agg.WorkersName(),
			Selector:    &metav1.LabelSelector{MatchLabels: aggSelectorLabels(agg)},
			// The operator assigns shards to whichever workers answer; no
			// start order matters.
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: aggLabels(agg)},
				Spec:       podSpec,
			},
		},
	}
	applyPodOptions(&sts.Spec.Template, agg.Spec.Pod)
	return sts
}

// desiredWorkersHeadless gives each worker pod a stable DNS name. Like the
// pools' Service it publishes pods before they are ready: the operator
// assigns a worker its shards as soon as it answers.
func desiredWorkersHeadless(agg *streamsv1alpha1.Aggregation) *corev1.Service {
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      agg.WorkersName(),
			Namespace: agg.Namespace,
			Labels:    aggLabels(agg),
		},
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			PublishNotReadyAddresses: true,
			Selector:                 aggSelectorLabels(agg),
			Ports:                    []corev1.ServicePort{namedPort(workerPortName, workerPort)},
		},
	}
}

// desiredWorkersService is the ClusterIP Service status.endpoint names:
// clients reach a ready worker, which asks its peers for the shards it does
// not own.
func desiredWorkersService(agg *streamsv1alpha1.Aggregation) *corev1.Service {
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      aggServiceName(agg),
			Namespace: agg.Namespace,
			Labels:    aggLabels(agg),
		},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: aggSelectorLabels(agg),
			Ports:    []corev1.ServicePort{namedPort(workerPortName, workerPort)},
		},
	}
}
